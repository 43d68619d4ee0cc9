"""The placer's decision: one placement cycle over the admitted jobs. Pure: no IO, no clock.

``decide(state, now, config)`` reads the folded state and returns the events to append:

1. heads: admitted jobs, those back from a planned shutdown and nominated beneficiaries of
   preemptions first (below), then highest priority first, then in admission's order;
2. snapshot: what is free where, indexed, with an overlay for what this cycle gives away, and
   the GPUs held for beneficiaries of preemptions under way taken out (below);
3. place: each job's whole gang or nothing, through the plugin chain (``stack.py``), each
   placement taking its GPUs from the snapshot so the next job sees what is left;
4. reserve: the first job that does not fit for lack of capacity gets a reservation on the GPUs
   that free up first, and later jobs backfill around it only if they cannot delay it
   (``backfill.py``);
5. gate: every placement is checked with the fold's own arithmetic (``projections.claims``) on a
   scratch copy of the nodes it touches, in order, so that none the fold would void is proposed;
6. emit: one ``JobsPlaced`` with the cycle's placements and one ``JobsUnschedulable`` with the
   coded reasons of jobs whose reasons changed (unchanged ones are not repeated).

Growth. A running elastic job that admission grew has ranks admitted but not placed; after
every admitted job had its turn, the cycle places them (all of them, or none this cycle) on
what is left, and proposes the job's whole placement: the ranks it has where they are, the
added ones numbered after them. Nothing is reserved for a growth, and it waits silently.

Nominations. A preemption frees GPUs for its beneficiary, the job its victims' ``preempted_for``
names, and the beneficiary gets them first. While its victims still checkpoint, or have stopped
and are not requeued yet, the cycle finds where its gang would go once they are gone (at its
minimum size if it is still queued) and hides the part of that which is free now from every
other job: neither the GPUs its stopped victims left nor free GPUs it is counting on go to
anyone else meanwhile. An admitted beneficiary is placed before anyone else while a victim of it
still checkpoints, is stopped, or waits to be placed again after being requeued, so that the
cycle that first sees it admitted (admission requeues its victims in the cycle it admits it)
places it first; placed out of priority order, it does not take the cycle's reservation. A
beneficiary with a place held for it (moved, or back from a planned shutdown: below) is sought
back on that place, as it is placed at its turn, and what is held for it is that place with the
rest of where it goes: held apart, its place stayed out of the snapshot for the whole cycle,
given back neither to it nor to anyone else.

Moves. A job a consolidation stopped has the place its move named held for it in the same way
(``JobState.moved_to``), from the record until it is placed again, while it checkpoints, is
stopped or is admitted again (not while it waits for quota): the part of that place still free
is hidden from every other job, before the beneficiaries' holds are sought, and given back to
it at its turn.

Kept places. A job that ran where a planned shutdown of its node stopped it (``corral up``
stopped and started again; ``JobState.kept_place``) keeps that place while it is interrupted,
requeued and admitted again (``queueing.keeps_place``): the part of it that is free is hidden,
before anything else, from every other job, and it is placed first, so that a restart gives
no job, the one the reservation was for included, the GPUs work had before it. The jobs with a
kept or moved place are the fold's (``State.places_held``), and what of their places is held is
taken out by one rule, the preemptor's simulation's too (``placement.back.hold_places``).

Back in place. At its turn, a moved job or one that kept its place goes on those very GPUs,
not wherever the search would put it (``placement.back``, the rule the preemptor's simulation
foresees it by): each worker of the place stays where the chain still takes its node for the
job and its GPUs are ones the chain's reserves could give it; a worker that cannot stay is
searched for beside the ones that do (``gang.place_beside``), out of the reservation's reach
if the job could delay the job it is for; the whole gang is then checked with the gate. Only
if nothing stays, those ranks find no room, or the gate refuses, is the whole gang searched for
as any job's is.

Both events carry ``based_on=state.seq`` and ``now``, so ``corral replay --verify`` can re-run
the cycle. Same state, same ``now``, same config: same events.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import msgspec

from corral.events import codec
from corral.events.base import Event, Reason
from corral.events.decisions import (
    JobsPlaced,
    JobsUnschedulable,
    Placement,
    Unschedulable,
)
from corral.projections import claims, indexes, preemption, queueing, quota
from corral.projections.lifecycle import Phase
from corral.projections.placement import back, gang, stack
from corral.projections.placement.framework import Request
from corral.projections.placement.plugins.packing import fragmentation_of
from corral.projections.placement.snapshot import Snapshot
from corral.projections.placement.stack import PlacerConfig
from corral.projections.state import JobState, NodeState, State
from corral.services.placer import backfill
from corral.services.placer.backfill import Reservation

DEFAULT = PlacerConfig()


def admitted(state: State) -> list[JobState]:
    """Jobs waiting for GPUs, in placement order: priority, then the order admission admitted
    them in (across queues, fair share; within one, the queue's own order), so that where the
    queues' nominal quota adds up to more than the free GPUs, the job fair share put first gets
    them."""
    jobs = indexes.jobs_in(state, "admitted")
    jobs.sort(key=lambda j: (-j.priority, j.admitted_at, j.id))
    return jobs


# A preemption under way, in the order the phases come.
_STOPPING: tuple[Phase, ...] = ("checkpointing", "preempted")


@dataclass
class Nominations:
    """Beneficiaries of preemptions: those placed before everyone else, and, per beneficiary,
    its victims still stopping (checkpointing, or stopped and not requeued)."""

    first: set[str] = field(default_factory=set)
    stopping: dict[str, list[JobState]] = field(default_factory=dict)
    # The jobs a place is held for and those places (``placement.back.held_places``): those a
    # planned shutdown interrupted that keep theirs (``queueing.keeps_place``), placed first
    # too, then the jobs a move stopped, until they are placed again (while stopping, or
    # admitted again); each place held until its job's turn.
    places: list[tuple[JobState, Placement]] = field(default_factory=list)

    @classmethod
    def of(cls, state: State) -> Nominations:
        """Who is named, from the fold's index (a requeued victim may be queued anywhere in the
        backlog), a look at every job stopping, in the order they began to stop, and the jobs
        the fold keeps a place for (``State.places_held``)."""
        out = cls(first=preemption.nominated(state))
        out.places = back.held_places(state)
        out.first.update(j.id for j, _ in out.places if queueing.keeps_place(j))
        for job in indexes.jobs_in(state, *_STOPPING):
            b = job.preempted_for
            if b:
                out.stopping.setdefault(b, []).append(job)
        return out


def growing(state: State) -> list[JobState]:
    """Running elastic jobs with admitted ranks to place, in submission order."""
    jobs = [
        j
        for j in indexes.elastic_in(state, "running")
        if j.admission is not None
        and j.placement is not None
        and j.admission.replicas > len(j.placement.workers)
        and j.held == j.placement
    ]
    jobs.sort(key=lambda j: (j.submitted_seq, j.id))
    return jobs


def decide(state: State, now: float, config: PlacerConfig = DEFAULT) -> list[Event]:
    queue = admitted(state)
    grow = growing(state)
    if not queue and not grow:
        return []
    nominated = Nominations.of(state)
    if nominated.first:
        queue.sort(key=lambda j: j.id not in nominated.first)  # stable: each part keeps its order
    cycle = _Cycle(state, now, config, nominated)
    waiting: list[Unschedulable] = []
    for job in queue:
        reasons = cycle.place(job)
        if reasons is not None and reasons != job.reasons:
            waiting.append(Unschedulable(job.id, job.attempt, reasons))
    for job in grow:
        cycle.grow(job)
    # As many events as keep each within what one message carries (``codec.by_size``): one of
    # 8,800 placements (a failover after a burst) was refused by the server every cycle, for
    # good, and nothing was placed again. The fold takes each on the state the last left.
    events: list[Event] = []
    for placements in codec.by_size([p for p, _ in cycle.placed]):
        events.append(JobsPlaced(based_on=state.seq, now=now, placements=placements))
    for jobs in codec.by_size(waiting):
        events.append(JobsUnschedulable(based_on=state.seq, now=now, jobs=jobs))
    return events


class _Cycle:
    """One cycle's working set: the snapshot, the chain, the gate, what is placed so far, and the
    reservation once one is made."""

    def __init__(
        self, state: State, now: float, config: PlacerConfig, nominated: Nominations | None = None
    ) -> None:
        self.state = state
        self.now = now
        self.config = config
        self.snap = Snapshot(state)
        self.chain = stack.build(config, fragmentation_of(state))
        self.gate = _Gate(state)
        self.placed: list[tuple[Placement, Request]] = []
        self.reservation: Reservation | None = None
        self.first = nominated.first if nominated is not None else set()
        self.held: dict[str, back.Held] = {}
        # The whole place held for a job back from a planned shutdown or moved, by job: where
        # it is placed at its turn, as far as that place still takes it (``_back_in_place``).
        self.places: dict[str, Placement] = {}
        if nominated is not None:
            # The places of the jobs back from a planned shutdown, then the moved jobs', first:
            # a beneficiary's search must not be given them (``placement.back.hold_places``, as
            # the preemptor's simulation holds them).
            self.held.update(back.hold_places(self.snap, nominated.places))
            self.places.update((j.id, p) for j, p in nominated.places if j.id in self.held)
            self.held.update(self._hold(nominated.stopping))

    def _hold(self, stopping: dict[str, list[JobState]]) -> dict[str, back.Held]:
        """For each waiting beneficiary of a preemption under way, highest priority first: where
        its gang goes once its victims are gone; the part of it free now is taken from the
        snapshot, so that no other job of the cycle gets it. A beneficiary with a place held for
        it (``placement.back.hold_places``) goes back there as far as it may, as at its turn: what is held for
        it is then that part with the rest of where its gang goes (it was taken out of the
        snapshot under its name, and given back only to it)."""
        jobs = self.state.jobs
        waiting = [jobs[b] for b in stopping if b in jobs and jobs[b].phase in ("queued", "admitted")]
        waiting.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
        out: dict[str, back.Held] = {}
        for b in waiting:
            if b.held is not None:
                continue
            # Its place, held already, and what its victims still hold, given back for the search
            # only.
            own = self.held.get(b.id, [])
            gone = [
                (w.node, v.spec.resources, w.gpus)
                for v in stopping[b.id]
                if v.held is not None
                for w in v.held.workers
                if w.node in self.state.nodes
            ]
            for node, res, claimed in (*own, *gone):
                self.snap.give_back(node, res, claimed)
            req = self.request(b)
            if b.admission is None:
                req = dataclasses.replace(req, replicas=quota.min_replicas(b.spec))
            place = self.places.get(b.id)
            found: Placement | tuple[Reason, ...] | None = None
            if place is not None:
                found = back.back_in_place(self.chain, self.snap, req, place, self.config.label_keys)
            if found is None:
                found = gang.place(self.chain, self.snap, req, self.config.label_keys)
            if isinstance(found, Placement):
                self.snap.release(found, req.res)
            for node, res, claimed in (*own, *gone):
                self.snap.take(node, res, claimed)
            if not isinstance(found, Placement):
                continue
            busy = {(node, c.gpu) for node, _, claimed in (*own, *gone) for c in claimed}
            part: back.Held = list(own)
            for w in found.workers:
                free = tuple(c for c in w.gpus if (w.node, c.gpu) not in busy)
                if free:
                    self.snap.take(w.node, req.res, free)
                    part.append((w.node, req.res, free))
            out[b.id] = part
        return out

    def place(self, job: JobState) -> tuple[Reason, ...] | None:
        """Place ``job`` (None) or say why it waits; a beneficiary or a moved job may use what is
        held for it, which stays hidden from the rest of the cycle unless it was placed. A moved
        job or one back from a planned shutdown goes back on its place if it still may."""
        if job.held is not None:
            return (Reason("draining", "workers of its previous attempt still hold GPUs", False),)
        held = self.held.pop(job.id, None)
        if held is None:
            return self._place(job)
        back.give_back(self.snap, held)
        place = self.places.pop(job.id, None)
        again = self._back_in_place(job, place) if place is not None else None
        if again is not None:
            self.placed.append(again)
            return None
        result = self._place(job)
        if result is not None:
            back.take_again(self.snap, held)
        return result

    def _back_in_place(self, job: JobState, place: Placement) -> tuple[Placement, Request] | None:
        """``job`` placed on the very GPUs held for it (``place``) as far as they still take it,
        by the rule the preemptor's simulation foresees it by (``placement.back``), and checked
        with the gate; or None, nothing taken. A moved job is not placed first: it may come
        after the reservation, which the ranks searched for may then not be given."""
        req = self.request(job)
        reserved = self.reservation
        hidden = reserved if reserved is not None and not reserved.admits(job, req, self.now) else None
        whole = back.back_in_place(self.chain, self.snap, req, place, self.config.label_keys, hidden)
        if whole is None:
            return None
        if self.gate.check(job, whole) is not None:
            self.snap.release(whole, req.res)
            return None
        return whole, req

    def grow(self, job: JobState) -> None:
        """Place the ranks admission added to a running elastic job, if they all fit now."""
        have = job.placement
        assert have is not None and job.admission is not None
        req = dataclasses.replace(self.request(job), replicas=job.admission.replicas - len(have.workers))
        found = gang.place_beside(self.chain, self.snap, req, self.config.label_keys, have)
        if not isinstance(found, Placement):
            return
        n = len(have.workers)
        added = tuple(msgspec.structs.replace(w, rank=n + w.rank) for w in found.workers)
        whole = Placement(job.id, job.attempt, (*have.workers, *added))
        if self.gate.check(job, whole) is None:
            self.placed.append((whole, req))
        else:
            self.snap.release(found, req.res)

    def request(self, job: JobState) -> Request:
        """``job``'s placement request, not to be placed on the nodes it avoids."""
        return Request.of(job, self.state.priority_classes, self.state)

    def _place(self, job: JobState) -> tuple[Reason, ...] | None:
        req = self.request(job)
        held = self.reservation
        hidden = held is not None and not held.admits(job, req, self.now)
        if held is not None and hidden:
            held.hide(self.snap)
        result = gang.place(self.chain, self.snap, req, self.config.label_keys)
        if held is not None and hidden:
            held.unhide(self.snap)
        if isinstance(result, Placement):
            error = self.gate.check(job, result)
            if error is None:
                self.placed.append((result, req))
                return None
            self.snap.release(result, req.res)
            return (Reason("conflict", f"placement withdrawn: {error.message}", False),)
        if held is not None and hidden:
            return self._behind(req, job.tenant, held, result)
        if held is None and self.config.reservations and _for_capacity(result) and job.id not in self.first:
            self.reservation = backfill.reserve(
                self.state,
                self.snap,
                self.chain,
                req,
                self.now,
                self.config.label_keys,
                self.placed,
                job.priority,
                job.tenant,
            )
            if self.reservation is not None:
                return (self.reservation.reason(), *result)
        if req.avoid:
            nodes = ", ".join(sorted(req.avoid))
            why = f"not placed again on {nodes}, which failed its start for the node's own fault"
            return (
                Reason("avoids", f"{why}, until a worker runs there or its cordon is lifted", False),
                *result,
            )
        return result

    def _behind(
        self, req: Request, tenant: str, held: Reservation, why: tuple[Reason, ...]
    ) -> tuple[Reason, ...]:
        """A job of ``tenant`` that did not fit with the reservation hidden: is the reservation
        what stops it?"""
        probe = gang.place(self.chain, self.snap, req, self.config.label_keys)
        if isinstance(probe, Placement):
            self.snap.release(probe, req.res)
            return (held.blocking(tenant),)
        return why


