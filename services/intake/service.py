"""The intake's shell: requests in on ``corral.req.*.*``, appends to the log, answers out.

Replicas share the requests (a queue group), each answered once; the intake keeps no state and
folds nothing, so any replica answers any request, and it needs no lease. Appends are pipelined:
each request is handled in a task of its own, at most ``MAX_IN_FLIGHT`` at once, so one slow
acknowledgement does not hold up the requests behind it. What the stream says (stored at ``seq``,
a duplicate, or an error) is the answer; a request the log could not take is answered with the
error, never dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from corral.events import subjects
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append, LogError
from corral.services.intake.decide import Accept, Refuse, decide
from corral.services.runtime import identities

log = logging.getLogger("corral.intake")

ROLE = "intake"
MAX_IN_FLIGHT = 512

_encode = msgspec.json.Encoder().encode


async def connect(url: str, **options: Any) -> JetStreamLog:
    """The intake's log: its own inbox prefix (where its acknowledgements come), and no stream
    creation: the stream is the administrator's to create."""
    return await JetStreamLog.connect(url, name=ROLE, inbox_prefix=identities.INTAKE_INBOX, **options)


class Intake:
    def __init__(self, log_: JetStreamLog) -> None:
        self.log = log_
        self.ready = asyncio.Event()
        self.dropped = 0  # requests with nowhere safe to answer
        self.refused = 0
        self.appended = 0
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._tasks: set[asyncio.Task[None]] = set()

    async def _on_request(self, msg: Msg) -> None:
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        verdict = decide(msg.subject, msg.reply, msg.headers, msg.data, inbox_prefix=identities.INBOXES)
        if verdict is None:
            self.dropped += 1
            log.debug("dropped a request on %s whose answer would go to %r", msg.subject, msg.reply)
            return
        if isinstance(verdict, Refuse):
            self.refused += 1
            error = {"code": verdict.code, "description": verdict.description}
            await self._answer(msg.reply, {"error": error})
            return
        await self._answer(msg.reply, await self._append(verdict))

    async def _append(self, accept: Accept) -> dict[str, Any]:
        try:
            item = Append(accept.subject, accept.data, msg_id=accept.msg_id, headers=accept.headers)
            ack = await self.log.append(item)
        except LogError as e:
            log.warning("could not append a request on %s: %s", accept.subject, e)
            return {"error": {"code": 503, "description": f"the log did not take it: {e}"}}
        self.appended += 1
        answer: dict[str, Any] = {"stream": subjects.STREAM, "seq": ack.seq}
        if ack.duplicate:
            answer["duplicate"] = True
        return answer

    async def _answer(self, reply: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self.log.nc.publish(reply, _encode(body))

    async def run(self, stop: asyncio.Event) -> None:
        sub: Subscription = await self.log.nc.subscribe(
            f"{subjects.REQ}.*.*", queue=ROLE, cb=self._on_request
        )
        self.ready.set()
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)


def serve(url: str, **options: Any) -> Callable[[asyncio.Event], Any]:
    """``corral serve intake``: connect, then run until ``stop``; the connection closes after."""

    async def run(stop: asyncio.Event) -> None:
        intake_log = await connect(url, **options)
        try:
            await Intake(intake_log).run(stop)
        finally:
            await intake_log.close()

    return run
