"""The EventLog contract, run against the in-memory log and against JetStream on a real server.

Whatever a service may rely on is asserted here for both, so the simulator and unit tests (in
memory) see the same log semantics as production (JetStream): ordering, batching, dedup by
message id, expected last subject sequence, per-item results of pipelined appends, headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

import nats
import nats.js.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events.jetstream import MAX_BATCH, JetStreamLog
from corral.events.log import (
    Ack,
    Append,
    ConflictError,
    EventLog,
    Fence,
    InMemoryLog,
    LogError,
    Record,
    UnacknowledgedError,
    UnstorableError,
)
from corral.events.server import EmbeddedServer
from corral.events.subjects import STREAM, STREAM_SUBJECTS
from tests.integration import polling

pytestmark = pytest.mark.integration

BATCH = 10
WAIT = 10.0  # seconds a test waits for what it expects before failing


def ev(subject: str = "corral.ev.job.j1", data: bytes = b"{}", **kw: object) -> Append:
    return Append(subject, data, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "jetstream"])
async def log(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EventLog]:
    if request.param == "memory":
        mem = InMemoryLog(batch=BATCH)
        yield mem
        await mem.close()
        return
    # The same per-test server as the nats_server fixture; started here since an async fixture
    # cannot be requested by name from inside another.
    async with EmbeddedServer(tmp_path_factory.mktemp("nats")) as server:
        js = await JetStreamLog.connect(server.url, batch=BATCH, create=True)
        try:
            yield js
        finally:
            await js.close()


T = TypeVar("T")


@contextlib.asynccontextmanager
async def closing(it: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close a reader when done with it (the protocol types it as a bare async iterator)."""
    try:
        yield it
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()


async def read_all(log: EventLog, start: int = 1, stop: int | None = None) -> list[list[Record]]:
    async def go() -> list[list[Record]]:
        return [batch async for batch in log.read(start, stop)]

    return await asyncio.wait_for(go(), WAIT)


def seqs(batches: list[list[Record]]) -> list[int]:
    return [r.seq for b in batches for r in b]


async def fill(log: EventLog, n: int, subject: str = "corral.ev.job.j1") -> list[Ack]:
    acks = await log.append_many([ev(subject, f'{{"n":{i}}}'.encode()) for i in range(n)])
    assert all(isinstance(a, Ack) for a in acks)
    return acks  # type: ignore[return-value]


# -- appends and reads -------------------------------------------------------------------------


async def test_append_returns_increasing_sequences(log: EventLog) -> None:
    acks = [await log.append(ev(f"corral.ev.job.j{i % 3}")) for i in range(5)]
    assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
    assert not any(a.duplicate for a in acks)


async def test_last_seq(log: EventLog) -> None:
    assert await log.last_seq() == 0
    await fill(log, 7)
    assert await log.last_seq() == 7


async def test_read_returns_everything_in_order_in_batches(log: EventLog) -> None:
    await fill(log, 25)
    batches = await read_all(log)
    assert seqs(batches) == list(range(1, 26))
    assert all(0 < len(b) <= BATCH for b in batches)
    assert len(batches) >= 3
    records = [r for b in batches for r in b]
    assert records[3].subject == "corral.ev.job.j1"
    assert records[3].data == b'{"n":3}'
    assert all(isinstance(r.time, float) for r in records)


@pytest.mark.parametrize(
    ("start", "stop", "expected"),
    [
        (1, None, range(1, 13)),
        (5, None, range(5, 13)),
        (5, 8, range(5, 9)),
        (1, 1, range(1, 2)),
        (12, None, range(12, 13)),
        (10, 100, range(10, 13)),
        (13, None, range(0)),
        (8, 5, range(0)),
        (0, 3, range(1, 4)),
    ],
    ids=[
        "all",
        "from",
        "from-to",
        "first",
        "last",
        "stop-past-end",
        "start-past-end",
        "empty-range",
        "zero-start",
    ],
)
async def test_read_honours_start_and_stop(
    log: EventLog, start: int, stop: int | None, expected: range
) -> None:
    await fill(log, 12)
    assert seqs(await read_all(log, start, stop)) == list(expected)


