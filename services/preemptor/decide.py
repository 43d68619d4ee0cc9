"""The preemptor's decision: one cycle over the work that waits for GPUs it could free. Pure: no
IO, no clock.

``decide(state, now, config)`` reads a State folded up to ``state.seq`` and returns the events to
append, each with ``based_on = state.seq`` and ``now``:

0. snapshot: the placer's view of free GPUs, the quota ledger and the jobs that may be stopped
   (preemptible, not protected by the anti-thrash guards), read once (``victims.Simulation``),
   with what of each place held for a job (kept across a planned shutdown, or named by a move)
   is free taken out up front, as the placer takes it out, and given back at that job's turn
   (``Simulation.hold_places``, ``turn``): no beneficiary whose turn comes first is found room
   on GPUs the placer will give that job;
1. in flight: jobs still checkpointing, or stopped and not yet requeued, for a beneficiary that
   still waits count as gone, and their GPUs (and quota) as that beneficiary's: it is skipped
   this cycle (its preemption is under way) and nobody else is offered the GPUs being freed for
   it (admission and the placer keep them for it too: the beneficiary is nominated);
2. beneficiaries, highest priority first, then by submission: admitted jobs the placer could not
   place and whose reasons say preemption helps; queued jobs admission cannot admit because
   their queue's quota is in use (``victims.blocked_targets``), for which lower-priority jobs of
   their queue, or other queues' borrowers, can give quota and GPUs back; but not a queued job
   that admission would keep out for an earlier job of its queue that holds the queue's quota
   (``projections.holds.Hold``): the first queued job of a best-effort queue that waits
   (quota blocks it and no victims get it admitted) holds it here as it does in admission, so
   that quota reclaimed for a later, smaller job does not go to a job that would delay it.
   Admitted jobs the placer has not tried yet take their turn among them (nominated ones
   first, as the placer places them): they keep in the simulation the GPUs they fit on now and
   nothing is stopped for them, so that no job of lower priority has victims stopped for GPUs
   the placer is about to give away (a victim requeued for a beneficiary, blocked by the quota
   the beneficiary was just admitted into, would otherwise stop work for the GPUs freed for the
   beneficiary, and hold them against it);
3. for each, ``victims.search``: the minimal victims found by simulation, checked with the fold's
   arithmetic, then kept in the simulation with the beneficiary placed on the freed GPUs, so
   that no two beneficiaries of a cycle are offered the same GPUs and no job is a victim twice;
4. emit a ``PreemptionRequested`` per beneficiary that needs victims, with the deadline
   ``now`` plus the longest grace period among them; a beneficiary that fits without anyone
   stopping gets nothing (the placer will place it). Elastic jobs shrink toward their minimum
   before anyone is stopped whole (``config.shrink``): one ``ShrinkRequested`` per elastic job
   that gives up its top ranks, with the same deadline; they keep running on the ranks they
   keep. The shrinks come before the preemption, in the order the search took them, as the
   fold judges record by record, and the beneficiary's own queue's stops and shrinks before
   another queue's shrinks, which they may make a reclaim (``in_judging_order``). A shrink
   under way counts like a preemption under way: its beneficiary is not searched for again
   until the leaving ranks are gone.

A deep backlog is read form by form (``State.queued_by_form``: a queue's jobs of one ask,
replicas, topology and selector, in the queue's order). The verdicts that passed a queued job
over hold for the rest of its form: a form no victims could help is passed over for the rest of
the cycle, one that quota does not block until a commit moves the ledger (whether a hold keeps a
job out reads the job's own runtime estimate: that verdict is the job's alone). So a cycle over
100,000 jobs queued behind one quota reads a few of them, and proposes what reading every one in
turn would (``PreemptorConfig.by_form``).

Same state, same ``now``, same config: same events. Every order is total (ties by job id), and
the simulation reads the State only in its insertion order, which the fold makes the log's.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import msgspec

from corral.events.base import Event
from corral.events.decisions import Placement, PreemptionRequested, ShrinkRequested, Victim
from corral.projections import indexes, moves, preemption, queueing, runtimes, thrash
from corral.projections.holds import Hold, QuotaHolders, hold
from corral.projections.placement import back
from corral.projections.placement.framework import avoided
from corral.projections.placement.inventory import Inventory
from corral.projections.placement.stack import PlacerConfig
from corral.projections.quota import Ledger
from corral.projections.state import JobState, State
from corral.services.preemptor import consolidation
from corral.services.preemptor.victims import (
    COHORT,
    OWN,
    RUNNING,
    Found,
    Pool,
    Simulation,
    Target,
    Unit,
    admitted_target,
    blocked_targets,
    candidates,
    charge_of,
    commit,
    queued_demand,
    queued_target,
    search,
    undo,
)


@dataclass(frozen=True, slots=True)
class Shrink:
    """An elastic job asked to give up its top ranks and keep ``replicas`` workers."""

    job_id: str
    attempt: int
    replicas: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What one beneficiary needs: victims stopped whole, elastic jobs shrunk, by ``deadline``;
    ``placement`` is where the simulation put its gang on the GPUs they free."""

    beneficiary: str
    victims: tuple[Victim, ...]
    shrinks: tuple[Shrink, ...]
    deadline: float
    placement: Placement
    moves: tuple[Placement, ...] = ()  # a consolidation: the placement, then each victim's new one
    key: str = ""  # the GPU model the stops are for, where the beneficiary names several


