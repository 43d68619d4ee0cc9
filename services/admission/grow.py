"""Growing running elastic jobs as quota frees up: the last step of an admission cycle.

An elastic job (``min_replicas..replicas`` workers) is admitted at the largest size that fits
then; while it runs, each cycle may admit it at more workers, on three conditions:

- nobody waits for its cohort tree's quota: growth only takes what the cycle's fair-share order
  left over, so a waiting job never loses to a running one (and a job grown into quota a waiting
  job then needs would be shrunk straight back by the preemptor);
- the added workers fit on GPUs that are free now (idle, healthy, on ready uncordoned nodes,
  less what admitted jobs not yet placed will take): quota admitted for ranks no GPU can hold
  would sit idle while it blocks others;
- it is not shrinking, and every worker it was admitted for is placed (one growth at a time);
- no growth of it was withdrawn lately: free GPUs counted cluster-wide may be none its
  topology, selector or model allows, so a growth the placer places nowhere for the placement
  timeout is withdrawn (``decide._growth_timeouts``) and the job sits out the back-off
  (``JobState.grow_after``) before it grows again.

Jobs grow in submission order, each by as many workers as quota and free GPUs allow, up to its
``replicas``. A growth is proposed as the job's new total in ``JobsAdmitted.growths``; the fold
checks it against quota at that point of the log, the placer then places the added ranks and
their agents start them. Only whole-GPU workers grow: a free GPU count says nothing of where a
fraction or a MIG slice would fit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from corral.events.jobs import Admission
from corral.projections import indexes, quota, shape
from corral.projections.quota import Ledger
from corral.projections.shape import Shape
from corral.projections.state import JobState, State


def growths(
    state: State,
    ledger: Ledger,
    running: Iterable[JobState],
    waiting: Mapping[str, Iterable[JobState]],
    admitted: Collection[Admission],
    now: float,
    most: Callable[[JobState], int] | None = None,
) -> list[Admission]:
    """The cycle's growths, charged to ``ledger``. ``running``: the running elastic jobs;
    ``waiting``: each queue's backlog this cycle, of which ``admitted`` were admitted (and, not
    yet placed, will take GPUs too); ``most``: the most workers the cluster could host of a job
    (``Inventory.most_workers``; its most workers if None)."""
    # Most running elastic jobs are at their most workers: pass them over without a call each.
    below = [j for j in running if j.admission is not None and j.admission.replicas < j.spec.replicas]
    candidates = sorted((j for j in below if growable(j, now)), key=lambda j: (j.submitted_seq, j.id))
    if not candidates:
        return []
    free = free_gpus(state) - _unplaced_gpus(state, admitted)
    if free <= 0:
        return []
    taken = {a.job_id for a in admitted}
    blocked = {
        ledger.root(q)
        for q, jobs in waiting.items()
        if ledger.has_queue(q) and any(j.id not in taken for j in jobs)
    }
    out: list[Admission] = []
    for job in candidates:
        queue = job.spec.queue
        if free <= 0:
            break
        if not ledger.has_queue(queue) or ledger.root(queue) in blocked:
            continue
        grown = _grow(job, ledger, free, job.spec.replicas if most is None else most(job))
        if grown is not None:
            assert job.admission is not None
            free -= (grown.replicas - job.admission.replicas) * job.spec.resources.gpus
            out.append(grown)
    return out


def growable(job: JobState, now: float) -> bool:
    spec, adm, placement = job.spec, job.admission, job.placement
    return (
        job.phase == "running"
        and job.grow_after <= now
        and spec.min_replicas is not None
        and adm is not None
        and adm.replicas < spec.replicas
        and placement is not None
        and len(placement.workers) == adm.replicas  # all placed, none leaving
        and shape.kind(spec.resources) == "whole"
    )


def _grow(job: JobState, ledger: Ledger, free: int, hosted: int) -> Admission | None:
    """The largest admission of ``job`` above its current one, of at most ``hosted`` workers,
    that quota and ``free`` GPUs allow, charged to ``ledger``; None if not even one more worker
    fits."""
    adm = job.admission
    assert adm is not None
    spec, queue = job.spec, job.spec.queue
    held = quota.holding(job)
    key = held[0][0] if len(held) == 1 else quota.candidate_keys(ledger.spec(queue), spec.resources)[0]
    most = min(spec.replicas, hosted, adm.replicas + free // spec.resources.gpus)
    for replicas in range(most, adm.replicas, -1):
        grown = quota.admission(ledger.spec(queue), job, replicas, key)
        if ledger.claim_growth(job, grown) is None:
            return grown
    return None


def free_gpus(state: State) -> int:
    """Whole GPUs nothing holds, healthy, not in MIG mode, on ready nodes that take work."""
    return sum(
        1
        for node in state.nodes.values()
        if node.schedulable
        for g in node.gpus
        if g.healthy and not g.holders and not g.info.mig
    )


def _unplaced_gpus(state: State, admitted: Collection[Admission]) -> int:
    """GPUs that admitted jobs not yet placed will take: the cycle's admissions and earlier ones."""
    pending = {a.job_id: a.replicas for a in admitted}
    for job in indexes.jobs_in(state, "admitted"):
        if job.admission is not None and job.held is None:
            pending.setdefault(job.id, job.admission.replicas)
    total = 0
    for job_id, replicas in pending.items():
        found = state.jobs.get(job_id)
        if found is not None:
            total += replicas * Shape.of(found.spec.resources).gpus
    return total
