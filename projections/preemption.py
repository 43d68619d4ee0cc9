"""Who may be stopped for whom: the rule the preemptor chooses victims by and the fold enforces.

A running job (or an elastic job's top ranks) may be stopped for a beneficiary only if

- it may be preempted at all: its spec and its priority class say so, and its class's
  anti-thrash guards (``thrash``) do not protect it at that moment;
- and the beneficiary's queue's preemption policy (``PreemptionPolicy``) allows it:
  a job of the beneficiary's own queue by ``within_queue`` (lower priority; or also equal
  priority submitted later); a job of another queue of the cohort tree only if it holds quota
  lent by the beneficiary's side of the tree (``Ledger.borrows_from``: its queue holds more than
  its nominal, and so does every cohort above it up to its side below the cohort where the two
  meet, as Kueue counts a cohort's quota and usage) on the key the beneficiary needs, and then
  by ``reclaim_within_cohort`` when the beneficiary's queue, or a cohort above it up to its
  side, stays within its quota once the record's victims are gone (``Ledger.within_own``: it
  takes back what its side lent), else by
  ``borrow_within_cohort`` (a lower priority, at most the threshold), or else by
  ``fair_sharing`` (Kueue's fair-sharing preemption, KEP-1714): the beneficiary's queue's share
  with the beneficiary admitted and the record's victims gone is at most the victim's queue's
  share once the record's victims are gone (``less-than-or-equal-to-final-share``, rule S2-a),
  or strictly below the victim's queue's share before the record
  (``less-than-initial-share``, S2-b); for queues of different cohorts, the shares of their
  branches below the cohort the two meet in (``Shares.may_take_from``). A queue's share
  (``Shares``) is its decayed GPU time held
  (``gpu_time.recent``, what fair-share admission orders by), with the stops under way and the
  record's change counted in full, less its nominal, over its weight: negative for a queue that
  ran under its nominal lately, high for one that has long held others' quota; the
  beneficiary's queue counts what it holds now where that is more (it may have just taken
  much). As in Kueue, only a queue that borrows can lose work this way, so nominal quota stays
  guaranteed.

Never twice between the same two jobs, in either direction, while neither's priority changed
(``JobState.stopped_for``): a job stopped for another is not stopped for it again, nor is the
other stopped for it, so that a borrower stopped by a lender's reclaim and a lender's job
stopped by a borrower's higher priority do not take the same GPUs from each other in turn.

Whether the beneficiary reclaims is judged with every victim of the record gone, its own queue's
too: a job that is back within its nominal after stopping its queue's lower-priority work takes
back what it lent in the same proposal. Quota and priorities are read at the fold's position in
the log, guards at its log time, and quota as it will stand once the stops under way are done
(``planning_ledger``): the preemptor plans each cycle on that view, and adds each of its
proposals to it as the fold will, so that the two read every proposal the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from corral.events.queues import DEFAULT_PREEMPTION, FairSharingStrategy, PreemptionPolicy
from corral.projections import gpu_time, indexes, quota, thrash
from corral.projections.lifecycle import Phase
from corral.projections.quota import Branch, Ledger
from corral.projections.shape import gpu_less
from corral.projections.state import WHOLE, JobState, State


def preemptible(state: State, job: JobState) -> bool:
    """Whether the job's spec and its priority class let it be preempted at all."""
    return quota.may_be_preempted(job.spec, state.priority_classes)


def rides(job: JobState) -> bool:
    """Whether ``job`` asks for no GPU: it holds no quota, so the CPU and memory it takes on a
    node are the GPU work's, and any job that holds or claims quota may stop it, of any queue
    (its own's included) and whatever its priority: a tenant with no quota could otherwise fill
    every node's CPUs and leave every GPU idle. Such a job must be one that may be preempted
    (admission's ``validate``), and its class's cap on preemptions does not protect it
    (``thrash.capped``)."""
    return gpu_less(job.spec.resources)


