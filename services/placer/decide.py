"""The placer's decision: one placement cycle over the admitted jobs. Pure: no IO, no clock.

``decide(state, now, config)`` reads the folded state and returns the events to append:

1. heads: admitted jobs, highest priority first, then in submission order;
2. snapshot: what is free where, indexed, with an overlay for what this cycle gives away;
3. place: each job's whole gang or nothing, through the plugin chain (``stack.py``), each
   placement taking its GPUs from the snapshot so the next job sees what is left;
4. reserve: the first job that does not fit for lack of capacity gets a reservation on the GPUs
   that free up first, and later jobs backfill around it only if they cannot delay it
   (``backfill.py``);
5. gate: every placement is checked with the fold's own arithmetic (``projections.claims``) on a
   scratch copy of the nodes it touches, in order, so that none the fold would void is proposed;
6. emit: one ``JobsPlaced`` with the cycle's placements and one ``JobsUnschedulable`` with the
   coded reasons of jobs whose reasons changed (unchanged ones are not repeated).

Both events carry ``based_on=state.seq`` and ``now``, so ``corral replay --verify`` can re-run
the cycle. Same state, same ``now``, same config: same events.
"""

from __future__ import annotations

import copy

import msgspec

from events.base import Event, Reason
from events.decisions import JobsPlaced, JobsUnschedulable, Placement, Unschedulable
from projections import claims
from projections.state import JobState, State
from services.placer import backfill, gang, stack
from services.placer.backfill import Reservation
from services.placer.framework import Request
from services.placer.plugins.packing import Fragmentation, workload_of
from services.placer.snapshot import Snapshot
from services.placer.stack import PlacerConfig

DEFAULT = PlacerConfig()


def admitted(state: State) -> list[JobState]:
    """Jobs waiting for GPUs, in placement order: priority, then who was submitted first."""
    jobs = [j for j in state.jobs.values() if j.phase == "admitted"]
    jobs.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
    return jobs


def decide(state: State, now: float, config: PlacerConfig = DEFAULT) -> list[Event]:
    queue = admitted(state)
    if not queue:
        return []
    cycle = _Cycle(state, now, config)
    waiting: list[Unschedulable] = []
    for job in queue:
        reasons = cycle.place(job)
        if reasons is not None and reasons != job.reasons:
            waiting.append(Unschedulable(job.id, job.attempt, reasons))
    events: list[Event] = []
    if cycle.placed:
        placements = tuple(p for p, _ in cycle.placed)
        events.append(JobsPlaced(based_on=state.seq, now=now, placements=placements))
    if waiting:
        events.append(JobsUnschedulable(based_on=state.seq, now=now, jobs=tuple(waiting)))
    return events


class _Cycle:
    """One cycle's working set: the snapshot, the chain, the gate, what is placed so far, and the
    reservation once one is made."""

    def __init__(self, state: State, now: float, config: PlacerConfig) -> None:
        self.state = state
        self.now = now
        self.config = config
        self.snap = Snapshot(state)
        self.chain = stack.build(config, Fragmentation(workload_of(state)))
        self.gate = _Gate(state)
        self.placed: list[tuple[Placement, Request]] = []
        self.reservation: Reservation | None = None

    def place(self, job: JobState) -> tuple[Reason, ...] | None:
        """Place ``job`` (None) or say why it waits."""
        if job.held is not None:
            return (Reason("draining", "workers of its previous attempt still hold GPUs", False),)
        req = Request.of(job, self.state.priority_classes)
        held = self.reservation
        hidden = held is not None and not held.admits(req, self.now)
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
            return self._behind(req, held, result)
        if held is None and self.config.reservations and _for_capacity(result):
            self.reservation = backfill.reserve(
                self.state, self.snap, self.chain, req, self.now, self.config.label_keys, self.placed
            )
            if self.reservation is not None:
                return (self.reservation.reason(), *result)
        return result

    def _behind(self, req: Request, held: Reservation, why: tuple[Reason, ...]) -> tuple[Reason, ...]:
        """A job that did not fit with the reservation hidden: is the reservation what stops it?"""
        probe = gang.place(self.chain, self.snap, req, self.config.label_keys)
        if isinstance(probe, Placement):
            self.snap.release(probe, req.res)
            return (held.blocking(),)
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
        for w in placement.workers:
            if w.node not in self.shadow.nodes and w.node in self.state.nodes:
                self.shadow.nodes[w.node] = copy.deepcopy(self.state.nodes[w.node])
        try:
            claims.check(self.shadow, job, placement)
        except claims.ClaimError as e:
            return e.reason
        claims.take(self.shadow, msgspec.structs.replace(job), placement)
        return None
