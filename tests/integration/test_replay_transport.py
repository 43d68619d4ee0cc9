"""The replay's fast path against a real nats-server: every record exactly once, in order.

``JetStreamLog.read`` takes deliveries straight from the protocol parser and keeps its own
account of the consumer's delivery sequence. These tests read a busy cluster's log through it and
compare each record with what nats-py's stock direct get returns for the same sequence, and make
deliveries go missing or arrive twice on the way in: the reader must notice and read again from
the last record it took, never skip one and never hand one over twice. The fold of what it read
must be the fold of the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from bench.workload import synthetic_log
from corral.events import reader
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append, LogError, Record
from corral.projections.fold import fold

pytestmark = pytest.mark.integration

WAIT = 30.0  # seconds a read may take before the test fails
EVENTS = 3_000


@pytest.fixture(scope="module")
def appends() -> list[Append]:
    return synthetic_log(EVENTS, seed=3)


@pytest.fixture
async def log(nats_server: str, appends: list[Append]) -> AsyncIterator[JetStreamLog]:
    # Small batches, so a read hands over many of them and a reset can fall between two.
    js = await JetStreamLog.connect(nats_server, create=True, batch=500)
    try:
        results = await js.append_many(appends)
        assert not [r for r in results if isinstance(r, LogError)]
        yield js
    finally:
        await js.close()


async def read_all(log: JetStreamLog, start: int = 1) -> list[Record]:
    async def go() -> list[Record]:
        return [r async for batch in log.read(start) for r in batch]

    return await asyncio.wait_for(go(), WAIT)


async def stored(log: JetStreamLog, seq: int) -> Record:
    """The record at ``seq`` as nats-py's own direct get returns it: the reference."""
    msg = await log.nc.jetstream().get_msg(log.stream, seq=seq, direct=True)
    assert msg.subject is not None and msg.headers is not None
    headers = {k: v for k, v in msg.headers.items() if not k.startswith("Nats-")} or None
    return Record(seq, msg.subject, msg.data or b"", headers, stamp(msg.headers["Nats-Time-Stamp"]))


def stamp(text: str) -> float:
    """Seconds of an RFC 3339 stream time in UTC, from its nanoseconds (as the stream keeps it)."""
    whole, _, fraction = text.removesuffix("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    return (seconds * 10**9 + int(fraction.ljust(9, "0"))) / 1e9


def tamper(monkeypatch: pytest.MonkeyPatch, plan: dict[int, int]) -> list[int]:
    """Pass the first delivery of each record ``plan`` names to the reader as many times as it
    says (0: it is lost on the way); every other delivery, a later one of the same record
    included, passes once. Returns the sequences tampered with, in the order it happened."""
    original = reader.Consumer._on_delivery
    left = dict(plan)
    done: list[int] = []

    def on_delivery(
        self: reader.Consumer, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        if left and reply.startswith(b"$JS.ACK."):
            seq = int(reply.split(b".")[5])
            copies = left.pop(seq, 1)
            if seq in plan and seq not in done:
                done.append(seq)
            for _ in range(copies):
                original(self, subject, reply, data, headers)
            return
        original(self, subject, reply, data, headers)

    monkeypatch.setattr(reader.Consumer, "_on_delivery", on_delivery)
    return done


async def test_every_record_comes_back_as_stored(log: JetStreamLog, appends: list[Append]) -> None:
    records = await read_all(log)
    assert [r.seq for r in records] == list(range(1, len(appends) + 1))
    assert [(r.subject, r.data) for r in records] == [(a.subject, a.data) for a in appends]
    for r in records[:: len(records) // 50] + records[-3:]:  # against an independent reader
        want = await stored(log, r.seq)
        assert r == want


async def test_a_lost_delivery_is_read_again_not_skipped(
    log: JetStreamLog, appends: list[Append], monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = tamper(monkeypatch, {700: 0, 701: 0, 2_400: 0})
    records = await read_all(log)
    assert lost == [700, 701, 2_400]
    assert [r.seq for r in records] == list(range(1, len(appends) + 1))
    assert [r.data for r in records] == [a.data for a in appends]


async def test_a_delivery_that_arrives_twice_is_taken_once(
    log: JetStreamLog, appends: list[Append], monkeypatch: pytest.MonkeyPatch
) -> None:
    twice = tamper(monkeypatch, {1: 2, 999: 2, 1_500: 2})
    records = await read_all(log)
    assert twice == [1, 999, 1_500]
    assert [r.seq for r in records] == list(range(1, len(appends) + 1))


async def test_a_read_from_the_middle_starts_there(log: JetStreamLog, appends: list[Append]) -> None:
    records = await read_all(log, start=1_234)
    assert [r.seq for r in records] == list(range(1_234, len(appends) + 1))
    assert records[0].data == appends[1_233].data


async def test_the_fold_of_the_read_is_the_fold_of_the_log(
    log: JetStreamLog, appends: list[Append], monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = fold([await stored(log, seq) for seq in range(1, len(appends) + 1)])
    assert tamper(monkeypatch, {100: 0, 1_800: 2}) == []
    replayed = fold(await read_all(log))
    assert replayed.seq == len(appends) and not replayed.faults and not replayed.rejected_total
    assert replayed.jobs == reference.jobs
    assert replayed.nodes == reference.nodes
    assert replayed.quota_held == reference.quota_held
    assert replayed.gpu_time == reference.gpu_time