async def test_read_of_an_empty_log_ends_at_once(log: EventLog) -> None:
    assert await read_all(log) == []


async def test_read_ends_at_the_last_sequence_at_call_time(log: EventLog) -> None:
    await fill(log, 25)
    got: list[int] = []

    async def go() -> None:
        async with closing(log.read()) as it:
            async for batch in it:
                if not got:
                    await fill(log, 5)  # arrives while reading: not part of this read
                got.extend(r.seq for r in batch)

    await asyncio.wait_for(go(), WAIT)
    assert got == list(range(1, 26))
    assert await log.last_seq() == 30


async def test_follow_delivers_the_catch_up_then_live_appends(log: EventLog) -> None:
    await fill(log, 3)
    got: list[Record] = []
    async with closing(log.follow(2)) as it:

        async def until(n: int) -> None:
            while len(got) < n:
                got.extend(await anext(it))

        await asyncio.wait_for(until(2), WAIT)
        assert [r.seq for r in got] == [2, 3]
        await log.append(ev("corral.ev.node.n1", b"live"))
        await fill(log, 2, "corral.ev.job.j2")
        await asyncio.wait_for(until(5), WAIT)
    assert [r.seq for r in got] == [2, 3, 4, 5, 6]
    assert (got[2].subject, got[2].data) == ("corral.ev.node.n1", b"live")


async def test_follow_from_the_start_of_an_empty_log_waits_for_the_first(log: EventLog) -> None:
    async with closing(log.follow()) as it:
        first = asyncio.ensure_future(anext(it))
        await log.append(ev())
        batch = await asyncio.wait_for(first, WAIT)
    assert [r.seq for r in batch] == [1]


# -- deduplication and optimistic concurrency ----------------------------------------------------


async def test_duplicate_msg_id_is_stored_once(log: EventLog) -> None:
    first = await log.append(ev(msg_id="place:j1:0"))
    await log.append(ev("corral.ev.job.j2"))
    again = await log.append(ev(data=b'{"retry":true}', msg_id="place:j1:0"))
    assert first == Ack(1)
    assert again == Ack(1, duplicate=True)
    assert seqs(await read_all(log)) == [1, 2]
    assert await log.last_seq() == 2


async def test_duplicates_within_one_append_many(log: EventLog) -> None:
    results = await log.append_many([ev(msg_id="a"), ev(msg_id="b"), ev(msg_id="a")])
    assert results == [Ack(1), Ack(2), Ack(1, duplicate=True)]


async def test_retried_conditional_append_is_a_duplicate_not_a_conflict(log: EventLog) -> None:
    # A writer that lost the acknowledgement retries the very same append: the stream answers
    # with the stored copy rather than a conflict with itself.
    item = ev("corral.ev.decision.placer", msg_id="place:j1:0", expected_last_subject_seq=0)
    first = await log.append(item)
    again = await log.append(item)
    assert (first, again) == (Ack(1), Ack(1, duplicate=True))


async def test_expected_last_subject_seq_holds(log: EventLog) -> None:
    subject = "corral.ev.decision.placer"
    first = await log.append(ev(subject, expected_last_subject_seq=0))
    await log.append(ev("corral.ev.job.other"))  # other subjects do not matter
    second = await log.append(ev(subject, expected_last_subject_seq=first.seq))
    assert (first.seq, second.seq) == (1, 3)


async def test_expected_last_subject_seq_conflicts_when_stale(log: EventLog) -> None:
    subject = "corral.ev.decision.placer"
    await log.append(ev(subject, expected_last_subject_seq=0))
    await log.append(ev(subject))
    with pytest.raises(ConflictError) as caught:
        await log.append(ev(subject, expected_last_subject_seq=1))
    assert (caught.value.subject, caught.value.expected, caught.value.actual) == (subject, 1, 2)
    assert isinstance(caught.value, LogError)
    assert await log.last_seq() == 2  # the refused append stored nothing


