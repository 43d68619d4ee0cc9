"""The preemptor counts the free GPUs of a place held for a job as that job's, not as free for a
beneficiary whose turn comes first: the placer takes them out of its snapshot before anything
else and gives them to that job alone, and the simulation does the same, up front, with the
same rule (``placement.back.hold_places``), giving each back at its job's own turn.

Each case is two 8-GPU nodes: ``low`` (priority 0) runs on the whole of node-00; GPUs 0-3 of
node-01 are free but held for ``back``, and ``high`` (priority 100) holds GPUs 4-7 there.
``wide`` (4 GPUs, priority 10) waits for room, its turn before ``back``'s. Counted as free, the
held GPUs would fit ``wide`` and nobody would be stopped, while the placer gives ``wide`` no
room at all: ``low`` must be stopped for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from corral.events import subjects as subj
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.events.nodes import NodeRegistered, NodeShutdown
from corral.projections import indexes
from corral.services.placer.decide import decide as placer
from tests.unit.test_preemptor import N0, N1, N2, World, gpus, whole

HELD = Placement("back", 0, (WorkerSlot(0, N1, tuple(GpuClaim(g) for g in range(4))),))


def _kept(w: World) -> None:
    """``back`` and ``high`` ran on node-01 when a planned shutdown of it stopped them; it is
    registered again, and both keep their places, ``back`` interrupted, not admitted yet."""
    w.run("back", gpus(4), whole(N1, 0, 1, 2, 3))
    w.run("high", gpus(4), whole(N1, 4, 5, 6, 7), priority=100)
    w.emit(subj.node(N1), NodeShutdown(node=N1, at=w.time, registers_again=True))
    w.stop("back").stop("high")
    inventory = w.state.nodes[N1].inventory
    w.emit(subj.node(N1), NodeRegistered(node=N1, inventory=inventory))
    # ``high`` is back in its place already: only ``back``'s is held.
    w.requeue("high").admit("high").place("high", whole(N1, 4, 5, 6, 7)).start("high")
    assert w.state.jobs["back"].phase == "interrupted" and w.state.jobs["back"].kept_place is not None


def _moved(w: World) -> None:
    """``back`` (priority 0) was moved by a consolidation onto GPUs 0-3 of node-01 and is admitted
    again: placed in priority order, after ``wide``, its move's place held until then."""
    w.run("high", gpus(4), whole(N1, 4, 5, 6, 7), priority=100)
    w.submit("back", gpus(4)).admit("back")
    back = w.state.jobs["back"]
    indexes.move_to(w.state, back, HELD)
    indexes.name(w.state, back, "its-beneficiary")


@dataclass
class Case:
    id: str
    hold: Callable[[World], None]


CASES = [
    Case("kept-place: held for a job a planned shutdown interrupted, not admitted yet", _kept),
    Case("moved: held for a moved job of a lower priority than the beneficiary", _moved),
]


def _world(case: Case) -> World:
    w = World(nodes=2).queue("team-a")
    w.run("low", gpus(8), whole(N0, *range(8)))
    case.hold(w)
    return w.waiting("wide", gpus(4), priority=10)


@pytest.mark.parametrize("case", CASES, ids=[c.id.split(":")[0] for c in CASES])
def test_a_held_place_is_not_counted_free_for_an_earlier_beneficiary(case: Case) -> None:
    w = _world(case)
    # The placer gives ``wide`` nothing: the free GPUs of node-01 are held for ``back``.
    placed = [p.job_id for e in placer(w.state, w.time) if isinstance(e, JobsPlaced) for p in e.placements]
    assert "wide" not in placed
    # So the preemptor stops ``low`` for it, and places it on node-00.
    assert w.victims() == {"wide": ["low"]}
    (p,) = w.plan()
    assert {x.node for x in p.placement.workers} == {N0}


def test_a_beneficiary_whose_victims_are_stopping_is_not_foreseen_on_a_held_place() -> None:
    """``low`` is stopping for ``wide`` (4 GPUs) on node-00; ``full`` (8 GPUs, one node) waits
    too, and ``other`` (priority 0) runs on the whole of node-02. Foreseen on ``back``'s held
    GPUs of node-01 (the tightest room), ``wide`` would leave node-00 whole for ``full``, and
    nobody would be stopped for it; the placer holds those GPUs for ``back`` and puts ``wide`` on
    node-00, so ``full`` needs node-02: ``other`` is stopped for it."""
    w = World(nodes=3).queue("team-a")
    w.run("low", gpus(8), whole(N0, *range(8)))
    w.run("other", gpus(8), whole(N2, *range(8)))
    _moved(w)
    w.submit("wide", gpus(4), priority=10).admit("wide").preempt("wide", "low")
    assert w.state.jobs["low"].phase == "checkpointing"
    w.waiting("full", gpus(8), priority=5)
    assert w.victims() == {"full": ["other"]}