def protected(state: State, job: JobState, now: float) -> str | None:
    """Why ``job`` may not be preempted at ``now``, or None."""
    if not preemptible(state, job):
        return f"{job.id} may not be preempted"
    guarded = thrash.guard(job, state.priority_classes.get(job.spec.priority_class), now)
    return None if guarded is None else guarded.message


def eligible(
    policy: PreemptionPolicy,
    victim: JobState,
    victim_key: str | None,
    beneficiary: JobState,
    key: str | None,
    *,
    lent: bool,
    reclaims: bool,
    fair: bool = False,
) -> bool:
    """The queue-and-priority part, under the beneficiary's queue's ``policy``, for a victim
    charged on ``victim_key`` and a beneficiary that needs ``key``. ``lent``: the victim's queue
    holds quota of ``key`` lent by the beneficiary's side (``Ledger.borrows_from``, before any
    stop); ``reclaims``: the beneficiary's queue, or a cohort above it up to its side, stays
    within its quota with it once the proposal's victims are gone (``Ledger.within_own``);
    ``fair``: one of the policy's
    fair-sharing strategies lets the beneficiary's queue take from the victim's (``fair_allows``)."""
    if victim.id == beneficiary.id or stopped_before(victim, beneficiary) is not None:
        return False  # once one was stopped for the other, neither is stopped for the other again
    if key is not None and rides(victim):
        return True  # whatever its queue and priority
    vp, bp = victim.priority, beneficiary.priority
    if victim.spec.queue == beneficiary.spec.queue:
        # Of a priority ``within_queue`` may stop, and if equal, submitted later.
        later = victim.submitted_seq > beneficiary.submitted_seq
        return may_stop_within(policy, vp, bp) and (vp < bp or later)
    if key is None or victim_key != key or not lent:
        return False
    if reclaims:
        # Within its side's own quota the beneficiary takes back what it lent: reclaim's
        # business alone, so a queue that never reclaims does not by borrowing over either.
        if may_reclaim(policy, vp, bp):
            return True
    elif may_borrow_over(policy, vp, bp):
        return True
    return fair and bool(policy.fair_sharing)


