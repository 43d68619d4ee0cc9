"""How a node agent's reports reach the log: as requests to the intake, never into the stream.

An agent sends each report request-reply on ``corral.nreq.<node>``, which only its node's login
may publish on; the intake charges the node's rate, checks the report is one a node agent writes
about that node, and appends it at ``corral.ev.node.<node>`` under the report's message id. The
answer becomes what ``EventLog.append`` gives or raises, so the agent keeps one way of handling
its appends whoever stores them:

- stored (or a duplicate of a stored copy): ``Ack``;
- 429, past the node's rate: ``RetryLater`` with the seconds to wait; nothing was appended;
- 504, or no answer in time: ``UnacknowledgedError``; it may be stored, and sent again under the
  same id it is stored once;
- 400 or 403, refused for what it is: ``UnstorableError``; sent again it would be refused again;
- anything else (503, no intake answering): ``LogError``, to send again later.

Answers come to the node's own inbox, ``_INBOX.agent.<node>.<…>`` (the intake answers nowhere
else), whatever the connection's inbox prefix: agents sharing one connection (``bench/e2e``)
each hear their own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import secrets
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from corral.events import subjects
from corral.events.jetstream import MSG_ID
from corral.events.log import Ack, Append, LogError, RetryLater, UnacknowledgedError, UnstorableError
from corral.events.nats_client import Client

# Seconds a report waits for the intake's answer: the intake waits up to 5 s for the log's
# acknowledgement (``jetstream.ACK_TIMEOUT``) after what waits before it in its batch.
ANSWER_TIMEOUT = 10.0
REFUSED = frozenset({400, 403})


class IntakeReports:
    """A node's reports, appended through the intake (``append``, as ``EventLog``'s)."""

    def __init__(self, nc: Client, node: str, timeout: float = ANSWER_TIMEOUT) -> None:
        self.nc = nc
        self.node = node
        self.subject = subjects.node_intake(node)
        self.timeout = timeout
        self._inbox = f"{subjects.AGENT_INBOXES}.{node}.{secrets.token_hex(8)}."
        self._sub: Subscription | None = None
        self._tokens = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[Msg]] = {}

    async def _answers(self) -> None:
        if self._sub is None:
            self._sub = await self.nc.subscribe(self._inbox + "*", cb=self._on_answer)

    async def _on_answer(self, msg: Msg) -> None:
        fut = self._waiting.pop(msg.subject[len(self._inbox) :], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def append(self, item: Append) -> Ack:
        own = subjects.node(self.node)
        if item.subject != own:  # the intake would refuse it: said here, in the agent's words
            raise UnstorableError(f"{self.node}'s agent appends on {own} only, not {item.subject}")
        headers = dict(item.headers) if item.headers else {}
        if item.msg_id is not None:
            headers[MSG_ID] = item.msg_id
        token = str(next(self._tokens))
        fut: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        try:
            await self._answers()
            await self.nc.publish(self.subject, item.data, reply=self._inbox + token, headers=headers or None)
            async with asyncio.timeout(self.timeout):
                msg = await fut
        except TimeoutError:
            raise UnacknowledgedError(f"the intake did not answer within {self.timeout:g}s") from None
        except nats.errors.MaxPayloadError as e:
            raise UnstorableError(f"report larger than a message may be: {e}") from None
        except nats.errors.Error as e:
            raise LogError(f"report not sent: {type(e).__name__}: {e}") from None
        finally:
            self._waiting.pop(token, None)
        if not msg.data and msg.headers and msg.headers.get("Status") == "503":
            raise LogError(f"no intake answers on {self.subject}")
        return _ack(msg.data)


def _ack(data: bytes) -> Ack:
    """The intake's answer as ``append`` gives it, or the error it raises."""
    try:
        answer: Any = json.loads(data)
    except ValueError:
        raise LogError(f"the intake answered {data[:200]!r}") from None
    if not isinstance(answer, dict):
        raise LogError(f"the intake answered {data[:200]!r}")
    error = answer.get("error")
    if error is None:
        seq = answer.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise LogError(f"the intake answered {data[:200]!r}")
        return Ack(seq, bool(answer.get("duplicate", False)))
    if not isinstance(error, dict):
        error = {"description": repr(error)[:200]}
    code = error.get("code")
    said = f"{error.get('description', error)} ({code})"
    if code == 429:
        said_s = error.get("retry_s")
        retry_s = 1.0  # when it did not say, as a client can read it
        if isinstance(said_s, int | float) and not isinstance(said_s, bool) and 0 <= said_s < math.inf:
            retry_s = float(said_s)
        raise RetryLater(f"the intake refused it for now: {said}", retry_s)
    if code == 504:
        raise UnacknowledgedError(f"the intake does not know whether the log stored it: {said}")
    if code in REFUSED:
        raise UnstorableError(f"the intake refused it: {said}")
    raise LogError(f"the intake did not take it: {said}")