@dataclass(frozen=True)
class PreemptorConfig:
    placer: PlacerConfig = field(default_factory=PlacerConfig)  # the fit is the placer's own search
    max_beneficiaries: int = 64  # searched per cycle: bounds a cycle over a deep backlog
    # Elastic jobs give up their top ranks before anyone is stopped whole. False: they are
    # stopped whole like any other job.
    shrink: bool = True
    # The backlog is judged form by form (``State.queued_by_form``): the rest of a form no
    # victims could help, or that quota does not block, is passed over unread. False: each
    # queued job is read in turn, as the same verdicts (what the form skip is tested against).
    by_form: bool = True
    # Consolidation: an admitted job that waits only because the free GPUs are scattered gets
    # room by moving at most this many preemptible jobs elsewhere (0: never). One a cycle, and
    # only in a cycle with no stop or move under way and none proposed before it
    # (``consolidation.find``).
    max_moved: int = 4


DEFAULT = PreemptorConfig()


def decide(state: State, now: float, config: PreemptorConfig = DEFAULT) -> list[Event]:
    events: list[Event] = []
    for p in plan(state, now, config):
        for shrinks, victims in in_judging_order(state, p):
            events.extend(
                ShrinkRequested(
                    based_on=state.seq,
                    now=now,
                    job_id=s.job_id,
                    attempt=s.attempt,
                    replicas=s.replicas,
                    beneficiary=p.beneficiary,
                    deadline=p.deadline,
                    key=p.key,
                )
                for s in shrinks
            )
            if victims:
                events.append(
                    PreemptionRequested(
                        based_on=state.seq,
                        now=now,
                        beneficiary=p.beneficiary,
                        victims=victims,
                        deadline=p.deadline,
                        moves=p.moves,
                        key=p.key,
                    )
                )
    return events


def in_judging_order(state: State, p: Plan) -> list[tuple[tuple[Shrink, ...], tuple[Victim, ...]]]:
    """A plan's records as (shrinks, jobs stopped whole) groups, in the order the fold is to
    judge them. The search judged the plan as a whole; the fold judges record by record, each
    with the records before it done. So each group's shrinks come first, in the order the search
    took them, then its jobs stopped whole: the order the search removed them in (a queue that
    borrowed before its shrink may no longer borrow once its whole jobs are gone). The
    beneficiary's own queue's group comes before the other queues' when the plan shrinks another
    queue's job and stops or shrinks one of its own: taking another queue's ranks back may be a
    reclaim only once the beneficiary's own lower-priority work is gone (its queue then back
    within its nominal), and its own jobs are judged by ``within_queue`` alone, whatever went
    before. A move is one record (its layout is judged whole)."""
    queue = state.jobs[p.beneficiary].spec.queue

    def own(job_id: str) -> bool:
        return state.jobs[job_id].spec.queue == queue

    own_victims = tuple(v for v in p.victims if own(v.job_id))
    others_shrink = any(not own(s.job_id) for s in p.shrinks)
    own_first = own_victims or any(own(s.job_id) for s in p.shrinks)
    if p.moves or not own_first or not others_shrink:
        return [(p.shrinks, p.victims)]
    return [
        (tuple(s for s in p.shrinks if own(s.job_id)), own_victims),
        (tuple(s for s in p.shrinks if not own(s.job_id)), tuple(v for v in p.victims if not own(v.job_id))),
    ]


def wake(state: State, now: float) -> float:
    """The earliest log time at which the passing of time alone may give a cycle that found no
    victims new candidates: when an anti-thrash guard stops protecting a running job. (The rest
    of what the cycle reads changes with records, or only orders what it tries.)"""
    soonest = math.inf
    for job in indexes.jobs_in(state, *RUNNING):
        if job.held is not None and preemption.preemptible(state, job):
            at = thrash.lifts_at(job, state.priority_classes.get(job.spec.priority_class), now)
            if now < at < soonest:
                soonest = at
    return soonest


