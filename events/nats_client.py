"""A nats-py client whose own subscriptions take deliveries straight from the protocol parser.

nats-py builds a message object, queues it and switches tasks for every delivery; for a replay of
the log that machinery costs more than folding the records. ``Client`` lets ``JetStreamLog``
register a callback per subscription that gets (subject, reply, data, headers) as bytes from
the parser itself.

``open_client`` is how every long-lived part of corral connects: to a list of servers (a NATS
cluster's; it fails over between them and learns the others from the servers themselves),
reconnecting for a bounded time (``RECONNECT_FOR``) when it loses them. A connection that gives
up is closed for good, and its client's ``lost`` event is set: whatever runs on it must end
(non-zero, for its supervisor to start it again), never wait on a connection that will not
come back. It reaches into nats-py's private parser and ``_process_msg``; a test checks it
hands over exactly what the stock parser does, so an upgrade that changes them fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, Parser

log = logging.getLogger("corral.nats")

# How long a connection that lost its servers tries to get one back before it gives up, and
# how long it waits before trying the same server again: a nats-server restarting, or a cluster
# electing leaders, is back within seconds; a minute of nothing is an outage, for a supervisor.
RECONNECT_FOR = 60.0
RECONNECT_WAIT = 0.5
# How soon a server that stopped answering (a paused VM, a host cut off, a process stopped) is
# given up for another: a ping every PING_INTERVAL, and the connection is stale once that many
# go unanswered. nats-py's defaults (two minutes, two pings) kept every service on a frozen
# server of a cluster of three for minutes: the log took appends through the other two, and
# nothing was placed.
PING_INTERVAL = 5
MAX_OUTSTANDING_PINGS = 3


def servers(url: str | Sequence[str]) -> list[str]:
    """Server URLs from ``--server``'s form, comma separated (``nats://a:4222,nats://b:4222``),
    or a list, as nats-py takes them."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    return [p.strip() for p in parts if p.strip()]


def reconnecting(reconnect_for: float = RECONNECT_FOR) -> dict[str, Any]:
    """nats-py connect options that reconnect (to any server of the list) for ``reconnect_for``
    seconds, then give up. Attempts count per server, each server tried again at most every
    ``RECONNECT_WAIT``, so the list as a whole is tried for about that long; a server that
    answers no ping for ``PING_INTERVAL`` times ``MAX_OUTSTANDING_PINGS`` seconds is left."""
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": max(1, round(reconnect_for / RECONNECT_WAIT)),
        "reconnect_time_wait": RECONNECT_WAIT,
        "connect_timeout": 2,
        "ping_interval": PING_INTERVAL,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
    }


# How often a connection says it dropped messages it could not read.
UNREADABLE_EVERY_S = 60.0

# (subject, reply, data, headers) of one delivery, straight from the protocol parser.
Delivery = Callable[[bytes, bytes, bytes, "bytes | None"], None]


