"""The event log: the one source of truth every service reads and appends to.

``EventLog`` is the small interface the rest of corral uses; ``InMemoryLog`` implements it for
the simulator and unit tests, ``events.jetstream.JetStreamLog`` on a real NATS JetStream stream.
One contract test suite runs against both.

Reads come in batches (lists of records), never one awaited message at a time: the fold is fast
and per-message awaits would dominate a replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Protocol

import msgspec


class Record(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One stored message: its stream sequence, subject, payload, headers, and the stream's
    timestamp (seconds) for it."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None
    time: float = 0.0


class Append(msgspec.Struct, frozen=True):
    """One message to append. ``msg_id`` deduplicates a retried append; a set
    ``expected_last_subject_seq`` makes the append conditional on nobody else having written to
    ``subject`` since that sequence (0 = the subject must be empty)."""

    subject: str
    data: bytes
    msg_id: str | None = None
    expected_last_subject_seq: int | None = None
    headers: dict[str, str] | None = None


class Fence(msgspec.Struct, frozen=True):
    """A condition on a whole append: ``subject``'s last sequence must still be ``last_seq``
    (0: nothing stored on it yet). A decision service fences each cycle on its decision subject,
    so that a cycle decided on a state another replica has since written to is refused whole."""

    subject: str
    last_seq: int


class Ack(msgspec.Struct, frozen=True):
    seq: int
    duplicate: bool = False


class LogError(Exception):
    """The log could not be reached or refused an append for a reason other than a conflict."""


class UnstorableError(LogError):
    """The log refuses this append for what it is (larger than a message may be), not for the
    moment: sent again, it is refused again. A writer that keeps appends in order drops it."""


class UnacknowledgedError(LogError):
    """The append went out but no acknowledgement came in time, or the stream says a message of
    its id is still being stored (a clustered stream's 409, "in process"): it may have been
    stored. Sent again with the same message id, it is stored once (the stream's duplicate
    window)."""


class RetryLater(LogError):
    """Not taken, for now: the writer sends past its rate (the intake's 429). Nothing was
    appended; the same append may be sent again after ``retry_s`` seconds."""

    def __init__(self, message: str, retry_s: float) -> None:
        super().__init__(message)
        self.retry_s = retry_s


class ConflictError(LogError):
    """An append's expected last subject sequence no longer holds: another writer got there
    first. The writer should fold the tail and decide again."""

    def __init__(self, subject: str, expected: int, actual: int | None = None) -> None:
        super().__init__(f"{subject}: expected last sequence {expected}, found {actual}")
        self.subject = subject
        self.expected = expected
        self.actual = actual


class EventLog(Protocol):
    async def append(self, item: Append) -> Ack:
        """Append one message and wait for it to be stored."""
        ...

    async def append_many(self, items: Sequence[Append]) -> list[Ack | LogError]:
        """Append several, pipelined: all are sent before any acknowledgement is awaited. Each
        result is the ack or the error of the item at the same index; order is preserved."""
        ...

    async def append_fenced(self, items: Sequence[Append], fence: Fence) -> list[Ack]:
        """Append all of ``items``, in order, or none of them: none if ``fence`` no longer holds
        (raises ``ConflictError``) or the log refuses any of them (raises ``LogError``). The
        items' own ``expected_last_subject_seq`` are ignored: the fence is the condition."""
        ...

    async def last_seq(self) -> int:
        """The sequence of the newest stored message (0 if empty)."""
        ...

    def read(self, start: int = 1, stop: int | None = None) -> AsyncIterator[list[Record]]:
        """Batches of records from ``start`` up to ``stop`` (inclusive) or, if None, up to the
        last sequence at the time of the call; then the iterator ends."""
        ...

    def follow(self, start: int = 1) -> AsyncIterator[list[Record]]:
        """Batches from ``start`` on, forever: the catch-up first, then each new arrival."""
        ...

    async def close(self) -> None: ...


class InMemoryLog:
    """An ``EventLog`` in a list, with JetStream's dedup and expected-sequence semantics."""

    def __init__(self, batch: int = 10_000) -> None:
        self._records: list[Record] = []
        self._last_by_subject: dict[str, int] = {}
        self._msg_ids: dict[str, int] = {}
        self._batch = batch
        self._grew = asyncio.Condition()
        self.now = 0.0  # stream time stamped on appends; the simulator moves it

    async def append(self, item: Append) -> Ack:
        result = self._store(item)
        if isinstance(result, LogError):
            raise result
        async with self._grew:
            self._grew.notify_all()
        return result

    async def append_many(self, items: Sequence[Append]) -> list[Ack | LogError]:
        results = [self._store(item) for item in items]
        async with self._grew:
            self._grew.notify_all()
        return results

    async def append_fenced(self, items: Sequence[Append], fence: Fence) -> list[Ack]:
        actual = self._last_by_subject.get(fence.subject, 0)
        if actual != fence.last_seq:
            raise ConflictError(fence.subject, fence.last_seq, actual)
        acks = []
        for item in items:
            result = self._store(msgspec.structs.replace(item, expected_last_subject_seq=None))
            assert not isinstance(result, LogError)  # nothing but a fence refuses an append here
            acks.append(result)
        async with self._grew:
            self._grew.notify_all()
        return acks

    def append_sync(self, item: Append) -> Ack:
        """For the simulator, which has no event loop to spare."""
        result = self._store(item)
        if isinstance(result, LogError):
            raise result
        return result

    def _store(self, item: Append) -> Ack | LogError:
        if item.msg_id is not None and item.msg_id in self._msg_ids:
            return Ack(self._msg_ids[item.msg_id], duplicate=True)
        if item.expected_last_subject_seq is not None:
            actual = self._last_by_subject.get(item.subject, 0)
            if actual != item.expected_last_subject_seq:
                return ConflictError(item.subject, item.expected_last_subject_seq, actual)
        seq = len(self._records) + 1
        self._records.append(Record(seq, item.subject, item.data, item.headers, self.now))
        self._last_by_subject[item.subject] = seq
        if item.msg_id is not None:
            self._msg_ids[item.msg_id] = seq
        return Ack(seq)

    @property
    def records(self) -> Sequence[Record]:
        return self._records

    async def last_seq(self) -> int:
        return len(self._records)

    async def read(self, start: int = 1, stop: int | None = None) -> AsyncIterator[list[Record]]:
        end = len(self._records) if stop is None else min(stop, len(self._records))
        i = max(start, 1) - 1
        while i < end:
            batch = self._records[i : min(i + self._batch, end)]
            i += len(batch)
            yield batch

    async def follow(self, start: int = 1) -> AsyncIterator[list[Record]]:
        i = max(start, 1) - 1
        while True:
            async with self._grew:
                await self._grew.wait_for(partial(self._longer_than, i))
            batch = self._records[i : i + self._batch]
            i += len(batch)
            yield batch

    def _longer_than(self, n: int) -> bool:
        return len(self._records) > n

    async def close(self) -> None:
        return None
