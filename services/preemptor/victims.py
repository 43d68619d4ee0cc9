"""Victim selection: which running work to stop so that one beneficiary's whole gang fits.

Simulate first, act second (Kueue ``GetTargets`` / ``fillBackWorkloads``). For one beneficiary,
under its queue's preemption policy (``PreemptionPolicy``, the rule of ``projections.preemption``):

1. candidates: work holding GPUs that may be stopped for it (``candidates``): jobs of its own
   queue as ``within_queue`` allows; jobs of other queues of its cohort tree that hold quota its
   side of the tree lent (``Ledger.borrows_from``), of a lower priority as
   ``borrow_within_cohort`` allows, or as ``reclaim_within_cohort`` allows while its side is
   under its own quota. Never a job that is not preemptible (spec or class), never one the
   anti-thrash guards protect (``thrash.py``). Elastic jobs running above their minimum offer
   their top ranks first, one by one (a shrink), before anyone is stopped whole;
2. order: shrinks before whole jobs; then other queues' jobs before the beneficiary's own; then
   the lowest priority, the least work lost (seconds since the last checkpoint of the running
   attempt, or since it started running, times the GPUs held), the youngest; ties by job id.
   Under fair sharing, other queues' jobs come by Kueue's tournament instead: from the tree's
   root down, the branch whose share is the highest at each level, to the next job of the
   queue it ends in, with the ones before it gone;
3. remove candidates from a snapshot in that order until the gang fits and the fold will let it
   take every victim (``Simulation.allowed``, by the fold's own ``preemption.eligible`` on the
   record as a whole: one taken only to take back lent quota needs ``reclaim_within_cohort`` to
   allow it and the beneficiary's side within its own quota once all the removals are counted,
   its own queue's included; one taken by fair sharing, the shares with all of them), skipping
   another queue's job once earlier removals left that queue holding nothing lent; if the gang
   does not fit with every candidate removed, stop nobody. (The shortest prefix that fits is
   found by doubling then halving; from there, one removal at a time to the first the fold
   allows, since under fair sharing a longer prefix can be refused where a shorter one was
   not.) Under fair sharing, a set the order
   never allows (each borrower taken makes its queue's share lower, and the last may leave it
   below the beneficiary's) is looked for once more with the beneficiary's own queue's
   candidates first. If that finds nothing, the same with the beneficiary's own queue's jobs
   alone (it then borrows). A beneficiary that asks more than its queue's nominal is looked for
   only where its queue may preempt while borrowing (``preemption.may_preempt_for``, Kueue's
   flavor assigner);
4. fill back: add back, in reverse order, every removed candidate the gang fits without. An
   elastic job keeps contiguous ranks: once one of its ranks must stay stopped, so do the ranks
   above it. What is left is minimal: no victim can be spared.

"Fits" is the placer's own gang search (``services/placer``: filters, reserves, topology) on its
``Snapshot``, a job whose place is held put back on it first as the placer puts it
(``projections.placement.back``), that place's free part held for it until its turn, plus the
queue's quota (``projections.quota.Ledger``) for a beneficiary that is not yet admitted: a queued
job blocked by quota needs both, so its victims are the smallest set after which admission can
admit it and the placer can place it. The result is then checked with the fold's arithmetic
(``projections.claims``) on scratch copies of the nodes involved, cumulative over the cycle,
exactly as the fold will see the GPUs once the victims are gone and the beneficiary is placed.

The ``Simulation`` is the cycle's one mutable view; the State itself is never touched.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import msgspec

from corral.events.base import Reason
from corral.events.decisions import Placement, WorkerSlot
from corral.events.queues import PreemptionPolicy
from corral.projections import claims, indexes, preemption, quota
from corral.projections.lifecycle import Phase
from corral.projections.placement import back, gang, stack
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.plugins.packing import fragmentation_of
from corral.projections.placement.snapshot import Snapshot
from corral.projections.placement.stack import PlacerConfig
from corral.projections.quota import Ledger
from corral.projections.state import WHOLE, JobState, State

RUNNING: tuple[Phase, ...] = ("placed", "starting", "running")  # the phases a PreemptionRequested may stop


# -- what stopping a job costs ----------------------------------------------------------------------


def gpus_held(state: State, job: JobState) -> float:
    """GPUs the job holds now, fractions and MIG slices counted by their share of a GPU."""
    if job.held is None:
        return 0.0
    milli = 0
    for w in job.held.workers:
        node = state.nodes.get(w.node)
        for c in w.gpus:
            if node is not None and c.mig is not None and 0 <= c.gpu < len(node.gpus):
                milli += claims.claim_milli(node.gpus[c.gpu].info.model, c)
            else:
                milli += c.milli
    return milli / WHOLE


def work_lost(state: State, job: JobState, now: float) -> float:
    """GPU-seconds stopping ``job`` now would throw away: time since the last checkpoint of the
    running attempt (or since it started running) times the GPUs it holds. A job not yet running
    has done no work to lose."""
    if job.phase != "running":
        return 0.0
    since = job.phase_since
    ckpt = job.checkpoint
    if ckpt is not None and ckpt.attempt == job.attempt:
        at: float | None = getattr(ckpt, "time", None)
        if at is not None:
            since = max(since, at)
    return max(0.0, now - since) * gpus_held(state, job)


preemptible = preemption.preemptible


# -- beneficiaries and candidates -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A beneficiary as it would hold quota and GPUs: ``job`` carries the admission it holds (or
    would get), ``need`` the quota still to charge (0 once admitted)."""

    job: JobState
    req: Request
    key: str | None
    need: int
    # The key a proposal for it names (``PreemptionRequested.key``): empty for a job that
    # counts against one key only, so that the log of such jobs names none.
    named: str = ""
    # The place held for it (``placement.back.held_place``): the placer puts it back there as
    # far as that place still takes it, and so does the simulation.
    place: Placement | None = None

    def shape(self) -> tuple[object, ...]:
        """What decides, besides priority, which candidates it has and whether they suffice."""
        r = self.req
        return (
            self.job.spec.queue,
            self.key,
            self.need,
            r.need,
            r.selector,
            r.pack,
            r.required,
            r.replicas,
            r.avoid,
            # A place held for it is its own: whether that place takes it says nothing of others.
            self.job.id if self.place is not None else None,
        )