class _Parser(Parser):
    """nats-py's protocol parser with a fast path for messages: it walks the buffer by offset
    (the stock parser matches regular expressions per message and shifts the buffer after each)
    and hands deliveries of direct subscriptions to their function without a coroutine. Any
    other operation (PING, INFO, -ERR, ...) and the rest of its chunk go to the stock parser,
    which shares this one's state."""

    nc: Client

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        if self.state == AWAITING_MSG_PAYLOAD and len(buf) < self.needed + 2:
            return  # a large payload still coming: copy nothing until it is all here
        # One copy of the buffer per chunk read: a slice of it is the bytes handed over, where a
        # slice of the bytearray would be copied a second time to become bytes.
        raw = bytes(buf)
        size = len(raw)
        direct = self.nc._direct
        pos = 0
        try:
            while True:
                if self.state == AWAITING_MSG_PAYLOAD:  # a message whose payload was still coming
                    arg = self.msg_arg
                    subject, sid, reply = arg["subject"], arg["sid"], arg["reply"]
                    hn, needed = self.header_needed, self.needed
                else:
                    end = raw.find(b"\r\n", pos)
                    if end < 0:
                        return
                    if raw.startswith(b"HMSG ", pos):  # HMSG subject sid [reply] header-size total-size
                        args = raw[pos:end].split()
                        hn, needed = int(args[-2]), int(args[-1])
                        reply = args[3] if len(args) == 6 else b""
                    elif raw.startswith(b"MSG ", pos):  # MSG subject sid [reply] size
                        args = raw[pos:end].split()
                        hn, needed = 0, int(args[-1])
                        reply = args[3] if len(args) == 5 else b""
                    else:
                        del buf[:pos]
                        pos = 0
                        await super().parse()
                        return
                    subject, sid = args[1], int(args[2])
                    pos = end + 2
                if size - pos < needed + 2:
                    self.msg_arg = {"subject": subject, "sid": sid, "reply": reply}
                    self.header_needed, self.needed = hn, needed
                    self.state = AWAITING_MSG_PAYLOAD
                    return
                headers = raw[pos : pos + hn] if hn else None
                payload = raw[pos + hn : pos + needed]
                pos += needed + 2
                self.state = AWAITING_CONTROL_LINE
                self.header_needed = 0
                handler = direct.get(sid)
                if handler is not None:
                    try:
                        handler(subject, reply, payload, headers)
                    except Exception as e:  # noqa: BLE001 - one message, not the connection
                        self.nc.unreadable(subject, e)
                    continue
                await self.nc._process_msg(sid, subject, reply, payload, headers)
                if self.buf is not buf:
                    return  # the connection was reset meanwhile: what is left here is stale
        finally:
            if pos and self.buf is buf:
                del buf[:pos]


class Client(NATS):
    """nats-py's client, able to hand a subscription's deliveries straight to a function.

    Everything else (connection, reconnection, requests, other subscriptions, JetStream and KV
    APIs) is nats-py's own, so a service can share this connection for all its NATS traffic.
    """

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, Delivery] = {}
        self._ps = _Parser(self)
        self.lost = asyncio.Event()  # closed without ``close`` being called: it gave up
        self._closing = False
        self.unreadable_total = 0  # deliveries dropped as unreadable (``unreadable``)
        self._unreadable_said = -UNREADABLE_EVERY_S

    async def close(self) -> None:
        # nats-py closes a connection that gave up reconnecting with ``close`` too, from its own
        # reconnecting task: that close is not ours.
        if asyncio.current_task() is not self._reconnection_task:
            self._closing = True
        await super().close()

    async def _closed(self) -> None:
        if not self._closing:
            self.lost.set()

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        # Whoever may publish to a subscribed subject writes the headers: a block nats-py cannot
        # read (``NATS/1.0`` and no line end, a status line not in UTF-8) raised out of its read
        # loop, which ended, and the connection heard nothing more until its pings went stale.
        # Such a message is dropped, and said; the connection reads on.
        try:
            handler = self._direct.get(sid)
            if handler is None:
                # nats-py annotates headers as bytes; its parser passes None for a message without.
                await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
            else:
                handler(subject, reply, data, headers)
        except Exception as e:  # noqa: BLE001 - one message, not the connection
            self.unreadable(subject, e)

    def unreadable(self, subject: bytes, e: Exception) -> None:
        """A delivery on ``subject`` could not be read (``e``): dropped and counted, said at most
        once every ``UNREADABLE_EVERY_S`` (a client sending such messages in a loop would
        otherwise fill the log)."""
        self.unreadable_total += 1
        now = time.monotonic()
        if now - self._unreadable_said >= UNREADABLE_EVERY_S:
            self._unreadable_said = now
            log.warning(
                "nats: dropped a message on %s it could not read (%s: %s); %d so far",
                subject[:128].decode(errors="replace"),
                type(e).__name__,
                e,
                self.unreadable_total,
            )

    async def subscribe_direct(self, subject: str, handler: Delivery) -> Subscription:
        sub = await self.subscribe(subject)
        self._direct[sub._id] = handler
        return sub

    async def unsubscribe_direct(self, sub: Subscription) -> None:
        self._direct.pop(sub._id, None)
        if not self.is_closed:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


