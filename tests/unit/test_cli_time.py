"""Times and durations as people write them on the command line (``services/cli/when.py``)."""

from __future__ import annotations

import datetime as dt

import pytest

from corral.services.cli import when
from corral.services.cli.main import parse

NOW = 1_796_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("45m", 2700.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1.5d", 129600.0),
        ("1w", 604800.0),
        (" 2H ", 7200.0),
    ],
    ids=lambda v: str(v),
)
def test_durations(text: str, seconds: float) -> None:
    assert when.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1x", "-5m", "1h 30m", "1e400", "soon", "nan"])
def test_what_is_not_a_duration_is_refused_with_what_would_do(text: str) -> None:
    with pytest.raises(when.BadTime, match="not a duration .*1h30m"):
        when.duration(text)


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("now", NOW),
        ("-1h", NOW - 3600),
        ("-90m", NOW - 5400),
        ("-1h30m", NOW - 5400),
        ("+10s", NOW + 10),
        ("-30", NOW - 30),
        ("1796168035", 1796168035.0),
        ("1796168035.5", 1796168035.5),
        ("2026-12-01T10:00Z", dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC).timestamp()),
        ("2026-12-01T10:00:00+02:00", dt.datetime(2026, 12, 1, 8, tzinfo=dt.UTC).timestamp()),
        ("2026-12-01T10:00", dt.datetime(2026, 12, 1, 10).astimezone().timestamp()),
        ("2026-12-01 10:00:05", dt.datetime(2026, 12, 1, 10, 0, 5).astimezone().timestamp()),
        ("2026-12-01", dt.datetime(2026, 12, 1).astimezone().timestamp()),
    ],
    ids=lambda v: str(v),
)
def test_moments(text: str, at: float) -> None:
    assert when.moment(text, NOW) == at


@pytest.mark.parametrize("text", ["yesterday", "-h", "2026-13-01", "10:00 tomorrow", "+"])
def test_what_is_not_a_time_is_refused_with_what_would_do(text: str) -> None:
    with pytest.raises(when.BadTime, match="not a time .*2026-12-01T10:00"):
        when.moment(text, NOW)


def test_a_relative_time_and_a_command_after_dashes_reach_their_verbs() -> None:
    args = parse(["replay", "log.jsonl", "--at", "-1h"])
    assert args.at == "-1h"
    args = parse(["submit", "--queue", "q", "--gpus", "2", "--", "python", "train.py", "--lr", "3"])
    assert (args.queue, args.gpus, args.command) == ("q", 2, ["python", "train.py", "--lr", "3"])
    with pytest.raises(SystemExit):
        parse(["cancel", "j1", "--", "x"])  # only submit and whatif run a command
