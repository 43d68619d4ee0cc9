"""Each job's history in the log: which jobs a record concerns, what it says about each of them in
an operator's words, and whether the fold refused it.

Pure: the query view stores these entries, and ``corral explain`` can compute them just as well
over an exported log with no database at all.

A record concerns a job if it is a request naming it, an event with its ``job_id``, or a decision
listing it (admissions, placements, unschedulable jobs, a preemption's beneficiary and victims).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

import msgspec

from corral.events import codec, subjects
from corral.events.base import Event, Reason
from corral.events.codec import DecodeError
from corral.events.decisions import (
    JobsPlaced,
    JobsUnschedulable,
    PreemptionRequested,
    ShrinkRequested,
    Victim,
)
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    CancelJob,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
    ResizeJob,
    Resources,
    SubmitJob,
    said_reason,
)
from corral.events.log import Record
from corral.events.nodes import CheckpointCompleted, NodeCordoned, WorkerExited, WorkerStarted
from corral.events.queues import CordonNode
from corral.events.routing import job_ids as job_ids_of
from corral.projections import indexes, quota, visibility
from corral.projections.shape import Shape, workers_text
from corral.projections.state import WHOLE, Rejection, State

__all__ = ["JobEvent", "deadline_text", "job_events", "job_ids_of", "summarize"]


class JobEvent(msgspec.Struct, frozen=True):
    """A record concerning one job. ``refused`` is the fold's ``code: message`` when it refused
    the record (or this job's part of a batch decision), else empty."""

    job_id: str
    seq: int
    subject: str
    type: str
    time: float
    summary: str
    refused: str


def job_events(state: State, records: Sequence[Record], refusals: Mapping[int, Rejection]) -> list[JobEvent]:
    """The entries of ``records``, which ``state`` has just folded, ``refusals`` saying which of
    them the fold refused (``fold_refusals``). Undecodable records concern no job anyone can
    name."""
    out: list[JobEvent] = []
    for rec in records:
        body, tenant = _decode(rec)
        if body is None:
            continue
        refusal = refusals.get(rec.seq)
        if isinstance(body, WorkerStarted) and body.failed and refusal is None:
            # A start that failed is no start: its exit, next, says the rank could not start.
            # One the fold refused has no exit taken to say so, and is kept, marked, as any.
            continue
        kind = type(body).__name__
        batch = batch_lines(body, _resources_in(state)) if isinstance(body, BATCHES) else None
        drained = _drained(state, body, rec.seq) if refusal is None else {}
        for job_id in drained or job_ids_of(body):
            if job_id in drained:
                out.append(JobEvent(job_id, rec.seq, rec.subject, kind, rec.time, drained[job_id], ""))
                continue
            if tenant is not None and not _may_speak_of(state, tenant, job_id, body):
                continue
            # A job's history is its owner's to read: other tenants' jobs are not named in it.
            owner = state.jobs[job_id].tenant if job_id in state.jobs else None
            named = _named_for(state, owner) if isinstance(body, _OF_OTHERS) else None
            refused = _refused(refusal, body, job_id, named)
            due = None if refused else _own_deadline(state, job_id, body)
            current = state.jobs[job_id].attempt if job_id in state.jobs else None
            checkpoints = job_id not in state.jobs or state.jobs[job_id].spec.checkpointable
            summary = summarize(body, job_id, batch, named, due, current, checkpoints)
            out.append(JobEvent(job_id, rec.seq, rec.subject, kind, rec.time, summary, refused))
    return out


def _drained(state: State, body: Event, seq: int) -> dict[str, str]:
    """A drain's line for each job it sent away from its node (``fold_nodes.drain_jobs``), by job
    id: a record of the node's names none of them, and their histories said nothing of the drain
    until they were requeued. The jobs are those still on the node with the drain's reason once
    its batch is folded (one that stopped within the batch too is told of by its requeue), this
    node's, and changed by the record at ``seq`` or later: a job an earlier drain sent away (of
    this node, or of another it holds GPUs on too) keeps its deadline, and a drain that asks
    nothing more of it is no line of its history."""
    if not isinstance(body, CordonNode | NodeCordoned) or not (body.cordoned and body.drain):
        return {}
    out = {}
    this = f"node {body.node} is draining:"
    for job in indexes.holding_on(state, body.node):
        why = job.reasons[0] if job.reasons else None
        if why is None or why.code != "drained" or job.updated_seq < seq or not why.message.startswith(this):
            continue
        if job.phase == "checkpointing" and job.preempt_deadline and job.spec.checkpointable:
            out[job.id] = (
                f"asked to checkpoint and leave by {deadline_text(job.preempt_deadline)}: {why.message}"
            )
        else:  # one that does not checkpoint is stopped at once: nothing of it to save
            out[job.id] = f"stopped: {why.message}"
    return out


def _own_deadline(state: State, job_id: str, body: Event) -> float | None:
    """The log time by which the fold gave ``job_id`` to checkpoint or shrink for the preemption
    or shrink ``body`` it just took (each victim its own grace, ``fold_preemption.victim_deadline``);
    None for any other record."""
    if not isinstance(body, _OF_OTHERS) or job_id == body.beneficiary:
        return None
    job = state.jobs.get(job_id)
    if job is None or job.preempted_for != body.beneficiary or not job.preempt_deadline:
        return None
    return job.preempt_deadline


def _by(deadline: float, due: float | None) -> str:
    """When a victim is due: its own deadline, else the record's (its victims' longest grace)."""
    return deadline_text(due) if due is not None else f"{deadline_text(deadline)} at the latest"


def _named_for(state: State, owner: str | None) -> Callable[[str], str]:
    """How the history of a job of ``owner`` names another job (``visibility.job_named``)."""
    jobs = state.jobs
    return lambda other: visibility.job_of(jobs, other, owner) if owner is not None else visibility.OTHER_JOB


def _decode(rec: Record) -> tuple[Event | None, str | None]:
    """The record's body and, for a request, the tenant it came from."""
    try:
        decoded = codec.decode_body(rec.subject, rec.data, rec.headers)
    except DecodeError:
        return None, None
    return decoded.body, decoded.tenant


def _may_speak_of(state: State, tenant: str, job_id: str, body: Event) -> bool:
    """A tenant's request joins a job's history only if the job is that tenant's: another
    tenant's refused attempt on it is not its owner's business, nor theirs to learn of."""
    if tenant == subjects.ADMIN:
        return True
    job = state.jobs.get(job_id)
    if job is None:
        return isinstance(body, SubmitJob)  # a submit refused outright, e.g. for a bad id
    return job.tenant == tenant


def _refused(rej: Rejection | None, body: Event, job_id: str, named: Callable[[str], str] | None) -> str:
    if rej is None:
        return ""
    if named is not None and any(named(j) != j for j in job_ids_of(body)):
        # Why the fold refused a decision about several jobs names them, another tenant's too.
        return f"{rej.code}: refused by the fold"
    if rej.code == "void" and isinstance(body, JobsAdmitted | JobsPlaced):
        # Batches are arbitrated item by item: only the items the fold voided were refused.
        why = next((why for voided, why in rej.voided if voided == job_id), None)
        return "" if why is None else f"void: {why}"
    return f"{rej.code}: {rej.message}"


# -- summaries --------------------------------------------------------------------------------


def _reasons_text(reasons: Iterable[Reason]) -> str:
    return "; ".join(f"{r.code}: {r.message}" for r in reasons) or "no reason given"


_WORD = re.compile(r"(?<!^)(?=[A-Z])")


BATCHES = (JobsAdmitted, JobsPlaced, JobsUnschedulable)  # decisions that speak of many jobs


def summarize(
    body: Event,
    job_id: str,
    batch: Mapping[str, str] | None = None,
    named: Callable[[str], str] | None = None,
    due: float | None = None,
    current: int | None = None,
    checkpoints: bool = True,
) -> str:
    """One line on what ``body`` says about job ``job_id``; for a batch decision, ``batch`` is its
    ``batch_lines`` when the caller has them already (a record of a few hundred jobs is then read
    once, not once per job). ``named`` says how to name the other jobs of a decision that speaks
    of several (a preemption's, a shrink's) to whoever reads the line; by their ids if None.
    ``due``: the log time the fold gave a victim of a preemption or shrink (else the record's
    deadline, the longest of its victims', is told as the latest). ``current``: the job's
    attempt now; a worker's report of an earlier one (a late exit of a worker of an attempt
    already over) names its attempt, else it reads as the current attempt's. ``checkpoints``:
    whether the job can checkpoint; a victim that cannot is asked to stop (its agent stops its
    workers at once), not to checkpoint."""
    name = _by_id if named is None else named
    asked = "asked to checkpoint and" if checkpoints else "asked to stop and"
    if isinstance(body, BATCHES):
        line = (batch_lines(body) if batch is None else batch).get(job_id)
        return line if line is not None else _generic(body)
    match body:
        case SubmitJob(job=spec):
            worker = Shape.of(spec.resources).gpus_short()
            elastic = f"{spec.min_replicas}..{spec.replicas}" if spec.min_replicas else f"{spec.replicas}"
            return f"submitted to queue {spec.queue}: {elastic} × {worker}"
        case CancelJob():
            return "cancel requested" + (f": {said_reason(body.reason)}" if body.reason else "")
        case ResizeJob():
            return f"resize to at most {body.replicas} workers requested"
        case JobAccepted():
            return f"accepted at priority {body.priority}"
        case JobPriorityChanged():
            return f"priority {body.priority}: {_reasons_text([body.reason])}"
        case JobRejected():
            return f"rejected: {_reasons_text([body.reason])}"
        case PendingReasonChanged():
            return f"pending: {_reasons_text(body.reasons)}"
        case AdmissionWithdrawn() if body.reason.code == "growth-timeout":
            return f"growth withdrawn, running on: {_reasons_text([body.reason])}"
        case AdmissionWithdrawn():
            return f"admission withdrawn, back in its queue: {_reasons_text([body.reason])}"
        case JobRequeued() if body.reason.code == "requeued":
            # Admission's reason says why, back where, for which attempt and from which step.
            at = f"; checkpoint {said_reason(body.resume_from)}" if body.resume_from else ""
            return f"requeued: {body.reason.message}{at}"
        case JobRequeued():
            resume = f", resuming from {said_reason(body.resume_from)}" if body.resume_from else ""
            return f"requeued for attempt {body.attempt + 1}: {_reasons_text([body.reason])}{resume}"
        case PreemptionRequested() if body.moves:
            # A consolidation: its victims run on elsewhere, moved to make room, not preempted.
            if job_id == body.beneficiary:
                return f"room made on its behalf by moving {_listed(body.victims, name)}"
            by, whom = _by(body.deadline, due), name(body.beneficiary)
            return f"{asked} move elsewhere, to make room for {whom}, by {by}"
        case PreemptionRequested():
            if job_id == body.beneficiary:
                return f"preemption requested on its behalf: victims {_listed(body.victims, name)}"
            by = _by(body.deadline, due)
            return f"{asked} yield to {name(body.beneficiary)} by {by}"
        case ShrinkRequested():
            if job_id == body.beneficiary:
                return f"shrink of {name(body.job_id)} to {body.replicas} workers requested on its behalf"
            by = _by(body.deadline, due)
            whom = name(body.beneficiary)
            return f"asked to shrink to {body.replicas} workers for {whom} by {by}"
        case WorkerStarted() if body.failed:
            return f"{_rank(body, current)} could not start on {body.node}"
        case WorkerStarted():
            return f"{_rank(body, current)} started on {body.node}"
        case WorkerExited() if body.start_error and body.code and not body.stopped and not body.node_fault:
            return f"{_rank(body, current)} could not start on {body.node}: {said_reason(body.start_error)}"
        case WorkerExited() if body.node_fault and body.code and not body.stopped:
            # A start the node failed: not the job's exit (127 reads as its command not found).
            why = said_reason(body.node_fault)
            return f"{_rank(body, current)} could not start on {body.node}, the node's own fault: {why}"
        case WorkerExited():
            how = "stopped" if body.stopped else "exited"
            return f"{_rank(body, current)} {how} with code {body.code} on {body.node}"
        case CheckpointCompleted():
            # The location as any agent sent it, refused or not: one line's worth of it.
            earlier = f" of earlier attempt {body.attempt}" if _earlier(body.attempt, current) else ""
            return f"checkpoint{earlier} at step {body.step}: {said_reason(body.location)}"
    return _generic(body)


def _earlier(attempt: int, current: int | None) -> bool:
    return current is not None and attempt < current


def _rank(body: WorkerStarted | WorkerExited, current: int | None) -> str:
    """The worker a report is of: its rank, and its attempt where that is over (a late report,
    its job requeued since, would read as the attempt that runs now)."""
    if _earlier(body.attempt, current):
        return f"rank {body.rank} of earlier attempt {body.attempt}"
    return f"rank {body.rank}"


def _by_id(job_id: str) -> str:
    return job_id


def _listed(victims: Sequence[Victim], name: Callable[[str], str]) -> str:
    """The victims by the names ``name`` gives, those it does not name counted."""
    shown = [v.job_id for v in victims if name(v.job_id) == v.job_id]
    hidden = sum(1 for v in victims if name(v.job_id) != v.job_id)
    if hidden:
        shown.append(visibility.OTHER_JOB if hidden == 1 else f"{hidden} jobs of other tenants")
    return ", ".join(shown)


# The records whose lines name jobs other than the one whose history they join.
_OF_OTHERS = (PreemptionRequested, ShrinkRequested)


def _resources_in(state: State) -> Callable[[str], Resources | None]:
    """What each job of ``state`` asks of a worker, by id (None: a job it does not hold)."""
    jobs = state.jobs
    return lambda job_id: jobs[job_id].spec.resources if job_id in jobs else None


def _held(a: Admission, resources: Resources | None) -> str:
    """What an admission holds of quota, as ``quota.holding`` charges it where the job's worker is
    known: a share of a GPU or a MIG slice for what it is (``Admission.gpus`` rounds it up to a
    whole GPU, and "holding 1 GPU" read as four times what a quarter GPU's queue is charged);
    else the whole GPUs the admission records. The key ``*`` is any model: "4 GPUs", not "4 *"."""
    if resources is not None and len(a.gpus) == 1:
        ((key, _),) = a.gpus.items()
        return quota.gpus_text(quota.worker_milli(resources, key) * a.replicas, key)
    return ", ".join(quota.gpus_text(n * WHOLE, m) for m, n in sorted(a.gpus.items()))


def batch_lines(
    body: JobsAdmitted | JobsPlaced | JobsUnschedulable,
    resources: Callable[[str], Resources | None] | None = None,
) -> dict[str, str]:
    """A batch decision's line per job it speaks of, each item read once (a job listed twice
    reads as its first item; an admission before a growth). ``resources``: what each job asks of
    a worker, where the caller knows it (``_held``)."""
    lines: dict[str, str] = {}
    match body:
        case JobsAdmitted():
            for a in body.admissions:
                if a.job_id not in lines:
                    held = _held(a, None if resources is None else resources(a.job_id))
                    quota_held = f"holding {held} of quota" if held else "no GPU quota"
                    workers = workers_text(a.replicas)
                    lines[a.job_id] = f"admitted attempt {a.attempt}: {workers}, {quota_held}"
            for g in body.growths:
                lines.setdefault(g.job_id, f"grown to {g.replicas} workers")
        case JobsPlaced():
            for p in body.placements:
                if p.job_id not in lines:
                    nodes = ", ".join(sorted({w.node for w in p.workers}))
                    n = len(p.workers)
                    workers = f"{n} worker{'s' if n != 1 else ''}"
                    lines[p.job_id] = f"placed attempt {p.attempt}: {workers} on {nodes}"
        case JobsUnschedulable():
            for u in body.jobs:
                lines.setdefault(u.job_id, f"unschedulable: {_reasons_text(u.reasons)}")
    return lines


def _generic(body: Event) -> str:
    return _WORD.sub(" ", type(body).__name__).lower()


def deadline_text(t: float) -> str:
    """A deadline as a person reads it: a UTC time of day (a simulated log that starts at 0: its
    seconds since the start)."""
    if t < 1e9:
        return f"t={t:.0f}s"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def expected_text(t: float) -> str:
    """A projected time as a person reads it (``deadline_text``), up to the next whole minute: a
    projection that moves by seconds from cycle to cycle says the same, and its reason is not
    written again each time (a simulated log's, to the second, as its tests read it)."""
    return deadline_text(t if t < 1e9 else math.ceil(t / 60) * 60)
