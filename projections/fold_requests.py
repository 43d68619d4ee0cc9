"""The fold's handling of tenants' and the admin's requests: submit, cancel and resize a job
(the tenant comes from the subject, and only the owner or the admin may touch a job), and
queues, cohorts, priority classes, fair-share settings, retention and cordons (the admin only).

A job id is unique among the jobs the state holds: a submit naming one of them is refused (a
duplicate of the owner's, the same spec again; a conflict, the owner's id with another spec; or
a taken id), one naming a job the state let go
(``projections/retention.py``) is a new job, as a Kubernetes name is free again once its
object is deleted. A cancel or resize of a job let go is refused as of a job that does not exist.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

import msgspec

from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.jobs import (
    MAX_GPU_MODELS,
    MAX_REPLICAS,
    CancelJob,
    JobSpec,
    ResizeJob,
    SubmitJob,
    said_reason,
)
from corral.events.nodes import MAX_GPU_NAME
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeletePriorityClass,
    DeleteQueue,
    QueueSpec,
    Quota,
)
from corral.projections import gpu_time, indexes, preemption, quota, retention, runtimes, shape
from corral.projections.fold_moves import (
    MAX_PREEMPTION_TIMES,
    Ctx,
    Handler,
    Refused,
    find_job,
    move,
    stop_holding,
)
from corral.projections.fold_nodes import cordon
from corral.projections.fold_preemption import readmit, shrink
from corral.projections.lifecycle import (
    FINAL,
    PHASES,
    Phase,
)
from corral.projections.state import (
    WHOLE,
    JobState,
    State,
)

# -- requests ------------------------------------------------------------------------------------


def _submit(state: State, ctx: Ctx, req: SubmitJob) -> None:
    assert ctx.tenant is not None
    if not subj.is_token(req.request_id):
        raise Refused("malformed", f"request id {req.request_id!r} is not a valid name")
    why = _names_problem(req.job)
    if why:
        raise Refused("malformed", why, req.request_id)
    existing = state.jobs.get(req.request_id)
    if existing is not None:
        if existing.tenant == ctx.tenant and _sent_again(existing, req.job):
            raise Refused("duplicate", f"job {req.request_id} was already submitted", req.request_id)
        if existing.tenant == ctx.tenant:
            # Not the job it names: taken for a duplicate, its sender was told its job was
            # accepted while the job of the id ran what was sent first.
            raise Refused(
                "conflict",
                f"job {req.request_id} was submitted with another spec; submit this one under another id",
                req.request_id,
            )
        raise Refused("forbidden", f"job id {req.request_id} is taken", req.request_id)
    held, most = len(state.jobs_by_tenant.get(ctx.tenant, ())), state.retention.jobs_per_tenant
    if held >= most:
        raise Refused(
            "limit",
            f"tenant {ctx.tenant} has {held} jobs in the cluster's state, the most one tenant may "
            f"have ({most}); submit again once some have ended and been let go",
            req.request_id,
        )
    size = indexes.spec_bytes(req.job)
    held, most = state.spec_bytes_by_tenant.get(ctx.tenant, 0), state.retention.spec_bytes_per_tenant
    if held + size > most:
        raise Refused(
            "limit",
            f"tenant {ctx.tenant}'s jobs in the cluster's state hold {held} bytes of specs and this "
            f"one {size}, past the most one tenant's may hold ({most}); submit again once some "
            "have ended and been let go, or with less in their command, env, mounts and labels",
            req.request_id,
        )
    job = JobState(
        id=req.request_id,
        tenant=ctx.tenant,
        spec=req.job,
        submitted_seq=ctx.seq,
        submitted_at=ctx.time,
        priority_seq=ctx.seq,
        phase_since=ctx.time,
        updated_seq=ctx.seq,
        traceparent=ctx.trace or "",
        learned_s=runtimes.learned(state, ctx.tenant, req.job),
        overrun=None if req.job.runtime_estimate_s is None else runtimes.overrun(state, ctx.tenant),
    )
    indexes.add(state, job, size)


def _sent_again(job: JobState, spec: JobSpec) -> bool:
    """Whether ``spec`` is ``job``'s as it was submitted: its own, with the most workers it was
    submitted with where a resize has changed them since."""
    if job.sent_replicas is None:
        return spec == job.spec
    return spec == msgspec.structs.replace(job.spec, replicas=job.sent_replicas)


# The longest MIG profile a job may name: NVIDIA's are a dozen characters (``1g.10gb+me``).
MAX_MIG = 32


def _names_problem(spec: JobSpec) -> str:
    """Why the names a job gives its queue, priority class, MIG profile or GPU models could
    never name one, or "". A queue and a class are names (``subjects.is_token``, as the admin's
    requests make them), a profile and a model are short, and a job names a few models: any
    string up to a request's size was kept in the job and repeated in every listing of it and
    in admission's reason (a tenant's one job filled a page of ``jobs``, sixteen emptied the
    admin's board)."""
    if not subj.is_token(spec.queue):
        return f"queue {_cut(spec.queue)} is not a valid name"
    if not subj.is_token(spec.priority_class):
        return f"priority class {_cut(spec.priority_class)} is not a valid name"
    res = spec.resources
    if len(res.gpu_models) > MAX_GPU_MODELS:
        return f"at most {MAX_GPU_MODELS} GPU models, not {len(res.gpu_models)}"
    if res.mig is not None and len(res.mig) > MAX_MIG:
        return f"MIG profile {_cut(res.mig)} is longer than {MAX_MIG} characters"
    for model in res.gpu_models:
        if len(model) > MAX_GPU_NAME:
            return f"GPU model {_cut(model)} is longer than {MAX_GPU_NAME} characters"
    return ""


