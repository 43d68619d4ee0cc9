"""The fold: ``apply(state, record) -> state``, the one function that turns the log into state.

Every service, the CLI, replay and the simulator use it, so every reader agrees on the state at
any sequence. It is deterministic (no clock, no IO, no randomness: time comes from the log) and
total: malformed payloads, unknown types, forbidden writers, illegal transitions and proposals
that no longer hold become recorded rejections, and the fold moves on.

Proposals are arbitrated here. A placement, an admission or a preemption is checked against the
state at its position in the log; if it no longer holds it is recorded void and changes nothing,
so a GPU is never held twice whatever races happen between writers.

``apply`` updates ``state`` in place and returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from events import codec, routing
from events import subjects as subj
from events.base import Event, Reason
from events.codec import DecodeError
from events.decisions import JobsPlaced, JobsUnschedulable, PreemptionRequested, ShrinkRequested
from events.jobs import (
    Admission,
    CancelJob,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
    ResizeJob,
    SubmitJob,
)
from events.log import Record
from events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from events.queues import ApplyCohort, ApplyPriorityClass, ApplyQueue, CordonNode, DeleteQueue
from projections import claims, quota
from projections.lifecycle import (
    FINAL,
    HOLDS_QUOTA,
    TRANSITIONS,
    TRIGGERS,
    IllegalTransition,
    Phase,
    Trigger,
)
from projections.state import (
    MAX_REJECTIONS,
    Checkpoint,
    GpuState,
    JobState,
    NodeState,
    Rejection,
    State,
)

MAX_PREEMPTION_TIMES = 32  # enough for any per-hour cap a priority class sets


class Refused(Exception):
    """Raised by a handler to record a rejection of the current record."""

    def __init__(self, code: str, message: str, job_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.job_id = job_id


class Ctx(msgspec.Struct, gc=False):
    """Where the record being folded came from (a Struct: one is made per record)."""

    seq: int
    subject: str
    time: float
    tenant: str | None
    trace: str | None = None  # W3C traceparent the writer sent: a job's trace starts at its submit


def fold(records: Iterable[Record], state: State | None = None) -> State:
    state = State() if state is None else state
    for r in records:
        apply(state, r)
    return state


def apply(state: State, record: Record) -> State:
    seq = record.seq
    if seq <= state.seq:
        return state  # already folded (a redelivery, or a snapshot ahead of this record)
    state.seq = seq
    time = record.time
    if time > state.time:
        state.time = time
    subject = record.subject
    body: Event
    try:
        if subject.startswith("corral.ev."):
            try:  # most records: a service event of the current schema
                env = _decode_current_envelope(record.data)
                body, tenant, trace = env.body, None, env.traceparent
            except (msgspec.DecodeError, msgspec.ValidationError):  # upcast, or refused as malformed
                body, tenant, trace = _decode_record(subject, record.data, record.headers)
        else:
            body, tenant, trace = _decode_record(subject, record.data, record.headers)
        # ``_dispatch``, for what the decoder gives: one of corral's types, its key a str.
        handler, home, key_of = _ROUTES[type(body)]
        ctx = Ctx(seq, subject, time, tenant, trace)
        if tenant is None:
            if home is None:
                raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
            if subject != (home if key_of is None else home + getattr(body, key_of)):
                _check_writer(ctx, body)
        handler(state, ctx, body)
    except Exception as e:  # noqa: BLE001 - the fold must never take a service down
        _refused(state, seq, subject, e)
    return state


def apply_event(
    state: State, seq: int, subject: str, body: Event, time: float, tenant: str | None = None
) -> State:
    """Fold an already-decoded event: the simulator's path, with no bytes in between. Requests
    name their ``tenant``; service events must sit on the subject they speak for, as on the wire."""
    if seq <= state.seq:
        return state
    state.seq = seq
    if time > state.time:
        state.time = time
    try:
        _dispatch(state, Ctx(seq, subject, time, tenant), body)
    except Exception as e:  # noqa: BLE001
        _refused(state, seq, subject, e)
    return state


_decode_record = codec.decode_record
_decode_current_envelope = codec.decode_current_envelope


def _dispatch(state: State, ctx: Ctx, body: Event) -> None:
    """Check the writer of a service event, then fold it with its type's handler."""
    route = _ROUTES.get(type(body))
    if route is None:  # not one of corral's types: refused as the general path says
        if ctx.tenant is None:
            _check_writer(ctx, body)
        HANDLERS[type(body)](state, ctx, body)
        return
    handler, subject, key_of = route
    if ctx.tenant is None:
        if subject is None:
            raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
        # The common case in one comparison; anything else takes the general check.
        if key_of is None:
            if ctx.subject != subject:
                _check_writer(ctx, body)
        else:
            key = getattr(body, key_of)
            if key.__class__ is not str or ctx.subject != subject + key:
                _check_writer(ctx, body)
    handler(state, ctx, body)