class Shares:
    """Fair shares for fair-sharing preemption at log time ``now``, per queue and quota key: the
    queue's decayed GPU time held (milli-GPU, ``gpu_time.recent``) with the stops under way in
    ``ledger`` (the rule's: victims' quota given back, beneficiaries' taken) and a change
    counted in full, less its nominal, over its weight, in GPUs per unit of weight (a queue of
    weight 0 always has the highest). Below the nominal it is negative, not 0 as Kueue's (which
    reads what is held now, where within the nominal is reclaim's business): a queue that ran
    far under its nominal lately ranks before one that ran just under it.

    Each side is read in the light least favourable to the preemption. The queue that takes
    (``taker``) counts what it holds now where that is more than its history: the history lags,
    and a queue whose jobs were just placed, or whose beneficiaries wait for their victims,
    would otherwise take again, in the same cycle or the next, what fair sharing gave it once.
    The queue taken from (``share``) counts its history or what it holds now, whichever is
    less: a queue that has just burst into idle quota is not the first to lose it, and one that
    held much for days and holds little now is not taken from again and again until its history
    catches up (by its history alone, a queue that had held 8 GPUs for days was taken down to 2
    where the even split was 4, then to 4 again days later when the other's caught up). So two
    queues can never each take from the other in turn while their histories stand still (S2-a or
    S2-b both ways would need the preemptor's ask and the victims to add up to less than
    nothing). The ledger must be read before the record's own victims are charged to it."""

    def __init__(self, state: State, ledger: Ledger, now: float) -> None:
        self.state = state
        self.ledger = ledger
        self.now = now
        self._past: dict[tuple[str, str], float] = {}

    def past(self, queue: str, key: str) -> float:
        found = self._past.get((queue, key))
        if found is None:
            g = self.state.gpu_time.get(queue, {}).get(key)
            half_life = self.state.fair_share.half_life_s
            found = self._past[(queue, key)] = 0.0 if g is None else gpu_time.recent(g, self.now, half_life)
        return found

    def share(self, queue: str, key: str, change: int = 0) -> float:
        """The share of a queue taken from, with ``change`` milli-GPU more: its history, with
        the stops under way (what the ledger holds beyond the state) counted in full, as the
        record's own change is, or what it holds, whichever is less."""
        held = self.ledger.used(queue, key)
        return self._over(queue, key, min(self._history(queue, key), held) + change)

    def taker(self, queue: str, key: str, change: int, unheld: int) -> float:
        """The share of the beneficiary's queue with ``change`` milli-GPU more (its ask, less its
        own victims), of which ``unheld`` the ledger does not hold yet (an admitted beneficiary
        holds its admission there; ``change`` must not count what a stop under way for it
        holds): its history or what it will hold, whichever is more."""
        return self._over(queue, key, self._taken(queue, key, change, unheld))

    def beneficiary(self, job: JobState, key: str, need: int, freed: int) -> float:
        """The share of ``job``'s queue (``taker``) with ``job`` admitted and ``freed`` milli-GPU
        of its own queue's victims gone; ``need``: what of its admission the ledger does not
        hold yet (a queued job's whole demand, or 0 where a stop under way for it is charged
        there already; 0 for an admitted one, whose admission the ledger holds)."""
        return self.beneficiary_side(Branch(job.spec.queue, (job.spec.queue,)), job, key, need, freed)

    def beneficiary_side(self, side: Branch, job: JobState, key: str, need: int, freed: int) -> float:
        """The share of ``side``, a branch that holds ``job``'s queue, read as ``beneficiary``
        reads the queue: the queue as ``taker`` reads it, each other queue of the branch at its
        history or what it holds, whichever is more, nothing of theirs counted gone (the light
        least favourable to the preemption, as the queue's own)."""
        queue = job.spec.queue
        queued = job.phase == "queued" or job.admission is None
        ask = need if queued else asks(self.state, self.ledger, job, key)
        mine = self._taken(queue, key, ask - freed, need - freed)
        if side.is_queue:
            return self._over(queue, key, mine)
        others = sum(max(self._history(q, key), self.ledger.used(q, key)) for q in side.queues if q != queue)
        return self._over_branch(side, key, mine + others)

    def side(self, branch: Branch, key: str, change: int = 0) -> float:
        """The share of a branch taken from, with ``change`` milli-GPU more: a queue's as
        ``share`` reads it; a cohort's from every queue under it read so, less the branch's
        nominal (``Ledger.branch_nominal``), over its weight (``Ledger.branch_weight``)."""
        if branch.is_queue:
            return self.share(branch.name, key, change)
        held = sum(min(self._history(q, key), self.ledger.used(q, key)) for q in branch.queues)
        return self._over_branch(branch, key, held + change)

    def _taken(self, queue: str, key: str, change: int, unheld: int) -> float:
        held = self.ledger.used(queue, key) + unheld
        return max(self._history(queue, key) + change, held)

    def _history(self, queue: str, key: str) -> float:
        pending = self.ledger.used(queue, key) - self.state.quota_held.get(queue, {}).get(key, 0)
        return self.past(queue, key) + pending

    def _over(self, queue: str, key: str, milli: float) -> float:
        weight = self.ledger.spec(queue).weight
        above = milli - self.ledger.nominal(queue, key)
        return above / WHOLE / weight if weight > 0 else math.inf

    def _over_branch(self, branch: Branch, key: str, milli: float) -> float:
        weight = self.ledger.branch_weight(branch)
        above = milli - self.ledger.branch_nominal(branch, key)
        return above / WHOLE / weight if weight > 0 else math.inf

    def may_take(
        self,
        strategies: Sequence[FairSharingStrategy],
        mine: float,
        theirs: Branch,
        key: str,
        gone: int,
        least: int,
    ) -> bool:
        """Whether ``strategies`` let a side whose share will be ``mine`` take ``gone`` milli-GPU
        of ``key`` from the branch ``theirs`` in one record, the smallest of its victims there
        freeing ``least``. Kueue judges each victim against the other side's share just before
        it (S2-b) and just after it (S2-a), those taken before it already gone: the last one
        taken binds both, and of the orders the record's victims could be taken in, the one that
        ends with the smallest is the least favourable to the taker, which is the order judged.
        So a record never takes a side past the point where the imbalance would switch sides."""
        final = self.side(theirs, key, -gone)
        return fair_allows(strategies, mine, self.side(theirs, key, least - gone), final)

    def may_take_from(
        self,
        strategies: Sequence[FairSharingStrategy],
        job: JobState,
        key: str,
        need: int,
        freed: Mapping[str, tuple[int, int]],
        other: str,
    ) -> bool:
        """Whether ``strategies`` let ``job`` (``need``: as ``beneficiary``) take what a record
        frees of ``key`` from queue ``other``'s side of the tree: ``freed`` per queue, (milli-GPU
        the record frees there, the least any one of its victims there frees). As Kueue, the
        shares compared are those of the two branches below the cohort the two queues meet in
        (``Ledger.branches``): the beneficiary's with it admitted and its own queue's victims
        gone (``beneficiary_side``), the other's with every victim of the record under it gone,
        the smallest last (``may_take``). Two queues of one cohort compare their own shares; a
        queue that borrows inside a department at its quota is not judged against a department
        that borrows from the others. The fold and the preemptor's search both judge by it."""
        sides = self.ledger.branches(job.spec.queue, other)
        if sides is None:
            return False
        mine_side, theirs = sides
        mine = self.beneficiary_side(mine_side, job, key, need, freed.get(job.spec.queue, (0, 0))[0])
        if theirs.is_queue:
            gone, least = freed.get(other, (0, 0))
        else:
            under = [freed[q] for q in theirs.queues if q in freed]
            gone, least = sum(g for g, _ in under), min((piece for _, piece in under), default=0)
        return self.may_take(strategies, mine, theirs, key, gone, least)


