"""Who may be stopped for whom, as the fold enforces it whoever proposes it.

The preemptor chooses victims with ``projections.preemption``; the fold checks every
``PreemptionRequested`` and ``ShrinkRequested`` with the same rule, at its position in the log, so
a writer that ignores the rule (a buggy or hostile preemptor) stops nobody it protects.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    CohortSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    Quota,
)
from corral.projections.state import State
from tests.builders import Cluster, LogBuilder, job, on, placement, queue_spec, whole, worker

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
    assert state.rejections[-1].code == "void" and "holds nothing" in state.rejections[-1].message


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


# -- the beneficiary's queue's policy, as the fold reads it ------------------------------------------------


def _policy_world(v_priority: int = 5, **policy: Any) -> LogBuilder:
    """team-a (nominal 8, ``policy``) runs ``own`` (4 GPUs, priority 5); team-b (nominal 0) runs
    ``v`` on 4 GPUs borrowed from team-a, at ``v_priority``."""
    lb = two_nodes_log()
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    pol = PreemptionPolicy(**policy)
    lb.queue(queue_spec("team-a", 8, cohort="org", preemption=pol)).queue(
        queue_spec("team-b", 0, cohort="org")
    )
    lb.submit("alice", "own", job("team-a").gpus(4).checkpointable()).accept("own", priority=5)
    lb.admit("own").place(on(N0, 0, 1, 2, 3, job_id="own")).started(N0, "own")
    lb.submit("bob", "v", job("team-b").gpus(4).checkpointable()).accept("v", priority=v_priority)
    lb.admit("v").place(on(N0, 4, 5, 6, 7, job_id="v")).started(N0, "v")
    return lb


@pytest.mark.parametrize(
    ("policy", "priority", "victims", "stopped"),
    [
        # Kueue preemption.md, withinClusterQueue: LowerPriority / LowerOrNewerEqualPriority / Never.
        pytest.param({}, 6, ("own",), True, id="within-lower"),
        pytest.param({}, 5, ("own",), False, id="within-not-equal"),
        pytest.param(
            {"within_queue": "lower-or-newer-equal-priority"}, 5, ("own",), False, id="within-older-equal"
        ),
        pytest.param({"within_queue": "never"}, 6, ("own",), False, id="within-never"),
        # reclaimWithinCohort: Any takes lent quota back whatever the priority; LowerPriority only
        # below; Never not at all (team-a, 4 + 4 of its 8, stays within its nominal).
        pytest.param({}, 0, ("v",), True, id="reclaim-any"),
        pytest.param({"reclaim_within_cohort": "lower-priority"}, 5, ("v",), False, id="reclaim-lower-equal"),
        pytest.param({"reclaim_within_cohort": "lower-priority"}, 6, ("v",), True, id="reclaim-lower"),
        pytest.param(
            {"reclaim_within_cohort": "never", "borrow_within_cohort": "never"},
            9,
            ("v",),
            False,
            id="reclaim-never",
        ),
        # Borrowing over lower priorities is for a job that borrows: within its nominal once v
        # is gone, b would take back lent quota, which ``never`` refuses whatever the priority.
        pytest.param({"reclaim_within_cohort": "never"}, 9, ("v",), False, id="reclaim-never-borrow-lower"),
    ],
)
def test_the_fold_applies_the_beneficiarys_queue_policy(
    policy: Any, priority: int, victims: tuple[str, ...], stopped: bool
) -> None:
    lb = _policy_world(**policy)
    lb.submit("alice", "b", job("team-a").gpus(4)).accept("b", priority=priority)
    state = lb.preempt("b", *victims).fold()
    assert all(state.jobs[v].phase == "checkpointing" for v in victims) is stopped


@pytest.mark.parametrize(
    ("policy", "victims", "stopped"),
    [
        # b (priority 6) needs 8: team-a (4 + 8 of its 8) would borrow, unless ``own`` is stopped in
        # the same record; then it takes back what v (priority 9, so only a reclaim may stop it)
        # borrows. Kueue's getTargets: cohort candidates with the queue's own, the preemptor then
        # within its nominal quota.
        pytest.param({}, ("own", "v"), True, id="reclaim-with-own-victims"),
        pytest.param({"borrow_within_cohort": "never"}, ("own", "v"), True, id="without-borrowing"),
        pytest.param({}, ("v",), False, id="v-alone-leaves-team-a-borrowing"),
        pytest.param(
            {"reclaim_within_cohort": "lower-priority"}, ("own", "v"), False, id="reclaim-lower-only"
        ),
    ],
)
def test_reclaim_counts_the_records_own_queue_victims(
    policy: Any, victims: tuple[str, ...], stopped: bool
) -> None:
    lb = _policy_world(v_priority=9, **policy)
    lb.submit("alice", "b", job("team-a").gpus(8)).accept("b", priority=6)
    state = lb.preempt("b", *victims).fold()
    assert (state.jobs["v"].phase == "checkpointing") is stopped


@pytest.mark.parametrize("shrink_first", [False, True])
def test_a_shrink_for_the_same_beneficiary_does_not_count_it_twice(shrink_first: bool) -> None:
    # team-a (nominal 8) runs elastic ``own`` on 4 of its GPUs; team-b (nominal 0) runs v on 4
    # borrowed from team-a, at a priority only a reclaim may stop. b (team-a, 4 GPUs) takes them
    # back: 4 + 4 of 8. The preemptor may also shrink ``own`` for b's room on the nodes, a record
    # before the preemption: once that is folded the ledger holds b as admitted, and b's 4 are
    # not asked of team-a's nominal a second time (6 + 4 would be over it).
    lb = two_nodes_log()
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 8, cohort="org")).queue(queue_spec("team-b", 0, cohort="org"))
    lb.submit("alice", "own", job("team-a").replicas(4, minimum=2).checkpointable()).accept("own", priority=5)
    lb.admit("own", replicas=4).place(placement("own", *(worker(r, N0, whole(r)) for r in range(4))))
    for rank in range(4):
        lb.started(N0, "own", rank=rank)
    lb.submit("bob", "v", job("team-b").gpus(4).checkpointable()).accept("v", priority=9)
    lb.admit("v").place(on(N0, 4, 5, 6, 7, job_id="v")).started(N0, "v")
    lb.submit("alice", "b", job("team-a").gpus(4)).accept("b", priority=6)
    if shrink_first:
        lb.shrink("own", 2, "b")
    state = lb.preempt("b", "v").fold()
    assert state.rejected_total == 0, state.rejections[-1:]
    assert state.jobs["v"].phase == "checkpointing"
    assert list(state.jobs["own"].leaving) == ([2, 3] if shrink_first else [])


@pytest.mark.parametrize("running", [False, True])
def test_an_elastic_job_that_cannot_shrink_yet_is_stopped_whole_down_to_its_nominal(running: bool) -> None:
    # team-a (nominal 1) holds elastic ``v`` at 4 one-GPU workers, borrowing 3 of team-b's
    # nominal 4; b (team-b, 1 GPU) takes back what it lent. Stopping v leaves team-a 1 short of
    # its nominal: while v is only placed, no record could shrink it, so a whole v is the least
    # piece it gives back and the record stands. Once it runs, a rank at a time could have
    # given back enough: stopping it whole takes team-a into its nominal, and the record is void.
    lb = two_nodes_log()
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 1, cohort="org")).queue(queue_spec("team-b", 4, cohort="org"))
    lb.submit("alice", "v", job("team-a").replicas(4, minimum=1).checkpointable()).accept("v", priority=5)
    lb.admit("v", replicas=4).place(placement("v", *(worker(r, N0, whole(r)) for r in range(4))))
    if running:
        for rank in range(4):
            lb.started(N0, "v", rank=rank)
    lb.submit("bob", "b", job("team-b").gpus(1)).accept("b", priority=9)
    state = lb.preempt("b", "v").fold()
    assert (state.jobs["v"].phase in ("checkpointing", "preempted")) is not running
    if running:
        assert "below its nominal" in state.rejections[-1].message


@pytest.mark.parametrize(
    ("threshold", "victim_priority", "stopped"),
    [
        # KEP 1337, borrowWithinCohort.maxPriorityThreshold: victims at or below it.
        pytest.param(None, 5, True, id="no-threshold"),
        pytest.param(5, 5, True, id="at-the-threshold"),
        pytest.param(4, 5, False, id="above-the-threshold"),
    ],
)
def test_borrowing_over_lower_priority_borrowers_up_to_a_threshold(
    threshold: int | None, victim_priority: int, stopped: bool
) -> None:
    # team-c lends its idle 4 to b: team-a holds 8 of its 8, and the cohort's 12 are all held.
    # b2 needs 12 of team-a's 8 with ``own`` left running: it borrows, so it may stop v only as
    # a lower-priority borrower, at most the threshold (with reclaim ``never``, and not at all
    # were it within its nominal once v is gone: ``test_the_fold_applies_the_beneficiarys_queue_policy``).
    lb = _policy_world(reclaim_within_cohort="never", borrow_priority_threshold=threshold)
    lb.queue(queue_spec("team-c", 4, cohort="org"))
    lb.submit("alice", "b", job("team-a").gpus(4)).accept("b", priority=9)
    lb.admit("b")
    lb.submit("alice", "b2", job("team-a").gpus(4)).accept("b2", priority=9)
    state = lb.preempt("b2", "v").fold()
    assert state.jobs["b"].phase == "admitted", state.rejections[-1:]
    assert (state.jobs["v"].phase == "checkpointing") is stopped


def _tree_world(x: bool = True) -> LogBuilder:
    """Hierarchical cohorts (Kueue KEP 79): root ``org`` holds nothing; cohort ``ml`` (under org)
    holds 8 GPUs of its own; team-a (nominal 0) is in ml; team-x (nominal 0) is in cohort
    ``web`` (under org, no quota): team-x borrows all it runs, from ml's quota."""
    lb = two_nodes_log()
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    ml = CohortSpec("ml", parent="org", quotas={"*": Quota(8)})
    lb.admin("cohort", ApplyCohort(cohort=ml))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("web", parent="org")))
    lb.queue(queue_spec("team-a", 0, cohort="ml")).queue(queue_spec("team-x", 0, cohort="web"))
    if not x:
        return lb
    lb.submit("bob", "x", job("team-x").gpus(8).checkpointable()).accept("x", priority=5)
    lb.admit("x").place(on(N0, *range(8), job_id="x")).started(N0, "x")
    return lb


