"""The intake's shell: requests in on ``corral.req.*.*``, node agents' reports in on
``corral.nreq.*``, appends to the log, answers out.

Replicas share the requests (a queue group), each answered once; the intake keeps no state and
folds nothing, so any replica answers any request, and it needs no lease. Appends are batched:
requests judged while a batch is on its way wait for the next, and each batch goes out pipelined
(``append_many``), so the intake keeps pace with many clients at the cost of one round trip per
batch. At most ``MAX_WAITING`` requests wait, and at most ``MAX_WAITING_PER_TENANT`` of one tenant's,
so that a tenant sending without end cannot keep the others' requests out; past either a
request is answered busy at once (503, as JetStream answers when it cannot take a message). A
tenant past its rate (``rate.py``, charged by the request's size from its subject alone, before
its body is decoded: ``decide.addressed``, then ``decide.judge``) is answered 429 with when to
send again. What the stream says (stored at ``seq``, a duplicate, or an error) is the answer; a
request the log could not take is answered with the error, never dropped silently, and one it
did not acknowledge (``UnacknowledgedError``) 504: it may be stored, to be sent again under the
same message id. Node reports take the same path, each node's at its own rate
(``NODE_DEFAULT``, its share of what waits as a tenant's), answered the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from corral.events import nats_client, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.log import Ack, Append, LogError, UnacknowledgedError
from corral.services.intake.decide import Accept, Refuse, Reporter, Sender, addressed, judge, weight
from corral.services.intake.rate import DEFAULT, NODE_DEFAULT, TOKEN_BYTES, Buckets, Rate, cost
from corral.services.runtime import identities, logs

log = logging.getLogger("corral.intake")

ROLE = "intake"
MAX_WAITING = 10_000
MAX_WAITING_PER_TENANT = 1_000
LIMITED_SAID_EVERY_S = 60.0
# The answer when the log did not acknowledge a request in time: stored or not, nobody knows.
MAYBE_STORED = 504

_encode = msgspec.json.Encoder().encode


async def connect(url: str, **options: Any) -> JetStreamLog:
    """The intake's log: its own inbox prefix (where its acknowledgements come), and no stream
    creation: the stream is the administrator's to create."""
    return await JetStreamLog.connect(url, name=ROLE, inbox_prefix=identities.INTAKE_INBOX, **options)