def fair_allows(
    strategies: Sequence[FairSharingStrategy], mine_after: float, theirs_before: float, theirs_after: float
) -> bool:
    """Whether one of ``strategies`` lets a queue whose share will be ``mine_after`` (the
    beneficiary admitted, the record's victims gone) take from a queue whose share is
    ``theirs_before`` and will be ``theirs_after`` (Kueue ``fairsharing/strategy.go``)."""
    for s in strategies:
        if s == "less-than-or-equal-to-final-share" and mine_after <= theirs_after:
            return True
        if s == "less-than-initial-share" and mine_after < theirs_before:
            return True
    return False


def asks(state: State, ledger: Ledger, job: JobState, key: str | None) -> int:
    """The milli-GPU of ``key`` the beneficiary will hold once placed, which its queue's GPU time
    does not count yet: what admission would charge a queued job, what an admitted one holds."""
    if key is None:
        return 0
    if job.phase == "queued" or job.admission is None:
        found = demand(state, ledger, job)
        return 0 if found is None or found[0] != key else found[1]
    return sum(m for k, m in quota.holding(job) if k == key)


def stopped_before(victim: JobState, beneficiary: JobState) -> tuple[str, str] | None:
    """(stopped, for whom) if one of the two was preempted for the other and neither's priority
    changed since; None if not (after a change of priority the order between them is new)."""
    if (beneficiary.id, beneficiary.priority_seq, victim.priority_seq) in victim.stopped_for:
        return victim.id, beneficiary.id
    if (victim.id, victim.priority_seq, beneficiary.priority_seq) in beneficiary.stopped_for:
        return beneficiary.id, victim.id
    return None


def not_again(victim: JobState, beneficiary: JobState) -> str | None:
    """Why ``victim`` may not be stopped for ``beneficiary`` because one of the two was stopped
    for the other before (``stopped_before``); None if neither was."""
    before = stopped_before(victim, beneficiary)
    if before is None:
        return None
    first, second = before
    return f"{victim.id}: {first} was stopped for {second} before; not again between the two"