def plan(state: State, now: float, config: PreemptorConfig = DEFAULT) -> list[Plan]:
    """The cycle's preemptions, in the order they are proposed."""
    if not _anyone(state):
        return []  # nobody a search could be for: the snapshot of the cluster would go unread
    # 0. Snapshot.
    sim = Simulation(state, config.placer, now)
    # What of the places held for jobs is free is theirs, until their turns (as the placer has it).
    sim.hold_places()
    # A job of several models is searched for, and counts, only on models it could run on.
    sim.ledger.hosts = Inventory(state, config.placer.label_keys).hosts_spec
    # 1. Preemptions under way.
    under_way = _settle(sim, state)
    # The jobs that may be stopped, read when the first search needs them (every running job:
    # a cycle whose beneficiaries are all passed over reads none of them).
    pool: Pool | None = None
    # 2. Beneficiaries; 3. victims for each.
    plans: list[Plan] = []
    searched = 0
    # Shapes no set of candidates could make room for, with the highest priority that tried: a
    # job of the same shape and no higher priority has no candidate the search did not try, so
    # it is not searched again this cycle (a search that fails costs O(candidates)). Room an
    # earlier beneficiary's victims free beyond its needs is left for the next cycle.
    hopeless: dict[tuple[object, ...], int] = {}
    # Queued jobs of one form (``_form``) that quota does not block (admission admits them, or
    # no preemption ever could): the answer holds until the ledger changes (a commit), and a deep
    # backlog asks the same question many times. A form also stands for its target's shape in
    # ``hopeless``, so that a backlog of jobs no candidates could help is passed over cheaply.
    unblocked: set[tuple[object, ...]] = set()
    holds = _Holds(state, sim.ledger, now)
    # Admitted jobs the placer has not tried yet keep their GPUs in the simulation
    # (``_takes_its_gpus``), which only a later search reads: they are kept when a search comes,
    # in their turns' order, so a cycle with no beneficiary after them (a free cluster taking a
    # burst) does not run the placer's search once per admitted job for nothing.
    untried: list[JobState] = []
    busy: str | None = None  # why no move may be made this cycle ("": none), once asked
    in_run: set[str] = set()  # jobs behind the first of a run searched together (``_run_behind``)
    turns = _Turns(state, now, config.by_form)
    while (job := turns.next()) is not None:
        if searched >= config.max_beneficiaries:
            break
        if job.id in under_way:
            continue
        if job.phase == "queued" and queueing.backs_off(job, now):
            continue  # admission admits it in no cycle before its back-off ends
        if job.phase == "admitted" and not job.reasons:
            untried.append(job)
            continue
        form: tuple[object, ...] | None = None
        if job.phase == "admitted":
            targets = [admitted_target(sim.state, sim.ledger, job)]
        else:
            # Each verdict below on a queued job holds for the rest of its form (its jobs come in
            # its queue's order, priority first): a hopeless form for good (``hopeless`` only
            # grows, and once the first of them waited, ``holds.note`` does nothing for the
            # rest), one quota does not block until a commit (``unblocked``). A hold keeping a
            # job out reads its runtime estimate, which the jobs of a form do not share. A job
            # preempted as often as its class allows may not borrow where the rest of its form
            # may (``Ledger.may_borrow``), one kept off the nodes that failed its starts
            # (``avoided``) finds no room where the rest may, and one with a place held for it
            # goes back there (``placement.back``): each is judged alone, and its verdict is its
            # own.
            alone = _capped(sim.ledger, job) or bool(avoided(state, job)) or _held(job)
            if holds.keeps_out(job):
                if alone:
                    continue
                form = _form(job)
                if form in unblocked:
                    turns.rest_until_committed()
                elif hopeless.get(form, job.priority - 1) >= job.priority:
                    turns.pass_form()
                continue
            if not alone:
                form = _form(job)
                if form in unblocked:
                    turns.rest_until_committed()
                    continue
                if hopeless.get(form, job.priority - 1) >= job.priority:
                    holds.note(job)
                    turns.pass_form()
                    continue
            targets = blocked_targets(state, sim.ledger, job)
            if not targets:
                if form is not None:
                    unblocked.add(form)
                    turns.rest_until_committed()
                continue
        targets = [t for t in targets if hopeless.get(t.shape(), job.priority - 1) < job.priority]
        if not targets:
            holds.note(job)
            if form is not None:
                # Its form's target has this shape: the rest of the form is hopeless too.
                hopeless[form] = job.priority
                turns.pass_form()
            continue
        searched += 1
        for earlier in untried:
            _takes_its_gpus(sim, earlier)
        untried.clear()
        if pool is None:
            pool = Pool(state, sim.ledger, now)  # reads only which queues the ledger knows
        own = sim.turn(job)  # what of a place held for it is free is its own now
        target, found, vain = _choose(sim, pool, targets, config)
        if (
            found is not None
            and found.removed
            and len(targets) == 1
            and job.phase == "queued"
            and job.id not in in_run
            and target.place is None
        ):
            most = config.max_beneficiaries - searched
            run = _run_behind(state, turns, holds, sim.ledger, job, under_way, now, most)
            if run:
                # Its run is searched together once, for its first: each of the rest searched
                # again as the first of what is left would place copies of itself at every step
                # of a search, a cycle's cost growing with the cube of the run.
                in_run.update(j.id for j in run)
                undo(sim, target, found)
                found = _search_in_run(sim, pool, target, config, len(run))
        for t in vain:
            hopeless[t.shape()] = job.priority
        if found is None and job.phase == "admitted" and not sim.taken:
            if busy is None:  # asked once a cycle, only of a cycle that could move anything
                busy = moves.move_under_way(state) or ""
            if not busy:
                found = consolidation.find(sim, pool, target, config.max_moved)
        if found is None:
            sim.not_placed(job, own)
            hopeless[target.shape()] = job.priority
            holds.note(job)
            if form is not None:
                hopeless[form] = job.priority
                turns.pass_form()
            continue
        committed = commit(sim, target, found)
        holds.moved()
        if committed is not None:
            sim.not_placed(job, own)
            holds.note(job)
            continue
        unblocked.clear()
        turns.committed()
        if not found.whole and not found.shrinks:
            continue  # fits as things are: the placer places it, on the GPUs kept for it here
        sim.proposed(target, found)
        holds.moved()
        # 4. The proposal.
        stopping = [*found.whole, *(j for j, _ in found.shrinks)]
        plans.append(
            Plan(
                beneficiary=job.id,
                victims=tuple(Victim(v.id, v.attempt) for v in sorted(found.whole, key=lambda v: v.id)),
                shrinks=tuple(Shrink(j.id, j.attempt, keep) for j, keep in found.shrinks),  # removal order
                deadline=now + max(preemption.grace_s(state, j, job.spec.queue) for j in stopping),
                placement=found.placement,
                moves=(found.placement, *(p for _, p in found.moves)) if found.moves else (),
                key=target.named,
            )
        )
        if found.moves:
            # The moved jobs gave their quota back in the simulation and will be admitted into
            # it again: a later search this cycle would be offered quota they are to take back.
            break
    return plans