class Intake:
    def __init__(
        self, log_: JetStreamLog, rate: Rate | None = DEFAULT, node_rate: Rate | None = NODE_DEFAULT
    ) -> None:
        """``rate``: how fast each tenant's requests are taken, ``node_rate`` each node's
        reports (None: as fast as they come)."""
        self.log = log_
        self.ready = asyncio.Event()
        self.dropped = 0  # requests with nowhere safe to answer
        self.refused = 0
        self.limited = 0  # requests past their sender's rate
        self.appended = 0
        self._buckets = Buckets(rate) if rate is not None else None
        self._node_buckets = Buckets(node_rate) if node_rate is not None else None
        # Per sender, when the service's log last said it was past its rate.
        self._limited_said: dict[str, float] = {}
        self._waiting: list[tuple[Accept, str]] = []  # judged, to append, with where to answer
        self._waiting_of: dict[str, int] = {}  # per sender, how many of ``_waiting`` are theirs
        self._arrived = asyncio.Event()

    async def _on_request(self, msg: Msg) -> None:
        # Whose it is and its size first, then its sender's rate, and only then its body: a
        # flood past the rate is refused before it costs the decoding of each request.
        sender = addressed(
            msg.subject,
            msg.reply,
            len(msg.data),
            inbox_prefix=identities.INBOXES,
            node_inboxes=identities.AGENT_INBOXES,
        )
        if sender is None:
            self.dropped += 1
            log.debug("dropped a request on %s whose answer would go to %r", msg.subject, msg.reply)
            return
        if isinstance(sender, Sender | Reporter):
            who = sender.who
            buckets = self._node_buckets if isinstance(sender, Reporter) else self._buckets
            if buckets is not None:
                over = self._over_rate(buckets, sender, cost(weight(msg.data, msg.headers)))
                if over is not None:
                    await self._answer(msg.reply, {"error": over})
                    return
            verdict = judge(sender, msg.headers, msg.data)
        else:
            verdict = sender
        if isinstance(verdict, Refuse):
            self.refused += 1
            error = {"code": verdict.code, "description": verdict.description}
            await self._answer(msg.reply, {"error": error})
            return
        mine = self._waiting_of.get(who, 0)
        if len(self._waiting) >= MAX_WAITING or mine >= MAX_WAITING_PER_TENANT:
            why = "the intake is busy" if mine < MAX_WAITING_PER_TENANT else f"{mine} requests of yours wait"
            await self._answer(msg.reply, {"error": {"code": 503, "description": f"{why}: retry"}})
            return
        self._waiting_of[who] = mine + 1
        self._waiting.append((verdict, msg.reply))
        self._arrived.set()

    def _over_rate(self, buckets: Buckets, sender: Sender | Reporter, tokens: int) -> dict[str, Any] | None:
        """None when ``sender`` is within its rate (its request's ``tokens`` taken); else the
        error to answer, with the seconds until it may send again."""
        now = asyncio.get_running_loop().time()
        who = sender.who
        wait = buckets.take(who, now, tokens)
        if wait == 0.0:
            return None
        self.limited += 1
        rate = buckets.rate
        what = "reports" if isinstance(sender, Reporter) else "requests"
        # Said at most once a minute a sender: one kept at its rate has a request taken at each
        # token it gets back, and was said anew after each, thousands of lines a minute.
        if now - self._limited_said.get(who, -math.inf) >= LIMITED_SAID_EVERY_S:
            if len(self._limited_said) >= MAX_WAITING:
                self._limited_said.clear()  # without logins, any name is a tenant
            self._limited_said[who] = now
            whose = f"node {sender.node}" if isinstance(sender, Reporter) else f"tenant {who}"
            log.warning("%s is past %g %s a second (burst %d): refused until it slows",
                        whose, rate.per_s, what, rate.burst)  # fmt: skip
        why = f"more than {rate.per_s:g} {what} a second of yours (burst {rate.burst}"
        if tokens > 1:
            why += f"; a request counts one for each {TOKEN_BYTES} bytes it starts: this one {tokens}"
        why += ")"
        return {"code": 429, "description": f"{why}: retry in {wait:.3f} s", "retry_s": round(wait, 3)}

    async def _appending(self, stop: asyncio.Event) -> None:
        """Append what waits, a batch at a time, and answer each request with its result."""
        while True:
            if not self._waiting:
                if stop.is_set():
                    return
                await self._arrived.wait()
                self._arrived.clear()
                continue
            batch, self._waiting = self._waiting, []
            self._waiting_of.clear()
            items = [Append(a.subject, a.data, msg_id=a.msg_id, headers=a.headers) for a, _ in batch]
            results = await self.log.append_many(items)
            for (accept, reply), result in zip(batch, results, strict=True):
                await self._answer(reply, self._answer_of(accept, result))
            _say_unstored(batch, results)

    def _answer_of(self, accept: Accept, result: Ack | LogError) -> dict[str, Any]:
        if isinstance(result, UnacknowledgedError):
            # It may be stored: said so, not that the log did not take it (a client that then
            # sent it anew under another id, or none, had it stored twice).
            why = "the log did not say whether it stored it"
            how = (
                "send it again with the same message id: the log stores it once"
                if accept.msg_id is not None
                else "it carried no message id, so sent again it may be stored twice: ask the read "
                "service for the verdict after the last position you know first"
            )
            return {"error": {"code": MAYBE_STORED, "description": f"{why} ({result}); {how}"}}
        if isinstance(result, LogError):
            return {"error": {"code": 503, "description": f"the log did not take it: {result}"}}
        self.appended += 1
        answer: dict[str, Any] = {"stream": subjects.STREAM, "seq": result.seq}
        if result.duplicate:
            answer["duplicate"] = True
        return answer

    async def _answer(self, reply: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self.log.nc.publish(reply, _encode(body))

    async def run(self, stop: asyncio.Event) -> None:
        logs.set_role(ROLE)
        sub: Subscription = await self.log.nc.subscribe(
            f"{subjects.REQ}.*.*", queue=ROLE, cb=self._on_request
        )
        node_sub: Subscription = await self.log.nc.subscribe(
            f"{subjects.NREQ}.*", queue=ROLE, cb=self._on_request
        )
        appending = asyncio.create_task(self._appending(stop))
        # Ready once the server has the subscriptions, not once they are in the connection's
        # buffer: a request sent meanwhile from elsewhere found nobody to answer it.
        await nats_client.heard(self.log.nc, ROLE)
        self.ready.set()
        lost = self.log.lost
        try:
            # A connection that gave up reconnecting takes no request again: end, for a
            # supervisor to start the intake anew, rather than stand by deaf.
            either = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            for f in either:
                f.cancel()
            if lost.is_set() and not stop.is_set():
                raise LogError("the intake lost its connection to NATS for good")
        finally:
            for each in (sub, node_sub):
                with contextlib.suppress(nats.errors.Error):
                    await each.unsubscribe()
            self._arrived.set()  # what waits is appended and answered, then the loop ends
            await appending


def _say_unstored(batch: list[tuple[Accept, str]], results: list[Ack | LogError]) -> None:
    """Say in the service's log what of a batch the log did not store: one line for those it
    did not acknowledge and one for those it refused, with how many and the first of them. A
    line a request, a tenant's flood that slowed the log had the intake write thousands of
    lines a second, the operator's log buried under one tenant's requests."""
    late: list[tuple[str, LogError]] = []
    refused: list[tuple[str, LogError]] = []
    for (accept, _), result in zip(batch, results, strict=True):
        if isinstance(result, UnacknowledgedError):
            late.append((accept.subject, result))
        elif isinstance(result, LogError):
            refused.append((accept.subject, result))
    for failed, what in ((late, "not acknowledged"), (refused, "not stored")):
        if failed:
            subject, first = failed[0]
            log.warning("%d of %d requests appended at once %s, the first on %s: %s",
                        len(failed), len(batch), what, subject, first)  # fmt: skip


def serve(
    url: str, rate: Rate | None = DEFAULT, node_rate: Rate | None = NODE_DEFAULT, **options: Any
) -> Callable[[asyncio.Event], Any]:
    """``corral serve intake``: connect, then run until ``stop``; the connection closes after."""

    async def run(stop: asyncio.Event) -> None:
        intake_log = await connect(url, **options)
        try:
            await Intake(intake_log, rate, node_rate).run(stop)
        finally:
            await intake_log.close()

    return run
