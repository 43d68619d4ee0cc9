"""What one client request or node report becomes: an append to the log as its sender's, a
refusal, or nothing.

Clients send requests request-reply on ``corral.req.<tenant>.<verb>``, never into the stream: a
JetStream publish is acknowledged on whatever reply subject the publisher names, by the server
itself, past the publisher's permissions, so a tenant allowed to publish into the stream could
make the server write its acknowledgements into the log, another tenant's inbox or the leaders'
lease bucket. The intake appends for them, with its own identity and its own inbox, and answers.

- The tenant is the subject's second token (NATS lets each identity send only on its own).
- The answer goes only into the tenant's own inbox (``_INBOX.corral.<tenant>.``); a request
  naming any other reply subject is dropped unanswered, and nothing is appended for it.
- A request must decode as its verb's type (admin verbs only for ``admin``), name no field twice
  in one object (``documents.given_twice``: parsers differ on which one counts), fit in
  ``MAX_REQUEST`` bytes and give as a name (a job id, a queue, a node...) only a name
  (``names_problem``); else it is refused with the reason, and nothing is appended. A job id
  that is no subject token can never be a job: appended, it was kept in the log for good only
  for the fold to refuse it.
- What is appended is the request's bytes as sent, at ``corral.in.<tenant>.<verb>``, with the
  client's message id (``Nats-Msg-Id``, its name in any case; two different ids are refused)
  under the tenant's name (``<tenant>/<id>``): the stream deduplicates ids
  across every subject, and a tenant may not pre-empt another's id. Of the client's headers only
  the trace context travels; ``Nats-Expected-*``, ``Nats-Rollup`` and the like are the intake's
  to set, never a client's.

Node agents send their reports the same way, on ``corral.nreq.<node>`` (NATS lets each agent
send only on its own node's), for the same reason and one more: the log is kept for good and every
replica folds it, so a node taken over must not grow it as fast as it can publish.

- The node is the subject's third token, never the report's say: a report about another node
  (``routing.subject_of`` its body) is refused.
- The answer goes only into the node's agent's inbox (``_INBOX.agent.<node>.``).
- A report must decode as an envelope whose body is a kind a node agent writes
  (``NODE_REPORTS``: its registration, its workers' starts and exits, checkpoints, its
  shutdown; not the health monitor's word on it, nor anything else), name no field twice, fit
  in ``MAX_REQUEST`` bytes, speak as the node's agent (its producer ``agent/<node>@…``, its id
  of its kind's form, ``events.nodes.REPORT_IDS``, no causation: traces and ``corral verify``
  read the writer and a decision's cycle from them), be typed as what its body is (readers in
  other languages route by the envelope's ``type``) and name only jobs a name could be.
- It is appended as sent at ``corral.ev.node.<node>``, with the agent's message id filed under
  the agent's identity (``agent-<node>/<id>``): no node, and no tenant (whose names never start
  ``agent-``), can take another's id first.

The answer has the shape of a JetStream acknowledgement (``{"stream", "seq", "duplicate"}`` or
``{"error": {"code", "description"}}``), so a client written against the stream reads it as is.
What the fold and admission then make of the request, the read service tells (ask ``after`` the
answered ``seq``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from corral.events import codec, documents, routing, subjects
from corral.events.base import Event
from corral.events.codec import DecodeError
from corral.events.jobs import CancelJob, ResizeJob, SubmitJob
from corral.events.nodes import (
    REPORT_IDS,
    agent_producer,
)
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeletePriorityClass,
    DeleteQueue,
)

MAX_REQUEST = 256 * 1024  # bytes: a job spec is bounded far below this by admission
MAX_MSG_ID = 128
# An agent's ids name a job (up to 64 characters), its run, attempt, rank and pid: longer than a
# client's can be.
MAX_REPORT_ID = 256
MSG_ID = "Nats-Msg-Id"
_MSG_ID = MSG_ID.lower()
FORWARDED_HEADERS = ("traceparent", "tracestate")
MAX_REASON = 512
# What a node agent may say of its node; the health monitor's word on it (condition, GPU
# health) and everything else is written by others.
NODE_REPORTS: tuple[type[Event], ...] = tuple(REPORT_IDS)
MAX_PRODUCER = 256


@dataclass(frozen=True, slots=True)
class Accept:
    """Append ``data`` at ``subject`` with ``msg_id`` (None: no deduplication) and ``headers``."""

    subject: str
    data: bytes
    msg_id: str | None
    headers: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer that the request was refused, and why; append nothing."""

    code: int  # as JetStream's error codes: 400 a bad request, 403 a forbidden one
    description: str


