"""The preemptor foresees a job whose place is held for it where the placer will place it: back
on those very GPUs (``projections.placement.back``), not wherever the search would put it.

Each case is two 8-GPU nodes: ``low`` (priority 0) runs on GPUs 4-7 of node-00, whose GPUs 0-3
are free; node-01 is idle. ``back`` (4 GPUs, admitted and not tried by the placer yet) has its
place held on GPUs 0-3 of node-01, and ``wide`` (priority 10, one worker of 8 GPUs) waits for
room. The search alone puts ``back`` on the tightest node, node-00, and leaves node-01 whole for
``wide``: nothing would be stopped, while the placer puts ``back`` on node-01 and ``wide`` finds
no node whole. Foreseen as the placer places it, ``low`` is stopped and ``wide`` goes on node-00.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.projections import indexes
from corral.projections.state import JobState
from corral.services.placer.decide import decide as placer
from tests.unit.test_preemptor import N0, N1, World, gpus, whole

HELD = Placement("back", 0, (WorkerSlot(0, N1, tuple(GpuClaim(g) for g in range(4))),))


def _kept(w: World, job: JobState) -> None:
    indexes.keep_place(w.state, job, HELD)  # a planned shutdown of node-01 stopped it there; admitted again


def _moved(w: World, job: JobState) -> None:
    indexes.move_to(w.state, job, HELD)  # a consolidation moved it there; admitted again, its move named
    indexes.name(w.state, job, "wide-before")


@dataclass
class Case:
    id: str
    hold: Callable[[World, JobState], None]
    priority: int  # ``back``'s: a moved job is placed in priority order, not first


CASES = [
    Case("kept-place: placed first, on node-01 as it ran", _kept, 0),
    Case("moved: of a higher priority than wide, on the place its move named", _moved, 20),
]


def _world(case: Case) -> World:
    w = World(nodes=2).queue("team-a")
    w.run("low", gpus(4), whole(N0, 4, 5, 6, 7))
    w.submit("back", gpus(4), priority=case.priority).admit("back")
    case.hold(w, w.state.jobs["back"])
    return w.waiting("wide", gpus(8), priority=10)


@pytest.mark.parametrize("case", CASES, ids=[c.id.split(":")[0] for c in CASES])
def test_the_job_back_in_place_is_foreseen_on_its_place(case: Case) -> None:
    w = _world(case)
    # The placer, as things are: ``back`` on its place, and no node whole for ``wide``.
    placed = {p.job_id: p for e in placer(w.state, w.time) if isinstance(e, JobsPlaced) for p in e.placements}
    assert list(placed) == ["back"] and placed["back"].workers == HELD.workers
    # So the preemptor stops ``low`` for ``wide``, on node-00.
    assert w.victims() == {"wide": ["low"]}
    (p,) = w.plan()
    assert {x.node for x in p.placement.workers} == {N0}