async def test_expected_zero_means_the_subject_must_be_empty(log: EventLog) -> None:
    subject = "corral.ev.decision.admission"
    await log.append(ev(subject, expected_last_subject_seq=0))
    with pytest.raises(ConflictError):
        await log.append(ev(subject, expected_last_subject_seq=0))


async def test_append_many_gives_per_item_results_in_order(log: EventLog) -> None:
    subject = "corral.ev.decision.placer"
    items = [
        ev("corral.ev.job.a"),
        ev(subject, expected_last_subject_seq=0),
        ev(subject, expected_last_subject_seq=0),  # stale by then: the one before got there first
        ev("corral.ev.job.b"),
        ev(subject, expected_last_subject_seq=2),
    ]
    results = await log.append_many(items)
    assert results[0] == Ack(1)
    assert results[1] == Ack(2)
    assert isinstance(results[2], ConflictError)
    assert results[2].expected == 0
    assert results[3] == Ack(3)
    assert results[4] == Ack(4)
    stored = [r for b in await read_all(log) for r in b]
    assert [r.subject for r in stored] == ["corral.ev.job.a", subject, "corral.ev.job.b", subject]


async def test_a_fenced_append_stores_all_in_order(log: EventLog) -> None:
    await fill(log, 2, "corral.ev.decision.placer")
    items = [ev("corral.ev.job.a"), ev("corral.ev.decision.placer", msg_id="p:1"), ev("corral.ev.job.b")]
    acks = await log.append_fenced(items, Fence("corral.ev.decision.placer", 2))
    assert [a.seq for a in acks] == [3, 4, 5]
    # Flattened: a reader may hand the five records over in batches of any size.
    assert [r.subject for b in await read_all(log) for r in b][-3:] == [i.subject for i in items]


async def test_a_fenced_append_whose_fence_moved_stores_nothing(log: EventLog) -> None:
    """Whichever subjects the items are on, and whatever they expect themselves."""
    await fill(log, 2, "corral.ev.decision.placer")
    items = [ev("corral.ev.job.a"), ev("corral.ev.job.b", expected_last_subject_seq=0)]
    with pytest.raises(ConflictError) as caught:
        await log.append_fenced(items, Fence("corral.ev.decision.placer", 1))
    assert (caught.value.subject, caught.value.expected, caught.value.actual) == (
        "corral.ev.decision.placer",
        1,
        2,
    )
    assert await log.last_seq() == 2
    with pytest.raises(ConflictError):  # an empty subject is at 0
        await log.append_fenced([ev("corral.ev.job.a")], Fence("corral.ev.decision.admission", 5))
    assert await log.last_seq() == 2
    acks = await log.append_fenced([ev("corral.ev.job.a")], Fence("corral.ev.decision.admission", 0))
    assert [a.seq for a in acks] == [3]


async def test_a_cycle_appended_again_is_a_race_lost_not_a_failure(log: EventLog) -> None:
    """The same decisions under the same message ids, fenced where the first were (a leader's
    acknowledgement lost in a server stall, and the replica that took over deciding the same
    cycle): a conflict, which the service answers by folding and deciding again; JetStream
    refused the batch for its duplicate ids, which the service counted as a failed cycle and
    handed its lease over for."""
    fence = Fence("corral.ev.decision.admission", 0)
    cycle = [ev("corral.ev.decision.admission", msg_id="admission:370")] + [
        ev(f"corral.ev.job.j{i}", msg_id=f"admission:370:{i}") for i in range(2)
    ]
    assert [a.seq for a in await log.append_fenced(cycle, fence)] == [1, 2, 3]
    with pytest.raises(ConflictError):
        await log.append_fenced(cycle, fence)
    assert await log.last_seq() == 3


async def test_append_many_of_nothing(log: EventLog) -> None:
    assert await log.append_many([]) == []


async def test_headers_round_trip(log: EventLog) -> None:
    traced = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-k": "v"}
    await log.append(ev(headers=traced, msg_id="m1", expected_last_subject_seq=0))
    await log.append(ev("corral.ev.job.j2"))
    records = [r for b in await read_all(log) for r in b]
    # Only the writer's own headers come back; the log's own (message id, expectations) do not.
    assert records[0].headers == traced
    assert records[1].headers is None