def _anyone(state: State) -> bool:
    """Whether any job may be searched for: a queued job, or an admitted one the placer says
    preemption would help. Without one the cycle proposes nothing, whatever it simulates."""
    if any(state.queued_by_queue.values()):
        return True
    admitted = indexes.jobs_in(state, "admitted")
    return any(j.held is None and any(r.preemption_helps for r in j.reasons) for j in admitted)


def _choose(
    sim: Simulation, pool: Pool, targets: list[Target], config: PreemptorConfig
) -> tuple[Target, Found | None, list[Target]]:
    """Of a beneficiary's targets (one per GPU model it names, in its order), the one whose
    victims Kueue's flavor assigner would prefer (``_preference``), with them, kept in the
    simulation as a search keeps them (the last target and None where no victims make room on
    any); and the targets searched in vain."""
    if len(targets) == 1:
        found = _search(sim, pool, targets[0], config)
        return targets[0], found, [] if found is not None else targets
    best: tuple[tuple[int, int, int], Target] | None = None
    vain: list[Target] = []
    for i, target in enumerate(targets):
        found = _search(sim, pool, target, config)
        if found is None:
            vain.append(target)
            continue
        rank = (*_preference(sim, target, found), i)
        if best is None or rank < best[0]:
            best = (rank, target)
        undo(sim, target, found)  # each model is searched on the same simulation
    if best is None:
        return targets[-1], None, vain
    target = best[1]
    return target, _search(sim, pool, target, config), vain


def _run_behind(
    state: State,
    turns: _Turns,
    holds: _Holds,
    ledger: Ledger,
    job: JobState,
    under_way: set[str],
    now: float,
    most: int,
) -> list[JobState]:
    """The jobs right behind queued ``job`` in the cycle's turns that are like it (its form and
    priority, queued, not backing off, no hold keeping it out, no preemption under way for it,
    and borrowing as it may: ``Ledger.may_borrow``, which its form does not say, decides what
    quota admission gives it, and no place held for it), at most ``most``: the cycle searches
    for each of them next, unless its room runs out first. One that may not borrow where ``job``
    may is no copy of it: room made for it beyond its queue's nominal would be made for nobody;
    nor is one the placer puts back on a place held for it, nor one kept off other nodes than
    ``job`` is (``avoided``): room made for it where it may not go would be made for nobody."""
    form = _form(job)
    borrow = ledger.may_borrow(job)
    avoids = avoided(state, job)
    out: list[JobState] = []
    for other in turns.following(most):
        if (
            other.phase != "queued"
            or other.priority != job.priority
            or other.id in under_way
            or queueing.backs_off(other, now)
            or _form(other) != form
            or ledger.may_borrow(other) != borrow
            or holds.keeps_out(other)
            or _held(other)
            or avoided(state, other) != avoids
        ):
            break
        out.append(other)
    return out