def _cut(name: str) -> str:
    """A name as a refusal quotes it: its first 64 characters."""
    return repr(name[:64]) + ("..." if len(name) > 64 else "")


def _owned(state: State, ctx: Ctx, job_id: str) -> JobState:
    job = find_job(state, job_id)
    if ctx.tenant not in (job.tenant, subj.ADMIN):
        # Say the same as for a job that does not exist: a tenant learns nothing of others' jobs.
        raise Refused("unknown", f"no job {job_id}", job_id)
    return job


def _cancel(state: State, ctx: Ctx, req: CancelJob) -> None:
    job = _owned(state, ctx, req.job_id)
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is already {job.phase}", job.id)
    move(state, job, "cancel", ctx)
    job.reasons = (Reason("cancelled", said_reason(req.reason) or f"cancelled by {ctx.tenant}"),)
    indexes.explain(state, job)
    stop_holding(state, job, ctx)


def _resize(state: State, ctx: Ctx, req: ResizeJob) -> None:
    """A new most workers for an elastic job. A running job above it shrinks to it at once (its
    ranks above leave within its grace period, at most the least ``max_grace_seconds`` of its
    cohort tree, ``preemption.shrink_grace_s``); below it, admission grows it when quota allows.

    Its quota is free at once and the leaving ranks hold their GPUs until they exit, so the grace
    is capped: with its own (up to a day), an owner who shrank a job that borrowed kept the GPUs
    a day while its queue was charged for one, and a lender within its nominal waited as long. A
    shrink already under way for a job that waits (the preemptor's) keeps its beneficiary and
    its deadline, or an earlier one: a resize does not undo a reclaim. After an owner's earlier
    shrink, for nobody, the ranks leaving now get their grace too (no rank's deadline moves
    earlier): with the first's deadline, perhaps past while a rank of it was slow to exit, they
    were stopped at once."""
    job = _owned(state, ctx, req.job_id)
    lo = job.spec.min_replicas
    if lo is None:
        n = job.spec.replicas
        raise Refused(
            "illegal",
            f"job {job.id} is not elastic: it runs {shape.workers_text(n)}, no more and no fewer "
            "(a job is resized between its min_replicas and any size up to the most)",
            job.id,
        )
    if req.replicas < lo:
        raise Refused(
            "illegal", f"job {job.id} is elastic down to {shape.workers_text(lo)}, not {req.replicas}", job.id
        )
    if req.replicas > MAX_REPLICAS:  # as a submission of that size is refused
        raise Refused(
            "illegal", f"job {job.id} may have at most {MAX_REPLICAS} workers, not {req.replicas}", job.id
        )
    if job.phase in FINAL:
        raise Refused("illegal", f"job {job.id} is already {job.phase}", job.id)
    adm = job.admission
    if adm is not None and req.replicas < adm.replicas:
        if job.phase == "admitted":  # nothing placed yet: it is placed at the smaller size
            readmit(state, job, req.replicas)
        elif job.phase == "running":
            deadline, beneficiary = ctx.time + preemption.shrink_grace_s(state, job), ""
            if job.leaving and job.preempted_for:
                deadline, beneficiary = min(deadline, job.preempt_deadline), job.preempted_for
            elif job.leaving:
                deadline = max(deadline, job.preempt_deadline)
            shrink(state, ctx, job, req.replicas, beneficiary, deadline)
        else:
            raise Refused("illegal", f"job {job.id} is {job.phase}: it can shrink once it runs", job.id)
    if job.sent_replicas is None and req.replicas != job.spec.replicas:
        job.sent_replicas = job.spec.replicas
    indexes.respec(state, job, msgspec.structs.replace(job.spec, replicas=req.replicas))
    job.updated_seq = ctx.seq