def admitted_target(state: State, ledger: Ledger, job: JobState) -> Target:
    adm = job.admission
    key = next(iter(adm.gpus)) if adm is not None and len(adm.gpus) == 1 else None
    # As the placer places it, off the nodes that failed its start (``Request.of`` with the
    # state): room made there for it would stand idle, and the room it needs elsewhere never made.
    return Target(job, Request.of(job, state=state), key, 0, place=back.held_place(job))


def queued_target(state: State, ledger: Ledger, job: JobState) -> Target | None:
    """A queued job as admission would admit it: at its minimum replicas, on the quota key the
    rule charges it on (``preemption.demand``: that of its stops under way, else its first);
    None if it needs no GPU or its queue is gone."""
    demand = queued_demand(state, ledger, job)
    return None if demand is None else _as_admitted(state, ledger, job, *demand)


def blocked_targets(state: State, ledger: Ledger, job: JobState) -> list[Target]:
    """A queued job that waits because its queue's quota is in use, as it would be admitted on
    each quota key (GPU model) it names, in its order, where admission cannot admit it now but
    could once lower-priority jobs of its queue, or queues of its tree that borrow, gave quota
    back. None if admission can admit it as things are on any of them (Kueue's flavor assigner
    passes over a flavor it would have to preempt on for a later one it fits), and none of a
    key where no preemption ever could (it needs more than its queue could hold there with the
    whole tree idle)."""
    qspec = state.queues.get(job.spec.queue)
    q = job.spec.queue
    replicas = quota.min_replicas(job.spec)
    if qspec is None or not ledger.has_queue(q) or replicas <= 0:
        return []
    demands = [(k, each * replicas) for k, each in ledger.demands(q, job.spec)]
    several = len(quota.worker_demands(qspec, job.spec.resources)) > 1  # the record names its key
    borrow = ledger.may_borrow(job)
    if any(ledger.fits(q, key, need, borrow) for key, need in demands):
        return []
    out = []
    policy = qspec.preemption
    for key, need in demands:
        if need > ledger.ceiling(q, key, borrow):
            continue
        if not preemption.may_preempt_for(ledger, policy, q, key, need):
            continue  # larger than its nominal, it would borrow, and its queue may not borrow over
        if not borrow and need > ledger.fixed_limit(q, key) - ledger.fixed(q, key):
            continue  # what stands in its way is its queue's jobs that may not be stopped either
        out.append(_as_admitted(state, ledger, job, key, need, key if several else ""))
    return out


queued_demand = preemption.demand


def _as_admitted(state: State, ledger: Ledger, job: JobState, key: str, need: int, named: str = "") -> Target:
    q = job.spec.queue
    adm = quota.admission(state.queues[q], job, replicas=quota.min_replicas(job.spec), key=key)
    as_admitted = msgspec.structs.replace(job, admission=adm)
    # Off the nodes that failed its starts, as the placer will place it (``admitted_target``).
    place = back.held_place(job, admitted=True)
    return Target(as_admitted, Request.of(as_admitted, state=state), key, need, named, place)


@dataclass(frozen=True, slots=True)
class Holder:
    """A job that may be stopped, as the cycle sees it once: where it counts against quota and
    what stopping it costs."""

    job: JobState
    key: str | None
    per_worker: int  # quota milli-GPU of one worker on ``key``
    lost: float  # work_lost at ``now``

    @property
    def frees(self) -> int:
        """The quota milli-GPU on ``key`` stopping the whole job gives back."""
        held = self.job.held
        return self.per_worker * len(held.workers) if held is not None else 0