async def test_many_appends_read_back_exactly(log: EventLog) -> None:
    n = 3_000
    acks = await fill(log, n, "corral.ev.node.n1")
    assert [a.seq for a in acks] == list(range(1, n + 1))
    records = [r for b in await read_all(log) for r in b]
    assert [r.data for r in records] == [f'{{"n":{i}}}'.encode() for i in range(n)]


# -- JetStream only ------------------------------------------------------------------------------


async def test_connect_twice_keeps_one_stream(nats_server: str) -> None:
    a = await JetStreamLog.connect(nats_server, create=True)
    await a.append(ev())
    b = await JetStreamLog.connect(nats_server, create=True)
    try:
        assert await b.last_seq() == 1
        assert (await b.append(ev())).seq == 2
        nc = await nats.connect(nats_server)
        try:
            info = await nc.jetstream().stream_info(STREAM)
        finally:
            await nc.close()
        cfg = info.config
        assert sorted(cfg.subjects or []) == sorted(STREAM_SUBJECTS)
        assert cfg.storage == "file"
        assert cfg.duplicate_window == 120.0
        assert cfg.max_msg_size == 1024 * 1024
        assert cfg.num_replicas == 1
    finally:
        await a.close()
        await b.close()


async def test_log_survives_a_server_restart(embedded_server: EmbeddedServer) -> None:
    log = await JetStreamLog.connect(embedded_server.url, create=True)
    await fill(log, 20)
    await log.append(ev(headers={"traceparent": "t"}, msg_id="m"))
    before = [r for b in await read_all(log) for r in b]
    await log.close()

    await embedded_server.stop()
    await embedded_server.start()

    log = await JetStreamLog.connect(embedded_server.url, create=True)
    try:
        after = [r for b in await read_all(log) for r in b]
        assert after == before
        assert (await log.append(ev())).seq == 22
    finally:
        await log.close()


async def test_follow_carries_on_across_a_server_restart(embedded_server: EmbeddedServer) -> None:
    # The consumer lives in the server's memory and is lost with it; the reader notices the
    # silence (missed heartbeats) and recreates it after the last record it took.
    log = await JetStreamLog.connect(embedded_server.url, heartbeat=0.2, reconnect_time_wait=0.1, create=True)
    try:
        await fill(log, 3)
        got: list[int] = []
        async with closing(log.follow()) as it:

            async def until(n: int) -> None:
                while len(got) < n:
                    got.extend(r.seq for r in await anext(it))

            await asyncio.wait_for(until(3), WAIT)
            await embedded_server.stop()
            await embedded_server.start()
            await asyncio.wait_for(log.append(ev("corral.ev.job.after")), WAIT)
            await asyncio.wait_for(until(4), WAIT)
        assert got == [1, 2, 3, 4]
    finally:
        await log.close()