def _admin(ctx: Ctx) -> None:
    if ctx.tenant != subj.ADMIN:
        raise Refused("forbidden", "only the admin identity may change queues and nodes")


# The most GPUs a quota, a borrowing or a lending limit may name per key: far beyond any cluster,
# and small enough that the quota arithmetic (milli-GPU) stays within what the state encodes.
MAX_QUOTA_GPUS = 1_000_000
# The shortest fair-share half-life: a second. Shorter forgets all history between two records,
# and decays the usage figures people read to nonsense.
MIN_HALF_LIFE_S = 1.0


def _quota_problem(what: str, quotas: Mapping[str, Quota]) -> str:
    """Why ``quotas`` are no quotas, or ``""``: each nominal and limit a whole number of GPUs,
    0 to ``MAX_QUOTA_GPUS``."""
    for key, q in quotas.items():
        for field, value in (
            ("nominal", q.nominal),
            ("borrowing_limit", q.borrowing_limit),
            ("lending_limit", q.lending_limit),
        ):
            if value is not None and not 0 <= value <= MAX_QUOTA_GPUS:
                return f"{what}: {field} of {key} must be 0..{MAX_QUOTA_GPUS} GPUs, not {value}"
    return ""


def _lending_problem(what: str, quotas: Mapping[str, Quota]) -> str:
    """Why a queue's ``quotas`` lend more than they hold, or ``""``: a queue lends its nominal at
    most, so a lending limit above it bounds nothing yet reads as a bound (Kueue refuses one
    too). A cohort's may be above its own quota: it bounds what its whole subtree lends."""
    for key, q in quotas.items():
        if q.lending_limit is not None and q.lending_limit > q.nominal:
            return (
                f"{what}: lending_limit of {key} is {q.lending_limit} GPUs, more than its nominal "
                f"{q.nominal}: at most the nominal can be lent (leave the limit out to lend it all)"
            )
    return ""


def _apply_queue(state: State, ctx: Ctx, req: ApplyQueue) -> None:
    _admin(ctx)
    q = req.queue
    if not subj.is_token(q.name):
        raise Refused("malformed", f"queue name {q.name!r} is not a valid name")
    if not (q.weight >= MIN_WEIGHT and math.isfinite(q.weight)):
        raise Refused(
            "malformed", f"queue {q.name}: weight must be a number of at least {MIN_WEIGHT:g}, not {q.weight}"
        )
    problem = _quota_problem(f"queue {q.name}", q.quotas) or _lending_problem(f"queue {q.name}", q.quotas)
    if problem:
        raise Refused("malformed", problem)
    cap = q.preemption.max_grace_seconds
    if cap is not None and not cap >= 0:
        raise Refused("malformed", f"queue {q.name}: max_grace_seconds must be 0 or more, not {cap}")
    before = state.queues.get(q.name)
    if before is not None:
        _may_change(state, before, q)
    _put_keeping_fixed(state, state.queues, q.name, q, "queue")