class Pool:
    """The jobs that may be stopped this cycle (preemptible, in a phase a preemption may stop,
    not protected by the anti-thrash guards), per queue, in the order victims are taken: least
    work lost, lowest priority, youngest, job id. Finding one beneficiary's candidates costs
    what its own queue and the queues that borrow from it hold, not what the cluster holds."""

    def __init__(self, state: State, ledger: Ledger, now: float) -> None:
        found: list[Holder] = []
        for job in indexes.jobs_in(state, *RUNNING):
            if job.held is None or preemption.protected(state, job, now):
                continue
            key, per_worker = charge_of(ledger, job)
            found.append(Holder(job, key, per_worker, work_lost(state, job, now)))
        found.sort(key=_order)
        self.by_queue: dict[str, list[Holder]] = {}
        self.elastic_by_queue: dict[str, list[Holder]] = {}  # the same, elastic jobs only
        self.riders: list[Holder] = []  # the same, jobs that ask for no GPU (``preemption.rides``)
        for h in found:
            self.by_queue.setdefault(h.job.spec.queue, []).append(h)
            if h.job.spec.min_replicas is not None:
                self.elastic_by_queue.setdefault(h.job.spec.queue, []).append(h)
            if preemption.rides(h.job):
                self.riders.append(h)


def _order(h: Holder) -> tuple[int, float, int, str]:
    return h.job.priority, h.lost, -h.job.submitted_seq, h.job.id


def charge_of(ledger: Ledger, job: JobState) -> tuple[str | None, int]:
    """The quota key the job's admission holds and the milli-GPU one of its workers costs there
    (what ``Ledger.hold`` charged); (None, 0) if it holds no quota the ledger knows."""
    adm = job.admission
    if adm is None or len(adm.gpus) != 1 or not ledger.has_queue(job.spec.queue):
        return None, 0
    key = next(iter(adm.gpus))
    return key, quota.worker_milli(job.spec.resources, key)


@dataclass(frozen=True, slots=True)
class Unit:
    """One step of the search: stop ``holder``'s whole job (``rank`` None) or one rank of an
    elastic job (a shrink by one worker)."""

    holder: Holder
    rank: int | None
    borrower: bool  # another queue's job, stoppable only while that queue borrows

    @property
    def job(self) -> JobState:
        return self.holder.job


COHORT, OWN = "cohort", "own"  # the search's attempts, in order


