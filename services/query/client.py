"""The client side, for any identity but ``services``: send requests into the log and ask the
read service, over a plain NATS connection that can do nothing else.

A request goes to the intake on ``corral.req.<tenant>.<verb>``, which appends it to the log at
``corral.in.<tenant>.<verb>`` and answers as JetStream would (the stream sequence it was stored
at, or why not); ``Nats-Msg-Id`` deduplicates a retry. A question is a request on
``corral.read.<asker>.<question>``. Replies come into the identity's own inbox prefix,
the only place its permissions let it listen.

The server refuses what an identity may not do with a permissions violation and drops the
message; ``Session`` turns that into ``Refused`` at once instead of waiting out a timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
from typing import Any, Protocol

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from corral.events import subjects
from corral.events.nats_client import open_client, servers
from corral.services.runtime import identities

MSG_ID = "Nats-Msg-Id"


class Refused(Exception):
    """The server refused the connection or the message, or nobody answered."""


class NoAnswer(Refused):
    """Nobody answered a request in time. Its server may be frozen (a paused VM, a host cut off),
    which the connection finds out only after its pings go unanswered, many seconds on."""


class Lost(Refused):
    """The connection closed under a request, after it was sent: it may have been delivered and
    acted on. The session is closed for good (it does not reconnect): open another, which may
    reach another server of the cluster."""


class Session:
    """One connection as one identity. Use ``await Session.open(url, user, password)``; one
    request or question at a time."""

    def __init__(self, timeout: float) -> None:
        self.nc: NATS | None = None
        self.timeout = timeout
        self._refused: asyncio.Future[str] | None = None
        self._gone = asyncio.Event()  # the connection closed: nats-py leaves a request waiting

    @classmethod
    async def open(
        cls, url: str, user: str, password: str | None, *, timeout: float = 5.0, inbox: str = ""
    ) -> Session:
        """``password`` None: no login (a server without logins), acting as ``user``. Answers come
        to the inbox of ``inbox`` (default: ``user``'s): the services login, which may hear any,
        takes the tenant's it speaks for, where the intake answers that tenant."""
        creds = {"user": user, "password": password} if password is not None else {}
        # Each server of the list in turn, in a random order as nats-py spreads its clients:
        # without reconnecting, nats-py tries only the first it picks, and with one server of
        # three down a session failed to open one time in three.
        urls = servers(url)
        random.shuffle(urls)
        why = ""
        for one in urls:
            session = cls(timeout)  # a failed try closes its connection, which it would hear
            try:
                # ``open_client``: a reply no reader of it can parse is dropped, not the connection.
                session.nc = await open_client(
                    one,
                    **creds,
                    inbox_prefix=identities.inbox_prefix(inbox or user),
                    error_cb=session._on_error,
                    closed_cb=session._on_closed,
                    connect_timeout=3,
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                )
                return session
            except nats.errors.AuthorizationError:
                raise Refused(f"the server at {url} did not accept {user} and that password") from None
            except (OSError, TimeoutError, nats.errors.Error) as e:
                why = str(e) or type(e).__name__
        raise Refused(f"cannot reach the corral server at {url}: {why or 'no server given'}")

    async def _on_closed(self) -> None:
        self._gone.set()

    async def _on_error(self, e: Exception) -> None:
        # nats-py reports a permissions violation here and keeps the connection open.
        if "permissions violation" in str(e).lower():
            refused = self._refused
            if refused is not None and not refused.done():
                refused.set_result(str(e).removeprefix("nats: "))

    async def request(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None, *, timeout: float = 0.0
    ) -> Msg:
        assert self.nc is not None
        timeout = timeout or self.timeout
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._refused = refused
        asked = self.nc.request(subject, data, timeout=timeout, headers=headers)
        reply: asyncio.Future[Msg] = asyncio.ensure_future(asked)
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            either: list[asyncio.Future[Any]] = [reply, refused, gone]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if refused.done():
                raise Refused(f"the server refused: {refused.result()}")
            if gone.done() and not reply.done():  # its server died, or stopped answering pings
                raise Lost(f"no answer on {subject}: the connection closed")
            try:
                return reply.result()
            except nats.errors.NoRespondersError:
                raise Refused(f"nobody answers on {subject}{_who_answers(subject)}") from None
            except nats.errors.TimeoutError:
                raise NoAnswer(f"no answer on {subject} within {timeout}s") from None
            except (nats.errors.Error, OSError) as e:  # the connection closed, or lost, under it
                raise Lost(f"no answer on {subject}: {str(e) or type(e).__name__}") from None
        finally:
            self._refused = None
            reply.cancel()
            refused.cancel()
            gone.cancel()
            with contextlib.suppress(BaseException):
                await reply

    async def send(
        self, subject: str, data: bytes, msg_id: str, headers: dict[str, str] | None = None
    ) -> int:
        """Have the intake append a request to the log at ``subject`` (``corral.in.<tenant>.<verb>``);
        returns the sequence it was stored at. Any other subject is published to as it is (and
        refused by the server, for every identity that may use a session)."""
        return (await self.store(subject, data, msg_id, headers))[0]

    async def store(
        self, subject: str, data: bytes, msg_id: str, headers: dict[str, str] | None = None
    ) -> tuple[int, bool]:
        """As ``send``, and whether the stream took it as a repeat of a message id it had."""
        parsed = subjects.parse_request(subject)
        target = subjects.intake(*parsed) if parsed is not None else subject
        msg = await self.request(target, data, {**(headers or {}), MSG_ID: msg_id})
        try:
            ack = json.loads(msg.data)
        except ValueError:
            raise Refused(f"the log answered {msg.data[:200]!r}") from None
        if "error" in ack:
            raise Refused(f"the log refused {subject}: {ack['error'].get('description', ack['error'])}")
        return int(ack["seq"]), bool(ack.get("duplicate", False))

    async def ask(
        self,
        asker: str,
        question: str,
        *,
        job: str = "",
        after: int = 0,
        everything: bool = False,
        verb: str = "",
        until: str = "",
        wait: float = 0.0,
        rank: int = -1,
        tail: int = -1,
        cursor: int = 0,
        page_after: int = 0,
        node_after: str = "",
    ) -> dict[str, Any]:
        """The read service's answer to ``question`` asked as ``asker``; ``everything``: for
        ``jobs``, the jobs the fold let go too; ``verb``, ``until``, ``wait``, and ``output``'s
        ``rank``, ``tail`` and ``cursor`` as ``Ask`` has them (the answer may take ``wait``
        seconds, so this waits that much longer)."""
        fields = {"job": job, "after": after, "all": everything, "verb": verb, "until": until, "wait": wait}
        if question == "output":
            fields |= {"rank": rank, "tail": tail, "cursor": cursor}
        if page_after:
            fields["page_after"] = page_after
        if node_after:
            fields["node_after"] = node_after
        body = json.dumps(fields).encode()
        subject = identities.read_subject(asker, question)
        msg = await self.request(subject, body, timeout=self.timeout + wait)
        try:
            answer: dict[str, Any] = json.loads(msg.data)
        except ValueError:
            raise Refused(f"the read service answered {msg.data[:200]!r}") from None
        return answer

    @property
    def closed(self) -> bool:
        """The connection is gone (its server died or stopped answering pings): this session
        answers nothing again."""
        return self.nc is None or self.nc.is_closed or self._gone.is_set()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(OSError, nats.errors.Error):
                await self.nc.close()


class Asks(Protocol):
    async def ask(
        self, asker: str, question: str, *, after: int = 0, page_after: int = 0, node_after: str = ""
    ) -> dict[str, Any]: ...


async def every_page(
    s: Asks, asker: str, question: str, first: dict[str, Any] | None = None, *, most: int | None = None
) -> dict[str, Any]:
    """The answer to a paged question (``nodes`` and ``gpus`` by node name, all as of the first
    page's log position; ``jobs`` by submission) with every page of it, following ``next``;
    of more than ``most`` pages, the newest. ``first``: its first page, if asked already."""
    if first is None:
        first = await s.ask(asker, question)
    key = "jobs" if question == "jobs" else "nodes"
    pages = collections.deque([first.get(key, ())], maxlen=most)
    page = first
    while page.get("next") and "error" not in page:
        if key == "jobs":
            page = await s.ask(asker, question, page_after=int(page["next"]))
        else:
            page = await s.ask(asker, question, after=int(first["seq"]), node_after=str(page["next"]))
        pages.append(page.get(key, ()))
    if "error" in page:
        return page
    return {**first, key: [row for rows in pages for row in rows]}


def _who_answers(subject: str) -> str:
    """Which role a subject's answers come from, so that a person told nobody answers knows
    which part of the corral to look at: ``corral status`` lists only the leased ones."""
    if subject.startswith(identities.READ + "."):
        return " (the read service, corral serve query, is not running)"
    if subject.startswith((subjects.REQ + ".", subjects.NREQ + ".")):
        return " (the intake, corral serve intake, is not running)"
    return ""
