"""A job's trace, and a node's, made from the log as a service folds it.

The log is the truth, so the spans are made from it, once the fold has said what took effect:
each phase a job leaves becomes a span from the log time it entered it to the log time of the
record that moved it on (``queued``: accepted or requeued → admitted; ``waiting for placement``:
admitted → placed; ``starting``: placed → every rank started, the gang's barrier;
``running``; ``checkpointing``; ``preempted``/``interrupted``: stopped → requeued), with the
decision on it as an event (admitted with which quota, placed on which node and GPUs, preempted
for which job, each checkpoint's step, the exit codes, the restart). Each attempt is a span over
its phases, the job a span over its attempts; the node agents hang their workers' runs under the
attempt (``NodeAgent``), and a job's own code under its worker (``TRACEPARENT``). Failures set
the error status (a planned stop, its node's shutdown, is no failure); a preemption links the
beneficiary's trace and each victim's; what a node event interrupted links to that event's span
in the node's trace; a proposal the fold voided is a span marked void, never a span of what it
proposed.

Every replica of every role folds the same log, so who emits a span must be one rule, or the
span would appear once per reader: the role that wrote the record that ends it (only the replica
that wrote it: its ``producer`` is on the record), and for records no deciding role wrote (a node
agent's reports, a client's requests) the holder of the admission lease, which keeps the
lifecycle (it requeues and restarts); node facts (an agent's registration, an administrator's
cordon), the health monitor's holder. Ids come from ``projections/trace_ids.py``, so no
emitter needs another's. The lease changes hands between records, not at them, so every replica
keeps the lease's spans of what it folded until the holder posts how far it traced
(``traced.py``): a new holder emits those after that position, each record's once.

Made only when spans are exported (``tracing.enabled``); the fold's cost is untouched otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.events import codec
from corral.events.base import Decision, Event
from corral.events.decisions import JobsPlaced, PreemptionRequested, ShrinkRequested
from corral.events.jobs import AdmissionWithdrawn, JobRequeued, JobsAdmitted
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    NodeShutdown,
)
from corral.events.queues import CordonNode, DeleteNode
from corral.projections import fold_nodes, trace_ids
from corral.projections.lifecycle import FINAL
from corral.projections.state import JobState, State
from corral.projections.trace_ids import JobTrace
from corral.services.runtime import tracing
from corral.services.runtime.tracing import Event as SpanEvent
from corral.services.runtime.tracing import LinkTo

# The roles that emit spans from the log; anything else written is the lifecycle keeper's.
EMITTERS = ("admission", "placer", "preemptor", "health")
KEEPER = "admission"

# The span a phase becomes when the job leaves it, in an operator's words. ``placed`` and
# ``starting`` are one span: from the placement until every rank has started.
SPAN_OF: dict[str, str] = {
    "queued": "queued",
    "admitted": "waiting for placement",
    "placed": "starting",
    "starting": "starting",
    "running": "running",
    "checkpointing": "checkpointing",
    "preempted": "preempted",
    "interrupted": "interrupted",
}
# Node facts no deciding role wrote (an agent's registration or shutdown, an administrator's
# cordon): the health monitor's, as the node facts it states itself.
_NODE_FACTS = (NodeRegistered, NodeShutdown, CordonNode)
_FAILED = frozenset({"failed", "interrupted", "rejected"})
_VOIDED = {
    JobsAdmitted: "admission void",
    JobsPlaced: "placement void",
    PreemptionRequested: "preemption void",
    ShrinkRequested: "shrink void",
    JobRequeued: "requeue void",
    AdmissionWithdrawn: "withdrawal void",
}


@dataclass
class _Job:
    """What a job's open spans need: where they go and since when each runs."""

    trace: JobTrace
    phase: str
    since: float  # log time it entered ``phase`` (``placed`` for the starting span)
    attempt: int
    attempt_since: float = -1.0  # log time this attempt was queued (-1: not yet accepted)
    events: list[SpanEvent] = field(default_factory=list)  # for the span of the current phase
    # Interrupted by its node's planned shutdown (``NodeShutdown``): an operator's stop, not a
    # failure, so neither the run it cut short nor the attempt it ended is an error. Read from
    # the job (``_shut_down``), not from the record that stopped it, which a replica started
    # from a snapshot never saw.
    planned: bool = False
    # Sent away by its node's drain (the fold moves it as a preemption's victim, for nobody):
    # its spans say it was drained, not preempted.
    drained: bool = False


