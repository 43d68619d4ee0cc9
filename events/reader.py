"""The log's reader: an ordered push consumer of the stream that recreates itself.

The server pushes the stream in order, flow controlled; a gap in delivery, or heartbeats that
stop, make the reader recreate its consumer after the last record it took; a consumer whose
creation goes unanswered (the server away, restarting, or electing) is asked for again, by a
follower for as long as the connection lasts. Deliveries come straight from the protocol parser
(``nats_client.Client.subscribe_direct``), without nats-py's per-message object, queue and task
switch: that machinery costs more than the rest of a replay. The stream sequence and timestamp
come from the delivery's reply subject. Headers the server adds or consumes (``Nats-*``) are not
part of a record; only the writer's own headers are.

``JetStreamLog.read`` and ``follow`` take records from a ``Consumer`` in whole batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.client import JetStreamContext

from corral.events.log import LogError, Record
from corral.events.nats_client import Client

HEARTBEAT = 2.0  # seconds between a consumer's idle heartbeats; two missed ones reset it
RETRY = 0.5  # seconds between tries to re-create a consumer: a cluster's election ends any moment

log = logging.getLogger("corral.log")

# What a JetStream API request meets while its server is away (restarting, the connection
# reconnecting) or its cluster elects a leader: no answer yet, which is not a refusal.
UNANSWERED: tuple[type[Exception], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
)


class Stall(NamedTuple):
    """A reader that cannot read on: since when (the wall clock) and why, in an operator's words."""

    since: float
    why: str


def why_unread(error: BaseException | None) -> str:
    """Why a consumer could not be made again, as an operator reads it. No answer from JetStream
    is what a cluster without a majority gives (no meta leader, so no stream leader either) and
    what a cluster electing gives for a few seconds: it is not told apart from an election."""
    if error is None:
        return "the stream stopped sending (its server or leader is gone)"
    if isinstance(error, UNANSWERED):
        return "no stream leader: JetStream does not answer"
    if isinstance(error, nats.errors.ConnectionClosedError | nats.errors.ConnectionReconnectingError):
        return "no NATS server answers"
    return f"NATS refuses to read: {str(error) or type(error).__name__}"


CONTROL = b"NATS/1.0 100"  # status line of flow control requests and idle heartbeats
CRLF = b"\r\n"


HEAD = b"NATS/1.0\r\n"
TRACE_LINE = HEAD + b"traceparent:"  # a record of a job's: its trace context first, as written
MSG_ID_LINE = HEAD + b"Nats-Msg-Id:"  # a record of no job's: the stream's message id alone
MSG_ID = b"Nats-Msg-Id:"


def _headers(raw: bytes) -> dict[str, str] | None:
    """The writer's headers from a raw ``NATS/1.0`` header block; the server's own are dropped."""
    # The blocks the writers store (events/jetstream.py puts the message id after the writer's
    # own headers): the trace context, the message id, or the one then the other. Read without
    # splitting the block into lines; anything else line by line.
    # Both first lines are 22 bytes long; ``last`` is where a whole block's last line ends (the
    # blank line follows).
    last = len(raw) - 4
    if raw.endswith(CRLF):
        if raw.startswith(TRACE_LINE):
            end = raw.find(CRLF, 22)
            if end == last or (raw.startswith(MSG_ID, end + 2) and raw.find(CRLF, end + 2) == last):
                return {"traceparent": raw[22:end].strip().decode(errors="replace")}
        elif raw.startswith(MSG_ID_LINE) and raw.find(CRLF, 22) == last:
            return None
    return _general(raw)


def _general(raw: bytes) -> dict[str, str] | None:
    """``_headers`` line by line: any block."""
    out: dict[str, str] | None = None
    for line in raw.split(CRLF)[1:]:
        if not line or line.startswith(b"Nats-"):
            continue
        key, _, value = line.partition(b":")
        if out is None:
            out = {}
        out[key.strip().decode(errors="replace")] = value.strip().decode(errors="replace")
    return out