def _refused(state: State, seq: int, subject: str, e: Exception) -> None:
    if isinstance(e, Refused):
        _reject(state, seq, subject, e.code, str(e), e.job_id)
    elif isinstance(e, DecodeError):
        _reject(state, seq, subject, e.code, str(e))
    elif isinstance(e, IllegalTransition):
        _reject(state, seq, subject, "illegal", str(e))
    else:
        state.faults += 1
        _reject(state, seq, subject, "fault", f"{type(e).__name__}: {e}")


def _check_writer(ctx: Ctx, body: Event) -> None:
    """A service event must sit on the subject of the entity it speaks about: the NATS
    permissions that bind a writer to its subjects then bind it to those entities too."""
    place = routing.home(body)
    if place is None:
        raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
    kind, expected = place
    # corral.ev.<kind>.<key>: the entity the subject names.
    parts = ctx.subject.split(".", 3)
    if (parts[2] if len(parts) > 2 else "") != kind or (parts[3] if len(parts) > 3 else "") != expected:
        raise Refused(
            "forbidden",
            f"{type(body).__name__} about {expected} may not be written on {ctx.subject}",
        )


def _reject(state: State, seq: int, subject: str, code: str, message: str, job_id: str = "") -> None:
    state.rejected_total += 1
    if code == "void":
        state.void_total += 1
    state.rejections.append(Rejection(seq, subject, code, message, job_id))
    if len(state.rejections) > MAX_REJECTIONS:
        del state.rejections[: len(state.rejections) - MAX_REJECTIONS]


def _job(state: State, job_id: str) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise Refused("unknown", f"no job {job_id}", job_id)
    return job


def _node(state: State, name: str) -> NodeState:
    node = state.nodes.get(name)
    if node is None:
        raise Refused("unknown", f"no node {name}")
    return node


def _moves() -> dict[Trigger, dict[Phase, tuple[Phase, int]]]:
    moves: dict[Trigger, dict[Phase, tuple[Phase, int]]] = {trigger: {} for trigger in TRIGGERS}
    for (before, trigger), after in TRANSITIONS.items():
        moves[trigger][before] = (after, (after in HOLDS_QUOTA) - (before in HOLDS_QUOTA))
    return moves


# trigger -> phase -> (next phase, 1 if the move takes quota, -1 if it gives it back, else 0):
# the lifecycle's transition table, looked up by trigger first (no key to build per move), with
# what each move does to the quota the job holds.
_MOVES = _moves()


def _move(state: State, job: JobState, trigger: Trigger, ctx: Ctx) -> None:
    try:
        job.phase, quota_change = _MOVES[trigger][job.phase]
    except KeyError:
        raise IllegalTransition(job.phase, trigger) from None
    job.phase_since = ctx.time
    job.updated_seq = ctx.seq
    if quota_change:
        quota.count_holding(state, job, quota_change)


def _move_twice(state: State, job: JobState, first: Trigger, then: Trigger, ctx: Ctx) -> None:
    """``_move`` by ``first``, then by ``then``, storing the job's time and sequence once."""
    before = job.phase
    try:
        middle, first_change = _MOVES[first][before]
    except KeyError:
        raise IllegalTransition(before, first) from None
    step = _MOVES[then].get(middle)
    if step is None:  # the first move stands, as two moves would leave it
        _move(state, job, first, ctx)
        raise IllegalTransition(middle, then)
    job.phase, then_change = step
    job.phase_since = ctx.time
    job.updated_seq = ctx.seq
    if first_change:
        quota.count_holding(state, job, first_change)
    if then_change:
        quota.count_holding(state, job, then_change)


