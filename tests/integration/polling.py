"""Waiting on a condition that no event announces: a process's state, a file a keeper writes, a
server's answer (which server leads a stream, how far a server's copy of the log has come).

The log and the runtime's reports are waited on as events; a worker's pid file or a process
that outlives its agent is not, so these conditions are looked at every 20 ms until they hold,
for at most ``timeout`` seconds (the wait fails, never passes, when they do not)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

POLL_S = 0.02


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait until ``predicate()`` holds, or raise ``TimeoutError`` after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(POLL_S)


async def until_answered(ask: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.1) -> None:
    """``until`` for a condition a server must be asked about: asked every ``every`` seconds (a
    question costs the server a request) until it holds, for at most ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await ask():
            await asyncio.sleep(every)
