"""Admission's decision core: one cycle over all pending work, as events. Pure: no IO, no clock.

``decide(state, now, config)`` reads a State folded up to ``state.seq`` and returns, in order:

1. ``JobAccepted`` / ``JobRejected`` for every submitted job (``validate``), by submission;
2. ``JobRequeued`` for every preempted or interrupted job, resuming from its last checkpoint;
   then, for jobs no node of the cluster can host any more (``Inventory``), ``AdmissionWithdrawn``
   for those admitted and ``PendingReasonChanged`` for those queued (see Hosts);
3. one ``JobsAdmitted`` (``based_on = state.seq``, ``now``) holding this cycle's admissions:
   first the beneficiaries of preemptions (below), then queued jobs in fair-share order
   (``order``), each gang admitted whole or not at all, an elastic job at the largest replica
   count in min..max that fits (at least min);
4. ``PendingReasonChanged`` for every waiting job whose reason differs from the one it has.

Jobs accepted or requeued in steps 1-2 compete in step 3 of the same cycle: their events come
first in the output, so when the fold reaches ``JobsAdmitted`` they are queued at the attempt
the admission names. Quota is charged in a Ledger as admissions are made, in the order they are
listed, which is the order the fold checks them in; so folding the output voids nothing.

Holds. The first job of a best-effort queue that does not fit holds its share of the queue's
nominal quota against later jobs of the queue (``projections.holds.Hold``); when it is free of the queue's
own jobs is projected from when they end (``projections.holds.quota_end``; a job admitted this cycle, at
``now`` plus its runtime estimate). The preemptor keeps the same holds: it stops nobody for a
job that the hold would keep out.

Nominations. A preemption frees quota for its beneficiary (the job its victims' ``preempted_for``
names), and nobody else may take it meanwhile. While some victims of a queued beneficiary still
checkpoint (or shrink), what the beneficiary will be admitted with is charged here on top of
what the victims still hold: the quota the preemptor counted on, the victims' and what was free
besides, so that no newcomer takes it; and victims already stopped stay stopped (not requeued),
their quota charged, so that the placer keeps their GPUs for the beneficiary. Once none
checkpoints, they are all requeued in one cycle, and in that cycle the queued beneficiaries of
stopped victims are admitted before the fair-share order. How long a victim stays stopped is
bounded by the preemption's deadline, by which every victim has stopped.

Lending holds. A queue whose first waiting job would be within its nominal quota but does not
fit, because other queues borrow what it lent, keeps that share from being lent again for the
rest of the cycle (Kueue's reservation for a lender that cannot be sure to reclaim; here for
every policy, so that borrowers are not admitted into quota the preemptor is about to take back
for it, and stopped again). One whose first waiting job fits the nominal only once the queue's
own jobs end keeps what of the nominal is free, unless it may take back lent quota from any
priority (``reclaim_within_cohort = "any"``), as Kueue does. The holds of the queues' first
waiting jobs are taken before anyone is admitted, so the order the cycle takes queues in (two
heads that borrow equally far go by fair share) does not let a borrower in first.

Reasons. The first ``config.detail`` waiting jobs of each queue carry figures ("needs 8 H100;
queue team-a at its nominal 16/16 H100; cohort org has 0 to lend; position 3 of 7; would fit
now if team-b's 8 borrowed H100 were reclaimed"); jobs further back carry one stable reason per
queue, and get it only once they had another one, so that a deep backlog does not turn every
admission into thousands of reason events.

Hosts. A job no node can host is refused at submission (``validate``), but nodes leave and
re-register with other GPUs. An admitted job that no node can host any more gives its quota back
(``AdmissionWithdrawn``: queued again, same attempt), and a queued job no node can host is left
out of the order: it holds no quota and blocks nobody, and it is admitted again in the first
cycle after a node that can host it registers (or comes back). It is not rejected: a node that
left may return. With no node at all (a cluster starting, or all of it gone at once) nothing
is judged.

Timeouts. Quota held by an admitted job that finds no room is idle quota: the GPUs free are
scattered where it cannot use them, and other jobs that could use them wait for quota (as
Kueue's ``waitForPodsReady``). An admitted job that the placer has found no room for since
``placement_timeout_s`` (log time) after its admission gives it back (``AdmissionWithdrawn``,
queued again, same attempt) and sits out ``placement_backoff_s`` before it is admitted again;
the fold voids an admission proposed during the back-off. The job the placer's reservation is
for keeps its admission (it starts once the reserved GPUs free, and it cannot starve), and so do
the beneficiaries of preemptions under way.

Growth. Last, running elastic jobs below their most workers are admitted at more (``grow``),
with the quota the cycle left over and only while nobody waits in their cohort tree; the growths
ride in the same ``JobsAdmitted``, after the admissions. An elastic job shrinking for a
beneficiary nominates it, as a checkpointing victim does. A growth whose added ranks the placer
has placed nowhere for ``placement_timeout_s`` is withdrawn as an admission is (the job runs on
at the workers it has) and the job does not grow again for ``placement_backoff_s``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter

import msgspec

from corral.events.base import Event, Reason
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
)
from corral.projections import indexes, preemption, queueing, quota, runtimes
from corral.projections.holds import Hold, QuotaHolders, hold
from corral.projections.index import deadline_text
from corral.projections.lifecycle import Phase
from corral.projections.placement.inventory import Inventory
from corral.projections.quota import Ledger, fmt_gpus, gpus_text, key_name
from corral.projections.state import JobState, State
from corral.projections.visibility import job_named, sees_queue
from corral.services.admission.backlog import Backlog
from corral.services.admission.grow import growths
from corral.services.admission.lending import LendingHolds
from corral.services.admission.order import Cursor, FairShare, FairShareOrder, sort_queue
from corral.services.admission.validate import priority_value, validate


@dataclass(frozen=True)
class AdmissionConfig:
    detail: int = 10  # jobs at the front of each queue whose reasons carry figures
    max_admissions: int = 1000  # per cycle, to bound the size of one JobsAdmitted event
    # Best-effort queues: how many jobs that do not fit a cycle may look past, per queue. Bounds
    # a cycle over deep, full queues; jobs further back wait for the queue to move.
    lookahead: int = 64
    grow: bool = True  # grow running elastic jobs into quota nobody waits for
    # An admitted job the placer finds no room for this long (log time; None: never) gives its
    # quota back, and may not be admitted again for ``placement_backoff_s`` (see Timeouts).
    placement_timeout_s: float | None = 300.0
    placement_backoff_s: float = 1800.0

    def __post_init__(self) -> None:
        t, b = self.placement_timeout_s, self.placement_backoff_s
        if t is not None and not (0 < t < math.inf):
            raise ValueError(f"placement_timeout_s must be a positive number of seconds or None, not {t}")
        if not 0 <= b <= queueing.MAX_BACKOFF_S:
            raise ValueError(f"placement_backoff_s must be 0 to {queueing.MAX_BACKOFF_S:.0f} s, not {b}")


DEFAULT = AdmissionConfig()

# Submission order, which a walk of ``State.jobs`` gave (the fold adds jobs as they are submitted).
_SUBMISSION = attrgetter("submitted_seq", "id")


def decide(state: State, now: float, config: AdmissionConfig = DEFAULT) -> list[Event]:
    # 0. Snapshot, from what the fold keeps: usage per queue, each queue's holders as the cycle
    # asks about them, each queue's backlog from its queued jobs, in the queue's order. No
    # finished job is looked at, and of the jobs holding quota only the queues asked about.
    ledger = Ledger.from_state(state)
    inventory = Inventory(state)
    ledger.hosts = inventory.hosts_spec  # a job's order and holds on a model it can run on
    fair = FairShare(ledger, state, now)
    holders = QuotaHolders(state, now, ledger.has_queue)  # read per queue, as asked
    waiting = _Waiting(state)
    explained: defaultdict[str, list[JobState]] = defaultdict(list)  # waiting jobs with a reason
    stopping: set[str] = set()  # beneficiaries some victim still checkpoints for
    elastic = indexes.elastic_in(state, "running")  # which may grow
    for job in indexes.jobs_in(state, "checkpointing"):
        if job.preempted_for:
            stopping.add(job.preempted_for)
    for job in elastic:
        if job.preempted_for and job.leaving:  # shrinking for a beneficiary
            stopping.add(job.preempted_for)
    # Each queue's backlog is read from its order the fold keeps, only as far as the cycle goes
    # (``Backlog``); the queued jobs with a reason, from the fold's index of them: a deep backlog
    # carries none, and is not walked.
    for name in state.explained_by_queue:
        explained[name] = indexes.explained(state, name)
    submitted = indexes.jobs_in(state, "submitted")
    stopped = indexes.jobs_in(state, "preempted", "interrupted")
    stopped.sort(key=_SUBMISSION)
    events: list[Event] = []

    # 1. Accept or reject what was submitted, in submission order.
    submitted.sort(key=lambda j: (j.submitted_seq, j.id))
    for job in submitted:
        why = validate(state, job, ledger, inventory)
        if why is not None:
            events.append(JobRejected(job_id=job.id, request_seq=job.submitted_seq, reason=why))
            continue
        prio = priority_value(state, job.spec.priority_class) or 0
        events.append(JobAccepted(job_id=job.id, priority=prio))
        as_queued = msgspec.structs.replace(job, phase="queued", priority=prio, reasons=())
        waiting[job.spec.queue].add(as_queued)

    # 2. Hold what the queued beneficiaries of stops under way will be admitted with, all the
    # preemptor counted on (the victims' quota and what was free besides), on top of what the
    # victims still hold until they are gone. Send stopped jobs back to their queue for their
    # next attempt, but for victims kept stopped for a beneficiary (see Nominations), whose
    # quota stays charged.
    for job_id in sorted(stopping):
        beneficiary = state.jobs.get(job_id)
        if beneficiary is not None and beneficiary.phase == "queued":
            preemption.hold(state, ledger, beneficiary)
            waiting[beneficiary.spec.queue].drop(job_id)
            why = _made_room_for(state, beneficiary)
            if why is not None:
                # Its reason is this one alone: not the queue's stable one for jobs further back.
                queue = beneficiary.spec.queue
                explained[queue] = [j for j in explained.get(queue, ()) if j.id != job_id]
                if beneficiary.reasons != (why,):
                    events.append(PendingReasonChanged(job_id=job_id, reasons=(why,)))
    stopped, nominated = _nominations(state, stopped, stopping, ledger, holders, now)
    nominated -= stopping
    stopped.sort(key=lambda j: (j.submitted_seq, j.id))
    back: list[JobState] = []  # requeued jobs that keep their place (a planned shutdown's)
    for job in stopped:
        reason = _requeue_reason(job)
        resume = job.checkpoint.location if job.checkpoint is not None else None
        events.append(JobRequeued(job_id=job.id, attempt=job.attempt, reason=reason, resume_from=resume))
        as_queued = msgspec.structs.replace(
            job, phase="queued", attempt=job.attempt + 1, admission=None, placement=None, reasons=(reason,)
        )
        waiting[job.spec.queue].add(as_queued)
        explained[job.spec.queue].append(as_queued)
        if queueing.keeps_place(as_queued):
            back.append(as_queued)
    unhosted = _unhosted(state, inventory, ledger, waiting, explained, events)
    nominated -= unhosted
    _placement_timeouts(state, config, nominated | stopping | unhosted, now, events)
    _growth_timeouts(elastic, config, now, events)
    _backing_off(waiting, explained, now)

    # 3. Order the backlog by fair share; 4. admit whole gangs while quota allows.
    lost = sorted(
        (job for name, jobs in waiting.items() if not ledger.has_queue(name) for job in jobs),
        key=lambda j: (j.submitted_seq, j.id),
    )
    back = [j for j in back if j.id not in unhosted]
    first = _admit_first(back, waiting, explained, ledger, config.max_admissions, inventory)
    first += _admit_nominated(
        state, nominated, waiting, explained, ledger, config.max_admissions - len(first), inventory
    )
    for adm in first:
        _ends_at(holders, state.jobs[adm.job_id], adm, now)
    order = FairShareOrder(waiting, ledger, fair, config.lookahead, waiting.keys(), now)
    lending_holds = LendingHolds(ledger)
    lending_holds.keep_for_heads(waiting, holders, now)
    admissions = first + _admit(
        order, ledger, config.max_admissions - len(first), now, holders, lending_holds, inventory
    )
    most = inventory.most_workers
    grown = growths(state, ledger, elastic, waiting, admissions, now, most) if config.grow else []
    if admissions or grown:
        events.append(
            JobsAdmitted(based_on=state.seq, now=now, admissions=tuple(admissions), growths=tuple(grown))
        )

    # 5. Say why everything else waits, where that changed.
    events.extend(_reasons(order, explained, ledger, holders, config.detail, now, lending_holds))
    for job in lost:
        why = Reason("unknown-queue", f"queue {job.spec.queue} no longer exists; cancel and resubmit the job")
        if job.reasons != (why,):
            events.append(PendingReasonChanged(job_id=job.id, reasons=(why,)))
    return events


def _requeue_reason(job: JobState) -> Reason:
    why = job.reasons[0].message if job.reasons else job.phase
    msg = f"{why}; back in queue {job.spec.queue} for attempt {job.attempt + 1}"
    if job.checkpoint is not None:
        msg += f", resuming from step {job.checkpoint.step}"
    else:  # what it had done is lost: its owner and the admin should not have to guess
        msg += ", from the start (no checkpoint)"
    return Reason(queueing.REQUEUED, msg)


# -- nominations -----------------------------------------------------------------------------------


def _nominations(
    state: State,
    stopped: list[JobState],
    stopping: set[str],
    ledger: Ledger,
    holders: QuotaHolders,
    now: float,
) -> tuple[list[JobState], set[str]]:
    """Split the stopped jobs: those to requeue now, and victims kept stopped because another
    victim of their waiting beneficiary still checkpoints (charged to the ledger again, to be
    given back as soon as they are requeued). Also returns the beneficiaries nominated this
    cycle: those with victims stopping or stopped."""
    nominated = set(stopping)
    requeue: list[JobState] = []
    for job in stopped:
        b = job.preempted_for if job.phase == "preempted" else ""
        if not b:
            requeue.append(job)
            continue
        nominated.add(b)
        beneficiary = state.jobs.get(b)
        if b in stopping and beneficiary is not None and beneficiary.phase in ("queued", "admitted"):
            held = ledger.hold(job)
            if held is not None:
                holders.end(job.spec.queue, held[0], now, held[1])
        else:
            requeue.append(job)
    return requeue, nominated


def _admit_nominated(
    state: State,
    nominated: set[str],
    waiting: _Waiting,
    explained: dict[str, list[JobState]],
    ledger: Ledger,
    cap: int,
    inventory: Inventory,
) -> list[Admission]:
    """Admit the queued beneficiaries of preemptions, highest priority first, ahead of the
    fair-share order: the quota their victims gave back is theirs. Those admitted leave
    ``waiting`` and ``explained``."""
    found = [state.jobs[b] for b in nominated if b in state.jobs]
    found = [b for b in found if b.phase == "queued"]
    found.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
    return _admit_first(found, waiting, explained, ledger, cap, inventory)


def _admit_first(
    found: list[JobState],
    waiting: _Waiting,
    explained: dict[str, list[JobState]],
    ledger: Ledger,
    cap: int,
    inventory: Inventory,
) -> list[Admission]:
    """Admit the queued jobs ``found``, in that order, ahead of the fair-share order, each whole
    where its quota allows: beneficiaries of preemptions (the quota their victims gave back),
    and, before them, jobs a planned shutdown requeued that keep their place
    (``queueing.keeps_place``: the quota they gave back at the shutdown). Those admitted leave
    ``waiting`` and ``explained``."""
    found = [j for j in found if ledger.has_queue(j.spec.queue)]
    out: list[Admission] = []
    for job in found[: max(0, cap)]:
        queue = job.spec.queue
        adm = _fit(queue, job, ledger, inventory)
        if adm is None:
            continue
        out.append(adm)
        waiting[queue].drop(job.id)
        if queue in explained:
            explained[queue] = [j for j in explained[queue] if j.id != job.id]
    return out


def _fit(queue: str, job: JobState, ledger: Ledger, inventory: Inventory) -> Admission | None:
    """Admit one job whole if its quota allows (charged to ``ledger``), as ``_admit`` does."""
    demands, lo, hi = _asked(inventory, ledger, queue, job)
    if not demands:  # needs no GPU, so no quota
        return Admission(job_id=job.id, attempt=job.attempt, replicas=hi)
    borrow = ledger.may_borrow(job)
    best: tuple[int, str, int] | None = None  # (replicas, key, milli-GPU per worker), as ``_admit``
    for key, per_worker, most in demands:
        replicas = min(most, ledger.available(queue, key, borrow) // per_worker)
        if replicas >= lo and (best is None or replicas > best[0]):
            best = (replicas, key, per_worker)
            if replicas == hi:
                break
    if best is None:
        return None
    replicas, key, per_worker = best
    milli = per_worker * replicas
    ledger.charge(queue, key, milli, fixed=not borrow)
    gpus = quota.admission_gpus(key, milli)
    return Admission(job_id=job.id, attempt=job.attempt, replicas=replicas, gpus=gpus)


def _asked(
    inventory: Inventory, ledger: Ledger, queue: str, job: JobState
) -> tuple[list[tuple[str, int, int]], int, int]:
    """What admitting ``job`` in ``queue`` may charge: its quota demands (milli-GPU per worker
    of each key, with the most workers it may be admitted at there; empty for a job of no GPU)
    on the models some node could host it on (``Ledger.demands``: once admitted on a model it
    runs on that model's GPUs only, ``shape.placed_resources``, so a model no node can host it
    on would be admitted, never placed, and admitted again), and its least and most workers, at
    most as many as the cluster could place at once (``Inventory.most_workers``). An elastic
    job of several models runs on the one it is charged to: its most there are those GPUs'."""
    spec = job.spec
    demands = ledger.demands(queue, spec)
    hi = min(spec.replicas, inventory.most_workers(job))
    models = spec.resources.gpu_models
    if spec.min_replicas is None or len(models) < 2:
        return [(key, per_worker, hi) for key, per_worker in demands], quota.min_replicas(spec), hi
    most = inventory.most_workers
    each = [(key, d, min(hi, most(job, key)) if key in models else hi) for key, d in demands]
    return each, quota.min_replicas(spec), hi