def test_a_queue_without_quota_reclaims_its_cohorts_quota_from_another_subtree() -> None:
    # Kueue hierarchical preemption: team-a has no nominal of its own, but its cohort ml does and
    # lends it to web; with ml within its own quota, team-a's job takes it back (any priority).
    lb = _tree_world()
    lb.submit("alice", "a", job("team-a").gpus(8)).accept("a", priority=0)
    state = lb.preempt("a", "x").fold()
    assert state.jobs["x"].phase == "checkpointing"


@pytest.mark.parametrize(
    ("within", "stopped"), [("lower-priority", False), ("lower-or-newer-equal-priority", True)]
)
def test_a_newer_job_of_equal_priority(within: str, stopped: bool) -> None:
    # Kueue withinClusterQueue: LowerOrNewerEqualPriority: b waited first; ``late`` came after it,
    # at the same priority, and runs.
    lb = two_nodes_log().queue(queue_spec("team-a", 8, preemption=PreemptionPolicy(within_queue=within)))  # type: ignore[arg-type]
    lb.submit("alice", "b", job("team-a").gpus(8)).accept("b", priority=5)
    lb.submit("alice", "late", job("team-a").gpus(8).checkpointable()).accept("late", priority=5)
    lb.admit("late").place(on(N0, *range(8), job_id="late")).started(N0, "late")
    state = lb.preempt("b", "late").fold()
    assert (state.jobs["late"].phase == "checkpointing") is stopped