_Spec = TypeVar("_Spec", QueueSpec, CohortSpec)


def _put_keeping_fixed(state: State, table: dict[str, _Spec], name: str, spec: _Spec, what: str) -> None:
    """Put ``spec`` under ``name`` in ``table`` (the state's queues or cohorts), unless that leaves
    jobs that may not be preempted holding past their queue's limit (``_fixed_cut``): then what
    was there stays, and the change is refused."""
    before = table.get(name)
    was = _fixed_limits(state)
    table[name] = spec
    cut = _fixed_cut(state, was)
    if cut is not None:
        if before is None:
            del table[name]
        else:
            table[name] = before
        raise Refused("forbidden", f"{what} {name} may not change so: {cut}")


def _fixed_limits(state: State) -> dict[tuple[str, str], int]:
    """Per queue and quota key its jobs that may not be preempted hold any of, the most they may
    hold (``Ledger.fixed_limit``). (None hold any, most of the time: no ledger is built, whose
    cohort tree is a web of references the collector would have to free.)"""
    if not state.quota_held_fixed:
        return {}
    ledger = quota.Ledger(state)
    return {
        (queue, key): ledger.fixed_limit(queue, key)
        for queue, held in state.quota_held_fixed.items()
        if ledger.has_queue(queue)
        for key in held
    }


def _fixed_cut(state: State, was: dict[tuple[str, str], int]) -> str | None:
    """Where an admin change just made left jobs that may not be preempted holding more than
    their queue's limit (``was``: the limits before it, ``_fixed_limits``), in words; None if
    nowhere. Any change that moves a limit may: a queue's nominal cut; where a cohort shares its
    own quota, a sibling's weight raised, a queue joining it, its quota cut or its sharing turned
    off. What they hold past it would be a loan nobody could take back, as they are never
    stopped: the queues it was lent from would wait for them to end."""
    if not was:
        return None
    ledger = quota.Ledger(state)
    for (queue, key), before in sorted(was.items()):
        milli = state.quota_held_fixed[queue][key]
        most = ledger.fixed_limit(queue, key) if ledger.has_queue(queue) else 0
        if milli > most and most < before:
            return (
                f"queue {queue}'s jobs that may not be stopped hold {quota.gpus_text(milli, key)}, "
                f"past the {quota.fmt_gpus(most)} it would leave them (its nominal and its part of a "
                "cohort's shared quota): they could never give back the rest, a loan nobody could "
                "take back; make the change once they end"
            )
    return None


# A job of these phases runs or will run in its queue (a running one goes back to it when
# stopped): a queue that no longer admits its tenant would still run it. (A submitted one is
# judged against the queue's tenants when admission accepts it.)
_IN_QUEUE: tuple[Phase, ...] = tuple(p for p in PHASES if p != "submitted" and p not in FINAL)


def _may_change(state: State, before: QueueSpec, after: QueueSpec) -> None:
    """Refuse a change of a queue that would leave work it holds or waits for unaccounted for:
    its tenants list closed to a tenant with jobs in it (waiting or running: a stopped one goes
    back to its queue; they would run on a queue their tenant may no longer use or see), or a
    move to another cohort while a queue of its cohort borrows (what the queue borrowed would be
    kept from its lenders for ever, none of them in its cohort to take it back, or what it lent
    from it). The admin cancels the jobs, or moves it once its cohort borrows nothing."""
    closed = set(after.tenants)
    if closed and (not before.tenants or not closed >= set(before.tenants)):
        left: dict[str, int] = {}
        for job in indexes.jobs_in(state, *_IN_QUEUE):
            if job.spec.queue == after.name and job.tenant not in closed:
                left[job.tenant] = left.get(job.tenant, 0) + 1
        if left:
            who = ", ".join(f"{t} ({n})" for t, n in sorted(left.items()))
            raise Refused(
                "forbidden",
                f"queue {after.name} may not close to tenants with jobs in it: {who}; "
                "cancel those jobs first (the admin may: corral cancel JOB --tenant admin)",
            )
    if before.cohort != after.cohort and before.cohort is not None:
        ledger = quota.Ledger.from_state(state)
        if ledger.has_queue(after.name):
            leaving = f"queue {after.name} may not leave cohort {before.cohort}"
            _none_borrows(state, ledger, after.name, leaving)