class _Waiting(dict[str, Backlog]):
    """Each queue's ``Backlog`` this cycle, made on first mention."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self._state = state
        for name, places in state.queued_by_queue.items():
            self[name] = Backlog(state.jobs, name, places)

    def __missing__(self, name: str) -> Backlog:
        found = self[name] = Backlog(self._state.jobs, name, ())
        return found


# -- hosts -----------------------------------------------------------------------------------------


def _unhosted(
    state: State,
    inventory: Inventory,
    ledger: Ledger,
    waiting: _Waiting,
    explained: dict[str, list[JobState]],
    events: list[Event],
) -> set[str]:
    """Withdraw the admissions of jobs no node can host any more, and take the waiting ones out
    of ``waiting`` and ``explained``, saying why they wait; returns the ids of both. Their quota
    stays charged in ``ledger`` this cycle: the fold gives it back, and the next cycle uses it.
    (The State's queued jobs are judged shape by shape, from the fold's index of them
    (``Inventory.unhosted_queued``): a deep backlog is not walked, only the jobs of shapes no
    node can host. Then the admitted and stopped ones, job by job. What it finds is taken in
    submission order.)"""
    if inventory.empty:
        return set()
    out: set[str] = set()
    homeless: dict[str, dict[str, Reason]] = {}  # queue -> job -> why it waits
    found = inventory.unhosted_queued(state)
    found += inventory.unhosted(indexes.jobs_in(state, *_HOSTED_LATER))
    found.sort(key=lambda item: _SUBMISSION(item[0]))
    for job, why in found:
        if job.phase == "admitted":
            events.append(AdmissionWithdrawn(job_id=job.id, attempt=job.attempt, reason=_waits(why)))
            out.add(job.id)
        elif ledger.has_queue(job.spec.queue):  # else it waits for its queue, and is told so
            homeless.setdefault(job.spec.queue, {})[job.id] = _waits(why)
    for name, why_of in homeless.items():
        if name not in waiting:
            continue
        backlog = waiting[name]
        # Those the State holds queued first, then those the cycle queued, each by submission.
        found_in = [i for i in why_of if backlog.has(i)]
        found_in.sort(key=backlog.added)  # stable
        for job_id in found_in:
            job = backlog.job(job_id)
            reason = why_of[job_id]
            backlog.drop(job_id)
            out.add(job_id)
            if job.reasons != (reason,):
                events.append(PendingReasonChanged(job_id=job_id, reasons=(reason,)))
        if name in explained:
            explained[name] = [j for j in explained[name] if j.id not in out]
    return out


# -- timeouts --------------------------------------------------------------------------------------


def _times_out_at(job: JobState, timeout: float) -> float | None:
    """When an admitted job's placement timeout runs out: ``timeout`` after its admission, if
    the placer has said why it waits (it may be down otherwise) and that is not that its
    reservation is for the job with a start in sight (placed as soon as the reserved GPUs free;
    not one that waits for jobs with no runtime estimate, ``queueing.RESERVED_UNTIMED``).
    None: never."""
    if not job.reasons or job.reasons[0].code == queueing.RESERVED:
        return None
    return job.phase_since + timeout


def _placement_timeouts(
    state: State, config: AdmissionConfig, exempt: set[str], now: float, events: list[Event]
) -> None:
    """Withdraw the admissions of jobs whose placement timeout (``_times_out_at``) has run out,
    but those ``exempt`` (beneficiaries of preemptions under way, jobs no node can host). Their
    quota stays charged in this cycle's ledger: the fold gives it back, and the next cycle
    admits others into it."""
    timeout = config.placement_timeout_s
    if timeout is None:
        return
    for job in indexes.jobs_in(state, "admitted"):  # no more than quota admits
        at = _times_out_at(job, timeout)
        if job.id in exempt or at is None or now < at:
            continue
        after = now + config.placement_backoff_s
        why = job.reasons[0].message
        reason = Reason(
            "placement-timeout",
            f"admitted at {deadline_text(job.phase_since)} and placed nowhere for {timeout:.0f} s "
            f"({why}); its quota given back, it may be admitted again from {deadline_text(after)}",
        )
        withdrawn = AdmissionWithdrawn(job_id=job.id, attempt=job.attempt, reason=reason, admit_after=after)
        events.append(withdrawn)


def _growth_timeouts(
    elastic: list[JobState], config: AdmissionConfig, now: float, events: list[Event]
) -> None:
    """Withdraw the growths of running elastic jobs whose added ranks the placer has placed
    nowhere for the placement timeout since they grew: the quota admission counted free GPUs
    for may be on GPUs their topology, selector or model rules out, or that failed since. The
    job keeps running at the workers it has and sits out the back-off before it grows again."""
    timeout = config.placement_timeout_s
    if timeout is None:
        return
    for job in elastic:
        if not queueing.growth_unplaced(job) or now < job.grown_at + timeout:
            continue
        assert job.admission is not None and job.placement is not None
        after = now + config.placement_backoff_s
        reason = Reason(
            "growth-timeout",
            f"grown to {job.admission.replicas} workers at {deadline_text(job.grown_at)} and its added "
            f"ranks placed nowhere for {timeout:.0f} s; it runs on at {len(job.placement.workers)}, "
            f"the quota of the rest given back, and may grow again from {deadline_text(after)}",
        )
        withdrawn = AdmissionWithdrawn(job_id=job.id, attempt=job.attempt, reason=reason, admit_after=after)
        events.append(withdrawn)


def wake(state: State, now: float, config: AdmissionConfig = DEFAULT) -> float:
    """The earliest log time after ``now`` at which the passing of time alone may change what a
    cycle decides: an admission's placement timeout running out, or a back-off ending. (The
    rest of what a cycle reads changes with records.)"""
    soonest = math.inf
    timeout = config.placement_timeout_s
    if timeout is not None:
        for job in indexes.jobs_in(state, "admitted"):
            at = _times_out_at(job, timeout)
            if at is not None and now < at < soonest:
                soonest = at
    for name in state.explained_by_queue:  # a job that backs off has a reason (``_backing_off``)
        for job in indexes.explained(state, name):
            if now < job.admit_after < soonest:
                soonest = job.admit_after
    for job in indexes.elastic_in(state, "running"):  # growths placed nowhere, and their back-offs
        if timeout is not None and queueing.growth_unplaced(job):
            at = job.grown_at + timeout
            if now < at < soonest:
                soonest = at
        if now < job.grow_after < soonest:
            soonest = job.grow_after
    return soonest


def _backing_off(waiting: _Waiting, explained: dict[str, list[JobState]], now: float) -> None:
    """Leave the jobs that sit out a placement back-off out of the cycle: they are admitted in
    none, hold nobody back and keep the reason they were withdrawn with. (Such a job has that
    reason, so it is among the queued jobs with one, which the fold indexes.)"""
    for name, jobs in explained.items():
        out = [j.id for j in jobs if queueing.backs_off(j, now)]
        if out:
            for job_id in out:
                waiting[name].drop(job_id)
            gone = set(out)
            explained[name] = [j for j in jobs if j.id not in gone]


# Jobs that wait to be hosted, besides the queued ones: admitted, or stopped and about to be
# queued again.
_HOSTED_LATER: tuple[Phase, ...] = ("admitted", "preempted", "interrupted")


def _waits(why: Reason) -> Reason:
    return Reason(
        why.code, f"{why.message}; waits, holding no quota, until a node that can host it registers"
    )


# -- 4. admission ----------------------------------------------------------------------------------


def _admit(
    order: FairShareOrder,
    ledger: Ledger,
    cap: int,
    now: float,
    holders: QuotaHolders,
    lending_holds: LendingHolds,
    inventory: Inventory,
) -> list[Admission]:
    out: list[Admission] = []
    while len(out) < cap and (cur := order.pop()) is not None:
        job = cur.head
        demands, lo, hi = _asked(inventory, ledger, cur.name, job)
        if not demands:  # needs no GPU, so no quota
            out.append(Admission(job_id=job.id, attempt=job.attempt, replicas=hi))
            order.admitted(cur)
            continue
        held = cur.hold
        borrow = ledger.may_borrow(job)
        # The model it fits whole on first, in its order; else (an elastic job) the one it fits
        # most workers on, the first of equals: Kueue's partial admission tries the whole count
        # on every flavor before any smaller count.
        best: tuple[int, str, int] | None = None  # (replicas, key, milli-GPU per worker)
        for key, per_worker, most in demands:
            room = cur.room.get(key)
            if room is not None and per_worker * lo > room:
                continue
            avail = lending_holds.available(cur.name, key, borrow)
            replicas = min(most, avail // per_worker)
            if borrow:  # what the queue's jobs that may borrow still have room for
                cur.room[key] = avail
            else:  # ... and those that may not
                cur.fixed_room[key] = avail
            if held is not None:  # what a job behind the held one may take without delaying it
                spare = held.spare(ledger, cur.name, key, job, now)
                if spare is not None:
                    replicas = min(replicas, spare // per_worker)
            if replicas >= lo and (best is None or replicas > best[0]):
                best = (replicas, key, per_worker)
                if replicas == hi:
                    break
        if best is not None:
            replicas, key, per_worker = best
            milli = per_worker * replicas
            lending_holds.charge(cur.name, key, milli, fixed=not borrow)
            lending_holds.admitted(job.id)
            if key in cur.room:
                cur.room[key] -= milli
            if not borrow and key in cur.fixed_room:  # a borrower leaves the nominal's room be
                cur.fixed_room[key] -= milli
            gpus = quota.admission_gpus(key, milli)
            out.append(Admission(job_id=job.id, attempt=job.attempt, replicas=replicas, gpus=gpus))
            _ends_at(holders, job, out[-1], now)
            order.admitted(cur)
        else:
            if held is None:
                found = hold(ledger, cur.name, job, holders, now)
                if found is not None:
                    lending_holds.keep(cur.name, job.id, found)
                    if not cur.strict:  # a strict queue goes no further than its head anyway
                        cur.hold = found
            order.passed(cur)
    return out


def _made_room_for(state: State, beneficiary: JobState) -> Reason | None:
    """Why a beneficiary waits while jobs stop or shrink for it: how many, and by when (a log
    time, written as a person reads it, and stable from cycle to cycle). Whose they are is not
    said: they may be other tenants'. None if none does."""
    deadlines = []
    for victim_id in beneficiary.victims:
        victim = state.jobs.get(victim_id)
        if victim is None or victim.preempted_for != beneficiary.id:
            continue
        if victim.phase == "checkpointing" or (victim.phase == "running" and victim.leaving):
            deadlines.append(victim.preempt_deadline)
    if not deadlines:
        return None
    n = len(deadlines)
    jobs = "1 job stops or shrinks" if n == 1 else f"{n} jobs stop or shrink"
    return Reason("preempting", f"{jobs} to make room for it, by {deadline_text(max(deadlines))}")