def candidates(
    target: Target,
    pool: Pool,
    taken: set[str],
    ledger: Ledger,
    policy: PreemptionPolicy,
    *,
    mode: str,
    shrink: bool,
    shares: preemption.Shares | None = None,
) -> Iterator[Unit]:
    """The units that may be stopped for ``target`` in one attempt of the search, in the order
    it removes them: shrinks, then whole jobs; other queues' jobs before the beneficiary's own;
    then the pool's order. The beneficiary's own queue's jobs by the policy's ``within_queue``;
    with ``COHORT``, also other queues' jobs that hold quota lent by its side
    (``Ledger.borrows_from``) and that ``borrow_within_cohort`` or ``reclaim_within_cohort``
    allows (those only the latter allows need the beneficiary within its side's own quota once
    the victims are gone: ``Simulation.allowed``), or, with ``shares`` and a policy that shares
    fairly, its ``fair_sharing`` strategies allow; those queues then in Kueue's order, the
    highest share first, branch by branch from the root. Lazy: the search usually stops long
    before the end."""
    b = target.job
    queue = b.spec.queue
    key = target.key
    # Which queues hold what the beneficiary's side lent, as the fold will read them (``ledger``
    # is the simulation's ``rules``).
    lenders: list[str] = []
    if key is not None and mode == COHORT and ledger.has_queue(queue):
        lenders = ledger.lenders_to(queue, key)
    lending = set(lenders)

    # The rule the fold enforces (``projections.preemption``) under the queue's policy.
    under: dict[str, bool] = {}  # per other queue: the beneficiary's side is under its own quota now

    # Fair sharing (Kueue's S2-a/S2-b), judged per victim as if it were the record's only one
    # from its queue, and the beneficiary's queue as if every job of it the policy lets it stop
    # were stopped too (its share then the least it can be): a candidate, not a verdict, for
    # ``Simulation.allowed`` judges the whole record as the fold will.
    spared = 0
    if shares is not None and key is not None and lending:
        spared = sum(
            h.frees
            for h in itertools.takewhile(
                lambda h: preemption.may_stop_within(policy, h.job.priority, b.priority),
                pool.by_queue.get(queue, ()),
            )
            if h.key == key and h.job.id not in taken
        )

    def fair(h: Holder) -> bool:
        if shares is None or key is None or h.key != key:
            return False
        record = {queue: (spared, spared), h.job.spec.queue: (h.frees, h.frees)}
        return shares.may_take_from(policy.fair_sharing, b, key, target.need, record, h.job.spec.queue)

    def may(h: Holder) -> bool:
        if h.job.id in taken:
            return False
        other = h.job.spec.queue
        if other not in lending:
            return preemption.eligible(policy, h.job, h.key, b, key, lent=False, reclaims=False)
        if other not in under:
            # As Kueue: taking back lent quota is tried only from under the side's own quota.
            # The least more it could hold: a milli-GPU, or none for an admitted beneficiary,
            # charged already (with one more, a lender at exactly its nominal took nothing back).
            under[other] = key is not None and ledger.within_own(queue, other, key, min(1, target.need))
        # A candidate, not a verdict: whether the record reclaims is known only once its
        # victims are (``Simulation.allowed``), so one either way may stop it.
        judge = functools.partial(preemption.eligible, policy, h.job, h.key, b, key, lent=True, fair=fair(h))
        return judge(reclaims=False) or (under[other] and judge(reclaims=True))

    def own(index: dict[str, list[Holder]]) -> Iterator[tuple[Holder, bool]]:
        for h in index.get(queue, ()):
            if not preemption.may_stop_within(policy, h.job.priority, b.priority):
                # The pool's order is priority first: no job of the queue from here on is of a
                # priority ``within_queue`` lets it stop.
                return
            if not preemption.rides(h.job) and may(h):
                yield h, False

    def borrowers(index: dict[str, list[Holder]]) -> Iterator[tuple[Holder, bool]]:
        if shares is not None and key is not None and policy.fair_sharing:
            yield from tournament(index, shares, key)
            return
        for h in heapq.merge(*(index.get(q, ()) for q in lenders), key=_order):
            if not preemption.rides(h.job) and may(h):
                yield h, True

    def tournament(
        index: dict[str, list[Holder]], shares: preemption.Shares, key: str
    ) -> Iterator[tuple[Holder, bool]]:
        """Kueue's fair sharing (KEP-1714 C1, ``TargetClusterQueueOrdering``): from the tree's
        root down, into the branch whose share is the highest at each level (a cohort before a
        queue of the same share, the cohort's highest branch then chosen in turn), to the next
        victim of the queue it ends in, asked again after every victim with those before it
        gone (the search removes a prefix of this order), so that one branch is not drained
        while another's share has become the higher. A branch that holds the beneficiary's
        queue counts its ask (Kueue simulates the preemptor's usage while it orders). With
        every queue in one cohort, the queue of highest share first."""
        queues = {q: iter(index.get(q, ())) for q in lenders}
        gone = dict.fromkeys(lenders, 0)
        ways = {q: shares.ledger.lineage(q) for q in lenders}

        def rank(q: str) -> tuple[tuple[tuple[float, int], ...], str]:
            steps = []
            for branch in ways[q]:
                change = -sum(gone[m] for m in branch.queues if m in gone)
                if not branch.is_queue and queue in branch.queues:
                    change += target.need
                steps.append((-shares.side(branch, key, change), 1 if branch.is_queue else 0))
            return tuple(steps), q

        # A victim lowers the shares of the branches above its queue only, so a queue's rank
        # never improves: one popped whose rank is still what it was pushed with is the next.
        ranked = [rank(q) for q in lenders]
        heapq.heapify(ranked)
        while ranked:
            was = heapq.heappop(ranked)
            q = was[1]
            now = rank(q)
            if now != was:
                heapq.heappush(ranked, now)
                continue
            for h in queues[q]:
                if not preemption.rides(h.job) and may(h):
                    yield h, True
                    gone[q] += h.frees
                    heapq.heappush(ranked, rank(q))
                    break

    if shrink:
        for h, borrower in itertools.chain(borrowers(pool.elastic_by_queue), own(pool.elastic_by_queue)):
            held, lo = h.job.held, h.job.spec.min_replicas
            assert held is not None and lo is not None
            if h.job.phase != "running" or h.job.leaving:
                continue  # the fold shrinks a running job, one shrink at a time; else it is stopped whole
            ranks = sorted((w.rank for w in held.workers), reverse=True)
            for rank in ranks[: max(0, len(ranks) - max(lo, 1))]:
                yield Unit(h, rank, borrower)
    if key is not None and target.need == 0:
        # Jobs that ask for no GPU hold no quota, so stopping them frees none: offered only to
        # a job that holds its quota and waits for a place, first, whatever their queue. (To
        # one blocked by quota every one of them would be taken, then each given back.)
        for h in pool.riders:
            if may(h):
                yield Unit(h, None, False)
    for h, borrower in itertools.chain(borrowers(pool.by_queue), own(pool.by_queue)):
        yield Unit(h, None, borrower)


# -- the simulation ---------------------------------------------------------------------------------


_Removed = list[tuple[Unit, tuple[int, ...]]]


class _FitOnly(Chain):
    """The placer's chain, minus the explanation of a gang that does not fit (a pass over every
    node): the search asks whether a gang fits many times a cycle and never why not."""

    def diagnose(self, snap: Snapshot, req: Request) -> tuple[Reason, ...]:
        return ()


@dataclass
class Found:
    """The victims one beneficiary needs, and where the simulation placed it."""

    whole: list[JobState]
    shrinks: list[tuple[JobState, int]]  # (elastic job, replicas it keeps)
    placement: Placement
    removed: _Removed = field(default_factory=list)  # (unit, ranks it gave back), in removal order
    # A consolidation: each victim, as it holds its admission, with where it goes once stopped
    # (``services/preemptor/consolidation.py``).
    moves: list[tuple[Target, Placement]] = field(default_factory=list)


