"""A nats-py client whose own subscriptions take deliveries straight from the protocol parser.

nats-py builds a message object, queues it and switches tasks for every delivery; for a replay of
the log that machinery costs more than folding the records. ``Client`` lets ``JetStreamLog``
register a callback per subscription that gets (subject, reply, data, headers) as bytes from
the parser itself. It reaches into nats-py's private parser and ``_process_msg``; a test checks it
hands over exactly what the stock parser does, so an upgrade that changes them fails there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, Parser

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
                    handler(subject, reply, payload, headers)
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

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            # nats-py annotates headers as bytes; its parser passes None for a message without.
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        else:
            handler(subject, reply, data, headers)

    async def subscribe_direct(self, subject: str, handler: Delivery) -> Subscription:
        sub = await self.subscribe(subject)
        self._direct[sub._id] = handler
        return sub

    async def unsubscribe_direct(self, sub: Subscription) -> None:
        self._direct.pop(sub._id, None)
        if not self.is_closed:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
