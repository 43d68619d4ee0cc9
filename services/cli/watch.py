"""Follow the log, fold it, and wait for what you expect: the demo's narrator and the tests' way
of waiting on an event with a timeout instead of sleeping. ``say`` sees each record with the
state just after it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from corral.events.log import EventLog, Record
from corral.projections.fold import apply
from corral.projections.state import State


class Watcher:
    def __init__(self, log: EventLog, say: Callable[[Record, State], None] | None = None) -> None:
        self.log = log
        self.state = State()
        self.records: list[Record] = []
        self.say = say
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watcher:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        async for batch in self.log.follow(1):
            for r in batch:
                apply(self.state, r)
                self.records.append(r)
                if self.say is not None:
                    self.say(r, self.state)
            async with self._changed:
                self._changed.notify_all()

    async def until(self, predicate: Callable[[State], bool], timeout: float = 30.0) -> State:
        """Wait until ``predicate(state)`` holds, or raise TimeoutError."""

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self.state))

        await asyncio.wait_for(wait(), timeout)
        return self.state

    async def caught_up(self, timeout: float = 30.0) -> State:
        """Wait until everything in the log now has been folded."""
        last = await self.log.last_seq()
        return await self.until(lambda s: s.seq >= last, timeout)