def _ends_at(holders: QuotaHolders, job: JobState, adm: Admission, now: float) -> None:
    """Count a job admitted this cycle among its queue's holders: it ends its runtime estimate
    from now."""
    if len(adm.gpus) == 1:
        key = next(iter(adm.gpus))
        est = runtimes.of(job)
        milli = quota.worker_milli(job.spec.resources, key) * adm.replicas
        holders.end(job.spec.queue, key, math.inf if est is None else now + est, milli)


# -- 5. reasons ------------------------------------------------------------------------------------


class _Explainer:
    """Reasons for waiting jobs, with the what-if arithmetic cached per queue, key and size."""

    def __init__(
        self,
        ledger: Ledger,
        holders: QuotaHolders,
        detail: int,
        lending: LendingHolds | None = None,
    ) -> None:
        self.ledger = ledger
        self.lending = lending
        self.holders = holders
        self.detail = detail
        self._quota: dict[tuple[str, str, int, int, str], tuple[str, str]] = {}
        self._standing: dict[tuple[str, str], str] = {}
        self._trees: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (root, key) -> borrowers
        self._borrowed: dict[tuple[str, str], tuple[list[tuple[str, int]], int]] = {}
        self._held: dict[tuple[object, ...], str | None] = {}  # queue and job shape -> what the hold says

    def quota(self, cur: Cursor, job: JobState, position: str) -> Reason:
        """Why a job the quota keeps out waits: for a job that may count against several keys
        (GPU models, Kueue's flavors), what stands in its way on each, in its order."""
        demands = quota.worker_demands(cur.spec, job.spec.resources)
        if not demands:
            return Reason("queued", f"waiting for the next admission cycle; {position}")
        said = [self._on_key(cur, job, key, per_worker) for key, per_worker in demands]
        text = "; or ".join(t for t, _ in said)
        helps = "".join(h for _, h in said)
        return Reason("quota", f"{text}; {position}{helps}", bool(helps))

    def _on_key(self, cur: Cursor, job: JobState, key: str, per_worker: int) -> tuple[str, str]:
        """What keeps ``job`` out of ``key``'s quota, and what preemption could free there."""
        need = per_worker * quota.min_replicas(job.spec)
        ledger = self.ledger
        if (
            not ledger.may_borrow(job)
            and not ledger.fits(cur.name, key, need, False)
            and ledger.fits(cur.name, key, need)  # it would, were it a job that may borrow
        ):
            return ledger.describe(cur.name, key, need, borrow=False), ""
        cache_key = (cur.name, key, need, job.priority, job.tenant)
        found = self._quota.get(cache_key)
        if found is None:
            if self.ledger.fits(cur.name, key, need):
                kept = self._kept_from(cur.name, key, need, job)
                if kept:
                    found = (f"needs {gpus_text(need, key)}; {kept}", "")
                else:
                    # Not looked at this cycle: further back than a best-effort queue's lookahead.
                    fits_now = f"needs {gpus_text(need, key)}, which fits now"
                    text = f"{fits_now}; waiting behind jobs that do not"
                    found = (text, "")
            else:
                standing = self._standing.get((cur.name, key))
                if standing is None:
                    standing = self._standing[cur.name, key] = self.ledger.standing(cur.name, key)
                text = f"needs {gpus_text(need, key)}; {standing}"
                helps = self._help(cur.name, key, need, job.priority, job.tenant)
                if not helps:
                    text += self._lent_for_good(cur.name, key, need, job.tenant)
                found = (text, helps)
            self._quota[cache_key] = found
        return found

    def _kept_from(self, queue: str, key: str, need: int, job: JobState) -> str:
        """Why a job the quota has room for is not admitted where other queues' lending holds
        keep that room for their first waiting jobs within their nominal (``LendingHolds``):
        whose ("" if none keeps it). Queues not open to the job's tenant are not named."""
        lending = self.lending
        if lending is None or lending.available(queue, key, self.ledger.may_borrow(job)) >= need:
            return ""
        root = self.ledger.root(queue)
        keepers = sorted(
            q
            for (q, k), m in lending.own.items()
            if k == key and m > 0 and q != queue and self.ledger.root(q) == root
        )
        if not keepers:
            return ""
        seen = [q for q in keepers if sees_queue(job.tenant, self.ledger.spec(q))]
        who = ", ".join([*seen, "other queues"] if len(seen) < len(keepers) else seen)
        return f"what it would borrow is kept for the first waiting jobs of {who} within their nominal quota"

    def _help(self, queue: str, key: str, need: int, priority: int, tenant: str) -> str:
        """What preemption could free for this job, as its queue's policy lets the preemptor
        (``projections.preemption``'s rules): GPUs other queues borrowed, when the job is within
        its queue's nominal (reclaim: held by their preemptible jobs of a priority
        ``reclaim_within_cohort`` lets it stop), or GPUs held by lower-priority preemptible jobs
        of its own queue (``within_queue``); nothing where it would borrow and its queue may not
        stop work to borrow (``borrow_within_cohort = "never"``). Simulated on the ledger, then
        undone. Queues not open to the job's ``tenant`` are not named (``visibility``)."""
        ledger = self.ledger
        name = key_name(key)
        policy = ledger.spec(queue).preemption
        if not preemption.may_preempt_for(ledger, policy, queue, key, need):
            return ""  # it would borrow where its queue may not stop work to borrow
        # Fair sharing takes other queues' borrowers of any priority, whatever the reclaim field
        # says, where the shares allow it (not judged here: the hint may then be hopeful).
        fair = bool(policy.fair_sharing)
        borrowers, borrowed_total = self._borrowers(queue, key)
        if (
            (fair or policy.reclaim_within_cohort != "never")
            and ledger.used(queue, key) + need <= ledger.nominal(queue, key)
            and need <= ledger.available(queue, key) + borrowed_total
        ):
            taken: list[tuple[str, int]] = []
            fits = False
            for other, borrowed in borrowers:
                stoppable = sum(
                    m
                    for p, m, ok in self.holders.jobs(other, key)
                    if ok and (fair or preemption.may_reclaim(policy, p, priority))
                )
                amount = min(borrowed, stoppable)
                if amount <= 0:
                    continue
                ledger.charge(other, key, -amount)
                taken.append((other, amount))
                if fits := ledger.fits(queue, key, need):
                    break
            for other, borrowed in taken:
                ledger.charge(other, key, borrowed)
            if fits:
                seen = [(q, b) for q, b in taken if sees_queue(tenant, ledger.spec(q))]
                unseen = sum(b for q, b in taken if not sees_queue(tenant, ledger.spec(q)))
                said = [f"{q}'s {fmt_gpus(b)}" for q, b in seen]
                if unseen:
                    said.append(f"other queues' {fmt_gpus(unseen)}")
                return f"; would fit now if {', '.join(said)} borrowed {name} were reclaimed"
        lower = sum(
            m
            for p, m, ok in self.holders.jobs(queue, key)
            if ok and p < priority and preemption.may_stop_within(policy, p, priority)
        )
        if lower > 0:
            ledger.charge(queue, key, -lower)
            fits = ledger.fits(queue, key, need)
            ledger.charge(queue, key, lower)
            if fits:
                return f"; would fit now if lower-priority jobs of {queue} gave back {fmt_gpus(lower)} {name}"
        return ""

    def _lent_for_good(self, queue: str, key: str, need: int, tenant: str) -> str:
        """Where a job within its queue's nominal waits for quota its queue lent out and no
        preemption may take back (borrowed by jobs that may not be stopped: not preemptible, or
        preempted as often as their class allows): who holds it, as far as the tenant may see,
        and that it comes back as they end. Else "": the owner read only "0 to lend"."""
        ledger = self.ledger
        if ledger.used(queue, key) + need > ledger.nominal(queue, key):
            return ""
        borrowers, _ = self._borrowers(queue, key)
        kept: list[tuple[str, int]] = []
        for other, borrowed in borrowers:
            stoppable = sum(m for _, m, ok in self.holders.jobs(other, key) if ok)
            if borrowed > stoppable:
                kept.append((other, borrowed - stoppable))
        if not kept:
            return ""
        seen = [f"{q} {fmt_gpus(m)}" for q, m in kept if sees_queue(tenant, ledger.spec(q))]
        unseen = sum(m for q, m in kept if not sees_queue(tenant, ledger.spec(q)))
        if unseen:
            seen.append(f"other queues {fmt_gpus(unseen)}")
        return (
            f"; of what it lent, jobs that may not be stopped (not preemptible, or preempted as "
            f"often as their class allows) borrow {', '.join(seen)}: it comes back as they end"
        )

    def _borrowers(self, queue: str, key: str) -> tuple[list[tuple[str, int]], int]:
        """Other queues of the tree above their nominal, biggest first, and what they borrow."""
        found = self._borrowed.get((queue, key))
        if found is None:
            tree = (self.ledger.root(queue), key)
            everyone = self._trees.get(tree)
            if everyone is None:
                everyone = self._trees[tree] = self.ledger.borrowers(queue, key, exclude=False)
            others = [(q, b) for q, b in everyone if q != queue]
            found = self._borrowed[queue, key] = (others, sum(b for _, b in others))
        return found

    def held(
        self, cur: Cursor, hold: Hold, job: JobState, reason: Reason, position: str, now: float
    ) -> Reason:
        """A job behind the held one that the ledger would admit hears that the hold stops it."""
        if job.id == hold.job_id or hold.takes_back(self.ledger, job, now):
            return reason  # (the verdicts below are for jobs the held job may not stop)
        spec = job.spec
        # The verdict depends on the job's shape alone (the ledger does not change while reasons
        # are given): asked once per queue and shape, not per job.
        shape = (cur.name, spec.resources, spec.min_replicas, spec.replicas, runtimes.of(job), job.tenant)
        if shape in self._held:
            said = self._held[shape]
        else:
            said = self._held[shape] = self._held_text(cur, hold, job, now)
        return reason if said is None else Reason("quota-held", f"{said}; {position}")

    def _held_text(self, cur: Cursor, hold: Hold, job: JobState, now: float) -> str | None:
        demands = quota.worker_demands(cur.spec, job.spec.resources)
        # The hold keeps room of one key: what it says is about the job's demand there.
        held = [(key, per_worker) for key, per_worker in demands if key == hold.key]
        if not held:
            return None
        ((key, per_worker),) = held
        need = per_worker * quota.min_replicas(job.spec)
        spare = hold.spare(self.ledger, cur.name, key, job, now)
        if spare is None or need <= spare or not self.ledger.fits(cur.name, key, need):
            return None
        held_for = job_named(hold.job_id, None if hold.held is None else hold.held.tenant, job.tenant)
        return (
            f"needs {gpus_text(need, key)}, which fits now, but queue {cur.name} holds "
            f"{gpus_text(hold.need, key)} of its nominal quota for {held_for}, its first job that "
            f"does not fit, free of its own jobs {hold.when()}; a job behind it goes first only if it "
            f"leaves it that room or its runtime estimate ends by then"
        )

    def fifo(self, cur: Cursor, job: JobState, position: str) -> Reason:
        head = job_named(cur.head.id, cur.head.tenant, job.tenant)
        return Reason("fifo", f"queue {cur.name} is strict FIFO: waiting behind {head}; {position}")

    def tail(self, cur: Cursor, code: str) -> Reason:
        if code == "fifo":
            return Reason(
                "fifo", f"waiting in strict-FIFO queue {cur.name} behind {self.detail} or more jobs"
            )
        return Reason(
            "quota", f"waiting in queue {cur.name} behind {self.detail} or more jobs; its quota is in use"
        )