async def _one_line(e: Exception) -> None:
    # nats-py's own logs each failed attempt with its traceback: while a server restarts, that
    # is a screenful a second of the same refused connection.
    log.warning("nats: %s: %s", type(e).__name__, e)


async def open_client(url: str | Sequence[str], **options: Any) -> Client:
    """A ``Client`` connected to ``url`` (one server or several, comma separated), reconnecting
    as ``reconnecting()`` says unless ``options`` say otherwise; ``options`` go to nats-py's
    connect (credentials, inbox prefix, name)."""
    nc = Client()
    given = options.pop("closed_cb", None)

    async def closed() -> None:
        await nc._closed()
        if given is not None:
            await given()

    try:
        await nc.connect(
            servers(url), closed_cb=closed, **{**reconnecting(), "error_cb": _one_line, **options}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await nc.close()
        raise
    return nc


# Copies of the log and the buckets on a JetStream cluster of this many servers or more (unless
# the operator says otherwise): any one server may be lost, and each append waits for two
# acknowledgements of three, not for every server of a bigger cluster.
CLUSTER_REPLICAS = 3


async def heard(nc: Any, what: str) -> bool:
    """Wait until the server has every command ``nc`` sent so far (its subscriptions): a part
    says it is ready only then, for a request sent from elsewhere meanwhile found nobody to
    answer it. ``flush`` alone does not do: nats-py writes its PING straight to the socket, ahead
    of the commands still in the connection's buffer, so its PONG may come before they are
    sent. They are written first (``_flush_pending``, forced), then the PING follows them. On
    a cluster, the other servers learn of a subscription over their routes later still.

    False, said, where the server did not confirm in time (slow, or gone a while): it has the
    subscriptions once it answers again (a reconnection sends them anew), and ``what`` (the
    part waiting) goes on as ready rather than end, or wait, for a confirmation."""
    try:
        await nc._flush_pending(force_flush=True)
        await nc.flush()
    except nats.errors.Error as e:
        log.warning("%s: the server has not confirmed its subscriptions: %s", what, e)
        return False
    return True


def servers_in_cluster(nc: Client) -> int:
    """How many servers the one ``nc`` is connected to says its cluster has: its INFO names the
    cluster and lists every member's client URL (``connect_urls``, gossiped along the routes,
    updated as servers join). A server without a cluster is one; so is a cluster configured
    with ``no_advertise``, which lists nobody."""
    info = nc._server_info  # the latest INFO; nats-py keeps it private but up to date
    if not info.get("cluster"):
        return 1
    return max(1, len(set(info.get("connect_urls") or ())))


def default_replicas(nc: Client) -> int:
    """The log's and the buckets' replicas when nobody says: three on a cluster of three or
    more servers, else one."""
    return CLUSTER_REPLICAS if servers_in_cluster(nc) >= CLUSTER_REPLICAS else 1


async def answers(url: str | Sequence[str], within: float) -> bool:
    """Whether any server of ``url`` greets a TCP connection with its INFO line within ``within``
    seconds, tried in turn until then. Plain asyncio, so a caller that is cancelled (Ctrl-C) stops
    at once; a cancelled nats-py connect may carry on through its retries."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        for one in servers(url):
            parsed = urlsplit(one if "://" in one else f"nats://{one}")
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(min(left, 2.0)):
                    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port or 4222)
                    try:
                        if (await reader.readline()).startswith(b"INFO "):
                            return True
                    finally:
                        writer.close()
            except (TimeoutError, OSError, ValueError):
                pass
        await asyncio.sleep(min(RECONNECT_WAIT, max(0.0, deadline - loop.time())))