def may_stop_within(policy: PreemptionPolicy, victim_priority: int, beneficiary_priority: int) -> bool:
    """Whether ``within_queue`` lets a beneficiary stop a job of its own queue of this priority at
    all (one of equal priority only if submitted later, which ``eligible`` asks)."""
    within = policy.within_queue
    if within == "never":
        return False
    return victim_priority < beneficiary_priority or (
        victim_priority == beneficiary_priority and within == "lower-or-newer-equal-priority"
    )


def may_preempt_for(ledger: Ledger, policy: PreemptionPolicy, queue: str, key: str, need: int) -> bool:
    """Whether a job of ``queue`` that needs ``need`` more of ``key`` may have work stopped for
    it at all (Kueue's flavor assigner): its ask fits its queue's nominal; or its queue, or a
    cohort above it short of the tree's root, stays within its quota holding it
    (``borrow_within_cohort`` not ``never``, or it shares fairly: ``fair_sharing`` names its
    strategies, Kueue's fair sharing with a reclaim policy, which a queue opts into here by
    naming them). Else it would stop work, its own queue's lower-priority jobs included, to run
    on quota that is not its side's to keep, where its queue said it may not borrow over
    others."""
    if policy.borrow_within_cohort != "never" or policy.fair_sharing:
        return True
    return need <= ledger.nominal(queue, key) or ledger.fits_below_root(queue, key, need)


def may_reclaim(policy: PreemptionPolicy, victim_priority: int, beneficiary_priority: int) -> bool:
    """Whether a beneficiary taking back quota its side lent may stop a borrower of this
    priority (``reclaim_within_cohort``)."""
    reclaim = policy.reclaim_within_cohort
    return reclaim == "any" or (reclaim == "lower-priority" and victim_priority < beneficiary_priority)


def may_borrow_over(policy: PreemptionPolicy, victim_priority: int, beneficiary_priority: int) -> bool:
    """Whether a beneficiary that would borrow may stop a borrower of this priority."""
    threshold = policy.borrow_priority_threshold
    return (
        policy.borrow_within_cohort == "lower-priority"
        and victim_priority < beneficiary_priority
        and (threshold is None or victim_priority <= threshold)
    )


def policy_of(state: State, job: JobState) -> PreemptionPolicy:
    q = state.queues.get(job.spec.queue)
    return DEFAULT_PREEMPTION if q is None else q.preemption


def demand(state: State, ledger: Ledger, job: JobState, key: str = "") -> tuple[str, int] | None:
    """(quota key, milli-GPU) a queued job would be admitted with, at its minimum replicas, on
    ``key`` (a proposal's), else on the key its stops under way are for (``reclaim_key``), else
    on its first; None if it counts against no such key. Never on what the ledger says: the
    fold, the preemptor and admission's holds for stops under way read the rule on different
    views of the quota, and must name the same key. (Admission's order and its holds for a
    queue's first waiting job read the key the job fits now, ``Ledger.key_for``.)"""
    qspec = state.queues.get(job.spec.queue)
    if qspec is None or not ledger.has_queue(job.spec.queue):
        return None
    demands = quota.worker_demands(qspec, job.spec.resources)
    replicas = quota.min_replicas(job.spec)
    if not demands or replicas <= 0:
        return None
    named = key or job.reclaim_key
    if not named:
        return demands[0][0], demands[0][1] * replicas
    for k, per_worker in demands:
        if k == named:
            return k, per_worker * replicas
    if key:
        return None  # a proposal names a key the job does not count against
    return demands[0][0], demands[0][1] * replicas  # its queue no longer has that key's quota


def claim(state: State, ledger: Ledger, job: JobState, key: str = "") -> tuple[str | None, int]:
    """The quota key a beneficiary holds or would be admitted on (``key``: as ``demand``), and
    what it still needs there (0 once it holds its admission)."""
    adm = job.admission
    if adm is not None and job.phase != "queued":
        return (next(iter(adm.gpus)) if len(adm.gpus) == 1 else None), 0
    found = demand(state, ledger, job, key)
    return (None, 0) if found is None else found


