"""Which place is held for a job (``placement.back.held_place``): the one rule the placer places
it back by and the preemptor's simulation foresees it by."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corral.events.base import Reason
from corral.events.decisions import GpuClaim, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources
from corral.projections import queueing
from corral.projections.lifecycle import Phase
from corral.projections.placement.back import held_place
from corral.projections.state import JobState

KEPT = Placement("j", 0, (WorkerSlot(0, "node-00", (GpuClaim(2), GpuClaim(3))),))
MOVED = Placement("j", 0, (WorkerSlot(0, "node-01", (GpuClaim(6), GpuClaim(7))),))
REQUEUED = Reason(queueing.REQUEUED, "its node was shut down")
QUOTA = Reason("quota", "its queue's quota is in use", True)


@dataclass
class Case:
    id: str
    phase: Phase
    kept: bool = False
    moved: bool = False
    named: bool = True  # its move still names a beneficiary
    reasons: tuple[Reason, ...] = ()
    held: Placement | None = None  # as it stands
    once_admitted: Placement | None = None  # as the preemptor simulates a queued job


CASES = [
    Case("kept-interrupted", "interrupted", kept=True, held=KEPT, once_admitted=KEPT),
    Case("kept-admitted", "admitted", kept=True, held=KEPT, once_admitted=KEPT),
    Case(
        "kept-queued-by-its-requeue", "queued", kept=True, reasons=(REQUEUED,), held=KEPT, once_admitted=KEPT
    ),
    Case(
        "kept-queued-for-quota: held again once admitted",
        "queued",
        kept=True,
        reasons=(QUOTA,),
        once_admitted=KEPT,
    ),
    Case("moved-checkpointing", "checkpointing", moved=True, held=MOVED, once_admitted=MOVED),
    Case("moved-admitted", "admitted", moved=True, held=MOVED, once_admitted=MOVED),
    Case("moved-queued: held again once admitted", "queued", moved=True, once_admitted=MOVED),
    Case("moved-whose-beneficiary-ended", "admitted", moved=True, named=False),
    Case(
        "kept-and-moved: the kept place first",
        "admitted",
        kept=True,
        moved=True,
        held=KEPT,
        once_admitted=KEPT,
    ),
    Case("neither", "admitted"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id.split(":")[0] for c in CASES])
def test_the_place_held_for_a_job(case: Case) -> None:
    spec = JobSpec(queue="q", resources=Resources(gpus=2))
    job = JobState(id="j", tenant="t", spec=spec, submitted_seq=1, submitted_at=0.0, phase=case.phase)
    job.reasons = case.reasons
    job.kept_place = KEPT if case.kept else None
    job.moved_to = MOVED if case.moved else None
    job.preempted_for = "b" if case.moved and case.named else ""
    assert held_place(job) == case.held
    assert held_place(job, admitted=True) == case.once_admitted