def _attrs(job: JobState) -> dict[str, Any]:
    spec = job.spec
    return {
        "corral.job.id": job.id,
        "corral.queue": spec.queue,
        "corral.tenant": job.tenant,
        "corral.gpus": spec.replicas * spec.resources.gpus,
        "corral.replicas": spec.replicas,
        "corral.priority_class": spec.priority_class,
    }


def writer_of(record: Record, body: Event) -> tuple[str, str]:
    """(role, producer) of a record: a client's request has no producer."""
    if not record.subject.startswith("corral.ev."):
        return ("client", "")
    producer = codec.decode_envelope(record.data).producer
    return (producer.split("@", 1)[0].split("/", 1)[0], producer)


class JobTraces:
    """The spans role ``role`` emits while it folds; ``producer`` names this replica's records.
    The spans that are the lease holder's wait in ``pending`` for the shell to hand them out."""

    def __init__(self, role: str, producer: str) -> None:
        self.role = role
        self.producer = producer
        self.live = False  # silent while replaying history: those spans were emitted then
        self.jobs: dict[str, _Job] = {}
        self.nodes: dict[str, tuple[str, float]] = {}  # node -> (condition, since)
        # The spans of records no deciding role wrote are the lease holder's, and the lease may
        # change hands between any two records: they wait here, by the record's log sequence,
        # until the shell hands them out (``emit_pending``) as the holder, past the position the
        # previous holder traced, or drops them (``drop_pending``) as a standby once the holder
        # says it traced them (``traced.py``).
        self.pending: list[tuple[int, dict[str, Any]]] = []
        # Before going live (replaying history), the lease's spans of records after this
        # sequence are kept too: the holder that traced up to here may be gone (None: unknown).
        self.resume_after: int | None = None
        self._seq = 0  # the record being folded
        self._held = False  # ... and whether its spans wait for the lease (``pending``)

    # -- what it keeps ---------------------------------------------------------------------------

    def seed(self, state: State) -> None:
        """Take up the unfinished jobs of a state loaded from a snapshot."""
        for job in state.jobs.values():
            if job.phase not in FINAL and job.id not in self.jobs:
                self.jobs[job.id] = self._new(job, job.phase_since)
        for name, node in state.nodes.items():
            self.nodes.setdefault(name, (node.condition, state.time))

    def _new(self, job: JobState, since: float) -> _Job:
        trace = trace_ids.job_trace(job.id, job.submitted_seq, job.traceparent)
        # A job taken up from a snapshot has its attempt's start from the fold, as it was folded.
        attempt_since = -1.0 if job.phase == "submitted" else job.attempt_since
        out = _Job(trace, job.phase, since, job.attempt, attempt_since)
        out.drained = job.phase in ("checkpointing", "preempted") and _drained(job)
        out.planned = job.phase == "interrupted" and _shut_down(job)
        return out

    # -- one record --------------------------------------------------------------------------------

    def folded(self, state: State, record: Record, rejected_before: int) -> None:
        """``record`` has just been folded into ``state`` (which had ``rejected_before``
        rejections before it)."""
        try:
            body = codec.decode_body(record.subject, record.data, record.headers).body
        except codec.UNREADABLE:
            return
        role, producer = writer_of(record, body)
        owner = role if role in EMITTERS else ("health" if isinstance(body, _NODE_FACTS) else KEEPER)
        seq, t = record.seq, record.time
        self._seq, self._held = seq, owner == self.role and role != self.role
        if owner != self.role:
            mine = False
        elif role == self.role:
            mine = producer == self.producer and self.live
        else:
            mine = self.live or (self.resume_after is not None and seq > self.resume_after)
        if state.rejected_total > rejected_before:
            rejection = state.rejections[-1]
            if rejection.code == "void" and mine:
                self._void(state, record, body, rejection.voided or ((rejection.job_id, rejection.message),))
            if rejection.code != "void" or not rejection.voided:
                return  # refused whole: nothing moved
        if isinstance(body, DeleteNode) and body.node not in state.nodes:
            # Gone for good: kept, every node name a cluster ever had would be, in every role.
            self.nodes.pop(body.node, None)
        node_link = self._node_fact(state, record, body, mine)
        for job in _moved(state, seq):
            self._moved(state, job, record, body, mine, node_link)
        if isinstance(body, CheckpointCompleted):
            open_ = self.jobs.get(body.job_id)
            if open_ is not None and open_.attempt == body.attempt:
                open_.events.append(
                    SpanEvent(
                        "checkpoint", t, {"corral.checkpoint.step": body.step, "corral.node": body.node}
                    )
                )
        elif isinstance(body, (PreemptionRequested, ShrinkRequested)) and mine:
            self._preemption(state, record, body)

    # -- spans out ----------------------------------------------------------------------------------

    def _emit(self, name: str, **span: Any) -> None:
        if self._held:
            self.pending.append((self._seq, {"name": name, **span}))
        else:
            tracing.emit(self.role, name, **span)

    def emit_pending(self, after: int) -> int:
        """Emit the lease's spans of records after log sequence ``after`` (this replica holds
        the lease); those up to it the previous holder emitted. Returns how many."""
        out = [span for seq, span in self.pending if seq > after]
        self.pending = []
        for span in out:
            tracing.emit(self.role, span.pop("name"), **span)
        return len(out)

    def drop_pending(self, upto: int) -> None:
        """The holder has emitted the lease's spans of records up to ``upto``."""
        if self.pending and self.pending[0][0] <= upto:
            self.pending = [(seq, span) for seq, span in self.pending if seq > upto]

    # -- a job moved -------------------------------------------------------------------------------

    def _moved(
        self, state: State, job: JobState, record: Record, body: Event, mine: bool, node_link: LinkTo | None
    ) -> None:
        t, seq = record.time, record.seq
        open_ = self.jobs.get(job.id)
        if open_ is None:
            self.jobs[job.id] = self._new(job, t)
            return
        before, attempt = open_.phase, open_.attempt
        if job.phase == before and job.attempt == attempt:
            return
        trace = open_.trace
        attrs = {**_attrs(job), "corral.attempt": attempt}
        if job.phase == "interrupted" and before != "interrupted":
            open_.planned = _shut_down(job)
        if job.phase in ("checkpointing", "preempted") and before not in ("checkpointing", "preempted"):
            open_.drained = _drained(job)
        name = SPAN_OF.get(before)
        same_span = name is not None and SPAN_OF.get(job.phase) == name and job.attempt == attempt
        if name is not None and not same_span:
            name = _named(name, job, open_.drained)
            events = [*open_.events, *self._decision(job, before, t, open_.drained)]
            links: list[LinkTo] = []
            if node_link is not None:
                links.append(node_link)
            if job.phase == "checkpointing" or (job.phase == "preempted" and before != "checkpointing"):
                ben = state.jobs.get(job.preempted_for)
                if ben is not None:
                    bt = trace_ids.job_trace(ben.id, ben.submitted_seq, ben.traceparent)
                    links.append(LinkTo(bt.trace_id, bt.job_span, {"corral.link": "preempted for"}))
            failed = job.phase in _FAILED and not (job.phase == "interrupted" and open_.planned)
            error = _reason(job) if failed and name in ("running", "starting") else ""
            if mine:
                self._emit(
                    name,
                    trace_id=trace.trace_id,
                    span_id=trace.record_span(seq),
                    parent=trace.attempt_span(attempt),
                    start=open_.since,
                    end=t,
                    attributes={**attrs, **_where(job, name)},
                    events=events,
                    links=links,
                    error=error,
                )
        if not same_span:  # the next phase's span starts here (``submitted`` had none)
            open_.events = []
            open_.since = t
        open_.phase = job.phase
        if (job.attempt != attempt or job.phase in FINAL) and open_.attempt_since >= 0 and mine:
            self._emit(
                f"attempt {attempt}",
                trace_id=trace.trace_id,
                span_id=trace.attempt_span(attempt),
                parent=trace.job_span,
                start=open_.attempt_since,
                end=t,
                attributes={
                    **attrs,
                    "corral.outcome": _named(
                        before if job.phase == "queued" else job.phase, job, open_.drained
                    ),
                },
                error=_reason(job)
                if (before == "interrupted" and not open_.planned) or job.phase == "failed"
                else "",
            )
        if job.attempt != attempt or (job.phase == "queued" and open_.attempt_since < 0):
            open_.attempt, open_.attempt_since = job.attempt, t
            open_.drained = False
        if job.phase in FINAL:
            del self.jobs[job.id]
            if mine:
                self._emit(
                    f"job {job.id}",
                    trace_id=trace.trace_id,
                    span_id=trace.job_span,
                    parent=trace.submit_span,
                    start=job.submitted_at,
                    end=t,
                    attributes={
                        **_attrs(job),
                        "corral.phase": job.phase,
                        "corral.attempt": job.attempt,
                        "corral.restarts": job.restarts,
                        "corral.preemptions": job.preemptions,
                        "corral.reason": _reason(job),
                    },
                    events=[SpanEvent(job.phase, t, {"corral.reason": _reason(job)})],
                    error=_reason(job) if job.phase in _FAILED else "",
                )

    def _decision(self, job: JobState, before: str, t: float, drained: bool) -> list[SpanEvent]:
        """The decision that ended the span of ``before``, as an event on it (``drained``: the
        job is leaving its node's drain)."""
        after = job.phase
        if after == "admitted" and job.admission is not None:
            adm = job.admission
            quota = {f"corral.quota.{key}": gpus for key, gpus in sorted(adm.gpus.items())}
            return [SpanEvent("admitted", t, {"corral.replicas": adm.replicas, **quota})]
        if after == "placed" and job.placement is not None:
            return [
                SpanEvent(
                    "placed",
                    t,
                    {
                        "corral.rank": w.rank,
                        "corral.node": w.node,
                        "corral.gpu.index": [g.gpu for g in w.gpus],
                    },
                )
                for w in job.placement.workers
            ]
        if drained and (after == "checkpointing" or (after == "preempted" and before != "checkpointing")):
            return [SpanEvent("drained", t, {"corral.reason": _reason(job)})]
        if after == "checkpointing" or (after == "preempted" and before != "checkpointing"):
            return [SpanEvent("preempted", t, {"corral.preempted_for": job.preempted_for})]
        if after == "queued" and before in ("preempted", "interrupted"):
            resume = job.checkpoint.location if job.checkpoint is not None else ""
            return [SpanEvent("requeued", t, {"corral.attempt": job.attempt, "corral.resume_from": resume})]
        if after == "queued" and before == "admitted":
            return [SpanEvent("admission withdrawn", t, {"corral.reason": _reason(job)})]
        if after == "running":
            return [SpanEvent("all ranks started", t)]
        out = []
        for rank, code in sorted(job.exit_codes.items()):
            out.append(SpanEvent("exited", t, {"corral.rank": rank, "corral.exit_code": code}))
        if after in ("interrupted", "failed", "cancelled", "preempted"):
            restart = {"corral.restarts": job.restarts} if after == "interrupted" else {}
            said = "stopped" if drained and after == "preempted" else after
            out.append(SpanEvent(said, t, {"corral.reason": _reason(job), **restart}))
        return out

    # -- decisions about several jobs ------------------------------------------------------------

    def _preemption(self, state: State, record: Record, body: PreemptionRequested | ShrinkRequested) -> None:
        """The preemption in the beneficiary's trace, linked to each victim's attempt."""
        ben = state.jobs.get(body.beneficiary)
        if ben is None:
            return
        bt = trace_ids.job_trace(ben.id, ben.submitted_seq, ben.traceparent)
        victims = (
            [(v.job_id, v.attempt) for v in body.victims]
            if isinstance(body, PreemptionRequested)
            else [(body.job_id, body.attempt)]
        )
        links, events = [], []
        for job_id, attempt in victims:
            victim = state.jobs.get(job_id)
            if victim is None:
                continue
            vt = trace_ids.job_trace(victim.id, victim.submitted_seq, victim.traceparent)
            if isinstance(body, ShrinkRequested):
                # The shrunk job runs on, so no phase of it ends here: the shrink is a span of
                # its own in its trace, and the beneficiary's span links to it.
                self._shrunk(record, body, victim, vt, bt)
                links.append(LinkTo(vt.trace_id, vt.record_span(record.seq), {"corral.link": "shrunk"}))
            else:
                links.append(LinkTo(vt.trace_id, vt.attempt_span(attempt), {"corral.link": "victim"}))
            events.append(
                SpanEvent("victim", record.time, {"corral.job.id": job_id, "corral.attempt": attempt})
            )
        kind = "preemption" if isinstance(body, PreemptionRequested) else "shrink"
        self._emit(
            kind,
            trace_id=bt.trace_id,
            span_id=bt.record_span(record.seq),
            parent=bt.attempt_span(ben.attempt),
            start=min(body.now, record.time),
            end=record.time,
            attributes={
                **_attrs(ben),
                "corral.attempt": ben.attempt,
                "corral.victims": [j for j, _ in victims],
                "corral.checkpoint.deadline_s": max(0.0, body.deadline - body.now),
            },
            events=events,
            links=links,
        )

    def _shrunk(
        self, record: Record, body: ShrinkRequested, job: JobState, trace: JobTrace, beneficiary: JobTrace
    ) -> None:
        """A shrink in the shrunk job's trace: which ranks leave, for which job, by when."""
        reason = f"shrunk to {body.replicas} ranks for job {body.beneficiary}"
        self._emit(
            "shrink",
            trace_id=trace.trace_id,
            span_id=trace.record_span(record.seq),
            parent=trace.attempt_span(body.attempt),
            start=min(body.now, record.time),
            end=record.time,
            attributes={
                **_attrs(job),
                "corral.attempt": body.attempt,
                "corral.replicas": body.replicas,
                "corral.ranks.leaving": list(job.leaving),
                "corral.shrunk_for": body.beneficiary,
                "corral.reason": reason,
                # its own grace, which the fold may have cut below the record's
                "corral.checkpoint.deadline_s": max(0.0, job.preempt_deadline - record.time),
            },
            events=[SpanEvent("shrunk", record.time, {"corral.shrunk_for": body.beneficiary})],
            links=[LinkTo(beneficiary.trace_id, beneficiary.job_span, {"corral.link": "shrunk for"})],
        )

    def _void(self, state: State, record: Record, body: Event, items: tuple[tuple[str, str], ...]) -> None:
        """What the fold voided of this replica's own proposal: a span that says so."""
        name = _VOIDED.get(type(body), f"{type(body).__name__} void")
        start = min(body.now, record.time) if isinstance(body, Decision) else record.time
        for job_id, why in items:
            job = state.jobs.get(job_id)
            if job is None:
                continue
            trace = trace_ids.job_trace(job.id, job.submitted_seq, job.traceparent)
            self._emit(
                name,
                trace_id=trace.trace_id,
                span_id=trace.record_span(record.seq),
                parent=trace.attempt_span(job.attempt),
                start=start,
                end=record.time,
                attributes={
                    **_attrs(job),
                    "corral.attempt": job.attempt,
                    "corral.void": True,
                    "corral.reason": why,
                },
            )

    # -- nodes ---------------------------------------------------------------------------------------

    def _node_fact(self, state: State, record: Record, body: Event, mine: bool) -> LinkTo | None:
        """A node's fact as a span of the node's trace; the link the jobs it interrupts carry."""
        t = record.time
        if isinstance(body, NodeRegistered):
            first = body.node not in self.nodes
            if first:  # an agent back keeps its node's condition until the health monitor says
                self.nodes[body.node] = ("ready", t)
            if first and mine:
                nt = trace_ids.node_trace(body.node)
                self._emit(
                    f"node {body.node}",
                    trace_id=nt.trace_id,
                    span_id=nt.node_span,
                    start=t,
                    end=t,
                    attributes={"corral.node": body.node, "corral.gpus": len(body.inventory.gpus)},
                )
            return None
        events: list[SpanEvent] = []
        fact = ""  # what the runs it interrupted link to it as, if not its name
        if isinstance(body, NodeConditionChanged):
            # The condition the node leaves is a span from when it entered it, named for it, as a
            # job's phase is: a span named for the new one would time the old. The change is its
            # event, and names the links of the runs it interrupted.
            node, fact = body.node, f"node {body.condition}"
            before, since = self.nodes.get(node, ("ready", t))
            self.nodes[node] = (body.condition, t)
            name, start = f"node {before}", since
            attrs: dict[str, Any] = {
                "corral.reason": body.reason,
                "corral.node.condition.after": body.condition,
            }
            events = [SpanEvent(body.condition, t, {"corral.reason": body.reason})]
        elif isinstance(body, GpuHealthChanged):
            node, start = body.node, t
            name = f"GPU {body.gpu} {'healthy' if body.healthy else 'unhealthy'}"
            attrs = {"corral.gpu.index": body.gpu, "corral.gpu.signal": body.signal}
        elif isinstance(body, (NodeCordoned, CordonNode)):
            node, start = body.node, t
            name = (
                "draining"
                if body.cordoned and body.drain
                else ("cordoned" if body.cordoned else "uncordoned")
            )
            attrs = {"corral.reason": body.reason}
        elif isinstance(body, NodeShutdown):
            node, start, name = body.node, t, "node shut down"
            attrs = {"corral.reason": body.reason}
        else:
            return None
        nt = trace_ids.node_trace(node)
        span_id = nt.record_span(record.seq)
        if mine:
            error = name in ("node lost", "node suspect") or (
                isinstance(body, GpuHealthChanged) and not body.healthy
            )
            self._emit(
                name,
                trace_id=nt.trace_id,
                span_id=span_id,
                parent=nt.node_span,
                start=start,
                end=t,
                attributes={"corral.node": node, **attrs},
                events=events,
                error=name if error else "",
            )
        return LinkTo(nt.trace_id, span_id, {"corral.link": fact or name, "corral.node": node})


