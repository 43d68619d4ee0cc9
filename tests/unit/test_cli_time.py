"""Times and durations as people write them on the command line (``services/cli/when.py``), and
what submit's flags and ``--`` make of a job."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from corral.services.cli import when
from corral.services.cli.jobfile import BadInput
from corral.services.cli.jobs import job_from_args
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
    # To any other verb "--" ends the options: a resize's count after it is its count.
    assert parse(["resize", "j1", "--", "4"]).replicas == 4
    assert parse(["resize", "--tenant", "t", "j1", "--", "-1"]).replicas == -1


def test_submit_flags_fill_the_spec_and_a_flag_beside_a_job_file_is_refused(tmp_path: Path) -> None:
    args = parse(
        [
            "submit", "--queue", "q", "--replicas", "4", "--min-replicas", "2", "--env", "LR=3e-4",
            "--mount", "/data:/data", "--mount", "/out:/out:rw", "--runtime-estimate", "1h30m",
            "--checkpointable", "--grace", "90s", "--image", "pytorch:24.05", "--gpu-model", "H100-80GB",
            "--not-preemptible", "--", "python", "train.py",
        ]
    )  # fmt: skip
    _, spec = job_from_args(args)
    assert (spec.replicas, spec.min_replicas, spec.env, spec.image) == (4, 2, {"LR": "3e-4"}, "pytorch:24.05")
    assert [(m.source, m.read_only) for m in spec.mounts] == [("/data", True), ("/out", False)]
    assert (spec.runtime_estimate_s, spec.grace_seconds, spec.checkpointable, spec.preemptible) == (
        5400.0,
        90.0,
        True,
        False,
    )
    assert spec.resources.gpu_models == ("H100-80GB",) and spec.command == ("python", "train.py")
    plain = job_from_args(parse(["submit", "--queue", "q", "--", "python", "train.py"]))[1]
    assert plain.grace_seconds == 30.0 and plain.preemptible and plain.min_replicas is None
    entrypoint = job_from_args(parse(["submit", "--queue", "q", "--image", "pytorch:24.05"]))[1]
    assert (entrypoint.command, entrypoint.image) == ((), "pytorch:24.05")  # the image's own runs
    with pytest.raises(
        BadInput, match=r"nothing to run: give the command after -- \(corral submit --queue q"
    ):
        job_from_args(parse(["submit", "--queue", "q"]))
    with pytest.raises(BadInput, match=r"^command: its program \(the first argument\) is empty$"):
        job_from_args(parse(["submit", "--queue", "q", "--", "", "train.py"]))
    job_file = tmp_path / "job.yaml"
    job_file.write_text("queue: q\n")
    with pytest.raises(BadInput, match="--gpus: give the job's fields in .*job.yaml or as flags"):
        job_from_args(parse(["submit", str(job_file), "--gpus", "4"]))
    with pytest.raises(BadInput, match="job.yaml: nothing to run: give a command, or an image"):
        job_from_args(parse(["submit", str(job_file)]))
    job_file.write_text('queue: q\ncommand: [""]\n')
    with pytest.raises(BadInput, match="job.yaml: command: its program .* is empty"):
        job_from_args(parse(["submit", str(job_file)]))
    job_file.write_text("queue: q\n")
    # The command may follow the file, once.
    given = job_from_args(parse(["submit", str(job_file), "--", "python", "train.py", "--lr", "0.1"]))[1]
    assert (given.queue, given.command) == ("q", ("python", "train.py", "--lr", "0.1"))
    job_file.write_text("queue: q\ncommand: [python, train.py]\n")
    with pytest.raises(BadInput, match="gives the command already: give it there or after --, not both"):
        job_from_args(parse(["submit", str(job_file), "--", "python", "eval.py"]))
    for bad, why in ((["--env", "LR"], "NAME=VALUE"), (["--mount", "/data"], "SOURCE:TARGET")):
        with pytest.raises(BadInput, match=why):
            job_from_args(parse(["submit", "--queue", "q", *bad]))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90m", 5400.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("0", 0.0),
    ],
    ids=lambda v: str(v),
)
def test_a_duration_a_flag_or_a_file_gives(value: object, seconds: float) -> None:
    assert when.seconds(value) == seconds


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "-1h", "inf", "soon", True, [1]], ids=str)
def test_a_duration_that_is_negative_infinite_or_garbage_is_refused(value: object) -> None:
    with pytest.raises(when.BadTime, match="duration"):
        when.seconds(value)


def test_a_duration_of_nothing_is_refused_where_it_must_be_more() -> None:
    with pytest.raises(when.BadTime, match="more than 0"):
        when.seconds("0s", zero=False)