def _reasons(
    order: FairShareOrder,
    explained: dict[str, list[JobState]],
    ledger: Ledger,
    holders: QuotaHolders,
    detail: int,
    now: float,
    lending: LendingHolds | None = None,
) -> list[Event]:
    ex = _Explainer(ledger, holders, detail, lending)
    out: list[Event] = []
    for name in sorted(order.cursors):
        cur = order.cursors[name]
        jobs = cur.jobs
        done = set(cur.admitted)
        left = len(jobs) - len(done)
        # Jobs at or past pos were not reached (the cycle hit its cap) unless the queue stopped.
        reached = len(jobs) if cur.blocked or cur.stopped else cur.pos
        total = str(left) if left <= detail else f"more than {detail}"
        front: set[str] = set()
        position = 0
        i = 0
        while i < reached and position < detail:  # the front: reasons with figures
            job = jobs[i]
            front.add(job.id)
            if i not in done:
                position += 1
                where = f"position {position} of {total} in {name}"
                if cur.blocked and i > cur.pos:
                    reason = ex.fifo(cur, job, where)
                else:
                    reason = ex.quota(cur, job, where)
                    if cur.hold is not None:
                        reason = ex.held(cur, cur.hold, job, reason, where, now)
                if job.reasons != (reason,):
                    out.append(PendingReasonChanged(job_id=job.id, reasons=(reason,)))
            i += 1
        if reached < len(jobs):
            continue  # the cycle ended before it reached the rest of this queue
        # Further back, one stable reason per queue, given only to jobs that carry another: the
        # deep backlog costs nothing here, and no event, until a job has something to unsay.
        tail = (ex.tail(cur, "fifo" if cur.blocked else "quota"),)
        admitted = {jobs[k].id for k in done}
        stale = explained.get(name, [])
        sort_queue(stale)  # events in queue order, whatever order the State held the jobs in
        for job in stale:
            if job.id not in front and job.id not in admitted and job.reasons != tail:
                out.append(PendingReasonChanged(job_id=job.id, reasons=tail))
    return out