def charged_key(ledger: Ledger, job: JobState) -> str | None:
    """The quota key a running job's admission holds (None: none the ledger knows)."""
    adm = job.admission
    if adm is None or len(adm.gpus) != 1 or not ledger.has_queue(job.spec.queue):
        return None
    return next(iter(adm.gpus))


def planning_ledger(state: State) -> Ledger:
    """The quota the rule reads (``planning``)."""
    return planning(state)[0]


def planning(state: State) -> tuple[Ledger, set[str]]:
    """The quota the rule reads: the state's, as it will stand once the stops under way are done;
    and the queued beneficiaries it has charged. A job being preempted (checkpointing) has given
    its quota back, and each job a stop is for (of one under way, or done and not yet requeued),
    while it is queued, has taken what it would be admitted with. (A shrink gives quota back at
    once, in the state itself.) It walks the jobs stopping, stopped and running (an elastic job
    shrinking runs): the fold calls it once per preemption or shrink proposed, the preemptor
    once per cycle."""
    ledger = Ledger.from_state(state)
    waiting: set[str] = set()
    for job in indexes.jobs_in(state, "checkpointing", "preempted", "running"):
        if job.phase == "checkpointing":
            release(ledger, job)
        if job.preempted_for and (job.phase in ("checkpointing", "preempted") or job.leaving):
            waiting.add(job.preempted_for)
    charged: set[str] = set()
    for job_id in sorted(waiting):
        beneficiary = state.jobs.get(job_id)
        if beneficiary is not None and beneficiary.phase == "queued" and hold(state, ledger, beneficiary):
            charged.add(job_id)
    return ledger, charged


def hold(state: State, ledger: Ledger, beneficiary: JobState) -> bool:
    """Charge, in ``ledger``, what a queued beneficiary of stops under way will be admitted with
    (``demand``), as a fixed part of its queue's nominal where it may not borrow, as its
    admission will be; whether it counts against any key. The fold's rule and admission's holds
    for stops under way both charge it so."""
    found = demand(state, ledger, beneficiary)
    if found is None:
        return False
    ledger.charge(beneficiary.spec.queue, *found, fixed=ledger.held_fixed(beneficiary))
    return True


def least_given(job: JobState, per_worker: int, stopping: int) -> int:
    """The least of what stopping ``stopping`` workers of ``job`` gives back that a search could
    have given back alone: one worker of a running elastic job (its ranks go one by one), else
    all. An elastic job not running yet, or shrinking already, is shrunk by no record: it can
    only be stopped whole."""
    shrinks = job.spec.min_replicas is not None and job.phase == "running" and not job.leaving
    return per_worker if shrinks else per_worker * stopping


def below_nominal(ledger: Ledger, queue: str, key: str, least: int, freed: int = 0) -> bool:
    """Whether a record leaves another ``queue`` short of its nominal of ``key`` by as much as
    ``least``, the least it gives back in one piece (``freed``: what it gives back, where
    ``ledger`` is not charged with it yet): it then gave back more than it borrowed, for some
    piece was taken once it borrowed nothing. As Kueue takes a queue's jobs only while the queue
    still borrows, a queue is stopped down to within one piece of its nominal, never into it:
    nominal quota stays guaranteed."""
    return ledger.nominal(queue, key) - ledger.used(queue, key) + freed >= least


def release(ledger: Ledger, job: JobState) -> None:
    """Give back, in ``ledger``, the quota ``job`` holds (and the fixed part, where it is)."""
    if ledger.has_queue(job.spec.queue):
        fixed = ledger.held_fixed(job)
        for key, milli in quota.holding(job):
            ledger.charge(job.spec.queue, key, -milli, fixed)


def grace_s(state: State, victim: JobState, queue: str) -> float:
    """How long ``victim`` is given to checkpoint when stopped, moved or shrunk for a job of
    ``queue``: its own ``grace_seconds``; for a job of another queue, at most ``queue``'s
    ``max_grace_seconds``. The preemptor asks for the longest of its victims'; the fold gives
    each victim its own."""
    if victim.spec.queue == queue:
        return max(0.0, victim.spec.grace_seconds)
    return _capped(state, victim, queue)