@dataclass
class Simulation:
    """The cycle's view of the cluster: the placer's snapshot and a quota ledger, both updated as
    victims are removed and beneficiaries placed, and scratch copies of the nodes the fold's
    arithmetic has checked so far."""

    state: State
    placer: PlacerConfig
    now: float = 0.0  # log time, for the fair shares
    ledger: Ledger = field(init=False)
    rules: Ledger = field(init=False)  # quota as the fold reads it for the rule: proposals only
    scratch: State = field(init=False)
    released: dict[str, set[int]] = field(default_factory=dict)  # job -> ranks given back
    taken: set[str] = field(default_factory=set)  # jobs stopped or shrunk this cycle
    # What a search removed, kept as it removes and restores so that judging it costs what it
    # removed, not what the whole cycle released (a run of like beneficiaries can stop hundreds of
    # jobs, and sparing each again asks ``allowed``): since the last ``mark``, each job whose ranks
    # given back changed, with how many it had given back at the mark; each job with more given
    # back now, with how many more; and per quota key and queue, what those free of the key (per
    # job: milli-GPU, and the least one piece of it could free alone).
    since_mark: dict[str, int] = field(default_factory=dict)
    removed_since: dict[str, int] = field(default_factory=dict)
    freed_since: dict[str, dict[str, tuple[dict[str, int], dict[str, int]]]] = field(default_factory=dict)
    # Per job a place is held for, what of it was free and is taken out of the snapshot until
    # the job's turn (``hold_places``).
    held: dict[str, back.Held] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Built on first use (``snap``): a walk of every GPU of the cluster, which a cycle whose
        # beneficiaries are all passed over (a backlog no preemption can help, jobs admission
        # admits as they are) never reads; at 100,000 queued, most of such a cycle's cost.
        self._snap: Snapshot | None = None
        self.ledger = Ledger.from_state(self.state)
        self.rules = preemption.planning_ledger(self.state)
        self.shares = preemption.Shares(self.state, self.rules, self.now)
        self.scratch = State(seq=self.state.seq, nodes={})
        self._chain: Chain | None = None  # built on first use: a cycle may never place anything

    @property
    def snap(self) -> Snapshot:
        """The placer's view of what is free where, with what the cycle has taken and given back."""
        if self._snap is None:
            self._snap = Snapshot(self.state)
        return self._snap

    @property
    def chain(self) -> Chain:
        if self._chain is None:
            built = stack.build(self.placer, fragmentation_of(self.state))
            self._chain = _FitOnly(built.filters, built.reserves, built.scores, built.limit)
        return self._chain

    # -- places held ------------------------------------------------------------------------------

    def hold_places(self) -> None:
        """Take out of the snapshot, as the placer does before anything else, what of each place
        held for a job (kept across a planned shutdown, or named by a move) is free: the placer
        gives it to that job alone, at its turn, so that a beneficiary whose turn comes first
        (one not yet admitted, a moved job's of a higher priority, one whose victims are
        stopping) is not offered it, and is not found room there that it will not get."""
        places = back.held_places(self.state)
        self.held = back.hold_places(self.snap, places) if places else {}

    def turn(self, job: JobState) -> back.Held:
        """``job``'s turn: what of its place was held for it is back in the snapshot, for it (and
        returned, to be held again with ``not_placed`` if the turn places it nowhere)."""
        part = self.held.pop(job.id, [])
        if part:
            back.give_back(self.snap, part)
        return part

    def not_placed(self, job: JobState, part: back.Held) -> None:
        """``job``'s turn placed it nowhere: what of its place was held for it is held again,
        as the placer holds it again for the rest of its cycle."""
        if part:
            back.take_again(self.snap, part)
            self.held[job.id] = part

    # -- removing and restoring work --------------------------------------------------------------

    def borrowing(self, unit: Unit, target: Target) -> bool:
        """Whether ``unit``'s queue still holds quota lent by ``target``'s side, after what the
        search has removed so far."""
        h = unit.holder
        if h.key is None:
            return False
        return self.ledger.borrows_from(unit.job.spec.queue, target.job.spec.queue, h.key)

    def mark(self) -> None:
        """Begin a search: ``allowed`` judges the removals made after this."""
        self.since_mark, self.removed_since, self.freed_since = {}, {}, {}

    def _moved(self, job: JobState, gone: set[int]) -> None:
        """Count ``job``'s ranks given back (``gone``) against the mark, after a change."""
        n = len(gone) - self.since_mark[job.id]
        if n > 0:
            self.removed_since[job.id] = n
        else:
            self.removed_since.pop(job.id, None)
        key, per_worker = charge_of(self.ledger, job)
        if key is None or not per_worker:
            return
        amounts, pieces = self.freed_since.setdefault(key, {}).setdefault(job.spec.queue, ({}, {}))
        if n > 0:
            amounts[job.id], pieces[job.id] = per_worker * n, preemption.least_given(job, per_worker, n)
        else:
            amounts.pop(job.id, None)
            pieces.pop(job.id, None)

    def allowed(self, target: Target, policy: PreemptionPolicy) -> bool:
        """Whether the fold will let ``target`` take every other queue's job the search removed
        since the ``mark``, judged by the fold's own rule
        (``preemption.eligible``) on the record as a whole: one the policy lets it borrow over,
        one it takes back lent quota from as ``reclaim_within_cohort`` allows (its side of the
        tree then within its own quota with every removal counted), or one its fair-sharing
        strategies let it take with every removal counted; each only if it holds quota lent by
        the beneficiary's side as the fold reads it before the record."""
        q, key = target.job.spec.queue, target.key
        freed = self._freed(key) if key is not None else {}  # per queue, of ``key``
        rules = self.rules
        record = {other: (gone, least) for other, (gone, least, _) in freed.items()}
        if key is not None and any(
            other != q and rules.has_queue(other) and preemption.below_nominal(rules, other, key, piece, gone)
            for other, (gone, _, piece) in freed.items()
        ):
            return False
        for job_id in self.removed_since:
            victim = self.state.jobs[job_id]
            other = victim.spec.queue
            if other == q:
                continue
            victim_key = charge_of(self.ledger, victim)[0]
            reclaims = key is not None and self.ledger.within_own(q, other, key, target.need)
            # Lent as the fold reads it, before the record's stops (as ``candidates`` offered it).
            lent = victim_key is not None and rules.borrows_from(other, q, victim_key)
            judge = functools.partial(
                preemption.eligible, policy, victim, victim_key, target.job, key, lent=lent, reclaims=reclaims
            )
            if judge():
                continue
            if key is None or not policy.fair_sharing:
                return False
            fair = self.shares.may_take_from(policy.fair_sharing, target.job, key, target.need, record, other)
            if not judge(fair=fair):
                return False
        return True

    def _freed(self, key: str) -> dict[str, tuple[int, int, int]]:
        """Per queue, the milli-GPU of ``key`` the removals since the mark free, the least any
        one job there frees, and the least any one piece could have freed alone
        (``preemption.least_given``: a rank of an elastic job)."""
        return {
            queue: (sum(amounts.values()), min(amounts.values()), min(pieces.values()))
            for queue, (amounts, pieces) in self.freed_since.get(key, {}).items()
            if amounts
        }

    def release(self, job: JobState, key: str | None, per_worker: int, rank: int | None) -> tuple[int, ...]:
        """Give back what ``job`` holds (only ``rank`` if given) in the snapshot and the ledger;
        returns the ranks given back (a rank already given back is not given twice)."""
        if job.held is None:
            return ()
        gone = self.released.setdefault(job.id, set())
        self.since_mark.setdefault(job.id, len(gone))
        slots = [w for w in job.held.workers if (rank is None or w.rank == rank) and w.rank not in gone]
        self._apply(job, key, per_worker, slots, +1)
        gone.update(w.rank for w in slots)
        self._moved(job, gone)
        return tuple(w.rank for w in slots)

    def restore(self, job: JobState, key: str | None, per_worker: int, ranks: tuple[int, ...]) -> None:
        if job.held is None or not ranks:
            return
        gone = self.released.setdefault(job.id, set())
        self.since_mark.setdefault(job.id, len(gone))
        slots = [w for w in job.held.workers if w.rank in ranks]
        self._apply(job, key, per_worker, slots, -1)
        gone.difference_update(ranks)
        self._moved(job, gone)

    def _apply(
        self, job: JobState, key: str | None, per_worker: int, slots: list[WorkerSlot], sign: int
    ) -> None:
        res = job.spec.resources
        for w in slots:
            if w.node in self.state.nodes:
                if sign > 0:
                    self.snap.give_back(w.node, res, w.gpus)
                else:
                    self.snap.take(w.node, res, w.gpus)
        if key is not None and per_worker and slots and self.ledger.has_queue(job.spec.queue):
            self.ledger.charge(
                job.spec.queue, key, -sign * per_worker * len(slots), self.ledger.held_fixed(job)
            )

    # -- placing the beneficiary ------------------------------------------------------------------

    def proposed(self, target: Target, found: Found) -> None:
        """Add a proposal to the rule's view as the fold will read it once it is logged: its
        victims give their quota back, shrinks their top ranks', and a queued beneficiary takes
        what it needs."""
        for job in found.whole:
            preemption.release(self.rules, job)
        for job, keep in found.shrinks:
            key, per_worker = charge_of(self.rules, job)
            adm = job.admission
            if key is not None and adm is not None and adm.replicas > keep:
                self.rules.charge(job.spec.queue, key, -per_worker * (adm.replicas - keep))
        if target.need and target.key is not None and self.rules.has_queue(target.job.spec.queue):
            fixed = self.rules.held_fixed(target.job)
            self.rules.charge(target.job.spec.queue, target.key, target.need, fixed)

    def place(self, target: Target) -> Placement | None:
        """Place ``target`` on the snapshot (taking its GPUs and quota) if it fits now."""
        q = target.job.spec.queue
        if target.need and (
            target.key is None
            or not self.ledger.fits(q, target.key, target.need, self.ledger.may_borrow(target.job))
        ):
            return None
        found = self._gang(target)
        if found is None:
            return None
        if target.need and target.key is not None:
            self.ledger.charge(q, target.key, target.need, self.ledger.held_fixed(target.job))
        return found

    def quota_fits(self, target: Target, copies: int) -> bool:
        """Whether the quota ``place`` checks lets ``copies`` jobs like ``target``'s in one
        after another, each charged as ``place`` charges it; the ledger is left as it was. The
        gangs' search reads no quota, so this is the quota half of placing the copies in turn."""
        if not target.need:
            return True
        q, key = target.job.spec.queue, target.key
        if key is None:
            return False
        ledger = self.ledger
        borrow, fixed = ledger.may_borrow(target.job), ledger.held_fixed(target.job)
        charged = 0
        try:
            for _ in range(copies):
                if not ledger.fits(q, key, target.need, borrow):
                    return False
                ledger.charge(q, key, target.need, fixed)
                charged += 1
            return True
        finally:
            for _ in range(charged):
                ledger.charge(q, key, -target.need, fixed)

    def _gang(self, target: Target) -> Placement | None:
        """Where the placer puts ``target``'s gang now, taken from the snapshot: a job whose
        place is held back on it as far as it still takes it (``placement.back``), else, or
        failing that, wherever its search finds room."""
        if target.place is not None:
            found = back.back_in_place(
                self.chain, self.snap, target.req, target.place, self.placer.label_keys
            )
            if found is not None:
                return found
        placed = gang.place(self.chain, self.snap, target.req, self.placer.label_keys)
        return placed if isinstance(placed, Placement) else None

    def unplace(self, target: Target, placement: Placement) -> None:
        self.snap.release(placement, target.req.res)
        if target.need and target.key is not None:
            self.ledger.charge(
                target.job.spec.queue, target.key, -target.need, self.ledger.held_fixed(target.job)
            )

    def fits(self, target: Target) -> bool:
        found = self.place(target)
        if found is None:
            return False
        self.unplace(target, found)
        return True

    # -- the fold's arithmetic ----------------------------------------------------------------------

    def gate(self, target: Target, found: Found) -> claims.ClaimError | None:
        """Check ``found`` with ``projections.claims`` on copies of the scratch nodes it touches
        (the fold's own arithmetic, ``claims.relayout``): the victims gone, the shrunk jobs on
        the ranks they keep, the beneficiary placed, then each moved job in its new place. Keep
        the copies if it holds, so the next beneficiary is checked against them."""
        placed = [(target.job, found.placement), *((t.job, p) for t, p in found.moves)]
        try:
            trial = claims.relayout(
                collections.ChainMap(self.scratch.nodes, self.state.nodes),
                self.state.seq,
                found.whole,
                found.shrinks,
                placed,
            )
        except claims.ClaimError as e:
            return e
        self.scratch.nodes.update(trial.nodes)
        return None