@dataclass(frozen=True, slots=True)
class Sender:
    """Whose request it is and what it asks, known before its body is read."""

    tenant: str
    verb: str

    @property
    def who(self) -> str:
        """The identity it is charged to (its rate, its share of what waits)."""
        return self.tenant


@dataclass(frozen=True, slots=True)
class Reporter:
    """Whose node report it is, known before its body is read."""

    node: str

    @property
    def who(self) -> str:
        return subjects.AGENT_PREFIX + self.node


def addressed(
    subject: str, reply: str, size: int, *, inbox_prefix: str, node_inboxes: str = subjects.AGENT_INBOXES
) -> Sender | Reporter | Refuse | None:
    """What the subject, the reply subject and the size say of a request or a node report,
    before its body is decoded (the intake charges the sender's rate first: decoding a large
    request costs far more than refusing it). None when there is nowhere safe to answer (then it
    is dropped). ``inbox_prefix`` is where replies to identity names go (``_INBOX.corral``),
    ``node_inboxes`` where they go to node agents (``_INBOX.agent``)."""
    node = subjects.parse_node_intake(subject)
    if node is not None:
        if not reply.startswith(f"{node_inboxes}.{node}."):
            return None
        if size > MAX_REQUEST:
            return Refuse(400, f"a report is at most {MAX_REQUEST} bytes, not {size}")
        return Reporter(node)
    parsed = subjects.parse_intake(subject)
    if parsed is None:
        return None
    tenant, verb = parsed
    if not subjects.is_token(tenant) or not reply.startswith(f"{inbox_prefix}.{tenant}."):
        return None
    verbs = codec.ADMIN_VERBS if tenant == subjects.ADMIN else codec.TENANT_VERBS
    if verb not in verbs:
        return Refuse(403, f"{tenant} may not {verb[:64]!r}; verbs: {', '.join(sorted(verbs))}")
    if size > MAX_REQUEST:
        return Refuse(400, f"a request is at most {MAX_REQUEST} bytes, not {size}")
    return Sender(tenant, verb)


def weight(data: bytes, headers: Mapping[str, str] | None) -> int:
    """What a request weighs for its sender's rate: its body and its headers (the trace context
    and the message id reach the log with it)."""
    return len(data) + (sum(len(k) + len(v) for k, v in headers.items()) if headers else 0)


def decide(
    subject: str, reply: str, headers: Mapping[str, str] | None, data: bytes, *, inbox_prefix: str
) -> Accept | Refuse | None:
    """The verdict on one request; None when there is nowhere safe to answer (then it is
    dropped)."""
    sender = addressed(subject, reply, len(data), inbox_prefix=inbox_prefix)
    if not isinstance(sender, Sender | Reporter):
        return sender
    return judge(sender, headers, data)


def judge(sender: Sender | Reporter, headers: Mapping[str, str] | None, data: bytes) -> Accept | Refuse:
    """The verdict on the body of a request or a report ``addressed`` let through."""
    if isinstance(sender, Reporter):
        return _judge_report(sender.node, headers, data)
    tenant, verb = sender.tenant, sender.verb
    try:
        body = codec.decode_request(verb, data)
    except DecodeError as e:
        return Refuse(400, _bounded(f"not a {verb} request: {e}"))
    twice = documents.given_twice(data)
    if twice is not None:
        return Refuse(400, _bounded(f"not a {verb} request: {twice!r} given twice"))
    problem = names_problem(body)
    if problem:
        return Refuse(400, _bounded(f"not a {verb} request: {problem}"))
    return _passed(subjects.request(tenant, verb), data, headers, tenant, MAX_MSG_ID)


def names_problem(body: Event) -> str:
    """Why a name ``body`` gives (a job id, a queue, a cohort, a priority class, a tenant, a
    node) could never name one, or "". Each becomes a subject token (``subjects.is_token``), and
    the fold makes and finds nothing under any other: such a request could only be refused, after
    the log had kept it for good."""
    for what, name in _names(body):
        if not subjects.is_token(name):
            return names_problem_of(what, name)
    return ""


def names_problem_of(what: str, name: str) -> str:
    shown = repr(name[:64]) + ("..." if len(name) > 64 else "")
    return f"{what} {shown} is not a name (1 to 64 letters, digits, '-' or '_')"