def _moved(state: State, seq: int) -> list[JobState]:
    """The jobs record ``seq`` changed (it is the one just folded): a job that moved was put
    last in its phase's index, so each phase's tail holds them (``projections/indexes.py``)."""
    jobs = state.jobs
    out = []
    for ids in state.jobs_by_phase.values():
        for job_id in reversed(ids):
            job = jobs[job_id]
            if job.updated_seq != seq:
                break
            out.append(job)
    return out


def _named(span: str, job: JobState, drained: bool) -> str:
    """``span`` as what happened to ``job`` (``SPAN_OF``'s names follow the fold's phases): one
    that cannot checkpoint was asked to stop, not to checkpoint, and a drain's "preempted" waits
    for no job (a drain is no preemption)."""
    if span == "checkpointing" and not job.spec.checkpointable:
        return "stopping"
    if span == "preempted" and drained:
        return "drained"
    return span


def _drained(job: JobState) -> bool:
    """Whether ``job`` stops because its node drains (``fold_nodes.drain_jobs``)."""
    return bool(job.reasons) and job.reasons[0].code == "drained"


def _shut_down(job: JobState) -> bool:
    """Whether ``job`` was interrupted by a planned shutdown of a node it ran on: the reason
    the fold gives it then (``fold_nodes.SHUT_DOWN``), which it keeps until it is requeued."""
    return bool(job.reasons) and job.reasons[0].code == fold_nodes.SHUT_DOWN


def _reason(job: JobState) -> str:
    return job.reasons[0].message if job.reasons else ""


def _where(job: JobState, span: str) -> dict[str, Any]:
    """Where the span's work ran: the nodes of its placement."""
    if span not in ("starting", "running", "checkpointing", "stopping") or job.placement is None:
        return {}
    return {"corral.node": sorted({w.node for w in job.placement.workers})}