def _stop_holding(state: State, job: JobState) -> None:
    """A job that left the running phases gives its GPUs back once its last worker is gone."""
    if job.held is not None and not job.live:
        claims.release(state, job)


def _void(job_id: str, message: str) -> Refused:
    return Refused("void", message, job_id)


# -- requests ------------------------------------------------------------------------------------


def _submit(state: State, ctx: Ctx, req: SubmitJob) -> None:
    assert ctx.tenant is not None
    if not subj.is_token(req.request_id):
        raise Refused("malformed", f"request id {req.request_id!r} is not a valid name")
    existing = state.jobs.get(req.request_id)
    if existing is not None:
        if existing.tenant == ctx.tenant:
            raise Refused("duplicate", f"job {req.request_id} was already submitted", req.request_id)
        raise Refused("forbidden", f"job id {req.request_id} is taken", req.request_id)
    state.jobs[req.request_id] = JobState(
        id=req.request_id,
        tenant=ctx.tenant,
        spec=req.job,
        submitted_seq=ctx.seq,
        submitted_at=ctx.time,
        phase_since=ctx.time,
        updated_seq=ctx.seq,
        traceparent=ctx.trace or "",
    )


def _owned(state: State, ctx: Ctx, job_id: str) -> JobState:
    job = _job(state, job_id)
    if ctx.tenant not in (job.tenant, subj.ADMIN):
        # Say the same as for a job that does not exist: a tenant learns nothing of others' jobs.
        raise Refused("unknown", f"no job {job_id}", job_id)
    return job


def _cancel(state: State, ctx: Ctx, req: CancelJob) -> None:
    job = _owned(state, ctx, req.job_id)
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is already {job.phase}", job.id)
    _move(state, job, "cancel", ctx)
    job.reasons = (Reason("cancelled", req.reason or f"cancelled by {ctx.tenant}"),)
    _stop_holding(state, job)


def _resize(state: State, ctx: Ctx, req: ResizeJob) -> None:
    """A new most workers for an elastic job. A running job above it shrinks to it at once (its
    ranks above leave within its grace period); below it, admission grows it when quota allows."""
    job = _owned(state, ctx, req.job_id)
    lo = job.spec.min_replicas
    if lo is None or req.replicas < lo:
        raise Refused("illegal", f"job {job.id} is not elastic down to {req.replicas}", job.id)
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is already {job.phase}", job.id)
    adm = job.admission
    if adm is not None and req.replicas < adm.replicas:
        if job.phase == "admitted":  # nothing placed yet: it is placed at the smaller size
            _readmit(state, job, req.replicas)
        elif job.phase == "running":
            _shrink(state, ctx, job, req.replicas, "", ctx.time + job.spec.grace_seconds)
        else:
            raise Refused("illegal", f"job {job.id} is {job.phase}: it can shrink once it runs", job.id)
    job.spec = msgspec.structs.replace(job.spec, replicas=req.replicas)
    job.updated_seq = ctx.seq


def _admin(ctx: Ctx) -> None:
    if ctx.tenant != subj.ADMIN:
        raise Refused("forbidden", "only the admin identity may change queues and nodes")


def _apply_queue(state: State, ctx: Ctx, req: ApplyQueue) -> None:
    _admin(ctx)
    q = req.queue
    if not subj.is_token(q.name):
        raise Refused("malformed", f"queue name {q.name!r} is not a valid name")
    if q.weight <= 0 or any(v.nominal < 0 for v in q.quotas.values()):
        raise Refused("malformed", f"queue {q.name}: weight and quotas must be positive")
    state.queues[q.name] = q


def _apply_cohort(state: State, ctx: Ctx, req: ApplyCohort) -> None:
    _admin(ctx)
    c = req.cohort
    if not subj.is_token(c.name):
        raise Refused("malformed", f"cohort name {c.name!r} is not a valid name")
    parent, seen = c.parent, {c.name}
    while parent is not None:
        if parent in seen:
            raise Refused("malformed", f"cohort {c.name}: parent chain loops at {parent}")
        seen.add(parent)
        p = state.cohorts.get(parent)
        parent = p.parent if p is not None else None
    state.cohorts[c.name] = c