# -- the search -------------------------------------------------------------------------------------


def search(
    sim: Simulation,
    target: Target,
    units: Iterable[Unit],
    policy: PreemptionPolicy | None = None,
    copies: int = 1,
) -> Found | None:
    """The minimal victims that let ``target``'s gang fit, with the gang placed on the snapshot;
    None (and the snapshot as it was) if no set of candidates is enough. No victims at all when
    the gang fits already. With the beneficiary's queue's ``policy``, the gang fits only if the
    fold will let it take every other queue's job removed (``Simulation.allowed``).

    With ``copies`` above one, the victims that make room for that many jobs like ``target``'s
    together (a run of like beneficiaries, ``services/preemptor/decide.py``), quota and GPUs,
    with ``target`` alone placed: the one search that sees the run's needs as a whole."""
    run = target if copies == 1 else replace(target, need=target.need * copies)

    def room() -> bool:
        return sim.fits(target) if copies == 1 else _fits_copies(sim, target, copies)

    if copies == 1 or room():
        placed = sim.place(target)
        if placed is not None:
            return Found([], [], placed)
    sim.mark()

    def allowed() -> bool:
        return policy is None or sim.allowed(run, policy)

    def fits() -> bool:
        return room() and allowed()

    removed = _remove(sim, target, units, room, allowed)
    if removed is None:
        return None
    removed = _fill_back(sim, removed, fits)
    placed = sim.place(target) if allowed() and (copies == 1 or room()) else None
    if placed is None:  # the placer's search need not be monotone; give up rather than guess
        _restore_all(sim, removed)
        return None
    return _found(removed, placed)


