"""Times and durations as people write them on the command line.

A moment (``--at``): a date and time as ISO 8601 writes it (``2026-12-01T10:00``, ``2026-12-01
10:00:05``, ``2026-12-01``; with ``Z`` or ``+02:00`` it is in that zone, without one in this
machine's local time, as ``date`` shows it), a time relative to now (``-1h``, ``-90m``,
``-1h30m``, ``+10s``), ``now``, or seconds since the epoch (``1796168035``, as the log stores
times). A duration (``--runtime-estimate``): ``90`` (seconds), ``90s``, ``45m``, ``2h``,
``1h30m``, ``1.5d``. Anything else is a ``BadTime`` whose message says what would do.
"""

from __future__ import annotations

import datetime as dt
import math
import re

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
MOMENT_HELP = (
    "e.g. 2026-12-01T10:00 (local time unless it ends in Z or +HH:MM), -1h, -30m, now, or unix seconds"
)
DURATION_HELP = "e.g. 90 (seconds), 90s, 45m, 2h, 1h30m, 1.5d"


class BadTime(ValueError):
    """A time or duration that does not read as one; the message is one line for a person."""


def duration(text: str) -> float:
    """Seconds in ``text``: a bare number of seconds, or numbers with units (``1h30m``)."""
    t = text.strip().lower()
    if _NUMBER.fullmatch(t):
        seconds = float(t)
    elif _DURATION.fullmatch(t):
        seconds = sum(float(n) * UNITS[u] for n, u in _PART.findall(t))
    else:
        raise BadTime(f"{text!r} is not a duration ({DURATION_HELP})")
    if not math.isfinite(seconds):
        raise BadTime(f"{text!r} is not a duration ({DURATION_HELP})")
    return seconds


def seconds(value: object, *, zero: bool = True) -> float:
    """A duration a flag or a file gives: a number of seconds (a file's ``86400``) or text as
    ``duration`` reads it (``"7d"``, ``"1h30m"``); 0 only when ``zero`` allows it. Negative,
    infinite and NaN durations are refused however written: TOML and YAML read ``nan`` and
    ``inf`` as numbers."""
    if isinstance(value, str):
        s = duration(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        s = float(value)
    else:
        raise BadTime(f"{value!r} is not a duration ({DURATION_HELP})")
    if not math.isfinite(s) or s < 0 or (s == 0 and not zero):
        bound = "0 or more" if zero else "more than 0"
        raise BadTime(f"{value!r} is not a duration {bound} ({DURATION_HELP})")
    return s


def moment(text: str, now: float) -> float:
    """Seconds since the epoch that ``text`` names, relative ones counted from ``now``."""
    t = text.strip()
    if t.lower() == "now":
        return now
    if t[:1] in ("-", "+"):
        try:
            offset = duration(t[1:])
        except BadTime:
            raise BadTime(f"{text!r} is not a time ({MOMENT_HELP})") from None
        return now - offset if t[0] == "-" else now + offset
    if _NUMBER.fullmatch(t):
        return float(t)
    try:
        when = dt.datetime.fromisoformat(t)
    except ValueError:
        raise BadTime(f"{text!r} is not a time ({MOMENT_HELP})") from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is this machine's local time
    return when.timestamp()
