"""Letting finished jobs go changes nothing about the live ones, on logs hypothesis makes up.

The same records are folded into a state that keeps every finished job and one that lets each
go at the next record. After every record, up to the first that reuses the id of a job one state
let go and the other still holds (where they are meant to differ), both states agree on
everything a decision reads: nodes and their GPUs, quota held, GPU time, queues, and every job
that is not finished or still holds GPUs. At the end, admission, the placer and the preemptor
decide the same on both.
"""

from __future__ import annotations

import math

import msgspec
from hypothesis import given

from corral.events.log import Record
from corral.events.queues import RetentionSpec
from corral.projections.fold import apply
from corral.projections.lifecycle import FINAL
from corral.projections.state import JobState, State
from corral.services.admission.decide import AdmissionConfig
from corral.services.admission.decide import decide as admission_decide
from corral.services.placer.decide import PlacerConfig
from corral.services.placer.decide import decide as placer_decide
from corral.services.preemptor.decide import PreemptorConfig
from corral.services.preemptor.decide import decide as preemptor_decide
from tests.property.test_fold_properties import FAST, logs


def _live(state: State, job: JobState) -> JobState:
    """What decisions read of a job. A beneficiary it names that is finished (and, in the
    other state, maybe let go) counts for none, as every reader treats it."""
    named = state.jobs.get(job.preempted_for)
    if named is None or named.phase in FINAL:
        job = msgspec.structs.replace(job, preempted_for="")
    return job


def decided_on(state: State) -> tuple[object, ...]:
    jobs = {j.id: _live(state, j) for j in state.jobs.values() if j.phase not in FINAL or j.held is not None}
    return state.nodes, state.quota_held, state.gpu_time, state.queues, state.cohorts, jobs


def _reused(kept: State, let_go: State) -> bool:
    """A job of an id the one state still holds and the other let go and gave to a new job."""
    return any(
        (other := kept.jobs.get(job_id)) is not None and other.submitted_seq != j.submitted_seq
        for job_id, j in let_go.jobs.items()
    )


@FAST
@given(logs)
def test_letting_finished_jobs_go_changes_nothing_a_decision_reads(records: list[Record]) -> None:
    kept, let_go = State(retention=RetentionSpec(math.inf)), State(retention=RetentionSpec(0.0))
    for r in records:
        apply(kept, r)
        apply(let_go, r)
        # A record may set a retention: keep the two states to theirs.
        kept.retention, let_go.retention = RetentionSpec(math.inf), RetentionSpec(0.0)
        if _reused(kept, let_go):
            return
        assert decided_on(kept) == decided_on(let_go)
    assert kept.faults == let_go.faults == 0
    assert let_go.jobs.keys() <= kept.jobs.keys()
    now = kept.time
    assert admission_decide(kept, now, AdmissionConfig()) == admission_decide(let_go, now, AdmissionConfig())
    assert placer_decide(kept, now, PlacerConfig()) == placer_decide(let_go, now, PlacerConfig())
    assert preemptor_decide(kept, now, PreemptorConfig()) == preemptor_decide(let_go, now, PreemptorConfig())