def _apply_priority_class(state: State, ctx: Ctx, req: ApplyPriorityClass) -> None:
    _admin(ctx)
    if not subj.is_token(req.priority_class.name):
        raise Refused("malformed", f"priority class {req.priority_class.name!r} is not a name")
    state.priority_classes[req.priority_class.name] = req.priority_class


def _delete_queue(state: State, ctx: Ctx, req: DeleteQueue) -> None:
    _admin(ctx)
    if req.name not in state.queues:
        raise Refused("unknown", f"no queue {req.name}")
    if any(j.spec.queue == req.name and j.phase not in FINAL for j in state.jobs.values()):
        raise Refused("illegal", f"queue {req.name} still has jobs")
    del state.queues[req.name]


def _cordon_request(state: State, ctx: Ctx, req: CordonNode) -> None:
    _admin(ctx)
    _cordon(state, ctx, req.node, req.cordoned, req.drain, req.reason or "drained by admin")


def _cordon(state: State, ctx: Ctx, name: str, cordoned: bool, drain: bool, why: str) -> None:
    """No new work lands on a cordoned node; draining one also sends its work elsewhere: the
    jobs there are interrupted (their agents stop the workers) and resume from their last
    checkpoint on other nodes."""
    node = _node(state, name)
    node.cordoned = cordoned
    node.draining = cordoned and drain
    if node.draining:
        _interrupt_on(state, ctx, name, None, f"node {name} is draining: {why}", node_gone=False)


# -- admission ----------------------------------------------------------------------------------


def _accepted(state: State, ctx: Ctx, ev: JobAccepted) -> None:
    job = state.jobs.get(ev.job_id)
    if job is None:
        raise Refused("unknown", f"no job {ev.job_id}", ev.job_id)
    _move(state, job, "accept", ctx)
    job.priority = ev.priority
    if job.reasons:  # a store costs more than the look (Structs)
        job.reasons = ()


def _rejected(state: State, ctx: Ctx, ev: JobRejected) -> None:
    job = _job(state, ev.job_id)
    _move(state, job, "reject", ctx)
    job.reasons = (ev.reason,)


def _pending_reason(state: State, ctx: Ctx, ev: PendingReasonChanged) -> None:
    job = _job(state, ev.job_id)
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is {job.phase}", job.id)
    job.reasons = ev.reasons
    job.updated_seq = ctx.seq


def _admitted(state: State, ctx: Ctx, ev: JobsAdmitted) -> None:
    void: list[str] = []
    # The fold's ledger: the tree is kept while queues and cohorts stay the same, and only its
    # usage is brought to this point of the log, so an admission cycle costs its admissions.
    ledger = quota.fold_ledger(state)
    jobs = state.jobs
    for adm in ev.admissions:
        job = jobs.get(adm.job_id)
        if job is None or job.phase != "queued" or job.attempt != adm.attempt:
            void.append(f"{adm.job_id}: not queued at attempt {adm.attempt}")
            continue
        spec = job.spec
        lo = spec.min_replicas if spec.min_replicas is not None else spec.replicas
        if not lo <= adm.replicas <= spec.replicas:
            void.append(f"{adm.job_id}: {adm.replicas} replicas outside {lo}..{spec.replicas}")
            continue
        why = ledger.claim(job, adm)  # the quota it claims must be there; charged when it is
        if why is not None:
            void.append(f"{adm.job_id}: {why.message}")
            continue
        job.admission = adm  # before the move: the move counts what the admission holds
        _move(state, job, "admit", ctx)
        if job.reasons:  # a store costs more than the look (Structs)
            job.reasons = ()
    for grown in ev.growths:
        refused = _grow(state, ctx, ledger, grown)
        if refused is not None:
            void.append(f"{grown.job_id}: {refused}")
    if void:
        raise _void("", "admissions void: " + "; ".join(void))