def _names(body: Event) -> Iterator[tuple[str, str]]:
    match body:
        case SubmitJob():
            yield "job id", body.request_id
            yield "queue", body.job.queue
            yield "priority class", body.job.priority_class
        case CancelJob() | ResizeJob():
            yield "job id", body.job_id
        case ApplyQueue():
            yield "queue", body.queue.name
            if body.queue.cohort is not None:
                yield "cohort", body.queue.cohort
            for tenant in body.queue.tenants:
                yield "tenant", tenant
        case ApplyCohort():
            yield "cohort", body.cohort.name
            if body.cohort.parent is not None:
                yield "cohort", body.cohort.parent
        case ApplyPriorityClass():
            yield "priority class", body.priority_class.name
        case DeleteQueue():
            yield "queue", body.name
        case DeleteCohort():
            yield "cohort", body.name
        case DeletePriorityClass():
            yield "priority class", body.name
        case CordonNode() | DeleteNode():
            yield "node", body.node


def _judge_report(node: str, headers: Mapping[str, str] | None, data: bytes) -> Accept | Refuse:
    """A node's report: a kind a node agent writes, about that node, appended on its subject."""
    try:
        env = codec.decode_envelope(data)
    except DecodeError as e:
        return Refuse(400, _bounded(f"not a node report: {e}"))
    body = env.body
    if not isinstance(body, NODE_REPORTS):
        kinds = ", ".join(t.__name__ for t in NODE_REPORTS)
        return Refuse(403, f"a node agent does not write {type(body).__name__}; it writes {kinds}")
    own = subjects.node(node)
    if routing.subject_of(body) != own:
        said = getattr(body, "node", "")
        return Refuse(403, _bounded(f"{node}'s agent reports for {node} only, not for {said!r}"))
    twice = documents.given_twice(data)
    if twice is not None:
        return Refuse(400, _bounded(f"not a node report: {twice!r} given twice"))
    problem = _report_problem(node, env)
    if problem:
        return Refuse(403, _bounded(f"{node}'s report: {problem}"))
    return _passed(own, data, headers, subjects.AGENT_PREFIX + node, MAX_REPORT_ID)


def _report_problem(node: str, env: codec.Envelope) -> str:
    """Why the envelope of node ``node``'s report speaks for someone else, or "". Traces and
    ``corral verify`` take a record's writer from its producer and a decision's cycle from its
    id: a node's report signed as the placer, or with an id of the placer's form, would be read
    as the placer's decision. Nor is a report caused by or part of anything (a client's trace
    context comes in its headers)."""
    mine = agent_producer(node)
    if not (env.producer.startswith(mine) and len(env.producer) <= MAX_PRODUCER):
        most = f"at most {MAX_PRODUCER} characters"
        return f"its producer is {mine}<host>:<pid> ({most}), not {env.producer[:80]!r}"
    # ``type`` is what a reader in another language routes a record by without reading its
    # body (``schema/events.json``): a report typed as the placer's decision or the health
    # monitor's word is read as one there.
    written = type(env.body).__name__
    if env.type != written:
        return f"its type is its body's, {written}, not {env.type[:80]!r}"
    kind = REPORT_IDS[type(env.body)]
    if not (env.id.startswith(kind) and len(env.id) <= MAX_REPORT_ID):
        most = f"at most {MAX_REPORT_ID} characters"
        return f"the id of a {env.type} begins {kind!r} ({most}), not {env.id[:80]!r}"
    if env.causation is not None or env.correlation is not None:
        return "a node's report names no causation or correlation"
    job_id = getattr(env.body, "job_id", None)
    if isinstance(job_id, str) and not subjects.is_token(job_id):
        return names_problem_of("job id", job_id)
    return ""


def _passed(
    subject: str, data: bytes, headers: Mapping[str, str] | None, who: str, max_id: int
) -> Accept | Refuse:
    """Append ``data`` at ``subject``, the sender's message id filed under ``who``, its trace
    context passed on and nothing else of its headers."""
    msg_id = None
    forwarded: dict[str, str] = {}
    for name, value in (headers or {}).items():
        # A header's name in any case: NATS headers are MIME headers, whose names are not
        # case-sensitive, and a client that sends ``nats-msg-id`` means the id as much as one
        # sending ``Nats-Msg-Id``. Dropped, it was stored without one, not deduplicated.
        if name.lower() == _MSG_ID:
            if not 0 < len(value) <= max_id:
                return Refuse(400, f"a message id is 1..{max_id} characters")
            if msg_id is not None and msg_id != f"{who}/{value}":
                return Refuse(400, "two message ids: give one Nats-Msg-Id header")
            msg_id = f"{who}/{value}"
        elif name.lower() in FORWARDED_HEADERS:
            forwarded[name.lower()] = value[:256]
    return Accept(subject, data, msg_id, forwarded or None)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"