def _none_borrows(state: State, ledger: quota.Ledger, queue: str, what: str) -> None:
    """Refuse ``what``, a change that takes quota out of ``queue``'s cohort tree or moves part of
    the tree elsewhere, while a queue of the tree borrows: what was lent could never be taken back
    (the preemptor takes back what a side of the tree lent to another), or what it lent from
    would be gone."""
    for key in sorted({k for held in state.quota_held.values() for k in held}):
        borrowing = ledger.borrowers(queue, key, exclude=False)
        if borrowing:
            name, over = borrowing[0]
            raise Refused(
                "forbidden",
                f"{what} while queue {name} borrows in its tree ({over / WHOLE:g} GPUs of {key} past "
                "its nominal): what was lent could never be taken back; try again once none borrows",
            )


def _a_queue_under(state: State, ledger: quota.Ledger, cohort: str) -> str | None:
    """A queue of the tree ``cohort`` is in (None: its tree has no queue, so nothing is lent in it)."""
    root = ledger.cohort_root(cohort)
    return next((q for q in sorted(state.queues) if ledger.has_queue(q) and ledger.root(q) == root), None)


def _apply_cohort(state: State, ctx: Ctx, req: ApplyCohort) -> None:
    _admin(ctx)
    c = req.cohort
    if not subj.is_token(c.name):
        raise Refused("malformed", f"cohort name {c.name!r} is not a valid name")
    problem = _quota_problem(f"cohort {c.name}", c.quotas)
    if problem:
        raise Refused("malformed", problem)
    parent, seen = c.parent, {c.name}
    while parent is not None:
        if parent in seen:
            raise Refused("malformed", f"cohort {c.name}: parent chain loops at {parent}")
        seen.add(parent)
        p = state.cohorts.get(parent)
        parent = p.parent if p is not None else None
    before = state.cohorts.get(c.name)
    if before is not None and before.parent is not None and before.parent != c.parent:
        ledger = quota.Ledger.from_state(state)
        queue = _a_queue_under(state, ledger, c.name)
        if queue is not None:
            _none_borrows(state, ledger, queue, f"cohort {c.name} may not leave its parent {before.parent}")
    _put_keeping_fixed(state, state.cohorts, c.name, c, "cohort")


# The least weight a queue may have: shares are divided by it, and a weight of 1e-320 made them
# infinite (a queue that should never be preferred has a weight far below the others', not 0).
MIN_WEIGHT = 1e-6