class Consumer:
    """One ordered push consumer from ``start``, gathering records into a list that the reader
    swaps out whole. It recreates itself (after the last record taken) on a delivery gap, a
    heartbeat that reports deliveries we never saw, or two missed heartbeats."""

    def __init__(
        self, nc: Client, js: JetStreamContext, stream: str, start: int, heartbeat: float = HEARTBEAT
    ) -> None:
        self._nc = nc
        self._js = js
        self._stream = stream
        self._heartbeat = heartbeat
        self.records: list[Record] = []
        self.ready = asyncio.Event()
        self.last = start - 1  # newest stream sequence taken in
        self._tail = b""  # the reply subject of the newest delivery taken in: ``pending``
        self.closed = False
        self.failed: LogError | None = None  # why it closed, when not by its reader
        self._dseq = 1  # next delivery sequence expected from the current consumer
        self._sub: Subscription | None = None
        self._name = ""
        self._ack = b"\x00"  # the reply subjects' prefix for this consumer, once it has a name
        self._active = True
        self._resetting = False
        self._tasks: set[asyncio.Task[None]] = set()
        # Set while the consumer is to be made again and is not yet: the records taken are all
        # there is to read until it is, whatever the stream holds.
        self.stalled: Stall | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe_direct(self._nc.new_inbox(), self._on_delivery)
        config = api.ConsumerConfig(
            deliver_subject=self._sub.subject,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last + 1,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=self._heartbeat,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=60.0,  # the server drops it if this client vanishes
        )
        info = await self._js.add_consumer(self._stream, config)
        self._name = info.name
        self._ack = f"$JS.ACK.{self._stream}.{info.name}.".encode()
        self._spawn(self._watch())

    async def begin(self, within: float | None) -> None:
        """``start``, again while the server does not answer, for ``within`` seconds (None: for
        as long as the connection tries to get a server back; when it gives up, the feed is
        failed and this ends). A reader that starts just as its server goes away (a service
        whose first cycle is done when NATS restarts) waits for it, as a reader that was
        already running does; a refusal is raised at once."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        said = False
        while not self.closed:
            try:
                await self.start()
                self.stalled = None
                return
            except UNANSWERED as e:
                self._stall(e)
                await self._drop(wait=False)  # the consumer, if made after all, is dropped once idle
                if deadline is not None and loop.time() >= deadline:
                    raise
                if not said:
                    log.warning(
                        "reading %s waits for NATS to answer: %s", self._stream, str(e) or type(e).__name__
                    )
                    said = True
            except (nats.errors.Error, nats.js.errors.Error):
                if self.closed:
                    return  # closed meanwhile (the log, or its connection given up): its reader ends
                raise
            await asyncio.sleep(min(RETRY, self._heartbeat))

    def _on_delivery(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        try:
            self._take(subject, reply, data, headers)
        except Exception as e:  # noqa: BLE001 - a record no reader may skip in silence
            # The connection drops a delivery its handler raises on; a record of the log so
            # dropped would be folded by no one. The feed ends, loudly, for its service's
            # supervisor, rather than go on past it.
            self.fail(LogError(f"a delivery of {self._stream} could not be read: {type(e).__name__}: {e}"))

    def _take(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if headers is not None and headers.startswith(CONTROL):
            self._control(reply, headers)
            return
        self._active = True
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts_ns>.<pending>, or the form
        # with domain and account hash in front and a random token behind (12 tokens). The first
        # is read from behind this consumer's own prefix: five tokens split, not nine.
        if reply.startswith(self._ack):
            _, s, d, ts, _ = reply[len(self._ack) :].split(b".")
            seq, dseq = int(s), int(d)
        else:
            t = reply.split(b".")
            if len(t) == 9:
                seq, dseq, ts = int(t[5]), int(t[6]), t[7]
            else:
                seq, dseq, ts = int(t[7]), int(t[8]), t[9]
        if dseq != self._dseq:
            self._reset()  # a delivery went missing: start again after the last one taken
            return
        if seq <= self.last:
            self._dseq = dseq + 1
            return
        # Whatever bytes a writer stored, the record is read (the fold refuses what it cannot
        # take): one that raised here was skipped by every reader, as if never written. Made
        # before the positions move on past it.
        record = Record(
            seq,
            subject.decode(errors="replace"),
            data,
            None if headers is None else _headers(headers),
            int(ts) / 1e9,
        )
        self._dseq = dseq + 1
        self.last = seq
        self._tail = reply
        self.records.append(record)
        if len(self.records) == 1:  # the reader is woken once per batch it takes, not per record
            self.ready.set()

    @property
    def pending(self) -> int:
        """Messages the server still had for us after the newest one taken in (-1: none taken
        yet). Read from that delivery's reply subject when asked, not for every delivery."""
        tail = self._tail
        if not tail:
            return -1
        t = tail.split(b".")
        return int(t[8] if len(t) == 9 else t[10])

    def _control(self, reply: bytes, headers: bytes) -> None:
        self._active = True
        if reply:  # a flow control request: everything before it has been taken in
            self._spawn(self._nc.publish(reply.decode()))
            return
        fields = {
            k.strip(): v.strip()
            for k, _, v in (line.partition(b":") for line in headers.split(CRLF)[1:] if line)
        }
        stalled = fields.get(b"Nats-Consumer-Stalled")
        if stalled:
            self._spawn(self._nc.publish(stalled.decode()))
        last = fields.get(b"Nats-Last-Consumer")
        if last is not None and int(last) != self._dseq - 1:
            self._reset()

    def _stall(self, error: BaseException | None) -> None:
        """Mark the consumer stalled (since the first time, why the latest)."""
        since = time.time() if self.stalled is None else self.stalled.since
        self.stalled = Stall(since, why_unread(error))

    def _reset(self) -> None:
        if self._resetting or self.closed:
            return
        self._resetting = True
        self._spawn(self._restart())

    async def _restart(self) -> None:
        try:
            while not self.closed:
                await self._drop(wait=False)
                self._dseq = 1
                try:
                    await self.start()
                    self.stalled = None
                    return
                except (nats.errors.Error, nats.js.errors.Error) as e:
                    # The server is away (restarting, or the connection is reconnecting).
                    self._stall(e)
                    await asyncio.sleep(min(RETRY, self._heartbeat))
        finally:
            self._resetting = False

    async def _watch(self) -> None:
        sub = self._sub
        while not self.closed and sub is self._sub:
            # The server sends something at least every heartbeat; two silent periods mean the
            # consumer is gone (a server restart loses it: it lives in memory).
            await asyncio.sleep(2 * self._heartbeat)
            if not self._active and sub is self._sub:
                self._stall(None)
                self._reset()
                return
            self._active = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drop(self, wait: bool = True) -> None:
        """Unsubscribe and delete the consumer. ``wait=False`` (a reset) does not wait for the
        deletion: the consumer's server may be the one lost, and its deletion would go
        unanswered for the API's whole timeout while the new consumer could already be reading
        (a consumer left behind is dropped by its server once inactive)."""
        sub, name, self._sub = self._sub, self._name, None
        if sub is not None:
            await self._nc.unsubscribe_direct(sub)
        if name and not self._nc.is_closed:
            if wait:
                await self._delete(name)
            else:
                self._spawn(self._delete(name))

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self._js.delete_consumer(self._stream, name)

    def take(self) -> list[Record]:
        batch, self.records = self.records, []
        self.ready.clear()
        return batch

    def fail(self, error: LogError) -> None:
        """End the feed with ``error``: its reader raises it once it has taken what came."""
        if not self.closed:
            self.failed = error
        self.close()

    def close(self) -> None:
        self.closed = True
        self.ready.set()
        for task in list(self._tasks):
            task.cancel()

    async def stop(self) -> None:
        self.close()
        await self._drop()