def _search_in_run(
    sim: Simulation, pool: Pool, target: Target, config: PreemptorConfig, run: int
) -> Found | None:
    """The victims for ``target``, the first of ``run`` more like it: of the victims the whole
    run needs together, the ones it needs alone. Searched one by one from all candidates, each
    would take what loses least for itself (one small job each) until the last found only a
    large one left, whose room would have done for all: the small ones were stopped for nothing
    (Armada's "gang preemption"). So the first is searched among what the run needs, and the
    rest then find the room it leaves, with what is kept in the simulation. Only where every job
    the run needs stopped is of a lower priority than the run: the rest of the run is named in
    no record, so admission keeps no room for it (it keeps room for a beneficiary), and a job
    stopped of the run's priority (by a reclaim, or fair sharing) may be admitted into that room
    first. Where the run does not fit whatever is stopped, or its first fits nothing of what the
    run needs, as alone. Asked only of a job whose search alone found victims: a hopeless form
    costs no more."""
    together = _search(sim, pool, target, config, copies=run + 1)
    if together is not None:
        undo(sim, target, together)
    if together is None or any(u.job.priority >= target.job.priority for u, _ in together.removed):
        return _search(sim, pool, target, config)
    found = _search(sim, pool, target, config, only=frozenset(u.job.id for u, _ in together.removed))
    return found if found is not None else _search(sim, pool, target, config)


def _preference(sim: Simulation, target: Target, found: Found) -> tuple[int, int]:
    """How Kueue's flavor assigner ranks a flavor it can preempt on (``isPreferred``, its default
    ``BorrowingOverPreemption``), lower first: taking back only what other queues hold before
    stopping the queue's own jobs; then, of two alike, not borrowing once admitted before
    borrowing; the models' order breaks a tie. Read with ``found`` kept in the simulation (its
    victims gone, the beneficiary charged)."""
    queue, key = target.job.spec.queue, target.key
    stopped = [*found.whole, *(j for j, _ in found.shrinks)]
    reclaims = all(j.spec.queue != queue for j in stopped)
    borrows = key is not None and sim.ledger.used(queue, key) > sim.ledger.nominal(queue, key)
    return (0 if reclaims else 1, 1 if borrows else 0)


def _search(
    sim: Simulation,
    pool: Pool,
    target: Target,
    config: PreemptorConfig,
    copies: int = 1,
    only: frozenset[str] | None = None,
) -> Found | None:
    """Kueue's attempts, under the beneficiary's queue's policy: first with other queues' jobs
    that hold what its side lent, borrowers first (those it may borrow over, and those it takes
    back lent quota from, its side then within its own quota), and its own queue's (under fair
    sharing, if no set in that order is allowed, its own queue's first); then, if that is not
    enough, its own queue's jobs alone, the beneficiary borrowing. ``copies``: room for that
    many like jobs at once (``victims.search``); ``only``: candidates among those jobs alone."""
    policy = preemption.policy_of(sim.state, target.job)
    # Kueue's fair-sharing strategies are tried in order, each only if those before found too
    # little: one cohort attempt per strategy, with it and those before it.
    strategies = policy.fair_sharing
    attempts = [
        (COHORT, msgspec.structs.replace(policy, fair_sharing=strategies[:n]))
        for n in range(1, len(strategies) + 1)
    ]
    for mode, rules in [*(attempts or [(COHORT, policy)]), (OWN, policy)]:
        shares = sim.shares if mode == COHORT and rules.fair_sharing else None
        units = list(
            candidates(
                target, pool, sim.taken, sim.rules, rules, mode=mode, shrink=config.shrink, shares=shares
            )
        )
        if only is not None:
            units = [u for u in units if u.job.id in only]
        checked = rules if mode == COHORT else None
        found = search(sim, target, units, checked, copies)
        if found is None and len(units) > 1:
            # The victims' order is quota's: a borrower's queue stops being a candidate once it
            # gave back what it borrowed, which can happen on nodes where the gang still does
            # not fit while the one job that would free a whole node comes later, or before it
            # on that node. Ask once more with the same candidates taken node by node, the node
            # they would free most first, each standing on its own: whether the record may take
            # them all is then the fold's rule alone (``Simulation.allowed``).
            found = search(sim, target, by_node(sim.state, units), checked, copies)
        if found is None and shares is not None and {u.borrower for u in units} == {True, False}:
            # Fair sharing judges a record by where it leaves each queue's share, and taking more
            # of a borrower's jobs can turn an allowed record into one that is not (the share it
            # leaves would fall below the beneficiary's): the prefix that fits with borrowers
            # first may never be allowed where one that stops the beneficiary's own queue's
            # lower-priority jobs first, and fewer of the borrower's, is (Kueue's tournament
            # takes from its own queue when its share is the highest). Where both kinds are
            # candidates, ask once more, own first.
            found = search(sim, target, own_first(units), checked, copies)
        if found is not None:
            return found
    return None


def own_first(units: list[Unit]) -> list[Unit]:
    """``units`` with the beneficiary's own queue's (shrinks, then whole jobs) before other
    queues', each in the order it had."""
    return [u for u in units if not u.borrower] + [u for u in units if u.borrower]


