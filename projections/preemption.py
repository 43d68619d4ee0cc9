"""Who may be stopped for whom: the rule the preemptor chooses victims by and the fold enforces.

A running job (or an elastic job's top ranks) may be stopped for a beneficiary only if

- it may be preempted at all: its spec and its priority class say so, and its class's
  anti-thrash guards (``thrash``) do not protect it at that moment;
- and it is of the beneficiary's queue with a lower priority; or of another queue of the
  beneficiary's cohort tree that borrows (holds more than its nominal quota) on the quota key
  the beneficiary needs, charged on that key itself, and either the beneficiary's queue stays
  within its nominal with the beneficiary (it reclaims what it lent: any priority, if reclaim
  across priorities is allowed) or the victim's priority is lower (and preempting to borrow is
  allowed, or the beneficiary reclaims).

The preemptor applies it with its settings (``any_priority``, ``borrow``); the fold with both
allowed, so that it voids exactly what no setting of the preemptor could propose: a job of another
tree, of a queue that does not borrow, of a queue's own equal or higher priority, or protected.
Quota and priorities are read at the fold's position in the log, guards at its log time, and
quota as it will stand once the stops under way are done (``planning_ledger``): the preemptor
plans each cycle on that view, and adds each of its proposals to it as the fold will, so that the
two read every proposal the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from corral.projections import quota, thrash
from corral.projections.quota import Ledger
from corral.projections.state import JobState, State


def preemptible(state: State, job: JobState) -> bool:
    """Whether the job's spec and its priority class let it be preempted at all."""
    pc = state.priority_classes.get(job.spec.priority_class)
    return job.spec.preemptible and (pc is None or pc.preemptible)


def protected(state: State, job: JobState, now: float) -> str | None:
    """Why ``job`` may not be preempted at ``now``, or None."""
    if not preemptible(state, job):
        return f"{job.id} may not be preempted"
    guarded = thrash.guard(job, state.priority_classes.get(job.spec.priority_class), now)
    return None if guarded is None else guarded.message


def eligible(
    victim: JobState,
    victim_key: str | None,
    beneficiary: JobState,
    key: str | None,
    *,
    borrowing: Collection[str],
    reclaim: bool,
    any_priority: bool = True,
    borrow: bool = True,
) -> bool:
    """The queue-and-priority part, for a victim charged on ``victim_key``, a beneficiary that
    needs ``key`` (``reclaim``: its queue stays within its nominal with it) and the queues of its
    tree that ``borrowing`` on ``key`` now."""
    if victim.id == beneficiary.id:
        return False
    lower = victim.priority < beneficiary.priority
    if victim.spec.queue == beneficiary.spec.queue:
        return lower
    if key is None or victim_key != key or victim.spec.queue not in borrowing:
        return False
    if reclaim and any_priority:
        return True
    return lower and (reclaim or borrow)


def demand(state: State, ledger: Ledger, job: JobState) -> tuple[str, int] | None:
    """(quota key, milli-GPU) a queued job would be admitted with, at its minimum replicas."""
    qspec = state.queues.get(job.spec.queue)
    if qspec is None or not ledger.has_queue(job.spec.queue):
        return None
    demands = quota.worker_demands(qspec, job.spec.resources)
    replicas = quota.min_replicas(job.spec)
    if not demands or replicas <= 0:
        return None
    key, per_worker = demands[0]
    return key, per_worker * replicas


def claim(state: State, ledger: Ledger, job: JobState) -> tuple[str | None, bool]:
    """The quota key a beneficiary holds or would be admitted on, and whether its queue stays
    within its nominal with it there (it reclaims)."""
    q = job.spec.queue
    adm = job.admission
    if adm is not None and job.phase != "queued":
        key = next(iter(adm.gpus)) if len(adm.gpus) == 1 else None
        reclaim = key is not None and ledger.has_queue(q) and ledger.used(q, key) <= ledger.nominal(q, key)
        return key, reclaim
    found = demand(state, ledger, job)
    if found is None:
        return None, False
    key, need = found
    return key, ledger.used(q, key) + need <= ledger.nominal(q, key)


def charged_key(ledger: Ledger, job: JobState) -> str | None:
    """The quota key a running job's admission holds (None: none the ledger knows)."""
    adm = job.admission
    if adm is None or len(adm.gpus) != 1 or not ledger.has_queue(job.spec.queue):
        return None
    return next(iter(adm.gpus))


def planning_ledger(state: State) -> Ledger:
    """The quota the rule reads: the state's, as it will stand once the stops under way are done.
    A job being preempted (checkpointing) has given its quota back, and each job a stop is for
    (of one under way, or done and not yet requeued), while it is queued, has taken what it would
    be admitted with. (A shrink gives quota back at once, in the state itself.) It walks the jobs:
    the fold calls it once per preemption or shrink proposed, the preemptor once per cycle."""
    ledger = Ledger.from_state(state)
    waiting: set[str] = set()
    for job in state.jobs.values():
        if job.phase == "checkpointing":
            release(ledger, job)
        if job.preempted_for and (job.phase in ("checkpointing", "preempted") or job.leaving):
            waiting.add(job.preempted_for)
    for job_id in sorted(waiting):
        beneficiary = state.jobs.get(job_id)
        if beneficiary is not None and beneficiary.phase == "queued":
            found = demand(state, ledger, beneficiary)
            if found is not None:
                ledger.charge(beneficiary.spec.queue, *found)
    return ledger


def release(ledger: Ledger, job: JobState) -> None:
    """Give back, in ``ledger``, the quota ``job`` holds."""
    if ledger.has_queue(job.spec.queue):
        for key, milli in quota.holding(job):
            ledger.charge(job.spec.queue, key, -milli)


def may_stop(state: State, victims: Sequence[JobState], beneficiary: JobState, now: float) -> str | None:
    """Why the fold may not let one of ``victims`` give up GPUs for ``beneficiary`` at ``now``;
    None if some setting of the preemptor could have chosen them all. The quota view is built
    once for the record, whatever the number of victims."""
    for victim in victims:
        why = protected(state, victim, now)
        if why is not None:
            return why
    ledger = planning_ledger(state)
    key, reclaim = claim(state, ledger, beneficiary)
    queue = beneficiary.spec.queue
    borrowing = {q for q, _ in ledger.borrowers(queue, key)} if key and ledger.has_queue(queue) else set()
    for victim in victims:
        victim_key = charged_key(ledger, victim)
        if eligible(victim, victim_key, beneficiary, key, borrowing=borrowing, reclaim=reclaim):
            continue
        if victim.spec.queue == queue:
            return f"{victim.id} is not of lower priority than {beneficiary.id} in queue {queue}"
        borrower = f"{victim.id} of queue {victim.spec.queue}"
        return f"{borrower} borrows nothing {beneficiary.id} of {queue} may take"
    return None
