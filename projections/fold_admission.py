"""The fold's arbitration of admission's facts and proposals: accepted, rejected, pending reasons,
admissions and growths of running elastic jobs (each checked against quota where it stands in
the log, and charged only if it fits), admissions withdrawn from jobs no node can host any
more, and requeues to a job's next attempt.
"""

from __future__ import annotations

import math

from corral.events.base import Event
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
)
from corral.projections import indexes, queueing, quota
from corral.projections.fold_moves import (
    MOVES,
    Ctx,
    Handler,
    Refused,
    find_job,
    move,
    void_items,
    voided,
)
from corral.projections.fold_preemption import readmit
from corral.projections.lifecycle import (
    FINAL,
    IllegalTransition,
)
from corral.projections.state import (
    State,
)

# -- admission ----------------------------------------------------------------------------------


def _accepted(state: State, ctx: Ctx, ev: JobAccepted) -> None:
    job = state.jobs.get(ev.job_id)
    if job is None:
        raise Refused("unknown", f"no job {ev.job_id}", ev.job_id)
    if job.phase not in MOVES["accept"]:
        raise IllegalTransition(job.phase, "accept")
    # The priority first: the job enters its queue at its place, not at priority 0 and then
    # taken out and put back.
    job.priority = ev.priority
    move(state, job, "accept", ctx)
    job.attempt_since = ctx.time
    if job.reasons:  # a store costs more than the look (Structs)
        job.reasons = ()
        indexes.explain(state, job)


def _priority_changed(state: State, ctx: Ctx, ev: JobPriorityChanged) -> None:
    job = find_job(state, ev.job_id)
    if job.phase in FINAL or job.phase == "submitted":
        raise Refused("illegal", f"job {job.id} is {job.phase}", job.id)
    if job.priority != ev.priority:
        job.priority_seq = ctx.seq
    before, job.priority = job.priority, ev.priority
    indexes.reprioritised(state, job, before)
    job.updated_seq = ctx.seq


def _rejected(state: State, ctx: Ctx, ev: JobRejected) -> None:
    job = find_job(state, ev.job_id)
    move(state, job, "reject", ctx)
    job.reasons = (ev.reason,)
    indexes.explain(state, job)


def _pending_reason(state: State, ctx: Ctx, ev: PendingReasonChanged) -> None:
    job = find_job(state, ev.job_id)
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is {job.phase}", job.id)
    job.reasons = ev.reasons
    indexes.explain(state, job)
    job.updated_seq = ctx.seq


def _admitted(state: State, ctx: Ctx, ev: JobsAdmitted) -> None:
    void: list[tuple[str, str]] = []
    # The fold's ledger: the tree is kept while queues and cohorts stay the same, and only its
    # usage is brought to this point of the log, so an admission cycle costs its admissions.
    ledger = quota.fold_ledger(state)
    jobs = state.jobs
    for place, adm in enumerate(ev.admissions):
        job = jobs.get(adm.job_id)
        if job is None or job.phase != "queued" or job.attempt != adm.attempt:
            void.append((adm.job_id, f"not queued at attempt {adm.attempt}"))
            continue
        if queueing.backs_off(job, ctx.time):
            void.append((adm.job_id, f"backs off until t={job.admit_after:.0f} (placed nowhere)"))
            continue
        spec = job.spec
        lo = spec.min_replicas if spec.min_replicas is not None else spec.replicas
        if not lo <= adm.replicas <= spec.replicas:
            void.append((adm.job_id, f"{adm.replicas} replicas outside {lo}..{spec.replicas}"))
            continue
        # Whether it may borrow reads its spec, its class and the cohort tree, none of which the
        # claim changes: read once, for the claim and for its standing.
        borrow = ledger.may_borrow(job)
        why = ledger.claim(job, adm, borrow)  # the quota it claims must be there; charged when it is
        if why is not None:
            void.append((adm.job_id, why.message))
            continue
        job.admission = adm  # before the move: the move counts what the admission holds
        job.fixed = not borrow  # as ``claim`` charged it
        job.admitted_at = (ctx.seq, place)
        if job.reclaim_key:  # a store costs more than the look (Structs)
            job.reclaim_key = ""
        move(state, job, "admit", ctx)
        if job.reasons:  # a store costs more than the look (Structs)
            job.reasons = ()
            indexes.explain(state, job)
    for grown in ev.growths:
        refused = _grow(state, ctx, ledger, grown)
        if refused is not None:
            void.append((grown.job_id, str(refused)))
    if void:
        raise void_items("admissions", void)


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
    if job.grow_after > ctx.time:
        return f"grows again from t={job.grow_after:.0f} (its last growth was placed nowhere)"
    why = ledger.claim_growth(job, grown)
    if why is not None:
        return why.message
    quota.count_holding(state, job, -1)
    job.admission = grown
    job.fixed = not ledger.may_borrow(job)  # as ``claim_growth`` charged it
    quota.count_holding(state, job, 1)
    job.grown_at = ctx.time
    job.updated_seq = ctx.seq
    return None


def _withdrawn(state: State, ctx: Ctx, ev: AdmissionWithdrawn) -> None:
    """Only an admission still waiting for its placement is withdrawn: a job placed meanwhile
    (the placer found room after all) keeps it, and the record is void. A running elastic job's
    growth whose added ranks are not placed is withdrawn alone: the job is admitted again at the
    workers it has, and keeps running."""
    job = find_job(state, ev.job_id)
    growing = job.phase == "running" and job.attempt == ev.attempt and queueing.growth_unplaced(job)
    if not growing and (job.phase != "admitted" or job.attempt != ev.attempt):
        raise voided(
            job.id, f"job {job.id} is {job.phase} at attempt {job.attempt}, not admitted at {ev.attempt}"
        )
    if not (math.isfinite(ev.admit_after) and ev.admit_after <= ctx.time + queueing.MAX_BACKOFF_S):
        longest = queueing.MAX_BACKOFF_S
        raise voided(
            job.id, f"a back-off until t={ev.admit_after} is more than {longest:.0f} s past t={ctx.time:.0f}"
        )
    if growing:
        assert job.placement is not None
        readmit(state, job, len(job.placement.workers))  # the quota of the added ranks is free
        job.grow_after = ev.admit_after
        job.updated_seq = ctx.seq
        return
    move(state, job, "withdraw", ctx)  # before the admission goes: the move gives back what it holds
    job.admission = None
    # Placed nowhere for the timeout: the place a shutdown left it or a move named is held no
    # longer (held again once it is admitted again, it would stand idle behind the same wait).
    indexes.keep_place(state, job, None)
    indexes.move_to(state, job, None)
    job.admit_after = ev.admit_after
    job.reasons = (ev.reason,)
    indexes.explain(state, job)


def _requeued(state: State, ctx: Ctx, ev: JobRequeued) -> None:
    job = find_job(state, ev.job_id)
    if job.attempt != ev.attempt:
        raise voided(job.id, f"job {job.id} is at attempt {job.attempt}, not {ev.attempt}")
    move(state, job, "requeue", ctx)
    job.attempt += 1
    job.attempt_since = ctx.time
    job.admission = None
    job.placement = None
    job.started = set()
    job.left = set()
    job.exit_codes = {}
    job.reasons = (ev.reason,)
    indexes.explain(state, job)


HANDLERS: dict[type[Event], Handler] = {
    JobAccepted: _accepted,
    JobPriorityChanged: _priority_changed,
    JobRejected: _rejected,
    PendingReasonChanged: _pending_reason,
    JobsAdmitted: _admitted,
    JobRequeued: _requeued,
    AdmissionWithdrawn: _withdrawn,
}