def by_node(state: State, units: list[Unit]) -> list[Unit]:
    """``units`` grouped by the node each stops work on (its first): first the node with the
    most GPUs free once its candidates are stopped, of those the one with most free already (the
    least to stop); the order within a node kept. None of them is passed over because its queue
    gave back what it borrowed before it (``Unit.borrower`` off): the search's ``policy`` judges
    the set."""
    groups: dict[str, list[Unit]] = {}
    for u in units:
        held = u.job.held
        workers = [] if held is None else [w for w in held.workers if u.rank is None or w.rank == u.rank]
        groups.setdefault(workers[0].node if workers else "", []).append(u)

    def room(node: str) -> tuple[int, int]:
        """(GPUs free once its candidates stop, of them those free already), as a sort key."""
        n = state.nodes.get(node)
        if n is None:
            return (0, 0)
        freed = {u.job.id for u in groups[node]}
        whole = [g for g in n.gpus if g.healthy and all(j in freed for j in g.holders)]
        return (-len(whole), -sum(1 for g in whole if not g.holders))

    return [replace(u, borrower=False) for node in sorted(groups, key=room) for u in groups[node]]


class _Holds:
    """Admission's holds as the cycle's simulation sees them: per best-effort queue, the quota
    kept for its first queued job that waits (``services.admission.order.hold``)."""

    def __init__(self, state: State, ledger: Ledger, now: float) -> None:
        self.state = state
        self.ledger = ledger
        self.now = now
        self.by_queue: dict[str, Hold] = {}
        self._holders: QuotaHolders | None = None  # made on first use
        # Verdicts per queue and ask (what ``keeps_out`` reads of a job): a deep backlog behind a
        # hold asks the same question many times. Valid until a hold is added or the ledger moves.
        self._verdicts: dict[tuple[object, ...], bool] = {}

    def keeps_out(self, job: JobState) -> bool:
        """Would admission keep ``job`` out for an earlier job of its queue, whatever is freed?"""
        spec = job.spec
        held = self.by_queue.get(spec.queue)
        if held is None or held.takes_back(self.ledger, job, self.now):
            return False  # (the verdicts below are for jobs the held job may not stop)
        # The estimate is the job's own (its owner's, else the one learned at its submission), as
        # admission reads it: jobs of one ask with different learned estimates get each its own.
        # So is whether it may borrow: of several models, one that may not borrow may count
        # against another model than one that may (``Ledger.key_for``), which the hold may not be on.
        ask = (
            spec.queue,
            spec.resources,
            spec.replicas,
            spec.min_replicas,
            runtimes.of(job),
            self.ledger.may_borrow(job),
        )
        found = self._verdicts.get(ask)
        if found is None:
            found = self._verdicts[ask] = self._keeps_out(held, job)
        return found

    def _keeps_out(self, held: Hold, job: JobState) -> bool:
        demand = self.ledger.key_for(job.spec.queue, job)  # as admission asks the hold
        if demand is None:
            return False
        spare = held.spare(self.ledger, job.spec.queue, demand[0], job, self.now)
        return spare is not None and demand[1] > spare

    def moved(self) -> None:
        """The ledger may have moved (a commit was tried): verdicts are asked again."""
        self._verdicts.clear()

    def note(self, job: JobState) -> None:
        """``job`` waits (no victims get it admitted this cycle): the first queued job of a
        best-effort queue to wait holds the queue's quota, as in admission."""
        q = job.spec.queue
        qspec = self.state.queues.get(q)
        if job.phase != "queued" or q in self.by_queue or qspec is None or qspec.strategy == "strict-fifo":
            return
        demand = queued_demand(self.state, self.ledger, job)
        if demand is None:
            return
        if self._holders is None:
            self._holders = QuotaHolders(self.state, self.now, self.ledger.has_queue)
        found = hold(self.ledger, q, job, self._holders, self.now)
        if found is not None:
            self.by_queue[q] = found
            self._verdicts.clear()


def _form(job: JobState) -> tuple[object, ...]:
    """What decides, besides priority and the ledger, a queued job's target and candidates: as
    the fold's form (``indexes.form_key``), whether it may be preempted at all among them."""
    spec = job.spec
    selector = tuple(sorted(spec.node_selector.items())) if spec.node_selector else ()
    return (
        "queued",
        spec.queue,
        spec.resources,
        spec.replicas,
        spec.min_replicas,
        spec.topology,
        selector,
        spec.preemptible,
        spec.priority_class,
    )


def _held(job: JobState) -> bool:
    """Whether queued ``job`` has a place held for it once admitted (``placement.back``): the
    placer puts it there, where the rest of its form have no place, so it stands for none of
    them."""
    return back.held_place(job, admitted=True) is not None


def _capped(ledger: Ledger, job: JobState) -> bool:
    """Whether ``job`` may be preempted by its spec and class but not borrow (its class's cap on
    preemptions reached): a difference ``_form`` leaves between jobs of a form, as it leaves the
    nodes a job avoids (``avoided``)."""
    return ledger.may_be_preempted(job.spec) and not ledger.may_borrow(job)