def _grow(state: State, ctx: Ctx, ledger: quota.Ledger, grown: Admission) -> str | None:
    """Admit a running elastic job at more replicas; None if done, else why not. Its quota is
    charged for the new total at once; the placer places the added ranks."""
    job = state.jobs.get(grown.job_id)
    if job is None or job.phase != "running" or job.attempt != grown.attempt or job.admission is None:
        return f"not running at attempt {grown.attempt}"
    spec, old = job.spec, job.admission
    if spec.min_replicas is None or not old.replicas < grown.replicas <= spec.replicas:
        return f"{grown.replicas} replicas is no growth of {old.replicas} within {spec.replicas}"
    if job.placement is None or len(job.placement.workers) != old.replicas:
        return f"its {old.replicas} admitted workers are not all placed, or some are leaving"
    held = quota.holding(job)
    for key, milli in held:
        ledger.charge(spec.queue, key, -milli)
    why = ledger.claim(job, grown)
    if why is not None:
        for key, milli in held:
            ledger.charge(spec.queue, key, milli)
        return why.message
    quota.count_holding(state, job, -1)
    job.admission = grown
    quota.count_holding(state, job, 1)
    job.updated_seq = ctx.seq
    return None


def _requeued(state: State, ctx: Ctx, ev: JobRequeued) -> None:
    job = _job(state, ev.job_id)
    if job.attempt != ev.attempt:
        raise _void(job.id, f"job {job.id} is at attempt {job.attempt}, not {ev.attempt}")
    _move(state, job, "requeue", ctx)
    job.attempt += 1
    job.admission = None
    job.placement = None
    job.started = set()
    job.left = set()
    job.exit_codes = {}
    job.reasons = (ev.reason,)


# -- placement and preemption -------------------------------------------------------------------


def _placed(state: State, ctx: Ctx, ev: JobsPlaced) -> None:
    void: list[str] = []
    jobs = state.jobs
    for p in ev.placements:
        job = jobs.get(p.job_id)
        if job is not None and job.phase == "running" and job.attempt == p.attempt:
            try:  # a running elastic job admitted at more replicas: its added ranks
                claims.grow(state, job, p)
            except claims.ClaimError as e:
                void.append(f"{p.job_id}: {e}")
                continue
            job.placement = p
            job.updated_seq = ctx.seq
            continue
        if job is None or job.phase != "admitted" or job.attempt != p.attempt:
            void.append(f"{p.job_id}: not admitted at attempt {p.attempt}")
            continue
        if job.held is not None:
            void.append(f"{p.job_id}: workers of an earlier attempt still hold GPUs")
            continue
        try:
            claims.place(state, job, p)  # check, then take
        except claims.ClaimError as e:
            void.append(f"{p.job_id}: {e}")
            continue
        _move(state, job, "place", ctx)
        job.placement = p
        if job.reasons:  # a store costs more than the look (Structs)
            job.reasons = ()
    if void:
        raise _void("", "placements void: " + "; ".join(void))


def _unschedulable(state: State, ctx: Ctx, ev: JobsUnschedulable) -> None:
    for u in ev.jobs:
        job = state.jobs.get(u.job_id)
        if job is not None and job.attempt == u.attempt and job.phase == "admitted":
            job.reasons = u.reasons
            job.updated_seq = ctx.seq


def _preemption(state: State, ctx: Ctx, ev: PreemptionRequested) -> None:
    beneficiary = state.jobs.get(ev.beneficiary)
    if beneficiary is None or beneficiary.phase in FINAL:
        raise _void(ev.beneficiary, f"beneficiary {ev.beneficiary} is not waiting")
    if len({v.job_id for v in ev.victims}) != len(ev.victims):
        raise _void(ev.beneficiary, "a victim is named twice")
    victims = []
    for v in ev.victims:
        job = state.jobs.get(v.job_id)
        if job is None or job.attempt != v.attempt:
            raise _void(ev.beneficiary, f"victim {v.job_id} is not at attempt {v.attempt}")
        if job.phase not in ("placed", "starting", "running"):
            raise _void(ev.beneficiary, f"victim {v.job_id} is {job.phase}")
        why = _may_stop(state, job, beneficiary)
        if why is not None:
            raise _void(ev.beneficiary, f"victim {why}")
        victims.append(job)
    for job in victims:
        _move(state, job, "preempt", ctx)
        job.preemptions += 1
        job.preempted_at = (*job.preempted_at[-(MAX_PREEMPTION_TIMES - 1) :], ctx.time)
        job.preempted_for = ev.beneficiary
        job.preempt_deadline = ev.deadline
        job.reasons = (Reason("preempted", f"preempted for {ev.beneficiary}"),)
        if not job.live:
            _move(state, job, "stop", ctx)
            _stop_holding(state, job)