def drain_grace_s(state: State, job: JobState) -> float:
    """How long a drain gives ``job`` to checkpoint: its own ``grace_seconds``, at most its
    queue's ``max_grace_seconds`` (a tenant's day of grace would hold a drain of a sick node)."""
    return _capped(state, job, job.spec.queue)


def shrink_grace_s(state: State, job: JobState) -> float:
    """How long an owner's shrink gives ``job``'s leaving ranks: its own ``grace_seconds``, at
    most the least ``max_grace_seconds`` of the queues of its cohort tree. Its quota is free at
    once and the ranks keep their GPUs until they exit, and the GPUs may be a lender's: a cap
    of its own queue's alone let a borrower's queue with none keep a lender waiting a day."""
    own = max(0.0, job.spec.grace_seconds)
    caps = [
        (spec.preemption if spec is not None else DEFAULT_PREEMPTION).max_grace_seconds
        for spec in [state.queues.get(q) for q in tree_queues(state, job.spec.queue)]
    ]
    return min([own, *(c for c in caps if c is not None)])


def tree_queues(state: State, queue: str) -> list[str]:
    """The queues of ``queue``'s cohort tree (``queue`` alone when it is in no cohort)."""
    root = _root(state, queue)
    if root is None:
        return [queue]
    return [name for name in state.queues if _root(state, name) == root]


def _root(state: State, queue: str) -> str | None:
    spec = state.queues.get(queue)
    cohort = spec.cohort if spec is not None else None
    seen: set[str] = set()
    while cohort is not None and cohort not in seen:  # a cycle is refused by the fold; bounded all the same
        seen.add(cohort)
        parent = state.cohorts.get(cohort)
        if parent is None or parent.parent is None:
            return cohort
        cohort = parent.parent
    return cohort


def _capped(state: State, job: JobState, queue: str) -> float:
    """``job``'s own grace, at most ``queue``'s ``max_grace_seconds``."""
    own = max(0.0, job.spec.grace_seconds)
    spec = state.queues.get(queue)
    cap = (spec.preemption if spec is not None else DEFAULT_PREEMPTION).max_grace_seconds
    return own if cap is None else min(own, cap)


