"""The fold's arbitration of the placer's and the preemptor's proposals: placements (a gang's
GPUs taken whole or not at all, or the ranks a grown elastic job adds), unschedulable reasons,
preemptions and shrinks of elastic jobs (only of jobs that may give way to the beneficiary), and
consolidations (jobs stopped to run elsewhere, only where the layout they name holds).
"""

from __future__ import annotations

from corral.events.base import Event, Reason
from corral.events.decisions import JobsPlaced, JobsUnschedulable, PreemptionRequested, ShrinkRequested
from corral.events.jobs import (
    Admission,
)
from corral.projections import claims, gpu_time, indexes, moves, preemption, quota, shape
from corral.projections.fold_moves import (
    MAX_PREEMPTION_TIMES,
    Ctx,
    Handler,
    move,
    stop_holding,
    void_items,
    voided,
)
from corral.projections.fold_nodes import left
from corral.projections.lifecycle import WAITING
from corral.projections.state import (
    JobState,
    State,
)
from corral.projections.visibility import job_named

# -- placement and preemption -------------------------------------------------------------------


def _placed(state: State, ctx: Ctx, ev: JobsPlaced) -> None:
    void: list[tuple[str, str]] = []
    jobs = state.jobs
    for p in ev.placements:
        job = jobs.get(p.job_id)
        if job is not None and job.phase == "running" and job.attempt == p.attempt:
            try:  # a running elastic job admitted at more replicas: its added ranks
                claims.grow(state, job, p)
            except claims.ClaimError as e:
                void.append((p.job_id, str(e)))
                continue
            gpu_time.track(state, job, ctx.time)
            job.placement = p
            job.updated_seq = ctx.seq
            continue
        if job is None or job.phase != "admitted" or job.attempt != p.attempt:
            void.append((p.job_id, f"not admitted at attempt {p.attempt}"))
            continue
        if job.held is not None:
            void.append((p.job_id, "workers of an earlier attempt still hold GPUs"))
            continue
        try:
            claims.place(state, job, p)  # check, then take
        except claims.ClaimError as e:
            void.append((p.job_id, str(e)))
            continue
        gpu_time.track(state, job, ctx.time)  # its queue holds GPU time from now
        move(state, job, "place", ctx)
        job.placement = p
        if job.moved_to is not None:  # placed again, where its move said or elsewhere
            indexes.move_to(state, job, None)
        if job.kept_place is not None:  # ... and back in place, or elsewhere
            indexes.keep_place(state, job, None)
        if job.reasons:  # a store costs more than the look (Structs)
            job.reasons = ()
            indexes.explain(state, job)
    if void:
        raise void_items("placements", void)


def _unschedulable(state: State, ctx: Ctx, ev: JobsUnschedulable) -> None:
    for u in ev.jobs:
        job = state.jobs.get(u.job_id)
        if job is not None and job.attempt == u.attempt and job.phase == "admitted":
            job.reasons = u.reasons
            indexes.explain(state, job)
            job.updated_seq = ctx.seq


def _preemption(state: State, ctx: Ctx, ev: PreemptionRequested) -> None:
    beneficiary = state.jobs.get(ev.beneficiary)
    # Decided on a state from before the beneficiary got GPUs (placed since, or finished), a
    # proposal would stop work for a job that no longer waits: void, as the preemptor only ever
    # chooses waiting beneficiaries.
    if beneficiary is None or beneficiary.phase not in WAITING:
        raise voided(ev.beneficiary, f"beneficiary {ev.beneficiary} is not waiting")
    if len({v.job_id for v in ev.victims}) != len(ev.victims):
        raise voided(ev.beneficiary, "a victim is named twice")
    victims = []
    for v in ev.victims:
        job = state.jobs.get(v.job_id)
        if job is None or job.attempt != v.attempt:
            raise voided(ev.beneficiary, f"victim {v.job_id} is not at attempt {v.attempt}")
        if job.phase not in ("placed", "starting", "running"):
            raise voided(ev.beneficiary, f"victim {v.job_id} is {job.phase}")
        victims.append(job)
    if ev.moves:
        why = moves.may_move(state, victims, beneficiary, ctx.time, ev.moves)
        what = "moved to make room for {}"
    else:
        why = preemption.may_stop(state, victims, beneficiary, ctx.time, on_key=ev.key)
        what = "preempted for {}"
    if why is not None:
        raise voided(ev.beneficiary, f"victim {why}")
    if beneficiary.phase == "queued":
        beneficiary.reclaim_key = ev.key
    for job in victims:
        move(state, job, "preempt", ctx)
        job.preemptions += 1
        job.preempted_at = (*job.preempted_at[-(MAX_PREEMPTION_TIMES - 1) :], ctx.time)
        indexes.name(state, job, ev.beneficiary)
        job.stopped_for = stopped_for(job, beneficiary)
        if ev.moves or job.moved_for:
            job.moved_for = moved_for(job, beneficiary, moved=bool(ev.moves))
        job.preempt_deadline = victim_deadline(state, ctx, ev, job, beneficiary)
        job.reasons = (
            Reason("preempted", what.format(job_named(ev.beneficiary, beneficiary.tenant, job.tenant))),
        )
        indexes.explain(state, job)
        if not job.live:
            move(state, job, "stop", ctx)
            stop_holding(state, job, ctx)
    for p in ev.moves[1:]:
        indexes.move_to(state, state.jobs[p.job_id], p)