def _fits_copies(sim: Simulation, target: Target, copies: int) -> bool:
    """Whether ``copies`` jobs like ``target``'s all fit at once, each placed as it would be.
    Quota first: placing them in turn fails at the first copy whose quota or gang does not fit,
    and a run of queued jobs is held back by quota far more often than by GPUs (the search's
    steps toward enough victims), so that no gang is searched for a set whose quota cannot
    take them all (at 100,000 queued, most of the gangs a cycle searched for)."""
    if not sim.quota_fits(target, copies):
        return False
    placed: list[Placement] = []
    try:
        for _ in range(copies):
            found = sim.place(target)
            if found is None:
                return False
            placed.append(found)
        return True
    finally:
        for p in reversed(placed):
            sim.unplace(target, p)


def _remove(
    sim: Simulation,
    target: Target,
    units: Iterable[Unit],
    fits: Callable[[], bool],
    allowed: Callable[[], bool],
) -> _Removed | None:
    """The shortest prefix of ``units`` whose removal lets ``target`` fit and that the fold
    allows, removed; None (and nothing removed) if there is none.

    Asking whether the gang fits after every removal costs a gang search per candidate;
    instead ask after 1, 2, 4, 8, ... removals, then halve the last interval back to the first
    count that fits: O(log n) searches, and the shortest prefix that fits whenever more
    removals never make a fitting gang unfit. Whether the fold allows a prefix is not so: under
    fair sharing, one victim too many from a queue can leave its share below the beneficiary's,
    and every longer prefix is refused as well until another queue's victims come. So from the
    shortest prefix that fits, removals go on one at a time to the first the fold allows (a
    look at the shares, no gang search).
    """
    order = iter(units)
    removed: _Removed = []
    put_back: list[Unit] = []  # taken from the order, then put back by the halving, in order

    def take() -> bool:
        """Remove the next candidate that still gives something back; False if none is left."""
        while True:
            u = put_back.pop(0) if put_back else next(order, None)
            if u is None:
                return False
            if u.borrower and not sim.borrowing(u, target):
                continue  # its queue gave back all it borrowed already
            ranks = sim.release(u.job, u.holder.key, u.holder.per_worker, u.rank)
            if ranks:
                removed.append((u, ranks))
                return True

    lo, probe, fitted = 0, 1, False  # lo: a count of removals known not to be enough
    while take():
        if len(removed) >= probe:
            if fits():
                fitted = True
                break
            lo, probe = len(removed), 2 * len(removed)
    if not fitted and len(removed) > lo:
        fitted = fits()
    if not fitted:
        _restore_all(sim, removed)
        return None
    hi = len(removed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        _restore_all(sim, removed[mid:])
        if fits():
            put_back[:0] = [u for u, _ in removed[mid:]]
            del removed[mid:]
            hi = mid
        else:
            for j in range(mid, hi):
                u = removed[j][0]
                removed[j] = (u, sim.release(u.job, u.holder.key, u.holder.per_worker, u.rank))
            lo = mid
    if not allowed():
        # Under fair sharing a victim taken early and not needed in the end (a small job of the
        # queue with the highest share) can be what makes the set unfair: spare what can be
        # spared first, the set allowed (a look at the shares) and the gang still fitting, and
        # take more only if that is not enough. Once, from the shortest prefix that fits: a
        # gang search per victim spared or not.
        removed = _fill_back(sim, removed, lambda: allowed() and fits())
    while not allowed():
        if not take():
            # Whether the fold allows a set is not monotone either way: a victim taken late (one
            # of the beneficiary's own queue) can make spare one taken early that left its queue
            # below its nominal. Spare what can be spared, the last removal too, before giving up.
            removed = _fill_back(sim, removed, lambda: allowed() and fits(), last_needed=False)
            if removed and allowed() and fits():
                return removed
            _restore_all(sim, removed)
            return None
    return removed


def _restore_all(sim: Simulation, removed: _Removed) -> None:
    for u, ranks in reversed(removed):
        sim.restore(u.job, u.holder.key, u.holder.per_worker, ranks)


def _fill_back(
    sim: Simulation, removed: _Removed, fits: Callable[[], bool], last_needed: bool = True
) -> _Removed:
    """Kueue's fillBackWorkloads: the last removal was needed; try to spare each earlier one
    (without ``last_needed``, the last one too)."""
    kept: list[bool] = [True] * len(removed)
    whole = {u.job.id for u, _ in removed if u.rank is None}
    # Elastic jobs whose lowest stopped rank stays stopped: the ranks above it stay stopped too,
    # so that the job keeps ranks 0..n-1. Its ranks were removed top first, so they come back
    # lowest first here, and the first one that cannot come back pins the rest.
    pinned: set[str] = set()
    last = removed[-1][0] if removed else None
    if last_needed and last is not None and last.rank is not None:
        pinned.add(last.job.id)
    for i in range(len(removed) - (2 if last_needed else 1), -1, -1):
        u, ranks = removed[i]
        jid = u.job.id
        if u.rank is not None and (jid in whole or jid in pinned):
            continue  # stopped whole anyway, or its ranks must stay contiguous
        sim.restore(u.job, u.holder.key, u.holder.per_worker, ranks)
        if fits():
            kept[i] = False
            if u.rank is None:
                whole.discard(jid)
        else:
            removed[i] = (u, sim.release(u.job, u.holder.key, u.holder.per_worker, u.rank))
            if u.rank is not None:
                pinned.add(jid)
    return [r for r, keep in zip(removed, kept, strict=True) if keep]


def _found(removed: _Removed, placement: Placement) -> Found:
    whole: dict[str, JobState] = {}
    shrunk: dict[str, tuple[JobState, int]] = {}
    for u, ranks in removed:
        job = u.job
        if u.rank is None:
            whole[job.id] = job
        else:
            held = len(job.held.workers) if job.held is not None else 0
            prev = shrunk.get(job.id, (job, held))[1]
            shrunk[job.id] = (job, prev - len(ranks))
    shrinks = [s for jid, s in shrunk.items() if jid not in whole]
    return Found(list(whole.values()), shrinks, placement, removed)


def unmove(sim: Simulation, moves: list[tuple[Target, Placement]]) -> None:
    """Take the moved jobs of a consolidation off the places the simulation gave them."""
    for mover, again in reversed(moves):
        sim.unplace(mover, again)


def undo(sim: Simulation, target: Target, found: Found) -> None:
    """Take ``found`` out of the simulation: the beneficiary and the moved jobs unplaced, the
    victims back as they were."""
    unmove(sim, found.moves)
    sim.unplace(target, found.placement)
    _restore_all(sim, found.removed)


def commit(sim: Simulation, target: Target, found: Found) -> claims.ClaimError | None:
    """Keep ``found`` in the simulation if the fold's arithmetic agrees; else undo it."""
    error = sim.gate(target, found)
    if error is not None:
        undo(sim, target, found)
        return error
    sim.taken.update(u.job.id for u, _ in found.removed)
    return None
