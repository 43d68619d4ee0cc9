"""Flag values that argparse alone cannot check: names, durations, ``NAME=VALUE`` pairs and mounts.

Each bad value is a ``BadInput`` naming the flag, for one line on stderr and exit status 2.
"""

from __future__ import annotations

from corral.events import subjects
from corral.events.jobs import Mount
from corral.services.cli import when
from corral.services.cli.jobfile import BadInput


def names(text: str | None, what: str) -> list[str]:
    names = [n for n in (text or "").split(",") if n]
    bad = [n for n in names if not subjects.is_token(n)]
    if bad:
        raise BadInput(f"{what} {bad[0]!r}: use letters, digits, '-' and '_' (at most 64)")
    return names


def duration(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return when.duration(text)
    except when.BadTime as e:
        raise BadInput(f"{flag}: {e}") from None


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise BadInput(f"{flag} {item!r}: write NAME=VALUE")
        out[name] = value
    return out


def mount(text: str) -> Mount:
    """``SOURCE:TARGET`` (read-only) or ``SOURCE:TARGET:rw``."""
    parts = text.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return Mount(source=parts[0], target=parts[1], read_only=parts[2] == "ro")
    if len(parts) == 2 and all(parts):
        return Mount(source=parts[0], target=parts[1])
    raise BadInput(f"--mount {text!r}: write SOURCE:TARGET, or SOURCE:TARGET:rw to let workers write")


def seconds(value: object, what: str, *, zero: bool = True) -> float:
    try:
        return when.seconds(value, zero=zero)
    except when.BadTime as e:
        raise BadInput(f"{what}: {e}") from None