def _shrink_requested(state: State, ctx: Ctx, ev: ShrinkRequested) -> None:
    beneficiary = state.jobs.get(ev.beneficiary)
    # Decided on a state from before the beneficiary got GPUs (placed since, or finished), a
    # proposal would stop work for a job that no longer waits: void, as the preemptor only ever
    # chooses waiting beneficiaries.
    if beneficiary is None or beneficiary.phase not in WAITING:
        raise voided(ev.beneficiary, f"beneficiary {ev.beneficiary} is not waiting")
    job = state.jobs.get(ev.job_id)
    if job is None or job.attempt != ev.attempt or job.phase != "running":
        raise voided(ev.job_id, f"{ev.job_id} is not running at attempt {ev.attempt}")
    why = preemption.may_stop(state, [job], beneficiary, ctx.time, keep=ev.replicas, on_key=ev.key)
    if why is not None:
        raise voided(ev.job_id, why)
    lo, adm = job.spec.min_replicas, job.admission
    if lo is None or adm is None or not lo <= ev.replicas < adm.replicas:
        raise voided(ev.job_id, f"{job.id} cannot shrink to {ev.replicas} workers")
    shrink(state, ctx, job, ev.replicas, ev.beneficiary, victim_deadline(state, ctx, ev, job, beneficiary))
    # Counted by the guards that pass with time (cooldown, the hourly cap), not the lifetime cap
    # (the job runs on): uncounted, a lender submitting and cancelling once a minute had a
    # borrower's elastic job shrunk 120 times in two hours past a class allowing once an hour.
    job.preempted_at = (*job.preempted_at[-(MAX_PREEMPTION_TIMES - 1) :], ctx.time)
    if beneficiary.phase == "queued":
        beneficiary.reclaim_key = ev.key
    for_whom = job_named(ev.beneficiary, beneficiary.tenant, job.tenant)
    job.reasons = (Reason("shrunk", f"shrunk to {shape.workers_text(ev.replicas)} for {for_whom}"),)
    indexes.explain(state, job)


def log_deadline(ctx: Ctx, now: float, deadline: float) -> float:
    """A decision's deadline in log time: the grace it grants (``deadline - now``, on the
    decider's clock) counted from where the decision sits in the log. So no agent ever reads a
    time set on the preemptor's host against its own host's clock."""
    return ctx.time + max(0.0, deadline - now)


def victim_deadline(
    state: State, ctx: Ctx, ev: PreemptionRequested | ShrinkRequested, victim: JobState, beneficiary: JobState
) -> float:
    """By when ``victim`` must be done checkpointing, in log time: as the record asks (the
    longest grace of its victims), but no later than its own grace allows
    (``preemption.grace_s``)."""
    own = ctx.time + preemption.grace_s(state, victim, beneficiary.spec.queue)
    return min(log_deadline(ctx, ev.now, ev.deadline), own)


def readmit(state: State, job: JobState, replicas: int) -> None:
    """Lower an admitted job's admission to ``replicas``: the quota above it is free at once."""
    adm = job.admission
    assert adm is not None
    per_key = quota.holding(job)
    gpus = {key: quota.whole_gpus(milli * replicas // adm.replicas) for key, milli in per_key}
    quota.count_holding(state, job, -1)
    job.admission = Admission(job.id, adm.attempt, replicas, {k: g for k, g in gpus.items() if g})
    quota.count_holding(state, job, 1)


def stopped_for(job: JobState, beneficiary: JobState) -> tuple[tuple[str, int, int], ...]:
    """``job.stopped_for`` with this preemption added (once), the oldest dropped past the bound."""
    entry = (beneficiary.id, beneficiary.priority_seq, job.priority_seq)
    if entry in job.stopped_for:
        return job.stopped_for
    return (*job.stopped_for[-(MAX_PREEMPTION_TIMES - 1) :], entry)


def moved_for(job: JobState, beneficiary: JobState, moved: bool) -> tuple[tuple[str, int, int], ...]:
    """``job.moved_for`` with this stop added (once) if it is a move, else taken out, none that
    ``stopped_for`` no longer keeps. A stop for a job it was moved for before, once that move
    was dropped from ``stopped_for`` (past its bound), may be a preemption: it is no move."""
    entry = (beneficiary.id, beneficiary.priority_seq, job.priority_seq)
    kept = tuple(e for e in job.moved_for if e != entry and e in job.stopped_for)
    return (*kept, entry) if moved else kept


def shrink(state: State, ctx: Ctx, job: JobState, replicas: int, beneficiary: str, deadline: float) -> None:
    """Admit a running elastic job at fewer replicas: its quota shrinks at once; its ranks from
    ``replicas`` up are leaving (their agents stop them) and hold their GPUs until they exit."""
    readmit(state, job, replicas)
    indexes.name(state, job, beneficiary)
    job.preempt_deadline = deadline
    job.updated_seq = ctx.seq
    for rank in job.leaving:
        if rank not in job.live:  # it had ended before: nothing to wait for
            left(state, job, rank, ctx)


HANDLERS: dict[type[Event], Handler] = {
    JobsPlaced: _placed,
    JobsUnschedulable: _unschedulable,
    PreemptionRequested: _preemption,
    ShrinkRequested: _shrink_requested,
}