async def test_follow_begun_while_the_server_is_away_waits_for_it(
    embedded_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A service starts following the log once its first cycle is done: if NATS is killed just
    # then, its consumer cannot be made until the server is back. The reader waits for it, as a
    # reader already running does, rather than end the service over one unanswered request.
    caplog.set_level(logging.WARNING, logger="corral.log")
    log = await JetStreamLog.connect(embedded_server.url, heartbeat=0.2, create=True)
    try:
        await fill(log, 1)
        await embedded_server.kill()
        async with closing(log.follow()) as it:
            first = asyncio.ensure_future(anext(it))
            # Its first try goes unanswered (the JetStream API's timeout): it says so and waits.
            await polling.until(lambda: first.done() or "waits for NATS" in caplog.text, 4 * WAIT)
            assert not first.done(), first.exception()
            await embedded_server.start()
            assert [r.seq for r in await asyncio.wait_for(first, 4 * WAIT)] == [1]
            await asyncio.wait_for(log.append(ev()), WAIT)
            assert [r.seq for r in await asyncio.wait_for(anext(it), WAIT)] == [2]
    finally:
        await log.close()


async def test_append_to_a_stopped_server_is_a_log_error(embedded_server: EmbeddedServer) -> None:
    log = await JetStreamLog.connect(
        embedded_server.url, ack_timeout=0.3, reconnect_time_wait=0.1, create=True
    )
    try:
        # Stored while the server runs, however long a loaded machine takes to acknowledge it:
        # the short ack timeout is for the append to the stopped server, which no answer ends.
        async def stored() -> bool:
            with contextlib.suppress(UnacknowledgedError):
                await log.append(ev(msg_id="before-the-stop"))
                return True
            return False

        await polling.until_answered(stored, WAIT)
        await embedded_server.stop()
        with pytest.raises(LogError) as caught:
            await asyncio.wait_for(log.append(ev()), WAIT)
        assert not isinstance(caught.value, UnstorableError)  # for now: sent again later, stored
        # Sent (kept by the client while it reconnects), not acknowledged: perhaps stored.
        assert isinstance(caught.value, UnacknowledgedError), caught.value
        results = await asyncio.wait_for(log.append_many([ev(), ev()]), WAIT)
        assert all(isinstance(r, LogError) for r in results)
    finally:
        await log.close()


async def test_oversized_append_is_a_log_error(nats_server: str) -> None:
    """Larger than the stream's messages (the server's refusal) or than the connection carries
    (the client's): refused for what it is, for good (``UnstorableError``)."""
    log = await JetStreamLog.connect(nats_server, max_msg_size=1024, create=True)
    try:
        for data in (b"x" * 2048, b"x" * (log.nc.max_payload + 1)):
            with pytest.raises(UnstorableError):
                await log.append(ev(data=data))
        results = await log.append_many([ev(), ev(data=b"x" * 2048), ev()])
        assert results[0] == Ack(1)
        assert isinstance(results[1], UnstorableError)
        assert results[2] == Ack(2)
    finally:
        await log.close()


async def test_append_outside_the_stream_is_a_log_error(nats_server: str) -> None:
    log = await JetStreamLog.connect(nats_server, ack_timeout=5.0, create=True)
    try:
        with pytest.raises(LogError):
            await log.append(ev("elsewhere.entirely"))
    finally:
        await log.close()


async def test_connect_to_nothing_is_a_log_error(unused_tcp_port: int) -> None:
    with pytest.raises(LogError):
        await JetStreamLog.connect(
            f"nats://127.0.0.1:{unused_tcp_port}",
            connect_timeout=1,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.05,
        )


async def test_follow_ends_when_the_log_closes(nats_server: str) -> None:
    log = await JetStreamLog.connect(nats_server, create=True)
    await log.append(ev())
    it = log.follow()
    first = await asyncio.wait_for(anext(it), WAIT)
    assert [r.seq for r in first] == [1]
    waiting = asyncio.ensure_future(anext(it))
    await log.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, WAIT)


# -- the protocol fast path -------------------------------------------------------------------------


class _Recorder:
    """Stands in for the connection: takes what the parser hands over."""

    def __init__(self) -> None:
        self._direct: dict[int, object] = {}
        self.got: list[tuple[object, ...]] = []
        self._direct[7] = lambda *a: self.got.append(("direct", *a))

    async def _process_msg(self, sid: int, *a: object) -> None:
        # As events.jetstream.Client does: deliveries of a direct subscription go to its function.
        if sid in self._direct:
            self.got.append(("direct", *a))
        else:
            self.got.append(("msg", sid, *a))

    async def _process_ping(self) -> None:
        self.got.append(("ping",))

    async def _process_pong(self) -> None:
        self.got.append(("pong",))

    async def _process_info(self, info: object) -> None:
        self.got.append(("info", info))


