"""The asyncio client: requests through the intake, verdicts and answers from the read service.

A request goes to the intake (``corral.req.<tenant>.<verb>``), which answers with the log
sequence it stored it at; the read service then tells what became of it (``verdict`` asked
``after`` that sequence: refused by the fold, rejected by admission, accepted, applied),
waiting up to ``timeout`` for the log to get there. ``wait=False`` stops at the stored
sequence. Nothing here reads the log itself: a tenant's login could not, and the same code
serves every login.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgspec

from corral.events import codec, documents, subjects
from corral.events.jobs import CancelJob, JobSpec, ResizeJob, SubmitJob, run_problem
from corral.events.queues import CordonNode, DeleteCohort, DeleteNode, DeletePriorityClass, DeleteQueue
from corral.projections.lifecycle import FINAL
from corral.services.client.results import (
    Applied,
    AsOf,
    Busy,
    CorralError,
    Explanation,
    Forbidden,
    Invalid,
    Job,
    NoSuchJob,
    OutputLine,
    Refused,
    Rejected,
    Submitted,
    TimedOut,
    Unreachable,
    WhatIf,
    as_of,
)
from corral.services.query import client as wire
from corral.services.query.decide import MAX_WAIT
from corral.services.runtime import identities

FOLLOW_PAUSE, FOLLOW_PAUSE_MAX = 0.25, 5.0  # seconds between follows answered empty at once

DEFAULT_SERVER = "nats://127.0.0.1:4222"
CONNECT_TIMEOUT = 10.0  # seconds: an unreachable server is an answer, not a hang
VERDICT_TIMEOUT = 30.0  # seconds a request's verdict is waited for, by default
JOB_VERBS = ("submit", "cancel", "resize")  # a refusal as "unknown" of these is NoSuchJob
# Seconds before a request the log did not acknowledge is sent again (under the same id): the
# log was slow to answer, not necessarily away.
MAYBE_STORED_RETRY_S = 0.5
# The pause before a request the intake could not take now (503: busy, or the log behind it
# electing its leader) is sent again, doubling each time: nothing was appended, and the same
# message under the same id is stored once.
BUSY_PAUSE_S, BUSY_PAUSE_MOST_S = 0.25, 2.0
# Requests of unknown fate a client remembers, to send again under their ids (the oldest go).
MAX_UNSETTLED = 1_000
WHATIF_TIMEOUT = 60.0  # seconds a what-if may take: it simulates, the more so on a deep backlog


def default_server() -> str:
    """``$CORRAL_SERVER``, else the server the ``corral up`` run from this directory recorded
    (under ``$CORRAL_HOME``, ``.corral`` by default), else the default port on this machine: as
    the ``corral`` command finds it."""
    if os.environ.get("CORRAL_SERVER"):
        return os.environ["CORRAL_SERVER"]
    recorded = Path(os.environ.get("CORRAL_HOME", ".corral")) / "server"
    if recorded.exists():
        return recorded.read_text().strip()
    return DEFAULT_SERVER


class AsyncClient:
    """``async with AsyncClient(server, tenant=..., user=..., password=...) as c``: one
    connection, one request at a time. Without a login (a server without logins) it acts as
    ``tenant``; ``credentials`` is a JSON file of login to password, as ``corral up --auth``
    writes it (the one login in it, or ``user``'s)."""

    def __init__(
        self,
        server: str | None = None,
        *,
        tenant: str | None = None,
        user: str | None = None,
        password: str | None = None,
        credentials: str | os.PathLike[str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.server = server or default_server()
        if credentials is not None:
            try:
                passwords = identities.load(credentials)
            except identities.CredentialsError as e:
                raise Invalid(str(e)) from None
            user = user or (next(iter(passwords)) if len(passwords) == 1 else tenant)
            if user is None or user not in passwords:
                raise Invalid(
                    f"no password for {user or 'anyone: name the login with user='} in {credentials}"
                )
            password = passwords[user]
        if password is not None and user is None:
            raise Invalid("a password needs the user it is for")
        self.user, self.password = user, password
        speaks_for = user if user is not None and user != identities.SERVICES else None
        tenant = tenant or os.environ.get("CORRAL_TENANT") or speaks_for or "default"
        if not subjects.is_token(tenant):
            raise Invalid(f"tenant {tenant!r}: use letters, digits, '-' and '_'")
        self.tenant = tenant
        # Who the read service answers: the login's own name, unless it is the services login
        # (which may ask as anyone) or none (a server without logins): then the tenant.
        self.asker = speaks_for or tenant
        self.timeout = timeout
        self._session: wire.Session | None = None
        # Per (verb, job), the bytes and message id of a request whose fate is unknown (no
        # answer, or none saying whether the log stored it): the same request sent again is
        # the same message, which the log stores once, even where the first copy comes late
        # (one held by a server that froze is delivered when it wakes).
        self._unsettled: dict[tuple[str, str], tuple[bytes, str]] = {}
        # How current the read service's last answer was (of a list of several pages, its least
        # current page; None: nothing asked yet). While it
        # cannot read the log on, it answers from what it folded, and says so: a caller that
        # shows the answer shows that too (the CLI prints ``as_of.text``).
        self.as_of: AsOf | None = None

    async def __aenter__(self) -> AsyncClient:
        await self._connected()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _drop(self, session: wire.Session) -> None:
        """Forget ``session`` after a request it carried got no answer: its server may be
        frozen, and the connection would find out only once its pings went unanswered (15 s
        and more), every call on it meanwhile waiting out its timeout. The next call opens a
        new one on whichever server answers."""
        if self._session is session:
            await self.close()

    async def _connected(self) -> wire.Session:
        # A session does not reconnect; one whose server went (killed, or paused past its pings)
        # is replaced by a new one, on whichever server of the list answers: kept, every later
        # call of a long-lived client failed while the rest of the cluster served.
        if self._session is not None and self._session.closed:
            await self.close()
        if self._session is None:
            name = self.user or self.tenant
            try:
                self._session = await asyncio.wait_for(
                    wire.Session.open(
                        self.server, name, self.password, timeout=self.timeout, inbox=self.asker
                    ),
                    CONNECT_TIMEOUT,
                )
            except TimeoutError:
                raise Unreachable(f"cannot reach the corral server at {self.server}: no answer") from None
            except wire.Refused as e:
                raise Unreachable(str(e)) from None
        return self._session

    # -- requests -----------------------------------------------------------------------------

    async def submit(
        self,
        spec: JobSpec | dict[str, Any],
        id: str | None = None,  # noqa: A002 - the job's id, as the job file calls it
        *,
        wait: bool = True,
        timeout: float = VERDICT_TIMEOUT,
    ) -> Submitted:
        """Submit a job (a ``JobSpec`` or a dict of its fields); returns once admission accepted
        it (``wait``), or once the log stored it. Raises ``Rejected`` with admission's reason,
        ``Refused`` for an id another job holds, ``TimedOut`` if no verdict came in time, and
        ``Invalid``, sending nothing, for a job with nothing to run (admission's rule, said early:
        without ``wait`` it would only be rejected later)."""
        if not isinstance(spec, JobSpec):
            try:  # the rule job files follow: each unknown field by its path, types in words
                spec = documents.convert(spec, JobSpec, "job spec")
            except documents.NotValid as e:
                raise Invalid(str(e)) from None
        problem = run_problem(spec)
        if problem:
            raise Invalid(problem)
        job_id = id or f"j-{secrets.token_hex(5)}"
        if not subjects.is_token(job_id):
            raise Invalid(f"job id {job_id!r}: use letters, digits, '-' and '_' (at most 64)")
        seq, duplicate = await self._store("submit", job_id, SubmitJob(request_id=job_id, job=spec))
        if not wait:
            return Submitted(job_id, seq, duplicate=duplicate)
        told = await self._verdict("submit", job_id, seq, timeout)
        return Submitted(job_id, seq, told["job"]["phase"], bool(told.get("duplicate")))

    async def cancel(
        self, job_id: str, reason: str = "", *, wait: bool = True, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        """Cancel a job of this tenant's; ``NoSuchJob`` for one it may not see."""
        seq, _ = await self._store("cancel", job_id, CancelJob(job_id=job_id, reason=reason))
        if not wait:
            return Applied(job_id, seq)
        await self._verdict("cancel", job_id, seq, timeout)
        return Applied(job_id, seq, applied=True)

    async def resize(
        self, job_id: str, replicas: int, *, wait: bool = True, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        """An elastic job's most workers (a running job above it shrinks at once)."""
        if replicas < 1:
            raise Invalid(f"replicas {replicas}: at least 1")
        seq, _ = await self._store("resize", job_id, ResizeJob(job_id=job_id, replicas=replicas))
        if not wait:
            return Applied(job_id, seq)
        await self._verdict("resize", job_id, seq, timeout)
        return Applied(job_id, seq, applied=True)

    # -- the admin's requests (the intake refuses them from any tenant but ``admin``) ---------

    async def cordon(
        self, node: str, reason: str = "", *, drain: bool = False, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        """No new work lands on ``node``; ``drain``: its running jobs also move away (each
        resumes elsewhere from its last checkpoint). ``Refused`` for a node the cluster does
        not know, or from a login that is not the admin's."""
        body = CordonNode(node=node, cordoned=True, drain=drain, reason=reason)
        return await self._admin("cordon", node, body, timeout)

    async def uncordon(
        self, node: str, *, repaired: bool = False, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        """Work may land on ``node`` again (whoever cordoned it: the admin, or the health
        monitor after a GPU fault; a GPU that is unhealthy stays unused). ``repaired``: its GPUs
        were reset or replaced, and the failures recorded on them are cleared."""
        req = CordonNode(node=node, cordoned=False, repaired=repaired)
        return await self._admin("cordon", node, req, timeout)

    async def delete_node(self, node: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        """Forget a node taken out of the cluster for good; ``Refused`` while any job holds
        something on it (drain it first), or for no such node. An agent that registers it again
        brings it back."""
        return await self._admin("delete-node", node, DeleteNode(node=node), timeout)

    async def delete_queue(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        """Delete a queue; ``Refused`` while it still has unfinished jobs, or for no such queue."""
        return await self._admin("delete-queue", name, DeleteQueue(name=name), timeout)

    async def delete_cohort(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        """Delete a cohort; ``Refused`` while a queue or a cohort names it as its parent, while
        its quota is lent in its tree, or for no such cohort."""
        return await self._admin("delete-cohort", name, DeleteCohort(name=name), timeout)

    async def delete_priority_class(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        """Delete a priority class; ``Refused`` while a job not finished names it, or for no
        such class."""
        return await self._admin("delete-priority-class", name, DeletePriorityClass(name=name), timeout)

    async def apply(self, verb: str, name: str, body: Any, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        """An admin's change of the cluster's setup, ``body`` a request of the catalog for
        ``verb`` (``queue``: an ``ApplyQueue``; ``cohort``, ``priority-class``, ``fair-share``,
        ``retention``), about ``name``, once the fold has taken it; ``Refused`` with why where
        it did not (a cohort whose parents loop, a quota out of bounds, a login not the admin's)."""
        return await self._admin(verb, name, body, timeout)

    async def _admin(self, verb: str, name: str, body: Any, timeout: float) -> Applied:
        if not subjects.is_token(name):
            raise Invalid(f"{name!r}: use letters, digits, '-' and '_' (at most 64)")
        seq, _ = await self._store(verb, name, body)
        await self._verdict(verb, name, seq, timeout)
        return Applied(name, seq, applied=True)

    async def _store(self, verb: str, job_id: str, body: Any) -> tuple[int, bool]:
        """Send a request to the intake; the log sequence it was stored at, and whether it was a
        repeat of a message id. The message id's unguessable part keeps another tenant from
        taking it first (the stream deduplicates ids across all subjects). Past the tenant's
        rate the intake says when to send again: sent again then, the same message, while that
        is within the client's ``timeout``; else ``Busy``. A request of unknown fate (``Busy``
        with ``maybe_stored``, ``Unreachable``) sent again by this client, the same bytes about
        the same job, goes under its first id: within the stream's duplicate window (two
        minutes) it is stored once, whichever copy comes first."""
        data, key = codec.encode(body), (verb, job_id)
        kept = self._unsettled.get(key)
        if kept is not None and kept[0] == data:
            msg_id = kept[1]
        else:
            msg_id = f"{verb}:{self.tenant}:{job_id}:{secrets.token_hex(8)}"
        try:
            seq, duplicate = await self._send(verb, data, msg_id)
        except Unreachable:
            self._unsettle(key, data, msg_id)
            raise
        except Busy as e:
            if e.maybe_stored:
                self._unsettle(key, data, msg_id)
            raise
        except CorralError:
            self._unsettled.pop(key, None)  # refused: nothing of it stored
            raise
        self._unsettled.pop(key, None)
        return seq, duplicate

    def _unsettle(self, key: tuple[str, str], data: bytes, msg_id: str) -> None:
        self._unsettled.pop(key, None)
        if len(self._unsettled) >= MAX_UNSETTLED:
            del self._unsettled[next(iter(self._unsettled))]  # the oldest
        self._unsettled[key] = (data, msg_id)

    async def _send(self, verb: str, data: bytes, msg_id: str) -> tuple[int, bool]:
        from corral.services.runtime import tracing

        session = await self._connected()
        deadline = time.monotonic() + self.timeout
        # The request's span is the root of its job's trace only when it is exported (a collector
        # configured by OTEL_EXPORTER_OTLP_*): a trace under a parent nobody records would have no
        # root, so without one no context travels and the job's trace is derived from the job.
        attributes = {"corral.tenant": self.tenant}
        with tracing.span(f"corral.{verb}", attributes=attributes, service="client") as span:
            tp = tracing.traceparent_of(span) if tracing.enabled("client") else None
            headers = {wire.MSG_ID: msg_id, **({"traceparent": tp} if tp else {})}
            subject = subjects.intake(self.tenant, verb)
            lost = False
            pause = BUSY_PAUSE_S
            while True:
                try:
                    answer = await self._request(session, subject, data, headers)
                except _Lost:
                    # Its connection closed under it: the intake may have appended it. Sent
                    # again under the same id through another server, it is stored once; sent
                    # anew by the caller, under another id, it was stored twice.
                    lost = True
                    if time.monotonic() + MAYBE_STORED_RETRY_S > deadline:
                        said = f"{verb} not known to be taken: its connection closed"
                        raise Busy(said, MAYBE_STORED_RETRY_S, maybe_stored=True) from None
                    await asyncio.sleep(MAYBE_STORED_RETRY_S)
                    session = await self._connected()
                    continue
                ack = _intake_answer(verb, answer)
                if isinstance(ack, Busy) and lost:
                    ack.maybe_stored = True  # this copy was not taken; the one lost may have been
                if isinstance(ack, Busy):
                    # Busy or past its rate nothing was appended; unacknowledged, it may have
                    # been: the same message under the same id either way, which the log stores
                    # once, within the timeout (a stream's new leader takes a few seconds).
                    wait = ack.retry_s if ack.resend else max(ack.retry_s, pause)
                    if time.monotonic() + wait <= deadline:
                        await asyncio.sleep(wait)
                        pause = min(2 * pause, BUSY_PAUSE_MOST_S)
                        continue
                break
        if isinstance(ack, Exception):
            raise ack
        return int(ack["seq"]), bool(ack.get("duplicate", False))

    async def _request(
        self, session: wire.Session, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> bytes:
        try:
            return (await session.request(subject, data, headers)).data
        except wire.Lost as e:
            raise _Lost(str(e)) from None
        except wire.NoAnswer as e:
            await self._drop(session)
            raise Unreachable(str(e)) from None
        except wire.Refused as e:
            if "permissions violation" in str(e).lower():
                raise Forbidden(str(e)) from None
            raise Unreachable(str(e)) from None

    async def _verdict(self, verb: str, job_id: str, seq: int, timeout: float) -> dict[str, Any]:
        """The read service's verdict on the request at ``seq``, asked again until it is known
        or ``timeout`` has passed; a refusal or rejection raised."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            told = await self._ask(
                "verdict", job=job_id, after=seq, verb=verb, wait=min(max(left, 0), MAX_WAIT)
            )
            kind = told.get("verdict")
            if kind == "refused":
                unknown_job = told.get("code") == "unknown" and verb in JOB_VERBS
                error = NoSuchJob if unknown_job else Refused
                raise error(str(told.get("code")), str(told.get("reason")))
            if kind == "rejected":
                raise Rejected(str(told.get("code")), f"{job_id} rejected: {told.get('reason')}")
            if kind in ("accepted", "applied"):
                return told
            if kind == "unknown":  # the request stands; what the fold said of it is not kept
                raise TimedOut(f"{verb} of {job_id} stored at seq {seq}: {told.get('reason')}")
            if time.monotonic() >= deadline:
                raise TimedOut(
                    f"{verb} of {job_id} stored at seq {seq}, no verdict within {timeout:g}s "
                    f"(corral explain {job_id} tells what became of it)"
                )

    async def _ask(self, question: str, **fields: Any) -> dict[str, Any]:
        session = await self._connected()
        try:
            try:
                answer = await session.ask(self.asker, question, **fields)
            except wire.Lost:  # a question changes nothing: asked again through another server
                answer = await (await self._connected()).ask(self.asker, question, **fields)
        except wire.NoAnswer as e:
            await self._drop(session)
            raise Unreachable(str(e)) from None
        except wire.Refused as e:
            if "permissions violation" in str(e).lower():
                raise Forbidden(str(e)) from None
            raise Unreachable(str(e)) from None
        self.as_of = as_of(answer)
        error = answer.get("error")
        if error is not None:
            if answer.get("busy") is True:
                raise Busy(str(error), _retry_s(answer.get("retry_s")))
            if str(error).startswith("no job "):  # with whatever the service adds of why
                raise NoSuchJob("unknown", "no such job " + str(error).removeprefix("no job "))
            raise Refused("malformed", str(error))
        return answer

    async def _ask_in_time(self, question: str, **fields: Any) -> dict[str, Any]:
        """``_ask``, asked again after a busy answer's ``retry_s`` (``FOLLOW_PAUSE`` at least),
        for as long as it takes. For the loops that ask until something happens (``watch``): a
        tenant's questions past its share of the read service's time are answered busy, which
        ended them."""
        while True:
            try:
                return await self._ask(question, **fields)
            except Busy as e:
                await asyncio.sleep(max(e.retry_s, FOLLOW_PAUSE))

    # -- questions ----------------------------------------------------------------------------

    async def jobs(self, *, all: bool = False) -> list[Job]:  # noqa: A002 - as `corral jobs --all`
        """This tenant's jobs (the admin's: everyone's); ``all``: also those the cluster let go
        after their retention period (the newest thousand)."""
        return (await self.job_list(all=all))[0]

    async def job_list(self, *, all: bool = False) -> tuple[list[Job], int]:  # noqa: A002
        """As ``jobs``, and how many older jobs let go it left out."""
        answer = await self._ask("jobs", everything=all)
        return await self._rest_of(answer), int(answer.get("more_let_go", 0))

    async def _rest_of(self, answer: dict[str, Any], *, patient: bool = False) -> list[Job]:
        """The jobs of a ``jobs`` answer and of the pages after it (the read service answers a
        page at a time, in the order the jobs were submitted, each at least as new as the first);
        ``patient``: a page answered busy is asked again when the answer says."""
        jobs = msgspec.convert(answer["jobs"], list[Job])
        seq = int(answer.get("seq", 0))
        first = self.as_of
        while answer.get("next"):
            fields = {"page_after": int(answer["next"]), "after": seq}
            answer = await (self._ask_in_time("jobs", **fields) if patient else self._ask("jobs", **fields))
            jobs += msgspec.convert(answer["jobs"], list[Job])
            # The list is as current as its least current page: one stale page is a stale list.
            if first is not None and not first.current:
                self.as_of = first
            first = self.as_of
        return jobs

    async def watch(self, *, all: bool = False) -> AsyncGenerator[list[Job], None]:  # noqa: A002
        """The jobs as ``jobs`` lists them, now and again each time the log moves on: the read
        service holds each question until it has folded a later record (or a minute passed),
        so nothing is asked while nothing happens. Ends when the caller stops iterating."""
        after = 0
        while True:
            answer = await self._ask_in_time("jobs", everything=all, after=after, wait=MAX_WAIT)
            seq = int(answer.get("seq", 0))
            if after == 0 or seq >= after:
                yield await self._rest_of(answer, patient=True)
            after = seq + 1

    async def logs(
        self, job_id: str, rank: int | None = None, tail: int | None = None, follow: bool = False
    ) -> AsyncGenerator[OutputLine, None]:
        """What the job's workers printed (``rank``: one worker's), all the cluster keeps or its
        last ``tail`` lines; ``follow``: then each line as it comes, until the job has ended.
        Read through the read service, which shows a tenant its own jobs only: ``NoSuchJob``
        for any other."""
        if not subjects.is_token(job_id):
            raise Invalid(f"job id {job_id!r}: use letters, digits, '-' and '_' (at most 64)")
        if rank is not None and rank < 0:
            raise Invalid(f"rank {rank}: ranks are 0 and up")
        if tail is not None and tail < 0:
            raise Invalid(f"tail {tail}: a number of lines, 0 or more")
        cursor = 0
        first = True
        pause = 0.0  # after answers that came back at once with nothing: the read service is busy
        while True:
            asked = time.monotonic()
            answer = await self._ask(
                "output",
                job=job_id,
                rank=-1 if rank is None else rank,
                tail=-1 if tail is None or not first else tail,
                cursor=cursor,
                wait=MAX_WAIT if follow and not first else 0.0,
            )
            waited = not first and time.monotonic() - asked >= MAX_WAIT / 2
            first = False
            lines = msgspec.convert(answer["lines"], list[OutputLine])
            for line in lines:
                yield line
            cursor = int(answer["cursor"])
            if answer.get("more"):
                continue
            if not follow or answer.get("ended"):
                return
            # A follow answered empty without the wait it asked for (the read service holds as
            # many waiting questions as it will): ask again after a pause, not in a tight loop.
            pause = 0.0 if lines or waited else min(FOLLOW_PAUSE_MAX, max(FOLLOW_PAUSE, pause * 2))
            if pause:
                await asyncio.sleep(pause)

    async def explain(self, job_id: str) -> Explanation:
        """A job's history and why it waits."""
        return msgspec.convert(await self._ask("explain", job=job_id), Explanation)

    async def whatif(
        self,
        spec: JobSpec | dict[str, Any],
        id: str | None = None,  # noqa: A002 - the job's id, as the job file calls it
        *,
        timeout: float = WHATIF_TIMEOUT,
    ) -> WhatIf:
        """What corral would do with the job if this tenant submitted it now: accepted or not,
        placed where or started when, stopping what, and smaller asks that start it at once.
        Nothing is written. Answered by the forecast role on the live state."""
        if not isinstance(spec, JobSpec):
            try:  # the rule job files follow: each unknown field by its path, types in words
                spec = documents.convert(spec, JobSpec, "job spec")
            except documents.NotValid as e:
                raise Invalid(str(e)) from None
        if id is not None and not subjects.is_token(id):
            raise Invalid(f"job id {id!r}: use letters, digits, '-' and '_' (at most 64)")
        session = await self._connected()
        body = msgspec.json.encode({"job": spec} if id is None else {"job": spec, "id": id})
        subject = identities.read_subject(self.asker, "whatif")
        try:
            msg = await session.request(subject, body, timeout=timeout)
        except wire.Refused as e:
            if "permissions violation" in str(e).lower():
                raise Forbidden(str(e)) from None
            raise Unreachable(f"no forecast role answered: {e}") from None
        try:
            told = msgspec.json.decode(msg.data)
        except msgspec.DecodeError:
            raise Unreachable(f"the forecast role answered {msg.data[:200]!r}") from None
        self.as_of = as_of(told)
        if "error" in told:
            if told.get("busy") is True:
                raise Busy(str(told["error"]), _retry_s(told.get("retry_s")))
            raise Refused("malformed", str(told["error"]))
        from corral.services.forecast.present import text

        return msgspec.convert({**told, "text": text(told)}, WhatIf)

    async def wait(self, job_id: str, state: str = "running", *, timeout: float = 600.0) -> Job:
        """The job once it is in ``state``, or in a final phase (succeeded, failed, cancelled,
        rejected: it will never get there then; compare ``.phase``). ``TimedOut`` past
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                answer = await self._ask("explain", job=job_id, until=state, wait=min(max(left, 0), MAX_WAIT))
            except Busy as e:
                # Past the tenant's share of the read service's time: asked again when told, for
                # what is left of the timeout then (the wait asked before the pause ran past it).
                pause = max(e.retry_s, FOLLOW_PAUSE)
                if time.monotonic() + pause >= deadline:
                    raise TimedOut(
                        f"{job_id} not seen {state} in {timeout:g}s: the read service said {e}"
                    ) from None
                await asyncio.sleep(pause)
                continue
            job = msgspec.convert(answer["job"], Job)
            if job.phase == state or job.phase in FINAL:
                return job
            if time.monotonic() >= deadline:
                raise TimedOut(f"{job_id} is {job.phase}, not {state}, after {timeout:g}s")


class _Lost(Unreachable):
    """A request's connection closed under it (``wire.Lost``): it may have been acted on."""


def _intake_answer(verb: str, msg: bytes) -> dict[str, Any] | Busy | Refused:
    """The intake's answer: where the log stored the request, or why not (503: the intake, or
    the log behind it, cannot take it now; 429: the tenant sends faster than its rate; 504: the
    log did not say whether it stored it; any other code: refused)."""
    try:
        ack = json.loads(msg)
    except ValueError:
        raise Unreachable(f"the intake answered {msg[:200]!r}") from None
    if "error" not in ack:
        return ack  # type: ignore[no-any-return]
    error = ack["error"]
    code = error.get("code")
    if code in (503, 429, 504):
        retry_s = _retry_s(error.get("retry_s"), MAYBE_STORED_RETRY_S if code == 504 else 0.0)
        said = "not known to be taken" if code == 504 else "not taken"
        told = f"{verb} {said}: {error.get('description', error)}"
        return Busy(told, float(retry_s), too_fast=code == 429, maybe_stored=code == 504)
    return Refused(str(code or ""), f"{verb} refused: {error.get('description', error)}")


def _retry_s(said: Any, otherwise: float = 0.0) -> float:
    """The seconds an answer said to wait before asking again (``otherwise`` when it said none
    a client can use)."""
    ok = isinstance(said, int | float) and not isinstance(said, bool) and 0 <= said < math.inf
    return float(said) if ok else otherwise