def beneficiaries(state: State, now: float = 0.0) -> list[JobState]:
    """Jobs preemption could get going, highest priority first, then by submission: admitted jobs
    the placer says preemption would help, and every queued job (``blocked_targets`` keeps only
    those that quota blocks). A shortest-first queue's queued jobs take its places in its own
    order (``projections.queueing.slots``), so that its holds fall on the job admission holds for."""
    turns = _Turns(state, now, by_form=False)
    return [j for j in iter(turns.next, None) if j.phase == "queued" or j.reasons]


# A turn's key: (not a nominated admitted job untried, -priority, place in its queue, id).
_Key = tuple[bool, int, int, str]


class _Turns:
    """The beneficiaries, and admitted jobs the placer has not tried yet (no reasons since their
    admission), in the order the cycle takes them: of the latter, those a stopped job names as
    its beneficiary first (``projections.preemption.nominated``: the placer places them before
    anyone), then all as ``beneficiaries``. Merged lazily from streams in order: the admitted
    jobs; each shortest-first queue's queued jobs, in its own order, which the time moves; each
    other queue's from the order the fold keeps, ``by_form`` one stream per form
    (``State.queued_by_form``), else one per queue (``State.queued_by_queue``). So a cycle that
    stops after its ``max_beneficiaries`` reads the fronts of the queues, and one that passes
    over the rest of a form (``pass_form``, ``rest_until_committed``) does not read its jobs."""

    def __init__(self, state: State, now: float, by_form: bool) -> None:
        self._jobs = jobs = state.jobs
        admitted: list[JobState] = []
        first: set[str] | None = None
        for job in indexes.jobs_in(state, "admitted"):
            if job.held is None and (not job.reasons or any(r.preemption_helps for r in job.reasons)):
                admitted.append(job)
                if first is None and not job.reasons:
                    # A look at the backlog, only when it can matter, and once: an empty answer
                    # asked again per admitted job cost a walk of every queued job each.
                    first = preemption.nominated(state)
        named = first or set()
        # The placer places the jobs back in their kept place first too (``queueing.keeps_place``).
        named.update(j.id for j in admitted if not j.reasons and queueing.keeps_place(j))
        # Each stream: its keys in order, or (``_places``) the fold's places (-priority,
        # submitted_seq, id), each standing for the key (True, *place).
        self._streams: list[Sequence[_Key] | Sequence[indexes.Place]] = [
            sorted(
                (not (j.id in named and not j.reasons), -j.priority, j.submitted_seq, j.id) for j in admitted
            )
        ]
        self._places: list[bool] = [False]
        self._forms: set[int] = set()  # the streams that are forms
        for name, places in state.queued_by_queue.items():
            spec = state.queues.get(name)
            if spec is not None and spec.strategy == queueing.SHORTEST_FIRST:
                slot = queueing.slots(indexes.queued_in(state, name), now)
                self._streams.append(sorted((True, p, slot[i], i) for p, _, i in places))
                self._places.append(False)
            elif not by_form:
                self._streams.append(places)
                self._places.append(True)
        if by_form:
            for places in state.queued_by_form.values():
                spec = state.queues.get(jobs[places[0][2]].spec.queue)
                if spec is None or spec.strategy != queueing.SHORTEST_FIRST:
                    self._forms.add(len(self._streams))
                    self._streams.append(places)
                    self._places.append(True)
        self._pos = [0] * len(self._streams)  # each stream's next turn
        self._version = [0] * len(self._streams)  # a heap entry of another version is stale
        self._heap: list[tuple[_Key, int, int]] = [
            (self._key(s, 0), s, 0) for s, items in enumerate(self._streams) if items
        ]
        heapq.heapify(self._heap)
        self._resting: list[int] = []
        self._current: tuple[_Key, int] | None = None

    def _key(self, s: int, pos: int) -> _Key:
        item = self._streams[s][pos]
        if self._places[s]:
            p, seq, i = item  # type: ignore[misc]
            return (True, p, seq, i)
        return item  # type: ignore[return-value]

    def next(self) -> JobState | None:
        """The next job in turn, or None when every stream is done."""
        heap = self._heap
        while heap:
            key, s, version = heap[0]
            if version != self._version[s]:
                heapq.heappop(heap)
                continue
            pos = self._pos[s] = self._pos[s] + 1
            if pos < len(self._streams[s]):
                heapq.heapreplace(heap, (self._key(s, pos), s, version))
            else:
                heapq.heappop(heap)
            self._current = (key, s)
            return self._jobs[key[3]]
        return None

    def following(self, most: int) -> list[JobState]:
        """Up to ``most`` jobs after the current one in its stream, in its order, none taken:
        those the cycle takes next of it (other streams' jobs may come between)."""
        if self._current is None or most <= 0:
            return []
        s = self._current[1]
        pos = self._pos[s]
        end = min(len(self._streams[s]), pos + most)
        return [self._jobs[self._key(s, p)[3]] for p in range(pos, end)]

    def pass_form(self) -> None:
        """The rest of the current job's form gets the verdict it got: its turns are over."""
        if self._current is not None and self._current[1] in self._forms:
            self._version[self._current[1]] += 1

    def rest_until_committed(self) -> None:
        """The rest of the current job's form gets the verdict it got until a commit
        (``committed``); then its turns resume after the job in turn at that moment."""
        if self._current is not None and self._current[1] in self._forms:
            s = self._current[1]
            self._version[s] += 1
            self._resting.append(s)

    def committed(self) -> None:
        """The simulation took a beneficiary's victims: the forms resting take their turns
        again, from the job in turn now on."""
        if self._current is None:
            return
        key = self._current[0]
        for s in self._resting:
            places = self._streams[s]
            # Places stand for keys (True, *place): all of them come after a key of False.
            after = bisect.bisect_right(places, key[1:]) if key[0] else 0
            pos = self._pos[s] = max(self._pos[s], after)
            if pos < len(places):
                heapq.heappush(self._heap, (self._key(s, pos), s, self._version[s]))
        self._resting.clear()