def _apply_priority_class(state: State, ctx: Ctx, req: ApplyPriorityClass) -> None:
    _admin(ctx)
    pc = req.priority_class
    if not subj.is_token(pc.name):
        raise Refused("malformed", f"priority class {pc.name!r} is not a name")
    for field, seconds in (("min_runtime_s", pc.min_runtime_s), ("cooldown_s", pc.cooldown_s)):
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise Refused(
                "malformed",
                f"priority class {pc.name}: {field} {seconds} is not a number of seconds, 0 or more",
            )
    for field, times in (
        ("max_preemptions", pc.max_preemptions),
        ("max_preemptions_per_hour", pc.max_preemptions_per_hour),
    ):
        if times is not None and times < 0:
            raise Refused(
                "malformed", f"priority class {pc.name}: {field} {times} is not a number of times, 0 or more"
            )
    hourly = pc.max_preemptions_per_hour
    if hourly is not None and hourly > MAX_PREEMPTION_TIMES:  # the times a job keeps: no more binds
        raise Refused(
            "malformed",
            f"priority class {pc.name}: max_preemptions_per_hour is at most {MAX_PREEMPTION_TIMES}, "
            f"not {hourly}",
        )
    before = state.priority_classes.get(req.priority_class.name)
    state.priority_classes[req.priority_class.name] = req.priority_class
    turned = (before is None or before.preemptible) != pc.preemptible
    recapped = (before.max_preemptions if before is not None else None) != pc.max_preemptions
    if turned or recapped:
        # Whether its jobs could be stopped, so may borrow, changed (``quota.stoppable``); none
        # name it: nothing.
        was = {q: dict(held) for q, held in state.quota_held_fixed.items()}
        standings = quota.refix(state, pc.name)
        past = _fixed_past_limit(state, was)
        if past is not None:
            if before is None:
                del state.priority_classes[pc.name]
            else:
                state.priority_classes[pc.name] = before
            quota.restore(state, standings)
            if not pc.preemptible:
                change, then = "turn non-preemptible", "Turn it off once they end"
            else:
                change, then = f"cap its jobs' preemptions at {pc.max_preemptions}", "Lower it once they end"
            raise Refused(
                "forbidden",
                f"priority class {pc.name} may not {change} while its jobs borrow: {past}; once "
                f"they may not be stopped, what they borrowed could never be taken back. {then}, "
                "or cancel them",
            )


def _fixed_past_limit(state: State, was: dict[str, dict[str, int]]) -> str | None:
    """Where jobs that may not be preempted now hold more than they may and than they held
    before (``was``), in words (``Ledger.fixed_limit``: their queue's nominal and its part of a
    shared cohort quota); None if nowhere."""
    ledger = quota.Ledger(state)
    for queue, held in sorted(state.quota_held_fixed.items()):
        if not ledger.has_queue(queue):
            continue
        for key, milli in sorted(held.items()):
            most = ledger.fixed_limit(queue, key)
            if milli > most and milli > was.get(queue, {}).get(key, 0):
                return (
                    f"queue {queue}'s would hold {quota.gpus_text(milli, key)}, "
                    f"past its {quota.fmt_gpus(most)}"
                )
    return None


def _apply_fair_share(state: State, ctx: Ctx, req: ApplyFairShare) -> None:
    _admin(ctx)
    half_life = req.fair_share.half_life_s
    if not (half_life >= MIN_HALF_LIFE_S and math.isfinite(half_life)):
        raise Refused(
            "malformed",
            f"fair share: half_life_s {half_life} is not a number of seconds, {MIN_HALF_LIFE_S:g} or more",
        )
    short = req.fair_share.short_job_gpu_s
    if not (short >= 0 and math.isfinite(short)):
        raise Refused(
            "malformed", f"fair share: short_job_gpu_s {short} is no number of GPU-seconds, 0 or more"
        )
    gpu_time.apply_settings(state, req.fair_share, ctx.time)


def _apply_retention(state: State, ctx: Ctx, req: ApplyRetention) -> None:
    _admin(ctx)
    keep = req.retention.finished_s
    if not (keep >= 0 and math.isfinite(keep)):
        raise Refused("malformed", f"retention: finished_s {keep} is not a number of seconds, 0 or more")
    if req.retention.jobs_per_tenant < 1:
        most = req.retention.jobs_per_tenant
        raise Refused("malformed", f"retention: jobs_per_tenant {most} is not a number of jobs, 1 or more")
    if req.retention.spec_bytes_per_tenant < indexes.SPEC_BYTES:
        most = req.retention.spec_bytes_per_tenant
        raise Refused(
            "malformed",
            f"retention: spec_bytes_per_tenant {most} is less than a job's spec holds ({indexes.SPEC_BYTES})",
        )
    retention.apply_settings(state, req.retention)