def _msg(subject: bytes, sid: int, reply: bytes, data: bytes, headers: bytes | None = None) -> bytes:
    reply_arg = b" " + reply if reply else b""
    if headers is None:
        return b"MSG %s %d%s %d\r\n%s\r\n" % (subject, sid, reply_arg, len(data), data)
    total = len(headers) + len(data)
    return b"HMSG %s %d%s %d %d\r\n%s%s\r\n" % (subject, sid, reply_arg, len(headers), total, headers, data)


_ACK = b"$JS.ACK.CORRAL.c.1.5.5.1700000000000000000.0"
_FRAMES = [
    _msg(b"corral.ev.job.j1", 7, _ACK, b'{"a":1}', b"NATS/1.0\r\nk: v\r\n\r\n"),
    _msg(b"corral.ev.job.j2", 7, _ACK, b"hi"),
    _msg(b"corral.ev.node.n1", 7, b"", b"x" * 300, b"NATS/1.0\r\ntraceparent: 00-ab-cd-01\r\n\r\n"),
    _msg(b"_INBOX.x", 3, b"", b"hello"),
    _msg(b"_INBOX.y", 3, b"reply.to", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"),
    _msg(b"empty", 7, b"", b""),
    b"PING\r\n",
    b"PONG\r\n",
    b'INFO {"server_id":"s"}\r\n',
]


@settings(max_examples=100, deadline=None)
@given(
    frames=st.lists(st.sampled_from(_FRAMES), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=1500), max_size=8),
)
async def test_fast_parser_agrees_with_the_stock_one(frames: list[bytes], cuts: list[int]) -> None:
    """Whatever the chunking, the fast path hands over exactly what the stock parser does."""
    from nats.protocol.parser import Parser

    from corral.events.nats_client import _Parser

    wire = b"".join(frames)
    bounds = sorted({0, len(wire), *(c for c in cuts if c < len(wire))})
    chunks = [wire[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    fast, stock = _Recorder(), _Recorder()
    fast_parser, stock_parser = _Parser(fast), Parser(stock)
    for chunk in chunks:
        await fast_parser.parse(chunk)
        await stock_parser.parse(chunk)
    assert fast.got == stock.got
    assert len(fast.got) == len(frames)


async def test_a_fenced_append_beyond_one_batch_is_fenced_batch_by_batch(nats_server: str) -> None:
    """More than the server takes in one atomic batch: each batch is fenced on where the ones
    before it left the fence's subject, so a writer slipping in between stops the rest."""
    log = await JetStreamLog.connect(nats_server, create=True)
    try:
        n = MAX_BATCH + 5
        items = [ev("corral.ev.decision.placer" if i % 100 == 0 else "corral.ev.job.a") for i in range(n)]
        acks = await log.append_fenced(items, Fence("corral.ev.decision.placer", 0))
        assert [a.seq for a in acks] == list(range(1, n + 1))
        assert await log.last_seq() == n
    finally:
        await log.close()


async def test_only_the_one_who_sets_up_configures_the_stream(nats_server: str) -> None:
    """A connection that does not create the stream finds it or fails, and changes nothing:
    a client with defaults of its own must not scale a replicated stream down, or re-limit it."""
    with pytest.raises(LogError, match="no stream"):
        await JetStreamLog.connect(nats_server)
    owner = await JetStreamLog.connect(nats_server, max_msg_size=4096, duplicate_window=60.0, create=True)
    client = await JetStreamLog.connect(nats_server)  # defaults: 1 MiB messages, 120 s window
    try:
        nc = await nats.connect(nats_server)
        try:
            info = await nc.jetstream().stream_info(STREAM)
            assert (info.config.max_msg_size, info.config.duplicate_window) == (4096, 60.0)
            assert info.config.deny_delete and info.config.deny_purge
            # Nothing is removed from the log, whole or piecemeal, by anyone who may append.
            await client.append(ev())
            with pytest.raises(nats.js.errors.Error):
                await nc.jetstream().purge_stream(STREAM)
            with pytest.raises(nats.js.errors.Error):
                await nc.jetstream().delete_msg(STREAM, 1)
            assert (await nc.jetstream().stream_info(STREAM)).state.messages == 1
        finally:
            await nc.close()
    finally:
        await client.close()
        await owner.close()
