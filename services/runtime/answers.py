"""What a role that answers questions from its folded state adds to every answer it sends.

The read service and the forecast role answer from what they folded; while they cannot read
the log on, an answer that looks current would mislead (``as_of``)."""

from __future__ import annotations

from typing import Any


def as_of(body: dict[str, Any], stall: tuple[float, str] | None) -> dict[str, Any]:
    """An answer as sent. While the service cannot read the log on (``stall``: since when, on the
    wall clock, and why), the answer says so under ``stale``: its ``seq`` is how far the service
    folded, and the log may have gone on past it, or may be unreadable to anyone. A user read
    "pending" from a cluster that had lost its stream leader, with nothing to say it might not be."""
    if stall is None:
        return body
    since, why = stall
    return {**body, "stale": {"since": since, "why": why}}