def test_a_sibling_on_the_cohorts_own_quota_is_not_reclaimed_from() -> None:
    # Both team-a and team-s (nominal 0, in ml) borrow ml's quota: neither lent it, so a job of
    # team-a may stop team-s's only as a borrower over a lower priority (Kueue: "infeasible
    # preemption all available workloads in pruned subtrees").
    lb = _tree_world(x=False)
    lb.queue(queue_spec("team-s", 0, cohort="ml"))
    lb.submit("sam", "s", job("team-s").gpus(8).checkpointable()).accept("s", priority=5)
    lb.admit("s").place(on("node-01", *range(8), job_id="s")).started("node-01", "s")
    lb.submit("alice", "a", job("team-a").gpus(8)).accept("a", priority=5)
    assert lb.fold().jobs["s"].phase == "running"
    state = lb.preempt("a", "s").fold()
    assert state.jobs["s"].phase == "running" and "holds nothing" in state.rejections[-1].message


@pytest.mark.parametrize(("beneficiary", "victim"), [("b", "v"), ("v", "b")])
def test_never_twice_between_the_same_two_jobs(beneficiary: str, victim: str) -> None:
    # v was stopped for b; b runs, then is stopped itself (for ``top``) and requeued, and v runs
    # again. Neither may now be stopped for the other while their priorities stay: a borrower and a
    # lender's job would otherwise take the same GPUs from each other in turn.
    lb = two_nodes_log().queue(queue_spec("team-a", 16))
    lb.submit("bob", "v", job("team-a").gpus(8).checkpointable()).accept("v", priority=0)
    lb.admit("v").place(on(N0, *range(8), job_id="v")).started(N0, "v")
    lb.submit("alice", "b", job("team-a").gpus(8).checkpointable()).accept("b", priority=5)
    lb.preempt("b", "v").exited(N0, "v", stopped=True).requeue("v", 0)
    lb.admit("b").place(on(N0, *range(8), job_id="b")).started(N0, "b")
    lb.submit("alice", "top", job("team-a").gpus(8)).accept("top", priority=9)
    lb.preempt("top", "b").exited(N0, "b", stopped=True).requeue("b", 0)
    # The victim runs again at attempt 1; the beneficiary waits (a beneficiary that runs is no
    # beneficiary: the fold voids that before asking who stopped whom).
    lb.admit(victim, attempt=1).place(on(N0, *range(8), job_id=victim, attempt=1))
    lb.started(N0, victim, attempt=1)
    state = lb.fold()
    # Each job's priority_seq is where it was submitted while its priority never changed.
    b_seq, v_seq = state.jobs["b"].submitted_seq, state.jobs["v"].submitted_seq
    assert state.jobs["v"].stopped_for == (("b", b_seq, v_seq),)
    assert state.jobs[victim].phase == "running" and state.jobs[beneficiary].phase == "queued"
    state = lb.preempt(beneficiary, victim, attempt=1).fold()
    assert state.jobs[victim].phase == "running"
    assert "v was stopped for b before" in state.rejections[-1].message


@pytest.mark.parametrize("placed", [False, True], ids=["beneficiary-waits", "beneficiary-placed-since"])
def test_a_preemption_for_a_beneficiary_placed_since_it_was_decided_is_void(placed: bool) -> None:
    """The preemptor decided on a state from before the placer placed the beneficiary (on the
    other node): its proposal, reaching the fold after the placement, would stop work for a job
    that no longer waits."""
    lb = two_nodes_log().queue(queue_spec("team-a", 16))
    lb.submit("bob", "v", job("team-a").gpus(8).checkpointable()).accept("v", priority=0)
    lb.admit("v").place(on(N0, *range(8), job_id="v")).started(N0, "v")
    lb.submit("alice", "b", job("team-a").gpus(8)).accept("b", priority=5).admit("b")
    if placed:
        lb.place(on("node-01", *range(8), job_id="b"))
    state = lb.preempt("b", "v").fold()
    assert _stopped(state) is not placed
    assert (state.jobs["b"].phase == "placed") is placed
    if placed:
        assert "beneficiary b is not waiting" in state.rejections[-1].message