def _may_stop(state: State, job: JobState, beneficiary: JobState) -> str | None:
    """Why ``job`` may not give up GPUs for ``beneficiary``: None if it may."""
    pc = state.priority_classes.get(job.spec.priority_class)
    if not job.spec.preemptible or (pc is not None and not pc.preemptible):
        return f"{job.id} may not be preempted"
    if job.priority >= beneficiary.priority and job.spec.queue == beneficiary.spec.queue:
        return f"{job.id} is not of lower priority"
    return None


def _shrink_requested(state: State, ctx: Ctx, ev: ShrinkRequested) -> None:
    beneficiary = state.jobs.get(ev.beneficiary)
    if beneficiary is None or beneficiary.phase in FINAL:
        raise _void(ev.beneficiary, f"beneficiary {ev.beneficiary} is not waiting")
    job = state.jobs.get(ev.job_id)
    if job is None or job.attempt != ev.attempt or job.phase != "running":
        raise _void(ev.job_id, f"{ev.job_id} is not running at attempt {ev.attempt}")
    why = _may_stop(state, job, beneficiary)
    if why is not None:
        raise _void(ev.job_id, why)
    lo, adm = job.spec.min_replicas, job.admission
    if lo is None or adm is None or not lo <= ev.replicas < adm.replicas:
        raise _void(ev.job_id, f"{job.id} cannot shrink to {ev.replicas} workers")
    _shrink(state, ctx, job, ev.replicas, ev.beneficiary, ev.deadline)
    job.reasons = (Reason("shrunk", f"shrunk to {ev.replicas} workers for {ev.beneficiary}"),)


