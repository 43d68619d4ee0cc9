"""``JetStreamLog``: the ``EventLog`` on the NATS JetStream stream ``CORRAL``.

Appends are JetStream publishes whose acknowledgements come back on one reply subscription of
this client; many may be in flight at once, and ``append_many`` keeps a window of them on the
wire while it gathers the acknowledgements of the window before. ``Append.msg_id`` travels as
``Nats-Msg-Id`` (the stream stores a repeat once and acknowledges it with the original sequence)
and ``expected_last_subject_seq`` as ``Nats-Expected-Last-Subject-Sequence`` (the stream refuses
the append when another writer got there first: a ``ConflictError``). Acknowledgements are
handed straight from the protocol parser to the log, as deliveries to its readers are.

Reads use the ordered push consumers of ``events/reader.py``, which recreate themselves after
the last record taken when a delivery goes missing or the server goes quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.client import JetStreamContext

from corral.events.log import (
    Ack,
    Append,
    ConflictError,
    Fence,
    LogError,
    Record,
    UnacknowledgedError,
    UnstorableError,
)
from corral.events.nats_client import Client, default_replicas, open_client
from corral.events.reader import CRLF, HEARTBEAT, UNANSWERED, Consumer, Stall, why_unread
from corral.events.subjects import STREAM, STREAM_SUBJECTS

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"  # the subject that check is on
# Atomic batch publish (nats-server 2.12 and later, on a stream that allows it): messages of one
# batch id are stored together at its commit, or not at all.
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
MAX_BATCH = 1000  # the server's limit on the messages of one atomic batch
# JetStream API errors: the expected last (subject) sequence is stale, with the sequence found
# (10071) or without it (10164, when another append to the subject is still in flight).
WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
# JetStream API error: an atomic batch holds a message id the stream has stored: the same
# decisions were appended already (by this writer, its acknowledgement lost, or by another
# replica deciding the same cycle), so the batch's fence is stale too. Checked before the fence.
BATCH_DUPLICATE = 10201
# An append larger than a message may be: the server's (JetStream API error 10054, the stream's
# maximum message size) or the connection's (the client's max payload, as 413 here).
TOO_LARGE, TOO_LARGE_FOR_STREAM = 413, 10054
UNACKNOWLEDGED = 408  # ours, not the server's: no acknowledgement came in time (``_timed_out``)
# JetStream API error (409): a message of this id is being stored, not stored yet (a clustered
# stream's proposal not yet applied). Sent again once an acknowledgement did not come, the same
# message finds its first copy in flight: that one may still be stored, as the first may.
IN_PROCESS = 10158
STREAM_NAME_IN_USE = 10058  # JetStream API error: the stream exists with another configuration
NO_PEERS = 10005  # JetStream API error: not enough servers of the cluster known and current yet
# JetStream API error: the server could not make the stream's store; so it answers a creation
# while the files of a stream of the same name, just deleted, are still being removed.
STORE_FAILED = 10049
PLACING_WITHIN = 30.0  # seconds a cluster just started (or electing) gets to place a stream
MIB = 1024 * 1024
# Seconds an append waits for its acknowledgement. An append sent to a stream leader that just
# died is never answered, and a service's cycle waits this long before it decides again on the
# new leader: a few seconds, well above a loaded machine's time to store a batch, and below
# the several seconds a cluster takes to elect one (bench/nats_loss.py).
ACK_TIMEOUT = 5.0
# Seconds a read of the log waits for the server to answer (an election, a server coming back)
# before it says it cannot read: a command run while the stream has no leader ends with that.
READ_IDLE_TIMEOUT = 30.0
# Seconds between a follower's looks at whether the stream has a leader (``watch_leader``).
LEADER_CHECK_S = 2.0

T = TypeVar("T")

log = logging.getLogger("corral.log")


class StreamStatus(msgspec.Struct, frozen=True):
    messages: int
    first_seq: int
    last_seq: int
    bytes: int


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0  # an atomic batch's commit: how many messages it stored
    error: _ApiError | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


class JetStreamLog:
    """An ``EventLog`` on a JetStream stream. Build one with ``await JetStreamLog.connect(url)``."""

    def __init__(
        self,
        nc: Client,
        *,
        stream: str = STREAM,
        ack_timeout: float = ACK_TIMEOUT,
        window: int = 2_000,
        batch: int = 10_000,
        read_idle_timeout: float | None = None,
        heartbeat: float = HEARTBEAT,
        owns_connection: bool = True,
    ) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self.replicas: int | None = None  # the stream's, once this connection has made it
        self._ack_timeout = ack_timeout
        self._window = window
        self._batch = batch
        self._read_idle_timeout = READ_IDLE_TIMEOUT if read_idle_timeout is None else read_idle_timeout
        self._heartbeat = heartbeat
        self._owns = owns_connection
        self._inbox = ""
        self._ack_sub: Subscription | None = None
        self._waiting: dict[bytes, asyncio.Future[_PubAck]] = {}
        self._tokens = itertools.count(1)
        self._consumers: set[Consumer] = set()
        self._lost_watch: asyncio.Future[None] | None = None
        self._leaderless: Stall | None = None  # what ``watch_leader`` last found, since when

    @property
    def nc(self) -> Client:
        """The connection, for a service's other NATS traffic (heartbeats, leases)."""
        return self._nc

    @classmethod
    async def connect(
        cls,
        url: str | list[str],
        *,
        stream: str = STREAM,
        create: bool = False,
        replicas: int | None = None,
        duplicate_window: float = 120.0,
        max_msg_size: int = MIB,
        ack_timeout: float = ACK_TIMEOUT,
        batch: int = 10_000,
        heartbeat: float = HEARTBEAT,
        name: str | None = None,
        **options: Any,
    ) -> JetStreamLog:
        """Connect and return the log on the stream. The stream is configured once, by whoever
        sets the corral up (``create``: create it, or bring it to ``replicas``,
        ``duplicate_window`` and ``max_msg_size``; ``replicas`` None: as the servers allow,
        ``nats_client.default_replicas``, then in ``log.replicas``); everyone else only checks
        that it is there, so no client's or service's connection can change the stream (scale it down to one
        replica, say). ``url``: one server or several, comma separated (a cluster's), which the
        connection fails over between. ``options`` go to nats-py's ``connect`` (credentials, TLS,
        reconnects: by default it reconnects for ``nats_client.RECONNECT_FOR``, then gives up
        and ``lost`` is set)."""
        try:
            nc = await open_client(url, name=name, **options)
        except Exception as e:
            raise LogError(f"cannot connect to {url}: {e}") from e
        log = cls(nc, stream=stream, ack_timeout=ack_timeout, batch=batch, heartbeat=heartbeat)
        try:
            if create:
                await log.ensure_stream(
                    replicas=replicas, duplicate_window=duplicate_window, max_msg_size=max_msg_size
                )
            else:
                await log.check_stream()
            log._inbox = nc.new_inbox() + "."
            log._ack_sub = await nc.subscribe_direct(log._inbox + "*", log._on_ack)
        except BaseException:
            await nc.close()
            raise
        return log

    async def check_stream(self) -> None:
        """Raise LogError unless the stream exists. A cluster electing the stream's leader
        answers nothing for a few seconds: asked again meanwhile, for a bounded time."""
        try:
            await answered(lambda: self._js.stream_info(self.stream))
        except nats.js.errors.NotFoundError:
            raise LogError(f"there is no stream {self.stream}: `corral up` creates it") from None
        except (nats.errors.Error, nats.js.errors.Error) as e:
            raise LogError(f"cannot read stream {self.stream}: {e}") from e

    async def ensure_stream(
        self, *, replicas: int | None = None, duplicate_window: float = 120.0, max_msg_size: int = MIB
    ) -> None:
        """Create the stream, or bring an existing one to this configuration. Idempotent.
        ``replicas`` None: three on a JetStream cluster of three servers or more, else one (the
        servers are asked, not the URLs given counted: one URL may lead to a whole cluster)."""
        if replicas is None:
            replicas = default_replicas(self.nc)
        self.replicas = replicas
        config = api.StreamConfig(
            name=self.stream,
            subjects=list(STREAM_SUBJECTS),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=duplicate_window,
            max_msg_size=max_msg_size,
            # The log is the record of every decision: nothing is removed from it, piecemeal or
            # whole, by anyone who may append (only changing this configuration could allow it).
            deny_delete=True,
            deny_purge=True,
            allow_direct=True,
            allow_atomic=True,  # decision cycles are appended as atomic batches
        )
        jsm = self._js
        try:
            await placed(lambda: jsm.add_stream(config))
        except nats.js.errors.BadRequestError as e:
            if e.err_code != STREAM_NAME_IN_USE:
                raise LogError(f"cannot create stream {self.stream}: {e.description}") from e
            try:
                # More replicas need as many current peers, as a creation does.
                await placed(lambda: jsm.update_stream(config))
            except nats.js.errors.Error as e2:
                raise LogError(f"cannot update stream {self.stream}: {e2}") from e2
        except (nats.errors.Error, nats.js.errors.Error) as e:
            raise LogError(f"cannot create stream {self.stream}: {e}") from e
        await replicated(jsm, self.stream, replicas)

    # -- appends --------------------------------------------------------------------------------

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        fut = self._waiting.pop(subject[subject.rfind(b".") + 1 :], None)
        if fut is None or fut.done():
            return  # answered after its writer gave up waiting
        if not data:  # a status only: 503 when no stream listens on the subject
            status = headers.split(CRLF, 1)[0].decode(errors="replace") if headers else ""
            fut.set_result(_PubAck(error=_ApiError(503, 0, f"no stream answered ({status})")))
            return
        try:
            fut.set_result(_decode_ack(data))
        except msgspec.DecodeError:
            fut.set_result(_PubAck(error=_ApiError(0, 0, f"unreadable acknowledgement {data!r}")))

    async def _send(self, item: Append) -> asyncio.Future[_PubAck]:
        """Publish one append; the future resolves with the server's acknowledgement."""
        headers = item.headers
        if item.msg_id is not None or item.expected_last_subject_seq is not None:
            headers = dict(headers) if headers else {}
            if item.msg_id is not None:
                headers[MSG_ID] = item.msg_id
            if item.expected_last_subject_seq is not None:
                headers[EXPECTED_LAST_SUBJECT_SEQ] = str(item.expected_last_subject_seq)
        token = str(next(self._tokens))
        fut: asyncio.Future[_PubAck] = asyncio.get_running_loop().create_future()
        self._waiting[token.encode()] = fut
        try:
            await self._nc.publish(item.subject, item.data, reply=self._inbox + token, headers=headers)
        except Exception as e:
            self._waiting.pop(token.encode(), None)
            code = TOO_LARGE if isinstance(e, nats.errors.MaxPayloadError) else 0
            fut.set_result(_PubAck(error=_ApiError(code, 0, f"{type(e).__name__}: {e}")))
        return fut

    @staticmethod
    def _result(item: Append, ack: _PubAck) -> Ack | LogError:
        err = ack.error
        if err is None:
            return Ack(ack.seq, ack.duplicate)
        if err.err_code in WRONG_LAST_SEQUENCE:
            assert item.expected_last_subject_seq is not None
            return ConflictError(item.subject, item.expected_last_subject_seq, _actual(err.description))
        said = f"{err.description} ({err.err_code or err.code})"
        if (err.code == UNACKNOWLEDGED and not err.err_code) or err.err_code == IN_PROCESS:
            return UnacknowledgedError(f"append to {item.subject} not acknowledged: {said}")
        why = f"append to {item.subject} refused: {said}"
        if err.code == TOO_LARGE or err.err_code == TOO_LARGE_FOR_STREAM:
            return UnstorableError(why)
        return LogError(why)

    async def _settle(self, item: Append, result: Ack | LogError) -> Ack | LogError:
        """A conflict with our own earlier copy is a duplicate.

        A standalone server checks the expected subject sequence before the message id, so the
        retry of a conditional append whose acknowledgement was lost comes back as a conflict
        with the very message it repeats. Answer it as the stream answers any other repeat (and
        as a clustered stream does): with the stored copy's sequence, marked duplicate.
        """
        if not (isinstance(result, ConflictError) and item.msg_id and result.actual):
            return result
        try:
            stored = await self._js.get_msg(self.stream, seq=result.actual, direct=True)
        except (nats.errors.Error, nats.js.errors.Error):
            return result
        if stored.subject == item.subject and (stored.headers or {}).get(MSG_ID) == item.msg_id:
            return Ack(result.actual, duplicate=True)
        return result

    def _timed_out(self, fut: asyncio.Future[_PubAck]) -> _PubAck:
        fut.cancel()
        return _PubAck(error=_ApiError(UNACKNOWLEDGED, 0, f"no acknowledgement within {self._ack_timeout}s"))

    async def append(self, item: Append) -> Ack:
        fut = await self._send(item)
        try:
            async with asyncio.timeout(self._ack_timeout):
                ack = await fut
        except TimeoutError:
            ack = self._timed_out(fut)
            self._waiting = {k: f for k, f in self._waiting.items() if not f.done()}
        result = await self._settle(item, self._result(item, ack))
        if isinstance(result, LogError):
            raise result
        return result

    async def append_many(self, items: Sequence[Append]) -> list[Ack | LogError]:
        # Windows of acknowledgements overlap: window k+1 is on the wire before window k is
        # awaited, so the server never waits for us and at most two windows are in flight.
        results: list[Ack | LogError] = []
        previous: list[asyncio.Future[_PubAck]] = []
        start = 0
        for lo in range(0, len(items), self._window):
            current = [await self._send(item) for item in items[lo : lo + self._window]]
            results += await self._collect(items, start, previous)
            start, previous = lo, current
        results += await self._collect(items, start, previous)
        for i, r in enumerate(results):
            if isinstance(r, ConflictError):
                results[i] = await self._settle(items[i], r)
        return results

    async def append_fenced(self, items: Sequence[Append], fence: Fence) -> list[Ack]:
        """As atomic batches of at most ``MAX_BATCH``, each conditional on the fence's subject
        not having moved: the first on ``fence``, each later one on where the batches before it
        left that subject (known from their acknowledgements, since a batch's messages take
        consecutive sequences). A batch refused leaves the ones after it unsent."""
        acks: list[Ack] = []
        last = fence.last_seq
        for lo in range(0, len(items), MAX_BATCH):
            chunk = items[lo : lo + MAX_BATCH]
            stored = await self._append_batch(chunk, Fence(fence.subject, last))
            acks += stored
            on_fence = [a.seq for a, item in zip(stored, chunk, strict=True) if item.subject == fence.subject]
            last = max([last, *on_fence])
        return acks

    async def _append_batch(self, items: Sequence[Append], fence: Fence) -> list[Ack]:
        batch_id = f"{next(self._tokens)}.{id(self):x}.{len(items)}"
        n = len(items)
        for i, item in enumerate(items, 1):
            headers = dict(item.headers) if item.headers else {}
            headers[BATCH_ID] = batch_id
            headers[BATCH_SEQUENCE] = str(i)
            if item.msg_id is not None:
                headers[MSG_ID] = item.msg_id
            if i == 1:
                headers[EXPECTED_LAST_SUBJECT_SEQ] = str(fence.last_seq)
                headers[EXPECTED_SUBJECT] = fence.subject
            if i < n:  # only the commit is answered
                try:
                    await self._nc.publish(item.subject, item.data, headers=headers)
                except Exception as e:
                    raise LogError(f"append to {item.subject} failed: {type(e).__name__}: {e}") from e
        headers[BATCH_COMMIT] = "1"
        last = items[-1]
        fut = await self._send(Append(last.subject, last.data, headers=headers))
        try:
            async with asyncio.timeout(self._ack_timeout):
                ack = await fut
        except TimeoutError:
            ack = self._timed_out(fut)
            self._waiting = {k: f for k, f in self._waiting.items() if not f.done()}
        err = ack.error
        if err is not None:
            if err.err_code in WRONG_LAST_SEQUENCE:
                raise ConflictError(fence.subject, fence.last_seq, _actual(err.description))
            if err.err_code == BATCH_DUPLICATE:  # a race lost: fold and decide again
                raise ConflictError(fence.subject, fence.last_seq, None)
            raise LogError(f"batch of {n} refused: {err.description} ({err.err_code or err.code})")
        if ack.count != n:
            raise LogError(f"batch of {n} stored {ack.count} messages at {ack.seq}")
        first = ack.seq - n + 1  # a batch's messages take consecutive sequences
        return [Ack(first + i) for i in range(n)]

    async def _collect(
        self, items: Sequence[Append], start: int, futs: list[asyncio.Future[_PubAck]]
    ) -> list[Ack | LogError]:
        if not futs:
            return []
        _, late = await asyncio.wait(futs, timeout=self._ack_timeout)
        results = [
            self._result(items[start + i], f.result() if f.done() else self._timed_out(f))
            for i, f in enumerate(futs)
        ]
        if late:  # forget them: an acknowledgement that still comes finds nobody waiting
            self._waiting = {k: f for k, f in self._waiting.items() if not f.done()}
        return results

    # -- reads ----------------------------------------------------------------------------------

    async def info(self) -> StreamStatus:
        """The stream's state as its leader knows it. A replica without a leader answers with
        what it holds, which may lag (an append is acknowledged once a majority stored it): a
        command reading the log on it read none of the newest records and said it had read them
        all. So while the stream has no leader (an election) it is asked again, for as long as
        a read waits for the server (``READ_IDLE_TIMEOUT``), then refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._read_idle_timeout
        while True:
            try:
                si = await self._js.stream_info(self.stream)
            except (nats.errors.Error, nats.js.errors.Error) as e:
                raise LogError(f"cannot read stream {self.stream}: {e}") from e
            if not _leaderless(si):
                break
            if loop.time() >= deadline:
                raise LogError(
                    f"stream {self.stream} has no leader (most of its servers cannot be reached) "
                    f"for {self._read_idle_timeout:g}s: its records cannot be read"
                )
            await asyncio.sleep(0.2)
        s = si.state
        return StreamStatus(s.messages, s.first_seq, s.last_seq, s.bytes)

    async def last_seq(self) -> int:
        return (await self.info()).last_seq

    def tail(self) -> int | None:
        """The newest stream sequence this log's readers have heard the server holds, asking it
        nothing: the last record a reader took in plus what the server said it still had for that
        reader (None: no reader has taken one in yet). What a service has not folded of the log."""
        known = [c.last + c.pending for c in self._consumers if c.pending >= 0]
        return max(known, default=None)

    def stalled(self) -> Stall | None:
        """Whether this log's readers cannot read on, asking the server nothing: the longest
        stalled reader's stall (None: every reader reads, as far as it knows). A reader stalls
        once its stream goes silent past two heartbeats, and reads again once its consumer is
        made again: a cluster without a majority of its servers has no stream leader to make it."""
        stalls = [c.stalled for c in self._consumers if c.stalled is not None]
        if self._leaderless is not None:
            stalls.append(self._leaderless)
        return min(stalls, default=None)

    async def watch_leader(self, every: float | None = None) -> None:
        """Look every ``every`` seconds (``LEADER_CHECK_S``) whether the stream has a leader, for
        ``stalled``; until cancelled. A reader's consumer on the one server of three left goes
        on sending heartbeats with nothing to send: the reader alone cannot tell that the
        stream lost its leader, and the log its appends."""
        while True:
            why = None
            try:
                si = await self._js.stream_info(self.stream)
                if _leaderless(si):
                    why = "no stream leader"
            except (nats.errors.Error, nats.js.errors.Error) as e:
                why = why_unread(e)
            if why is None:
                self._leaderless = None
            else:
                since = time.time() if self._leaderless is None else self._leaderless.since
                self._leaderless = Stall(since, why)
            await asyncio.sleep(LEADER_CHECK_S if every is None else every)

    async def identity(self) -> str:
        """Which stream this is: its name and when it was created. A stream deleted and created
        again under the same name is another history, and has another identity."""
        try:
            si = await self._js.stream_info(self.stream)
        except (nats.errors.Error, nats.js.errors.Error) as e:
            raise LogError(f"cannot read stream {self.stream}: {e}") from e
        created = si.created.isoformat() if si.created is not None else "unknown"
        return f"{self.stream}@{created}"

    async def read(self, start: int = 1, stop: int | None = None) -> AsyncIterator[list[Record]]:
        status = await self.info()
        end = status.last_seq if stop is None else min(stop, status.last_seq)
        start = max(start, status.first_seq, 1)
        if start > end:
            return
        async with self._consume(start, self._read_idle_timeout) as feed:
            while True:
                try:
                    async with asyncio.timeout(self._read_idle_timeout):
                        await feed.ready.wait()
                except TimeoutError:
                    raise LogError(
                        f"read of {self.stream} stalled at {feed.last} of {end} for "
                        f"{self._read_idle_timeout}s"
                    ) from None
                done = feed.closed or feed.last >= end or feed.pending == 0
                batch = feed.take()
                if batch and batch[-1].seq > end:
                    batch = [r for r in batch if r.seq <= end]
                for lo in range(0, len(batch), self._batch):
                    yield batch[lo : lo + self._batch]
                if feed.failed is not None and feed.last < end:
                    raise feed.failed
                if done:
                    return

    async def follow(self, start: int = 1) -> AsyncIterator[list[Record]]:
        async with self._consume(max(start, 1), None) as feed:
            while not feed.closed:
                await feed.ready.wait()
                batch = feed.take()
                for lo in range(0, len(batch), self._batch):
                    yield batch[lo : lo + self._batch]
            batch = feed.take()
            if batch:
                yield batch
            if feed.failed is not None:
                raise feed.failed

    @property
    def lost(self) -> asyncio.Event:
        """Set when the connection gave up reconnecting: nothing on it will work again."""
        return self._nc.lost

    async def _watch_lost(self) -> None:
        await self._nc.lost.wait()
        error = LogError(f"lost the connection to NATS for good ({self._nc.last_error or 'no server'})")
        for consumer in list(self._consumers):
            consumer.fail(error)

    @contextlib.asynccontextmanager
    async def _consume(self, start: int, within: float | None) -> AsyncIterator[Consumer]:
        """A consumer from ``start``, made as ``Consumer.begin`` says: ``within`` seconds of
        the server not answering, or (None) as long as the connection lasts."""
        if self._lost_watch is None:
            self._lost_watch = asyncio.ensure_future(self._watch_lost())
        if self._nc.lost.is_set():
            raise LogError("lost the connection to NATS for good")
        consumer = Consumer(self._nc, self._js, self.stream, start, self._heartbeat)
        # Known before it starts, so that a connection given up, or the log closed, ends it.
        self._consumers.add(consumer)
        try:
            try:
                await consumer.begin(within)
            except (nats.errors.Error, nats.js.errors.Error) as e:
                raise LogError(f"cannot read stream {self.stream}: {e}") from e
            yield consumer
        finally:
            self._consumers.discard(consumer)
            await consumer.stop()

    async def close(self) -> None:
        if self._lost_watch is not None:
            self._lost_watch.cancel()
        for consumer in list(self._consumers):
            consumer.close()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_result(_PubAck(error=_ApiError(0, 0, "log closed")))
        self._waiting.clear()
        if self._owns and not self._nc.is_closed:
            # Closing a connection whose server is gone can fail while flushing: it is closed anyway.
            with contextlib.suppress(OSError, nats.errors.Error):
                await self._nc.close()


async def placed(make: Callable[[], Awaitable[T]], within: float = PLACING_WITHIN) -> T:
    """``make()`` (a stream's creation), again while the cluster cannot place it yet: a cluster
    just started has a meta leader before it knows every peer as current, and a stream of three
    replicas needs three; and while a server still removes the store of a stream of that name
    deleted just before; and while nobody answers (a leader elected again under load): the same
    configuration asked twice is created once, so asking again is safe. Bounded: after
    ``within`` seconds the refusal is raised."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await make()
        except UNANSWERED:
            if asyncio.get_running_loop().time() > deadline:
                raise
        except (
            nats.js.errors.BadRequestError,
            nats.js.errors.ServiceUnavailableError,
            nats.js.errors.ServerError,
        ) as e:
            unplaced = isinstance(e, nats.js.errors.ServiceUnavailableError) or e.err_code in (
                NO_PEERS,
                STORE_FAILED,
            )
            if not unplaced or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)


