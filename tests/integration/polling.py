"""Waiting on a condition that no event announces: a process's state, a file a keeper writes.

The log and the runtime's reports are waited on as events; a worker's pid file or a process
that outlives its agent is not, so these conditions are looked at every 20 ms until they hold,
for at most ``timeout`` seconds (the wait fails, never passes, when they do not)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.02


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait until ``predicate()`` holds, or raise ``TimeoutError`` after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(POLL_S)