def _readmit(state: State, job: JobState, replicas: int) -> None:
    """Lower an admitted job's admission to ``replicas``: the quota above it is free at once."""
    adm = job.admission
    assert adm is not None
    per_key = quota.holding(job)
    gpus = {key: quota.whole_gpus(milli * replicas // adm.replicas) for key, milli in per_key}
    quota.count_holding(state, job, -1)
    job.admission = Admission(job.id, adm.attempt, replicas, {k: g for k, g in gpus.items() if g})
    quota.count_holding(state, job, 1)


def _shrink(state: State, ctx: Ctx, job: JobState, replicas: int, beneficiary: str, deadline: float) -> None:
    """Admit a running elastic job at fewer replicas: its quota shrinks at once; its ranks from
    ``replicas`` up are leaving (their agents stop them) and hold their GPUs until they exit."""
    _readmit(state, job, replicas)
    job.preempted_for = beneficiary
    job.preempt_deadline = deadline
    job.updated_seq = ctx.seq
    for rank in job.leaving:
        if rank not in job.live:  # it had ended before: nothing to wait for
            _left(state, job, rank, ctx)


# -- nodes and workers --------------------------------------------------------------------------


def _registered(state: State, ctx: Ctx, ev: NodeRegistered) -> None:
    if not subj.is_token(ev.node):
        raise Refused("malformed", f"node name {ev.node!r} is not a valid name")
    indices = [g.index for g in ev.inventory.gpus]
    if indices != list(range(len(indices))):
        raise Refused("malformed", f"node {ev.node}: GPU indices must be 0..{len(indices) - 1}")
    old = state.nodes.get(ev.node)
    gpus = []
    for info in ev.inventory.gpus:
        prev = old.gpus[info.index] if old is not None and info.index < len(old.gpus) else None
        if prev is not None and prev.holders:
            prev.info = info  # work still holds it: keep what it holds
            gpus.append(prev)
        else:
            gpus.append(GpuState(info=info))
    if old is None:
        state.nodes[ev.node] = NodeState(name=ev.node, inventory=ev.inventory, gpus=gpus)
    else:
        old.inventory = ev.inventory
        old.gpus = gpus


def _placed_job(state: State, ev: WorkerStarted | WorkerExited | CheckpointCompleted) -> JobState:
    job = state.jobs.get(ev.job_id)
    if job is None:
        raise Refused("unknown", f"no job {ev.job_id}", ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    return job


def _worker_started(state: State, ctx: Ctx, ev: WorkerStarted) -> None:
    job = state.jobs.get(ev.job_id)  # ``_placed_job``, on the hot path
    if job is None:
        raise Refused("unknown", f"no job {ev.job_id}", ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    rank = ev.rank
    placement = job.placement
    slot = None
    if placement is not None:
        for w in placement.workers:
            if w.rank == rank:
                slot = w
                break
    if ev.attempt != job.attempt or slot is None or slot.node != ev.node:
        raise Refused("illegal", f"job {job.id} has no rank {rank} on {ev.node} now", job.id)
    if job.phase == "running" and rank not in job.started:  # a rank an elastic job grew by
        job.started.add(rank)
        job.live.add(rank)
        job.left.discard(rank)
        job.updated_seq = ctx.seq
        return
    if job.phase not in ("placed", "starting"):
        raise IllegalTransition(job.phase, "start")
    job.started.add(rank)
    job.live.add(rank)
    if len(job.started) == len(placement.workers):  # type: ignore[union-attr]
        _move_twice(state, job, "start", "run", ctx)  # the gang's last worker: it runs
    else:
        _move(state, job, "start", ctx)


def _worker_exited(state: State, ctx: Ctx, ev: WorkerExited) -> None:
    job = state.jobs.get(ev.job_id)  # ``_placed_job``, on the hot path
    if job is None:
        raise Refused("unknown", f"no job {ev.job_id}", ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    if ev.attempt < job.attempt or job.phase in FINAL or job.phase in ("preempted", "interrupted"):
        # A straggler of an attempt already over: it only gives back what that attempt holds.
        # A rank of the same number in a newer attempt is another process on other GPUs.
        if job.held is not None and job.held.attempt == ev.attempt:
            job.live.discard(ev.rank)
            _stop_holding(state, job)
        return
    rank = ev.rank
    live = job.live
    if rank not in live or rank not in job.started:  # live may hold an older attempt's rank
        raise Refused("illegal", f"rank {rank} of job {job.id} is not running", job.id)
    live.discard(rank)
    job.updated_seq = ctx.seq
    adm = job.admission
    if job.phase == "running" and adm is not None and rank >= adm.replicas:
        _left(state, job, rank, ctx)
        if job.held is not None and not live:
            claims.release(state, job)  # the ranks it kept had ended: the GPUs are free
        return
    codes = job.exit_codes
    codes[rank] = ev.code
    if job.phase == "checkpointing":
        if not live:
            _move(state, job, "stop", ctx)
    elif ev.code == 0 and not ev.stopped and job.spec.restart_policy != "always":
        _succeed_if_done(state, job, ctx)
    else:
        _worker_failed(state, job, ctx, f"rank {rank} exited with code {ev.code}")
    if job.held is not None and not live:
        claims.release(state, job)  # the last worker is gone: the GPUs are free


def _succeed_if_done(state: State, job: JobState, ctx: Ctx) -> None:
    """A job whose every rank has exited 0 has succeeded."""
    codes = job.exit_codes
    n = len(job.placement.workers) if job.placement is not None else 0
    if len(codes) == n and not any(codes.values()):
        _move(state, job, "succeed", ctx)


def _left(state: State, job: JobState, rank: int, ctx: Ctx) -> None:
    """A rank an elastic job shrank away from is gone: its GPUs are free, whatever its code;
    once the last of them is gone, the shrink is over."""
    claims.release_rank(state, job, rank)
    job.exit_codes.pop(rank, None)
    job.started.discard(rank)
    job.left.add(rank)  # its agent may forget the process: a growth starts the rank anew
    if job.placement is not None and job.held is not None:
        job.placement = job.held
    if not job.leaving:
        job.preempted_for = ""
        job.preempt_deadline = 0.0
        if job.exit_codes and job.spec.restart_policy != "always":  # the ranks it kept had ended
            _succeed_if_done(state, job, ctx)


def _worker_failed(state: State, job: JobState, ctx: Ctx, why: str) -> None:
    """A gang with a dead worker is broken: restart it whole, or fail it when out of restarts."""
    if job.spec.restart_policy != "never" and job.restarts < job.spec.max_restarts:
        job.restarts += 1
        _move(state, job, "interrupt", ctx)
        job.reasons = (Reason("restarting", f"{why}; restart {job.restarts}"),)
    else:
        _move(state, job, "fail", ctx)
        job.reasons = (Reason("failed", f"{why}; no restarts left"),)


def _checkpointed(state: State, ctx: Ctx, ev: CheckpointCompleted) -> None:
    job = _placed_job(state, ev)
    # A checkpoint may land after the job ended (a worker saving as it is stopped): it is a late
    # fact, not a wrong one, and is kept; the job's phase does not change.
    if job.checkpoint is None or ev.step >= job.checkpoint.step:
        job.checkpoint = Checkpoint(ev.location, ev.step, ev.attempt, ctx.seq, ctx.time)
        job.updated_seq = ctx.seq


def _interrupt_on(
    state: State, ctx: Ctx, node: str, gpu: int | None, why: str, node_gone: bool = True
) -> None:
    """Jobs holding GPUs on ``node`` (only GPU ``gpu`` if given) lost them: their workers there
    are gone, and the job goes back to its queue (not counted against its restarts)."""
    for job in list(state.jobs.values()):
        if job.held is None:
            continue
        hit = [
            w.rank
            for w in job.held.workers
            if w.node == node and (gpu is None or any(c.gpu == gpu for c in w.gpus))
        ]
        if not hit:
            continue
        if gpu is None and node_gone:  # the node is lost: its workers are gone with it
            for rank in hit:
                job.live.discard(rank)
        if job.phase in ("placed", "starting", "running", "checkpointing"):
            _move(state, job, "interrupt", ctx)
            job.reasons = (Reason("interrupted", why),)
        _stop_holding(state, job)


def _condition(state: State, ctx: Ctx, ev: NodeConditionChanged) -> None:
    node = _node(state, ev.node)
    node.condition = ev.condition
    if ev.condition == "lost":
        _interrupt_on(state, ctx, ev.node, None, f"node {ev.node} lost: {ev.reason}")


def _gpu_health(state: State, ctx: Ctx, ev: GpuHealthChanged) -> None:
    node = _node(state, ev.node)
    if not 0 <= ev.gpu < len(node.gpus):
        raise Refused("unknown", f"node {ev.node} has no GPU {ev.gpu}")
    g = node.gpus[ev.gpu]
    g.healthy, g.signal = ev.healthy, ev.signal
    if not ev.healthy:
        _interrupt_on(state, ctx, ev.node, ev.gpu, f"GPU {ev.gpu} of {ev.node}: {ev.signal}")


def _cordoned(state: State, ctx: Ctx, ev: NodeCordoned) -> None:
    _cordon(state, ctx, ev.node, ev.cordoned, ev.drain, ev.reason or "cordoned by the health monitor")


Handler = Callable[[State, Ctx, Any], None]
HANDLERS: dict[type[Event], Handler] = {
    SubmitJob: _submit,
    CancelJob: _cancel,
    ResizeJob: _resize,
    ApplyQueue: _apply_queue,
    ApplyCohort: _apply_cohort,
    ApplyPriorityClass: _apply_priority_class,
    DeleteQueue: _delete_queue,
    CordonNode: _cordon_request,
    JobAccepted: _accepted,
    JobRejected: _rejected,
    PendingReasonChanged: _pending_reason,
    JobsAdmitted: _admitted,
    JobRequeued: _requeued,
    JobsPlaced: _placed,
    JobsUnschedulable: _unschedulable,
    PreemptionRequested: _preemption,
    ShrinkRequested: _shrink_requested,
    NodeRegistered: _registered,
    WorkerStarted: _worker_started,
    WorkerExited: _worker_exited,
    CheckpointCompleted: _checkpointed,
    NodeConditionChanged: _condition,
    GpuHealthChanged: _gpu_health,
    NodeCordoned: _cordoned,
}

# type -> (handler, the subject it must be written on or that subject's prefix, the field naming
# its key): one lookup per record. Requests have no subject here: they come with the tenant their
# subject names.
_ROUTES: dict[type[Event], tuple[Handler, str | None, str | None]] = {
    t: (h, *routing.WRITTEN_ON.get(t, (None, None))) for t, h in HANDLERS.items()
}