def _delete_queue(state: State, ctx: Ctx, req: DeleteQueue) -> None:
    _admin(ctx)
    if req.name not in state.queues:
        raise Refused("unknown", f"no queue {req.name}")
    # Every unfinished job, whatever its queue: a rare request, and it costs no finished job.
    held = sorted(j.id for j in indexes.unfinished(state) if j.spec.queue == req.name)
    if held:
        # Which, as a priority class's refusal says: the admin is to cancel them or let them end.
        said = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise Refused("illegal", f"queue {req.name} still has jobs not finished: {said}")
    del state.queues[req.name]
    # What its jobs held, decayed: nothing is held any longer, and a queue made again under
    # the name starts without a history that is not its own.
    state.gpu_time.pop(req.name, None)


def _delete_cohort(state: State, ctx: Ctx, req: DeleteCohort) -> None:
    _admin(ctx)
    cohort = state.cohorts.get(req.name)
    if cohort is None:
        raise Refused("unknown", f"no cohort {req.name}")
    members = [f"queue {q.name}" for q in state.queues.values() if q.cohort == req.name]
    members += [f"cohort {c.name}" for c in state.cohorts.values() if c.parent == req.name]
    if members:
        said = ", ".join(sorted(members)[:3]) + (f" and {len(members) - 3} more" if len(members) > 3 else "")
        raise Refused("illegal", f"cohort {req.name} still has members: {said}; move or delete them first")
    if cohort.quotas:
        ledger = quota.Ledger.from_state(state)
        queue = _a_queue_under(state, ledger, req.name)
        if queue is not None:
            _none_borrows(state, ledger, queue, f"cohort {req.name} and its quota may not leave its tree")
    del state.cohorts[req.name]


def _delete_priority_class(state: State, ctx: Ctx, req: DeletePriorityClass) -> None:
    """Classes were only ever added: a cluster whose teams come and go kept every one, in every
    service's state and answer."""
    _admin(ctx)
    if req.name not in state.priority_classes:
        raise Refused("unknown", f"no priority class {req.name}")
    # Every unfinished job: a rare request, and it costs no finished job.
    users = sorted(j.id for j in indexes.unfinished(state) if j.spec.priority_class == req.name)
    if users:
        said = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
        raise Refused("illegal", f"priority class {req.name} is named by jobs not finished: {said}")
    del state.priority_classes[req.name]


def _cordon_request(state: State, ctx: Ctx, req: CordonNode) -> None:
    _admin(ctx)
    if req.repaired and req.cordoned:
        raise Refused("malformed", f"node {req.node}: repaired goes with an uncordon, not a cordon")
    default = "drained by admin" if req.drain else "cordoned by admin"
    cordon(state, ctx, req.node, req.cordoned, req.drain, req.reason or default)
    if req.repaired:
        for g in state.nodes[req.node].gpus:
            g.healthy, g.signal = True, ""


def _delete_node(state: State, ctx: Ctx, req: DeleteNode) -> None:
    """A node gone for good leaves the state: nodes replaced over months would otherwise stay in
    every service's state, cycle and answer. Only one no job holds anything on."""
    _admin(ctx)
    if req.node not in state.nodes:
        raise Refused("unknown", f"no node {req.node}")
    holding = indexes.holding_on(state, req.node)
    if holding:
        jobs = ", ".join(j.id for j in holding[:3]) + (
            f" and {len(holding) - 3} more" if len(holding) > 3 else ""
        )
        raise Refused("illegal", f"node {req.node} holds work of {jobs}: drain it first")
    del state.nodes[req.node]
    state.holding_by_node.pop(req.node, None)


HANDLERS: dict[type[Event], Handler] = {
    SubmitJob: _submit,
    CancelJob: _cancel,
    ResizeJob: _resize,
    ApplyQueue: _apply_queue,
    ApplyCohort: _apply_cohort,
    ApplyPriorityClass: _apply_priority_class,
    ApplyFairShare: _apply_fair_share,
    ApplyRetention: _apply_retention,
    DeleteQueue: _delete_queue,
    DeleteCohort: _delete_cohort,
    DeletePriorityClass: _delete_priority_class,
    CordonNode: _cordon_request,
    DeleteNode: _delete_node,
}