def may_stop(
    state: State,
    victims: Sequence[JobState],
    beneficiary: JobState,
    now: float,
    keep: int | None = None,
    on_key: str = "",
) -> str | None:
    """Why the fold may not let ``victims`` give up GPUs for ``beneficiary`` at ``now`` (all of
    their GPUs, or, with ``keep``, all but their first ``keep`` workers), for its quota of
    ``on_key`` (as ``demand``'s ``key``); None if the beneficiary's queue's policy allows every
    one. The quota view is built once for the record, whatever the number of victims."""
    for victim in victims:
        why = protected(state, victim, now)
        if why is not None:
            return why
    ledger, waiting = planning(state)
    if beneficiary.phase == "queued":
        queue = beneficiary.spec.queue
        if demand(state, ledger, beneficiary, on_key) is None and on_key:
            return f"{beneficiary.id} counts against no quota of {on_key[:64]!r} in queue {queue}"
        if beneficiary.id in waiting and on_key != beneficiary.reclaim_key:
            # One key per beneficiary while its stops are under way: every reader charges it there.
            before, now_named = beneficiary.reclaim_key or "its first model", on_key or "its first model"
            return f"stops for {beneficiary.id} are under way for {before}, not {now_named}"
    key, need = claim(state, ledger, beneficiary, on_key)
    if beneficiary.id in waiting:
        # A stop for it is under way (the shrink a proposal's first record asked, say): the
        # ledger holds it as admitted already, and it takes nothing back twice.
        need = 0
    queue = beneficiary.spec.queue
    policy = policy_of(state, beneficiary)
    if (
        key is not None
        and beneficiary.phase == "queued"
        and ledger.has_queue(queue)
        and ledger.held_fixed(beneficiary)
        and ledger.fixed(queue, key) + need > ledger.fixed_limit(queue, key)
    ):
        return (
            f"{beneficiary.id} may not be preempted, so may not borrow, and jobs of queue {queue} "
            f"that may not be preempted hold {quota.fmt_gpus(ledger.fixed(queue, key))} of what they "
            "may hold: no stop gets it admitted"
        )
    if key is not None and ledger.has_queue(queue) and not may_preempt_for(ledger, policy, queue, key, need):
        return (
            f"{beneficiary.id} asks more than queue {queue}'s nominal {key} quota and would borrow, "
            "and its queue may not stop work for a job that borrows (borrow_within_cohort: never)"
        )
    charged = [(v, charged_key(ledger, v)) for v in victims]
    lent = {v.id: k is not None and ledger.borrows_from(v.spec.queue, queue, k) for v, k in charged}
    freed: dict[str, int] = {}  # per queue, milli-GPU of ``key`` the record frees
    least: dict[str, int] = {}  # ... and the least any one of its victims there frees
    piece: dict[str, int] = {}  # ... and the least any one of them could have freed alone
    given: list[tuple[str, str, int]] = []  # (queue, key, milli-GPU) each victim gives back
    for victim, victim_key in charged:  # what the record frees, for whether the beneficiary reclaims
        if victim_key is not None:
            milli = quota.worker_milli(victim.spec.resources, victim_key)
            adm = victim.admission
            stopping = adm.replicas if adm is not None and keep is None else 0
            if adm is not None and keep is not None:
                stopping = max(0, adm.replicas - keep)
            given.append((victim.spec.queue, victim_key, milli * stopping))
            if victim_key == key and stopping:
                q, amount = victim.spec.queue, milli * stopping
                freed[q] = freed.get(q, 0) + amount
                least[q] = min(least.get(q, amount), amount)
                one = least_given(victim, milli, stopping)
                piece[q] = min(piece.get(q, one), one)
    fair: dict[str, bool] = {}
    if policy.fair_sharing and key is not None and ledger.has_queue(queue):
        shares = Shares(state, ledger, now)  # read before the record's victims are charged
        record = {q: (gone, least[q]) for q, gone in freed.items()}
        for other in freed:
            if other != queue and ledger.has_queue(other):
                fair[other] = shares.may_take_from(policy.fair_sharing, beneficiary, key, need, record, other)
    for q, k, milli in given:
        ledger.charge(q, k, -milli)
    for victim, victim_key in charged:
        again = not_again(victim, beneficiary)
        if again is not None:
            return again
        reclaims = key is not None and ledger.has_queue(queue) and ledger.within_own(
            queue, victim.spec.queue, key, need
        )  # fmt: skip
        if eligible(
            policy,
            victim,
            victim_key,
            beneficiary,
            key,
            lent=lent[victim.id],
            reclaims=reclaims,
            fair=fair.get(victim.spec.queue, False),
        ):
            continue
        if victim.spec.queue == queue:
            rule = policy.within_queue
            return f"{victim.id} may not be stopped for {beneficiary.id} in queue {queue} (within: {rule})"
        borrower = f"{victim.id} of queue {victim.spec.queue}"
        return f"{borrower} holds nothing {beneficiary.id} of {queue} may take back, borrow over or share"
    if key is not None:
        for other, one in piece.items():
            if other != queue and ledger.has_queue(other) and below_nominal(ledger, other, key, one):
                return f"queue {other} would give back more than it borrows: it would end below its nominal"
    return None


# The phases in which a job stopped for a beneficiary names it (``JobState.preempted_for``):
# stopping, stopped, or requeued and not placed again yet. The placer places the admitted jobs
# so named before any other, and the preemptor gives them their GPUs first in its simulation.
NAMING: tuple[Phase, ...] = indexes.NAMING


def nominated(state: State) -> set[str]:
    """The beneficiaries a job stopped for them names, in a phase of ``NAMING`` (a requeued
    victim may be queued anywhere in the backlog: the fold keeps who is named,
    ``State.naming_by_beneficiary``)."""
    return indexes.nominated(state)