def _for_capacity(reasons: tuple[Reason, ...]) -> bool:
    """A job waits for capacity (not for a constraint no node meets) if freeing GPUs would help."""
    return any(r.preemption_helps for r in reasons)


class _Gate:
    """The fold's check and take, applied in cycle order to copies of the nodes they touch."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.shadow = State(seq=state.seq, nodes={})

    def check(self, job: JobState, placement: Placement) -> Reason | None:
        """The fold's verdict on ``placement``, taken on the shadow if it holds; for a running
        job, a growth: only the ranks it adds are checked and taken."""
        for w in placement.workers:
            if w.node not in self.shadow.nodes and w.node in self.state.nodes:
                self.shadow.nodes[w.node] = _scratch(self.state.nodes[w.node])
        take = claims.grow if job.phase == "running" else claims.place
        try:
            take(self.shadow, msgspec.structs.replace(job), placement)
        except claims.ClaimError as e:
            return e.reason
        return None


def _scratch(node: NodeState) -> NodeState:
    """A copy of ``node`` the gate may take claims on: what a claim changes (the node's CPU and
    memory, each GPU's use, holders and MIG instances) is copied; what it only reads (the
    inventory, each GPU's info, frozen) is shared. A deep copy cost a third of a cycle."""
    gpus = [msgspec.structs.replace(g, mig=dict(g.mig), holders=dict(g.holders)) for g in node.gpus]
    return msgspec.structs.replace(node, gpus=gpus)
