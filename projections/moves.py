"""Consolidation's rule: when running work may be moved so that a waiting job fits where it was.

A job that waits only because the free GPUs are scattered over the nodes (KAI's consolidation)
is given its room by stopping preemptible jobs that then run elsewhere: a ``PreemptionRequested``
with ``moves``, the layout after it. The preemptor plans moves by this rule
(``services/preemptor/consolidation.py``) and the fold judges every move record by it
(``may_move``); the queues' preemption policies (``projections.preemption``) are about whose
work may be stopped for whose quota, and a move takes no one's quota, so they do not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.events.decisions import Placement
from corral.projections import claims
from corral.projections.lifecycle import WAITING
from corral.projections.preemption import charged_key, not_again, planning_ledger, protected
from corral.projections.quota import Ledger
from corral.projections.state import JobState, State


def borrows(ledger: Ledger, job: JobState) -> bool:
    """Whether ``job``'s queue holds more than its own nominal quota on the key the job's
    admission is charged on (the job counted), as ``ledger`` reads it."""
    key = charged_key(ledger, job)
    return key is not None and ledger.borrowing_height(job.spec.queue, key, 0) > 0


def movable(ledger: Ledger, victim: JobState, beneficiary: JobState) -> bool:
    """The queue part of whether ``victim`` may be moved for ``beneficiary``: a beneficiary whose
    queue borrows moves only jobs of its own queue or of queues that borrow too, never a lender's
    work within its nominal for work the lenders may take back."""
    same = victim.spec.queue == beneficiary.spec.queue
    return same or not borrows(ledger, beneficiary) or borrows(ledger, victim)


def refuses(ledger: Ledger, victim: JobState, beneficiary: JobState) -> str | None:
    """Why ``victim`` may not be moved for ``beneficiary`` whatever the layout (beyond the guards
    of ``preemption.protected``), or None: a higher priority, a stop between the two before
    (``preemption.not_again``), or a lender's work for a borrower (``movable``). The preemptor
    offers only the jobs this lets through; the fold asks it of every victim."""
    if victim.priority > beneficiary.priority:
        return f"{victim.id} has a higher priority than {beneficiary.id}: it is not moved for it"
    again = not_again(victim, beneficiary)
    if again is not None:
        return again
    if not movable(ledger, victim, beneficiary):
        return f"{beneficiary.id} borrows: it does not move {victim.id} of a queue within its nominal"
    return None


def misplaced(victim: JobState, to: Placement, beneficiary: Placement) -> str | None:
    """Why moving ``victim`` to ``to`` makes no room for a beneficiary placed at ``beneficiary``,
    or None: it would go back where it is, or it runs on none of the beneficiary's nodes."""
    if claims.claimed(to) == claims.claimed(victim.held):
        return f"{victim.id} would be moved to where it is"
    if not claims.nodes_of(victim.held) & claims.nodes_of(beneficiary):
        return f"{victim.id} is on no node {beneficiary.job_id} is placed on: moving it makes no room"
    return None


def move_under_way(state: State) -> str | None:
    """Why no move may be made now, or None: a stop or move is under way until the jobs it
    stopped are placed again or wait for quota, and its beneficiary holds its GPUs. While a
    beneficiary waits for the room made for it, or a job stopped for one is admitted and not
    placed again, the GPUs they are to take look free and are not: a move planned on them
    would stop work for room that is taken (``State.naming_by_beneficiary``)."""
    jobs = state.jobs
    for b_id, named in state.naming_by_beneficiary.items():
        b = jobs.get(b_id)
        if b is not None and b.phase in WAITING and b.held is None:
            return f"the room made for {b_id} is not taken yet"
        for job_id in named:
            if jobs[job_id].phase != "queued":
                return f"{job_id}, stopped for {b_id}, is not placed again yet"
    return None


def may_move(
    state: State, victims: Sequence[JobState], beneficiary: JobState, now: float, moves: Sequence[Placement]
) -> str | None:
    """Why the fold may not let ``victims`` be stopped to move them elsewhere, so that
    ``beneficiary``'s gang fits where they were (a consolidation); None if it may. The beneficiary
    holds its admission and no GPUs (it waits only for room, not for quota: a move gives no quota to
    anyone), and no other stop or move is under way (``move_under_way``). Each victim may be
    preempted at ``now`` (its spec, its class and the anti-thrash guards), has no higher priority
    than the beneficiary, was never stopped for it nor it for the victim, and, if the beneficiary's
    queue borrows, is of that queue or of one that borrows too (``movable``), and runs on a node the
    beneficiary is placed on. And ``moves``, the beneficiary's placement then one for each victim,
    hold on the nodes as they stand with the victims gone, each victim somewhere it was not.
    Otherwise any queue's jobs may be moved: the queues' policies say whose work may be stopped for
    whose quota, and a move takes no one's quota; it costs a restart from the last checkpoint."""
    if beneficiary.phase != "admitted" or beneficiary.held is not None:
        return f"{beneficiary.id} does not wait for room with its admission held"
    busy = move_under_way(state)
    if busy is not None:
        return f"a move waits until a stop under way is done: {busy}"
    ledger = planning_ledger(state)
    for victim in victims:
        why = protected(state, victim, now) or refuses(ledger, victim, beneficiary)
        if why is not None:
            return why
    jobs = {v.id: v for v in victims}
    if (
        not moves
        or moves[0].job_id != beneficiary.id
        or moves[0].attempt != beneficiary.attempt
        or sorted(p.job_id for p in moves[1:]) != sorted(jobs)
    ):
        return "a move names the beneficiary's placement first, then one for each victim"
    placed = [(beneficiary, moves[0]), *((jobs[p.job_id], p) for p in moves[1:])]
    for victim, p in placed[1:]:
        why = misplaced(victim, p, moves[0])
        if why is not None:
            return why
    try:
        claims.relayout(state.nodes, state.seq, victims, (), placed)
    except claims.ClaimError as e:
        return f"the moves do not fit: {e}"
    return None
