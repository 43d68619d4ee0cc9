"""Who may be stopped for whom, as the fold enforces it whoever proposes it.

The preemptor chooses victims with ``projections.preemption``; the fold checks every
``PreemptionRequested`` and ``ShrinkRequested`` with the same rule, at its position in the log, so
a writer that ignores the rule (a buggy or hostile preemptor) stops nobody it protects.
"""

from __future__ import annotations

import pytest

from corral.events.queues import ApplyCohort, ApplyPriorityClass, CohortSpec, PriorityClassSpec
from corral.projections.state import State
from tests.builders import Cluster, LogBuilder, job, on, queue_spec

N0 = "node-00"


def two_nodes_log() -> LogBuilder:
    return LogBuilder().nodes(Cluster(2))


def _world(*, borrowing: bool, cohort_b: str = "org") -> LogBuilder:
    """team-a (nominal 8) and team-b (nominal 4) in cohorts; v of team-b runs on 8 GPUs, so it
    borrows 4 of team-a's when both are in one cohort, and nothing if ``borrowing`` is false
    (then it runs on 4)."""
    lb = two_nodes_log()
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("other")))
    lb.queue(queue_spec("team-a", 8, cohort="org")).queue(queue_spec("team-b", 4, cohort=cohort_b))
    gpus = 8 if borrowing else 4
    lb.submit("bob", "v", job("team-b").gpus(gpus).checkpointable()).accept("v", priority=5)
    lb.admit("v").place(on(N0, *range(gpus), job_id="v")).started(N0, "v")
    return lb


def _preempt(lb: LogBuilder, beneficiary_priority: int, gpus: int = 8) -> State:
    lb.submit("alice", "b", job("team-a").gpus(gpus)).accept("b", priority=beneficiary_priority)
    return lb.preempt("b", "v").fold()


def _stopped(state: State) -> bool:
    return state.jobs["v"].phase == "checkpointing"


def test_a_borrower_is_stopped_for_a_lender_reclaiming_whatever_their_priorities() -> None:
    assert _stopped(_preempt(_world(borrowing=True), beneficiary_priority=0))


def test_a_queue_that_does_not_borrow_keeps_its_jobs() -> None:
    state = _preempt(_world(borrowing=False), beneficiary_priority=100)
    assert not _stopped(state)
    assert state.rejections[-1].code == "void" and "borrows nothing" in state.rejections[-1].message


def test_another_cohort_trees_jobs_are_never_stopped() -> None:
    state = _preempt(_world(borrowing=True, cohort_b="other"), beneficiary_priority=100)
    assert not _stopped(state) and state.rejections[-1].code == "void"


def test_a_borrowing_beneficiary_stops_only_lower_priority_borrowers() -> None:
    # b needs 12 of team-a's 8: it borrows too, so it may take only from lower priorities.
    assert not _stopped(_preempt(_world(borrowing=True), beneficiary_priority=5, gpus=12))
    assert _stopped(_preempt(_world(borrowing=True), beneficiary_priority=6, gpus=12))


@pytest.mark.parametrize(("priority", "stopped"), [(4, False), (5, False), (6, True)])
def test_in_its_own_queue_only_lower_priority_work_is_stopped(priority: int, stopped: bool) -> None:
    lb = _world(borrowing=False)
    lb.submit("bob", "b", job("team-b").gpus(4)).accept("b", priority=priority)
    assert _stopped(lb.preempt("b", "v").fold()) is stopped


def test_a_class_that_guarantees_a_runtime_protects_its_jobs_until_then() -> None:
    lb = two_nodes_log().queues("team-a")
    steady = PriorityClassSpec("steady", 0, min_runtime_s=3600)
    lb.admin("priority-class", ApplyPriorityClass(priority_class=steady))
    lb.submit("bob", "v", job().gpus(8).priority_class("steady")).accept("v").admit("v")
    lb.place(on(N0, *range(8), job_id="v")).started(N0, "v")
    lb.submit("alice", "b", job().gpus(8)).accept("b", priority=10)
    state = lb.preempt("b", "v").fold()
    assert not _stopped(state) and "guarantees" in state.rejections[-1].message