def _takes_its_gpus(sim: Simulation, job: JobState) -> None:
    """An admitted job the placer has not tried yet: the placer places it on what is free before
    any job the cycle could preempt for is admitted (a nominated one before anyone), so where it
    fits now its GPUs are kept for it in the simulation, and no later beneficiary is offered them
    (a queued job blocked by quota would have victims stopped for its quota, then find its GPUs
    taken and wait for a second preemption). Where it does not fit, nothing is stopped for it
    until the placer says preemption would help."""
    target = admitted_target(sim.state, sim.ledger, job)
    own = sim.turn(job)
    found = search(sim, target, ())
    if found is None or commit(sim, target, found) is not None:
        sim.not_placed(job, own)


def preempted_for(job: JobState) -> str:
    """The beneficiary a job checkpointing or stopped by a preemption was stopped for ("" if
    none, or if the beneficiary has ended: ``fold_moves._ended`` clears the field then, while the
    job's reason still names it, so the field is read, never the reason)."""
    return job.preempted_for


def _settle(sim: Simulation, state: State) -> set[str]:
    """Take the GPUs of jobs stopping, or stopped and not yet requeued, for a waiting beneficiary
    as freed (of an elastic job shrinking for one, those of its leaving ranks) and nominate the
    beneficiary onto them; returns the beneficiaries whose preemption is under way."""
    leaving: dict[str, list[JobState]] = {}
    # Jobs stopping and stopped, and running ones (an elastic job shrinking runs); each
    # beneficiary's in submission order, as a walk of every job found them.
    for job in indexes.jobs_in(state, "checkpointing", "preempted"):
        who = preempted_for(job)
        if who:
            leaving.setdefault(who, []).append(job)
    for job in indexes.elastic_in(state, "running"):  # only an elastic job shrinks
        if job.preempted_for and job.leaving:
            leaving.setdefault(job.preempted_for, []).append(job)
    for victims in leaving.values():
        victims.sort(key=lambda j: (j.submitted_seq, j.id))
    under_way: set[str] = set()
    waiting = [
        state.jobs[b] for b in leaving if b in state.jobs and state.jobs[b].phase in ("admitted", "queued")
    ]
    waiting.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
    for b in waiting:
        under_way.add(b.id)
        for victim in leaving[b.id]:
            if victim.phase == "running":  # shrinking: its quota is already given back
                for rank in victim.leaving:
                    sim.release(victim, None, 0, rank)
                sim.taken.add(victim.id)
                continue
            # A job still checkpointing holds quota; one already stopped holds only GPUs, until
            # its last worker is gone.
            key, per_worker = charge_of(sim.ledger, victim) if victim.phase == "checkpointing" else (None, 0)
            sim.release(victim, key, per_worker, None)
            sim.taken.add(victim.id)
        target: Target | None
        target = (
            admitted_target(sim.state, sim.ledger, b)
            if b.phase == "admitted"
            else queued_target(state, sim.ledger, b)
        )
        # Placed on the GPUs freed (and on what of a place held for it is free), unless it still
        # holds some of an earlier attempt's.
        own = sim.turn(b)
        if target is not None and b.held is None and sim.place(target) is not None:
            continue
        sim.not_placed(b, own)
        if target is None:
            continue
        if b.phase == "queued" and target.need and target.key is not None:
            # Its quota is charged whether or not it is placed (after a quota cut the tree may
            # be over-committed; it may hold an earlier attempt's GPUs), as the fold's rule
            # charges it (``preemption.planning``): judged on another view, a reclaim for
            # another job was void on every cycle.
            sim.ledger.charge(b.spec.queue, target.key, target.need, sim.ledger.held_fixed(b))
    return under_way