async def replicated(jsm: Any, stream: str, replicas: int, within: float = PLACING_WITHIN) -> None:
    """Wait until ``stream`` has a leader and ``replicas - 1`` current followers: a stream just
    created or brought to more replicas elects its leader and copies itself first, and an append
    meanwhile goes unanswered. Bounded: after ``within`` seconds, a ``LogError`` that says so."""
    if replicas <= 1:
        return
    deadline = asyncio.get_running_loop().time() + within
    while True:
        with contextlib.suppress(*UNANSWERED, nats.js.errors.Error):
            cluster = (await jsm.stream_info(stream)).cluster
            current = [r for r in (cluster.replicas or ()) if r.current] if cluster is not None else []
            if cluster is not None and cluster.leader and len(current) >= replicas - 1:
                return
        if asyncio.get_running_loop().time() > deadline:
            raise LogError(f"stream {stream}: no leader with {replicas - 1} current replicas in {within:g}s")
        await asyncio.sleep(0.2)


async def answered(ask: Callable[[], Awaitable[T]], within: float = PLACING_WITHIN) -> T:
    """``ask()`` (a JetStream API request), again while nobody answers it or JetStream says it is
    unavailable: a cluster electing a leader. Bounded by ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await ask()
        except UNANSWERED:
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)


def _leaderless(si: Any) -> bool:
    """Whether stream info ``si`` says the stream has no leader: a replica of a cluster answers
    with what it holds, which may lag. (A server of its own names itself leader.)"""
    return si.cluster is not None and not si.cluster.leader


async def connect(url: str | list[str], **kwargs: Any) -> JetStreamLog:
    """``JetStreamLog.connect``: connect and make sure the stream exists."""
    return await JetStreamLog.connect(url, **kwargs)


def _actual(description: str) -> int | None:
    """The sequence the server found, from e.g. ``wrong last sequence: 42``."""
    tail = description.rsplit(":", 1)[-1].strip()
    return int(tail) if tail.isdigit() else None
