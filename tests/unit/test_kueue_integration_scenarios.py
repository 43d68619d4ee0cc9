"""Kueue's integration scenarios, step by step, as corral's whole chain answers them.

The cases follow Kueue's Ginkgo specs (kubernetes-sigs/kueue, as of commit ff69552e), which create
workloads one after another against a running Kueue, wait for each step, finish evictions and
check who holds quota: ``test/integration/singlecluster/scheduler/preemption_test.go``,
``scheduler_test.go`` and ``fairsharing/fair_sharing_test.go`` of the same directory, then the
cases of ``pkg/scheduler/scheduler_test.go`` and ``scheduler_fs_test.go`` where several workloads
preempt in one cycle, run to their end. Each test's docstring names its source spec as Kueue
spells it (``Context`` / ``It`` where the ``It`` alone is not unique).

Translation. Kueue's CPUs are GPUs one for one, on corral's quota key ``"*"``; a workload asking
for ``n`` CPUs is a job of one worker of ``n`` GPUs, on nodes that have room for every GPU the
queues could hand out, so quota, never a full node, decides. A ClusterQueue is a queue with the
same nominal quota, borrowing and lending limits, queueing strategy and the same three preemption
fields, each written out (Kueue's default is ``never`` for all three; corral's is to stop work);
a Cohort is a cohort with the same parent, quota and limits. Kueue's priorities -1, 0, 1 and 2
(``lowPriority`` to ``veryHighPriority``) are priority classes of those values, other values
classes of their own. ``ExpectWorkloadsToHaveQuotaReservation`` is a job corral has admitted and
placed, running once the simulated agents start it; ``ExpectWorkloadsToBePending`` a job that
waits in its queue; ``FinishEvictionForWorkloads`` the agents checkpointing and stopping a job the
preemptor asked to stop (until then it stays checkpointing: ``Scenario.settle(evicting=...)``).
Between steps admission, the placer and the preemptor decide in turn, and the agents act, until
nobody has anything to add.

Specs left out, and why:

- ``preemption_test.go``. Already ported: "Should preempt Workloads in the cohort borrowing quota,
  when the ClusterQueue is using less than nominal quota" (``test_kueue_quota_tree.py``). What
  corral has no counterpart of: "Should retry on failed preemptions" (an API server that refuses
  the eviction), "Should include job UID in preemption condition when the label is set" (a
  Kubernetes label), the two "Queue head is preemption gated" specs (preemption gates), "ElasticJobs
  In a single ClusterQueue / Should preempt on-scale-up Workloads with lower priority when there is
  not enough quota" (Kueue grows a job by admitting a replacement workload that preempts; corral
  grows a running elastic job in place with quota nobody waits for: DESIGN §6, admission). The
  same end state as a kept spec: "Should preempt all necessary workloads in concurrent scheduling
  with the same priority (RecomputeAssignmentUponPreemptionTargetsOverlap=false)" (the gate
  changes how many of Kueue's cycles it takes).
- ``scheduler_test.go`` (integration). Flavors, taints, namespace selectors, admission checks,
  limit ranges, reclaimable pods, stop policies, workload slices and object lifecycles (a queue,
  flavor or cohort created or deleted around its workloads), none of which corral has: every
  spec but those kept here. "Should not deadlock the preempting workloads" is a race between two
  API patches.
- ``fair_sharing_test.go``. Cohort fair weights ("preempts workloads to enforce fair share", "admits
  workloads respecting fair share" of the hierarchical cohorts; corral weighs queues, not
  cohorts), flavors, two resources, LocalQueue fair sharing (admission fair sharing), metrics and
  admission checks.
- ``scheduler_fs_test.go``: "multiple preemptions skip overlapping preemption targets" (two
  resources per queue); ``scheduler_test.go``: the flavor cases ("prefer first preemption flavor
  ...", "PreemptionOverBorrowing ...", "BorrowingOverPreemption ...") and
  ``pkg/scheduler/preemption/preemption_test.go``'s "skip duplicate preemption across calls"
  (counts API patches; corral's fold takes no second preemption of a job being stopped:
  ``test_preemptor.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from corral.events import subjects as subj
from corral.events.decisions import PreemptionRequested
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.nodes import NodeRegistered
from corral.events.queues import (
    ApplyCohort,
    ApplyQueue,
    BorrowWithinCohort,
    CohortSpec,
    FairSharingStrategy,
    QueueSpec,
    Quota,
    ReclaimWithinCohort,
    WithinQueue,
)
from corral.projections.quota import ANY
from corral.services.admission.decide import decide as admission
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import decide as preemptor
from tests.builders import TRAIN
from tests.unit.test_kueue_preemption import _queue as kueue_queue
from tests.unit.test_preemptor import World
from tests.unit.test_volcano_scenarios import Node, _inventory

# Kueue's lowPriority, midPriority, highPriority and veryHighPriority.
LOW, MID, HIGH, VERY_HIGH = "low", "mid", "high", "very-high"
CLASSES = {LOW: -1, MID: 0, HIGH: 1, VERY_HIGH: 2}
# Kueue's fair sharing on: its default preemption strategies, in its order.
FAIR_SHARING: tuple[FairSharingStrategy, ...] = (
    "less-than-or-equal-to-final-share",
    "less-than-initial-share",
)


def cq(
    name: str,
    nominal: int,
    cohort: str | None = None,
    *,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    within: WithinQueue = "never",
    reclaim: ReclaimWithinCohort = "never",
    borrow: BorrowWithinCohort = "never",
    threshold: int | None = None,
    strict_fifo: bool = False,
    fair: bool = False,
    weight: float = 1.0,
) -> QueueSpec:
    """A ClusterQueue as ``test_kueue_preemption`` writes one (every preemption field, Kueue's
    default ``never`` unless the spec sets it), with its queueing strategy, fair sharing and
    weight."""
    spec = kueue_queue(
        name,
        nominal,
        cohort,
        borrowing_limit=borrowing_limit,
        lending_limit=lending_limit,
        within=within,
        reclaim=reclaim,
        borrow=borrow,
        threshold=threshold,
    )
    policy = msgspec.structs.replace(spec.preemption, fair_sharing=FAIR_SHARING if fair else ())
    strategy: Literal["strict-fifo", "best-effort-fifo"] = (
        "strict-fifo" if strict_fifo else "best-effort-fifo"
    )
    return msgspec.structs.replace(spec, preemption=policy, strategy=strategy, weight=weight)


@dataclass
class Scenario:
    """A running corral, built by folding events: four nodes of 16 GPUs (a workload of up to 15
    CPUs is one worker here), Kueue's priorities."""

    queues: tuple[QueueSpec, ...]
    cohorts: tuple[CohortSpec, ...] = ()
    w: World = field(default_factory=lambda: World(nodes=0))
    # Every job the preemptor asked to stop, once per request.
    stopped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in range(4):
            n = Node(f"n{i}", 16)
            self.w.emit(subj.node(n.name), NodeRegistered(node=n.name, inventory=_inventory(n)))
        for name, value in CLASSES.items():
            self.w.priority_class(name, value)
        named = {q.cohort for q in self.queues} - {None} - {c.name for c in self.cohorts}
        for c in (*self.cohorts, *(CohortSpec(str(n)) for n in sorted(named, key=str))):
            self.w.emit(subj.admin("cohort"), ApplyCohort(cohort=c), subj.ADMIN)
        for q in self.queues:
            self.w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)

    def create(self, job_id: str, queue: str, gpus: int, priority: str = MID) -> Scenario:
        spec = JobSpec(
            queue=queue,
            priority_class=priority,
            resources=Resources(gpus=gpus),
            preemptible=True,
            checkpointable=True,
            command=TRAIN,
        )
        self.w.emit(subj.request("alice", "submit"), SubmitJob(request_id=job_id, job=spec), "alice")
        self.w.wait(1.0)  # Kueue's WaitForNextSecondAfterCreation: creation times differ
        return self

    def apply(self, q: QueueSpec) -> Scenario:
        """An admin's change of a ClusterQueue (``k8sClient.Update``)."""
        self.w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
        return self

    def finish(self, *job_ids: str) -> Scenario:
        for j in job_ids:
            self.w.finish(j)
        return self

    def settle(self, *, evicting: frozenset[str] = frozenset(), rounds: int = 40) -> Scenario:
        """Admission, the placer and the preemptor decide in turn, and the agents start what is
        placed and checkpoint and stop what is being preempted, except the jobs in ``evicting``,
        whose eviction Kueue's spec has not finished yet: they stay checkpointing."""
        for _ in range(rounds):
            moved = False
            for role in (admission, placer, preemptor):
                events = self.w.cycle(role)
                moved = moved or bool(events)
                for e in events:
                    if isinstance(e, PreemptionRequested):
                        self.stopped.extend(v.job_id for v in e.victims)
            for job in list(self.w.state.jobs.values()):
                if job.phase == "placed":
                    self.w.start(job.id)
                    moved = True
                elif job.phase == "checkpointing" and job.id not in evicting:
                    self.w.wait(5.0)
                    self.w.checkpoint(job.id, 1)
                    self.w.stop(job.id)
                    moved = True
            if not moved:
                return self
            self.w.wait(1.0)
        raise AssertionError(f"the chain did not settle in {rounds} rounds")

    def phase(self, job_id: str) -> str:
        return self.w.state.jobs[job_id].phase

    def running(self, *job_ids: str) -> None:
        assert {j: self.phase(j) for j in job_ids} == dict.fromkeys(job_ids, "running")

    def pending(self, *job_ids: str) -> None:
        assert {j: self.phase(j) for j in job_ids} == dict.fromkeys(job_ids, "queued")


# -- In a single ClusterQueue ------------------------------------------------------------------------


def single_cq(nominal: int = 4) -> Scenario:
    return Scenario((cq("cq", nominal, within="lower-or-newer-equal-priority"),))


def test_single_cq_preempts_lower_priority() -> None:
    """preemption_test.go: In a single ClusterQueue / Should preempt Workloads with lower priority when there
    is not enough quota"""
    s = single_cq()
    for j, prio in (("low-wl-1", LOW), ("low-wl-2", LOW), ("mid-wl", MID), ("high-wl-1", HIGH)):
        s.create(j, "cq", 1, prio)
    s.settle().running("low-wl-1", "low-wl-2", "mid-wl", "high-wl-1")
    # A low-priority newcomer finds the queue full and stops nobody: the others are older or
    # of a higher priority.
    s.create("low-wl-3", "cq", 1, LOW).settle().pending("low-wl-3")
    assert s.stopped == []
    s.create("high-wl-2", "cq", 2, HIGH).settle()
    assert sorted(s.stopped) == ["low-wl-1", "low-wl-2"]
    s.running("high-wl-2", "mid-wl", "high-wl-1")
    s.pending("low-wl-1", "low-wl-2", "low-wl-3")


def test_single_cq_preempts_newer_equal_priority() -> None:
    """preemption_test.go: In a single ClusterQueue / Should preempt newer Workloads with the same priority
    when there is not enough quota"""
    s = single_cq()
    s.create("wl-1", "cq", 1, LOW).create("wl-2", "cq", 1, LOW).settle().running("wl-1", "wl-2")
    s.create("wl-3", "cq", 3, LOW).settle().pending("wl-3")
    # wl-4 passes wl-3 (best-effort FIFO): wl-3 may stop it, being older and of its priority,
    # so it only borrows wl-3's room; stopping it alone would still leave wl-3 short.
    s.create("wl-4", "cq", 1, LOW).settle()
    s.running("wl-1", "wl-2", "wl-4")
    s.pending("wl-3")
    assert s.stopped == []
    s.finish("wl-1").settle()
    assert s.stopped == ["wl-4"]
    s.running("wl-3", "wl-2")
    s.pending("wl-4")


def test_single_cq_issues_each_preemption_once() -> None:
    """preemption_test.go: In a single ClusterQueue / Should issue preemption exactly once for each preempted
    workload

    Kueue's eight workloads of half a CPU in a quota of 4 are eight jobs of one GPU in a
    quota of 8, the preemptors of 4 CPUs jobs of 8 GPUs."""
    s = Scenario((cq("cq", 8, within="lower-or-newer-equal-priority"),))
    s.w.priority_class("low-priority", 10).priority_class("high-priority", 100)
    low = [f"low-priority-wl-{i}" for i in range(1, 9)]
    for j in low:
        s.create(j, "cq", 1, "low-priority")
    s.settle().running(*low)
    s.create("first-high-prio", "cq", 8, "high-priority").settle()
    assert sorted(s.stopped) == sorted(low)
    s.running("first-high-prio")
    s.finish("first-high-prio").settle().running(*low)
    s.create("second-high-prio", "cq", 8, "high-priority").settle()
    assert sorted(s.stopped) == sorted(low + low)
    s.running("second-high-prio")


# -- In a ClusterQueue that is part of a cohort ------------------------------------------------------


def cohort_all() -> Scenario:
    return Scenario(
        (
            cq("alpha-cq", 2, "all", within="lower-priority", reclaim="any"),
            cq("beta-cq", 2, "all"),
            cq("gamma-cq", 2, "all", within="lower-priority", reclaim="any"),
        )
    )


def test_cohort_does_not_preempt_when_the_queue_would_borrow() -> None:
    """preemption_test.go: In a ClusterQueue that is part of a cohort / Should not preempt Workloads in the
    cohort, if the ClusterQueue requires borrowing"""
    s = cohort_all()
    s.create("alpha-high-1", "alpha-cq", 2, HIGH).create("beta-low", "beta-cq", 4, LOW).settle()
    s.running("alpha-high-1", "beta-low")
    # alpha-high-2 fits only by borrowing: reclaim does not apply, and alpha-cq may not stop
    # work while it borrows (BorrowWithinCohort unset).
    s.create("alpha-high-2", "alpha-cq", 2, HIGH).settle()
    s.pending("alpha-high-2")
    s.running("alpha-high-1", "beta-low")
    assert s.stopped == []


def test_cohort_preempts_for_concurrent_workloads_of_different_priorities() -> None:
    """preemption_test.go: In a ClusterQueue that is part of a cohort / Should preempt all necessary workloads
    in concurrent scheduling with different priorities"""
    s = cohort_all()
    s.create("beta-mid", "beta-cq", 3, MID).create("beta-high", "beta-cq", 3, HIGH).settle()
    s.running("beta-mid", "beta-high")
    s.create("alpha-mid", "alpha-cq", 2, MID).create("gamma-mid", "gamma-cq", 2, MID).settle()
    assert sorted(s.stopped) == ["beta-high", "beta-mid"]
    s.running("alpha-mid", "gamma-mid")
    s.pending("beta-mid", "beta-high")


def test_cohort_preempts_for_concurrent_workloads_of_the_same_priority() -> None:
    """preemption_test.go: In a ClusterQueue that is part of a cohort / Should preempt all necessary workloads
    in concurrent scheduling with the same priority (RecomputeAssignmentUponPreemptionTargetsOverlap=true)"""
    s = cohort_all()
    beta = ["beta-0", "beta-1", "beta-2"]
    for j in beta:
        s.create(j, "beta-cq", 2)
    s.settle().running(*beta)
    s.create("alpha", "alpha-cq", 2).create("gamma", "gamma-cq", 2).settle()
    assert len(s.stopped) == 2 and set(s.stopped) < set(beta)
    s.running("alpha", "gamma")
    assert sum(s.phase(j) == "running" for j in beta) == 1


# -- In a cohort with StrictFIFO ---------------------------------------------------------------------


def test_strict_fifo_reclaims_while_another_cq_has_pending_workloads() -> None:
    """preemption_test.go: In a cohort with StrictFIFO / Should reclaim from cohort even if another CQ has
    pending workloads"""
    s = Scenario(
        (
            cq("alpha-cq", 2, "all", within="lower-priority", reclaim="any", strict_fifo=True),
            cq("beta-cq", 2, "all", within="lower-priority", reclaim="any", strict_fifo=True),
        )
    )
    s.create("use-all", "alpha-cq", 4, HIGH).settle().running("use-all")
    s.create("pending", "alpha-cq", 1, MID).settle().pending("pending")
    s.create("preemptor", "beta-cq", 1, LOW).settle()
    assert s.stopped == ["use-all"]
    s.running("preemptor")
    # Kueue asserts only that use-all waits; "pending" may be admitted (kueue#8141). corral's
    # strict FIFO keeps it behind use-all, which no longer fits.
    s.pending("use-all", "pending")


# -- When most quota is in a shared ClusterQueue in a cohort -----------------------------------------


def test_shared_cq_preempts_while_borrowing_up_to_the_threshold() -> None:
    """preemption_test.go: When most quota is in a shared ClusterQueue in a cohort / should allow preempting
    workloads while borrowing

    Kueue's queues have a second flavor, ``fallback`` (10 CPUs, no borrowing), which
    a-best-effort-low is admitted on again once stopped; corral's one GPU model is the ``one``
    flavor alone, so a-best-effort-low waits instead (its 5 GPUs do not fit what is left)."""
    s = Scenario(
        (
            cq(
                "a-standard-cq",
                1,
                "all",
                borrowing_limit=10,
                reclaim="lower-priority",
                borrow="lower-priority",
                threshold=0,
            ),
            cq(
                "a-best-effort-cq",
                1,
                "all",
                borrowing_limit=10,
                reclaim="lower-priority",
                borrow="lower-priority",
            ),
            cq(
                "b-best-effort-cq",
                1,
                "all",
                borrowing_limit=10,
                reclaim="lower-priority",
                borrow="lower-priority",
            ),
            cq(
                "b-standard-cq",
                1,
                "all",
                borrowing_limit=10,
                reclaim="lower-priority",
                borrow="lower-priority",
                threshold=0,
            ),
            cq("shared-cq", 10, "all"),
        )
    )
    s.create("a-best-effort-low", "a-best-effort-cq", 5, LOW).settle().running("a-best-effort-low")
    s.create("b-best-effort-low", "b-best-effort-cq", 1, LOW).settle().running("b-best-effort-low")
    s.create("b-standard-high", "b-standard-cq", 5, HIGH).settle().running("b-standard-high")
    # 7 asked, 3 free: a-standard-very-high borrows, and may stop borrowers of priority 0 or
    # below; b-standard-high (1) is above the threshold. a-best-effort-low's 5 are enough.
    s.create("a-standard-very-high", "a-standard-cq", 7, VERY_HIGH).settle()
    assert s.stopped == ["a-best-effort-low"]
    s.running("a-standard-very-high", "b-standard-high", "b-best-effort-low")
    s.pending("a-best-effort-low")


# -- With lending limit ------------------------------------------------------------------------------


def test_lending_limit_preempts_to_reclaim() -> None:
    """preemption_test.go: With lending limit / Should be able to preempt when lending limit enabled"""
    s = Scenario(
        (
            cq("prod-cq", 5, "all", lending_limit=4, reclaim="any"),
            cq("dev-cq", 5, "all"),
        )
    )
    s.create("wl-1", "dev-cq", 4, MID).create("wl-2", "dev-cq", 5, HIGH).settle()
    s.running("wl-1", "wl-2")
    s.create("wl-3", "prod-cq", 4, MID).settle()
    assert s.stopped == ["wl-1"]
    s.running("wl-3", "wl-2")
    s.pending("wl-1")


# -- When borrowWithinCohort is used and PrioritySortingWithinCohort disabled ------------------------


def test_borrow_within_cohort_preempts_while_borrowing() -> None:
    """preemption_test.go: When borrowWithinCohort is used and PrioritySortingWithinCohort disabled / should
    allow preempting workloads while borrowing

    corral always orders borrowers by priority across queues (Kueue's
    PrioritySortingWithinCohort on); no job here waits beside another, so the gate changes
    nothing."""
    s = Scenario(
        (
            cq("a-cq", 0, "all", borrowing_limit=10, within="lower-priority", reclaim="any"),
            cq(
                "b-cq",
                5,
                "all",
                borrowing_limit=5,
                within="lower-priority",
                reclaim="any",
                borrow="lower-priority",
                threshold=CLASSES[VERY_HIGH],
            ),
            cq("c-cq", 5, "all", within="lower-priority", reclaim="any"),
        )
    )
    s.create("a-low", "a-cq", 4, MID).settle().running("a-low")
    s.create("b1-high", "b-cq", 4, HIGH).settle().running("b1-high")
    s.create("b2-high", "b-cq", 4, HIGH).settle()
    assert s.stopped == ["a-low"]
    s.running("b1-high", "b2-high")
    s.pending("a-low")


# -- In a multi-level cohort -------------------------------------------------------------------------


def test_multi_level_cohort_guaranteed_cq_reclaims() -> None:
    """preemption_test.go: In a multi-level cohort / workloads in guaranteed cq should have preferential
    access to the resources"""
    s = Scenario(
        (
            cq("best-effort", 0, "root", within="lower-priority", reclaim="any"),
            cq("guaranteed", 0, "guaranteed", within="lower-priority", reclaim="any"),
        ),
        (CohortSpec("root"), CohortSpec("guaranteed", parent="root", quotas={ANY: Quota(3)})),
    )
    s.create("best-effort-wl", "best-effort", 3, HIGH).settle().running("best-effort-wl")
    # The guaranteed cohort's own quota is its queue's to take back, whatever the priority.
    s.create("guaranteed-wl", "guaranteed", 3, MID).settle()
    assert s.stopped == ["best-effort-wl"]
    s.running("guaranteed-wl")
    s.pending("best-effort-wl")


# -- In a cohort with multiple queues ----------------------------------------------------------------


def test_preemptor_waiting_for_several_evictions_keeps_the_freed_quota() -> None:
    """preemption_test.go: In a cohort with multiple queues / Should prevent other workloads from stealing
    quota when a preemptor is waiting for multiple evictions"""
    s = Scenario(
        (
            cq("alpha-cq", 2, "all", within="lower-priority", reclaim="any", borrow="lower-priority"),
            cq(
                "beta-cq",
                1,
                "all",
                within="lower-priority",
                reclaim="lower-priority",
                borrow="lower-priority",
            ),
            cq(
                "gamma-cq",
                1,
                "all",
                within="lower-priority",
                reclaim="lower-priority",
                borrow="lower-priority",
            ),
        )
    )
    s.create("wl-a", "alpha-cq", 1, MID).create("wl-b", "beta-cq", 3, MID).settle()
    s.running("wl-a", "wl-b")
    # gamma-cq's quota is lent to wl-b, which wl-c, of a lower priority, may not reclaim.
    s.create("wl-c", "gamma-cq", 1, LOW).settle().pending("wl-c")
    # The preemptor asks the whole cohort: it stops wl-a (its queue's, lower priority) and
    # wl-b (a borrower of lower priority).
    s.create("preemptor", "alpha-cq", 4, HIGH).settle(evicting=frozenset({"wl-a"}))
    assert sorted(s.stopped) == ["wl-a", "wl-b"]
    # wl-b gone, wl-a still checkpointing: the quota wl-b gave back is the preemptor's.
    assert s.phase("wl-a") == "checkpointing"
    s.pending("wl-c", "preemptor")
    s.settle()
    s.running("preemptor")
    s.pending("wl-c", "wl-a", "wl-b")
    assert sorted(s.stopped) == ["wl-a", "wl-b"]


# -- Kueue's one-cycle scheduler tables, run to their end ---------------------------------------------
#
# ``TestSchedule`` in ``pkg/scheduler/scheduler_test.go`` and ``TestScheduleForFairSharing`` in
# ``pkg/scheduler/scheduler_fs_test.go`` (both as of commit ff69552e), the cases where several
# workloads preempt in one cycle. Kueue checks the one cycle: who is evicted, who waits for the
# evictions. Here the chain runs on until nothing moves, so each case checks who is stopped and
# who runs at the end; a workload holding a quota reservation in Kueue's table is a job that
# runs before the pending ones are submitted, all pending ones together.


def test_multiple_preemptions_without_borrowing() -> None:
    """scheduler_test.go: multiple preemptions without borrowing"""
    s = Scenario(
        (
            cq("other-alpha", 2, "other", within="lower-priority"),
            cq("other-beta", 2, "other", within="lower-priority"),
        )
    )
    s.w.priority_class("p100", 100)
    s.create("a1", "other-alpha", 2).create("b1", "other-beta", 2).settle().running("a1", "b1")
    s.create("preemptor-alpha", "other-alpha", 2, "p100").create("preemptor-beta", "other-beta", 2, "p100")
    s.settle()
    assert sorted(s.stopped) == ["a1", "b1"]
    s.running("preemptor-alpha", "preemptor-beta")
    s.pending("a1", "b1")


def test_multiple_preemptions_preemption_possible_after_earlier_workload_fits() -> None:
    """scheduler_test.go: multiple preemptions preemption possible after earlier workload fits"""
    s = Scenario(
        (
            cq("other-alpha", 1, "other", within="lower-priority"),
            cq("other-beta", 2, "other", within="lower-priority"),
        )
    )
    s.w.priority_class("p100", 100).priority_class("p99", 99)
    s.create("b1", "other-beta", 2).settle().running("b1")
    s.create("fit", "other-alpha", 1, "p100").create("preemptor", "other-beta", 2, "p99").settle()
    assert s.stopped == ["b1"]
    s.running("fit", "preemptor")
    s.pending("b1")


def test_multiple_preemptions_skip_preemption_when_shared_limited_resource() -> None:
    """scheduler_test.go: multiple preemptions skip preemption when shared limited resource

    Each preemptor asks 3 of its queue's 2 and the resource bank's 1: only one can have the
    bank's GPU, so stopping b1 for the other would be wasted."""
    s = Scenario(
        (
            cq("other-alpha", 2, "other", within="lower-priority", borrow="lower-priority"),
            cq("other-beta", 2, "other", within="lower-priority", borrow="lower-priority"),
            cq("resource-bank", 1, "other"),
        )
    )
    s.w.priority_class("p100", 100).priority_class("p99", 99)
    s.create("a1", "other-alpha", 2).create("b1", "other-beta", 2).settle().running("a1", "b1")
    s.create("preemptor", "other-alpha", 3, "p100").create("pretending-preemptor", "other-beta", 3, "p99")
    s.settle()
    assert s.stopped == ["a1"]
    s.running("preemptor", "b1")
    s.pending("a1", "pretending-preemptor")


def test_multiple_preemptions_within_cq_when_fair_sharing() -> None:
    """scheduler_fs_test.go: multiple preemptions within cq when fair sharing"""
    queues = tuple(
        cq(f"other-{n}", 2, "other", within="lower-priority", fair=True) for n in ("alpha", "beta", "gamma")
    )
    s = Scenario((*queues, cq("resource-bank", 3, "other")))
    s.w.priority_class("p100", 100)
    s.create("a1", "other-alpha", 3).create("b1", "other-beta", 3).create("c1", "other-gamma", 3)
    s.settle().running("a1", "b1", "c1")
    for n in ("alpha", "beta", "gamma"):
        s.create(f"preemptor-{n}", f"other-{n}", 3, "p100")
    s.settle()
    assert sorted(s.stopped) == ["a1", "b1", "c1"]
    s.running("preemptor-alpha", "preemptor-beta", "preemptor-gamma")


def test_fair_sharing_in_cq_preemption_for_cq_without_cohort() -> None:
    """scheduler_fs_test.go: fair sharing: in-CQ preemption for CQ without cohort; repro for nil
    pointer panic"""
    s = Scenario((cq("no-cohort-cq", 4, within="lower-priority", fair=True),))
    s.w.priority_class("p100", 100)
    s.create("nc-low", "no-cohort-cq", 4, LOW).settle().running("nc-low")
    s.create("nc-high", "no-cohort-cq", 4, "p100").settle()
    assert s.stopped == ["nc-low"]
    s.running("nc-high")
    s.pending("nc-low")


# -- Kueue's integration scenarios of admission ------------------------------------------------------
#
# ``test/integration/singlecluster/scheduler/scheduler_test.go`` (as of commit ff69552e), the specs
# about quota, cohorts, borrowing and lending limits and priority, on the same translation. Where a
# spec creates a ClusterQueue after its workloads so that they meet in one cycle, the queue exists
# from the start here and the workloads are submitted before the chain runs: corral refuses at
# submission a job no quota could ever hold. Kueue's half CPUs are whole GPUs, its CPUs two GPUs,
# where a spec asks for 500m.


def test_cohorts_schedule_workloads_borrowing_quota_from_the_same_cohort() -> None:
    """scheduler_test.go (integration): Using cohorts for sharing unused resources / Should schedule workloads
    borrowing quota from ClusterQueues in the same Cohort"""
    s = Scenario(
        (
            cq("prod-cq", 5, "all", borrowing_limit=10),
            cq("dev-cq", 5, "all", borrowing_limit=10),
            cq("test-cq", 15, "all", borrowing_limit=0),
        )
    )
    s.create("wl-1", "prod-cq", 11).create("wl-2", "dev-cq", 11).settle()
    s.running("wl-1", "wl-2")


def test_cohorts_start_workloads_under_min_quota_before_borrowing() -> None:
    """scheduler_test.go (integration): Using cohorts for sharing unused resources / Should start workloads
    that are under min quota before borrowing"""
    s = Scenario((cq("prod-cq", 2, "all", strict_fifo=True), cq("dev-cq", 0, "all", strict_fifo=True)))
    s.create("p-wl-1", "prod-cq", 2).settle().running("p-wl-1")
    s.create("d-wl-1", "dev-cq", 1).create("p-wl-2", "prod-cq", 2).settle()
    s.pending("d-wl-1", "p-wl-2")
    # p-wl-2 is admitted though d-wl-1 was created first: it is within its queue's nominal.
    s.finish("p-wl-1").settle()
    s.running("p-wl-2")
    s.pending("d-wl-1")
    s.finish("p-wl-2").settle().running("d-wl-1")


def test_cohorts_admit_workloads_after_updating_lending_limit() -> None:
    """scheduler_test.go (integration): Using cohorts for sharing unused resources / Should admit workloads
    after updating lending limit"""
    s = Scenario((cq("prod-cq", 5, "all", lending_limit=0), cq("dev-cq", 5, "all", lending_limit=0)))
    s.create("wl-1", "prod-cq", 5).create("wl-2", "prod-cq", 5).settle()
    s.running("wl-1")
    s.pending("wl-2")
    s.apply(cq("dev-cq", 5, "all", lending_limit=5)).settle().running("wl-1", "wl-2")


def test_strict_fifo_schedules_by_priority_strictly() -> None:
    """scheduler_test.go (integration): Queueing with StrictFIFO / Should schedule workloads by their priority
    strictly"""
    s = Scenario((cq("strict-fifo-cq", 5, "cohort", borrowing_limit=0, strict_fifo=True),))
    s.w.priority_class("p100", 100).priority_class("p10", 10).priority_class("p1", 1)
    s.create("wl1", "strict-fifo-cq", 2, "p100").create("wl2", "strict-fifo-cq", 5, "p10")
    s.create("wl3", "strict-fifo-cq", 1, "p1").settle()
    s.running("wl1")
    # wl3 would fit, but stays behind wl2.
    s.pending("wl2", "wl3")


def test_strict_fifo_pending_workload_does_not_block_borrowing_from_a_third_cq() -> None:
    """scheduler_test.go (integration): Queueing with StrictFIFO / Pending workload with StrictFIFO doesn't
    block other CQ from borrowing from a third CQ

    Kueue holds team-a (StopPolicy Hold) while the pending workloads are created, so that they
    meet in one cycle; here they are all submitted before the chain runs."""
    s = Scenario(
        (
            cq("strict-fifo-cq", 5, "cohort", borrowing_limit=0, strict_fifo=True),
            cq("team-a", 5, "cohort"),
            cq("shared-resources", 5, "cohort"),
        )
    )
    for name, value in (("p10", 10), ("p1", 1), ("p99", 99), ("p11", 11)):
        s.w.priority_class(name, value)
    s.create("wl", "strict-fifo-cq", 3, "p10").create("player1-a", "team-a", 5, "p1").settle()
    s.running("wl", "player1-a")
    # pending-wl exceeds its queue's nominal and may not preempt; player2-a borrows
    # shared-resources' idle quota; player3-a would borrow strict-fifo-cq's, which pending-wl
    # waits for.
    s.create("pending-wl", "strict-fifo-cq", 3, "p99").create("player2-a", "team-a", 5, "p11")
    s.create("player3-a", "team-a", 1, "p10").settle()
    s.running("player2-a")
    s.pending("pending-wl", "player3-a")


def test_foundation_queue_lends_until_it_is_ready_to_admit() -> None:
    """scheduler_test.go (integration): Reserving Resources in Cohort / foundation-queue allows best-effort
    queue to use capacity until it is ready to admit next workload"""
    s = Scenario(
        (
            cq("foundation-queue", 2, "cohort", reclaim="any", strict_fifo=True),
            cq("best-effort-queue", 0, "cohort"),
        )
    )
    s.w.priority_class("p1000", 1000).priority_class("p0", 0)
    s.create("foundation-1", "foundation-queue", 1, "p1000").settle().running("foundation-1")
    s.create("foundation-2", "foundation-queue", 2, "p1000").settle().pending("foundation-2")
    s.create("best-effort-1", "best-effort-queue", 1, "p0").create(
        "best-effort-2", "best-effort-queue", 1, "p0"
    )
    s.settle()
    s.running("best-effort-1")
    s.pending("best-effort-2")
    # foundation-2 now fits its nominal by taking back what best-effort-1 borrows: the GPU
    # foundation-1 gave back is not lent to best-effort-2 meanwhile.
    s.finish("foundation-1").settle(evicting=frozenset({"best-effort-1"}))
    assert s.stopped == ["best-effort-1"]
    s.pending("best-effort-2", "foundation-2")
    s.settle()
    s.running("foundation-2")
    s.pending("best-effort-1", "best-effort-2")


def test_foundation_queue_blocks_capacity_when_not_sure_it_can_reclaim() -> None:
    """scheduler_test.go (integration): Reserving Resources in Cohort / foundation-queue blocks capacity when
    it is not sure that it can reclaim"""
    s = Scenario(
        (
            cq("foundation-queue", 2, "cohort", reclaim="lower-priority", strict_fifo=True),
            cq("best-effort-queue", 0, "cohort"),
        )
    )
    s.w.priority_class("p1000", 1000).priority_class("p0", 0)
    s.create("foundation-1", "foundation-queue", 1, "p1000").settle().running("foundation-1")
    s.create("foundation-2", "foundation-queue", 2, "p1000").settle().pending("foundation-2")
    s.create("best-effort-1", "best-effort-queue", 1, "p0").create(
        "best-effort-2", "best-effort-queue", 1, "p0"
    )
    s.settle().pending("best-effort-1", "best-effort-2")
    s.finish("foundation-1").settle()
    s.running("foundation-2")
    s.pending("best-effort-1", "best-effort-2")
    assert s.stopped == []


def test_hierarchy_admits_only_up_to_the_lending_limit_of_a_sibling_cohort() -> None:
    """scheduler_test.go (integration): Should admit only up to the lendingLimit of sibling cohort"""
    s = Scenario(
        (cq("lender-cq", 2, "lender"), cq("borrower-cq", 0, "borrower")),
        (
            CohortSpec("root"),
            CohortSpec("lender", parent="root", quotas={ANY: Quota(2, lending_limit=1)}),
            CohortSpec("borrower", parent="root"),
        ),
    )
    s.create("wl-1", "borrower-cq", 1).create("wl-2", "borrower-cq", 1).settle()
    s.running("wl-1")
    s.pending("wl-2")


def test_hierarchy_cohort_borrowing_limit_blocks_research_from_borrowing() -> None:
    """scheduler_test.go (integration): Cohort borrowingLimit blocks sibling borrowing in hierarchy / should
    allow production to borrow but block research from borrowing"""
    s = Scenario(
        (cq("research-cq", 2, "research"), cq("production-cq", 2, "production")),
        (
            CohortSpec("root"),
            CohortSpec("research", parent="root", quotas={ANY: Quota(0, borrowing_limit=0)}),
            CohortSpec("production", parent="root"),
        ),
    )
    prod = [f"prod-{i}" for i in (1, 2, 3)]
    for j in prod:
        s.create(j, "production-cq", 1)
    s.settle().running(*prod)
    s.finish(*prod)
    research = [f"research-{i}" for i in (1, 2, 3)]
    for j in research:
        s.create(j, "research-cq", 1)
    s.settle()
    assert sum(s.phase(j) == "running" for j in research) == 2
    assert sum(s.phase(j) == "queued" for j in research) == 1


def test_hierarchy_burst_queue_borrows_idle_capacity_while_orgs_stay_isolated() -> None:
    """scheduler_test.go (integration): Cohort borrowingLimit blocks sibling borrowing in hierarchy / should
    allow burst queue to borrow idle capacity while orgs stay isolated"""
    s = Scenario(
        (cq("org-a-cq", 2, "org-a"), cq("org-b-cq", 2, "org-b"), cq("burst-cq", 0, "root")),
        (
            CohortSpec("root"),
            CohortSpec("org-a", parent="root", quotas={ANY: Quota(0, borrowing_limit=0)}),
            CohortSpec("org-b", parent="root", quotas={ANY: Quota(0, borrowing_limit=0)}),
        ),
    )
    s.create("org-a-1", "org-a-cq", 1).create("org-a-2", "org-a-cq", 1).create(
        "org-a-overflow", "org-a-cq", 1
    )
    s.settle()
    s.running("org-a-1", "org-a-2")
    s.pending("org-a-overflow")
    s.create("burst-1", "burst-cq", 1).create("burst-2", "burst-cq", 1).settle()
    s.running("burst-1", "burst-2", "org-a-1", "org-a-2")
    s.pending("org-a-overflow")


# -- Kueue's integration scenarios of fair sharing ---------------------------------------------------
#
# ``test/integration/singlecluster/scheduler/fairsharing/fair_sharing_test.go`` (as of commit
# ff69552e): Kueue's fair sharing on, so every ClusterQueue here names Kueue's default strategies.
# Kueue's weight of 0 is a tiny one (corral's must be positive).
#
# One difference, on purpose (DESIGN §5, fair sharing): a corral share is the GPU time a queue held
# lately, not what it holds at the moment, so a queue that has just filled idle quota is not taken
# from by fair sharing at once, as Kueue takes from it; it is once its history shows it held that
# much (here, a day or three of log time at the default 24-hour half-life).

ZERO_WEIGHT = 1e-3
DAY = 24 * 3600.0


def test_fair_sharing_does_not_cause_an_infinite_preemption_cycle() -> None:
    """fair_sharing_test.go: Preemption is enabled and CQs have 0 weight / should not cause an infinite
    preemption cycle"""
    s = Scenario(
        (
            cq("best-effort-cq-a", 0, "top-cohort", reclaim="any", fair=True, weight=ZERO_WEIGHT),
            cq("best-effort-cq-b", 0, "top-cohort", reclaim="any", fair=True, weight=ZERO_WEIGHT),
        ),
        (CohortSpec("top-cohort", quotas={ANY: Quota(8)}),),
    )
    s.w.priority_class("p9001", 9001).priority_class("p100", 100)
    s.create("wlA1", "best-effort-cq-a", 4, "p9001").create("wlA2", "best-effort-cq-a", 4, "p100").settle()
    s.running("wlA1", "wlA2")
    # Kueue preempts wlA2 for wlB1 at once. corral's cq-a has held its 8 GPUs for seconds: by
    # its history it holds next to nothing, and wlB1 waits.
    s.create("wlB1", "best-effort-cq-b", 4, "p100").settle()
    assert s.stopped == []
    s.pending("wlB1")
    # A day on, cq-a's history shows the 8 GPUs: wlA2, the lower priority of its jobs, goes.
    s.w.wait(DAY)
    s.settle()
    assert s.stopped == ["wlA2"]
    s.running("wlA1", "wlB1")
    # And nobody takes it back from the other: no cycle, days later.
    s.w.wait(3 * DAY)
    s.settle()
    assert s.stopped == ["wlA2"]
    s.running("wlA1", "wlB1")
    s.pending("wlA2")


def test_fair_sharing_prevents_stealing_quota_while_a_preemptor_waits_for_evictions() -> None:
    """fair_sharing_test.go: Preemption is enabled and CQs have 0 weight / Should prevent other workloads from
    stealing quota when preemptor is waiting for multiple evictions

    Kueue's cq-1 holds the CPU quota and cq-2 the memory quota, each workload asking both; with
    GPUs alone, cq-1 holds the quota and cq-2's workloads borrow it."""
    s = Scenario(
        (
            cq("cq-1", 10, "thrash-cohort", reclaim="any", fair=True),
            cq("cq-2", 0, "thrash-cohort", reclaim="any", fair=True),
        )
    )
    s.w.priority_class("p100", 100)
    s.create("wlA", "cq-2", 1, "p100").create("wlB", "cq-2", 1, "p100").settle().running("wlA", "wlB")
    s.create("preemptor-wl", "cq-1", 10, MID).settle(evicting=frozenset({"wlB"}))
    assert sorted(s.stopped) == ["wlA", "wlB"]
    # wlA has stopped, wlB still checkpoints: wlA is not admitted again into what it gave back.
    assert s.phase("wlA") in ("preempted", "queued")
    assert s.phase("wlB") == "checkpointing"
    s.settle()
    s.running("preemptor-wl")
    s.pending("wlA", "wlB")


def test_fair_sharing_size_5_preempts_using_less_than_initial_share() -> None:
    """fair_sharing_test.go: ClusterQueue head is ineligible for admission due to DominantResourceShare /
    workload of size 5 preempts using LessThanInitialShare policy and admits"""
    s = Scenario(
        (
            cq("cq-p1", 0, "cohort-a", within="lower-priority", reclaim="any", fair=True),
            cq("cq-p2", 0, "cohort-a", within="lower-priority", reclaim="any", fair=True),
        ),
        (CohortSpec("root-cohort"), CohortSpec("cohort-a", parent="root-cohort", quotas={ANY: Quota(9)})),
    )
    p1 = [f"cq-p1-{i}" for i in range(4)]
    for j in p1:
        s.create(j, "cq-p1", 2)
    s.settle().running(*p1)
    # Kueue takes two of cq-p1's at once (the first by LessThanOrEqualToFinalShare, 5 <= 6, the
    # second by LessThanInitialShare, 5 < 6). corral does once cq-p1's history shows its 8 GPUs.
    s.create("cq-p2-0", "cq-p2", 5).settle()
    assert s.stopped == []
    s.w.wait(3 * DAY)
    s.settle()
    assert len(s.stopped) == 2 and set(s.stopped) < set(p1)
    s.running("cq-p2-0")
    assert sum(s.phase(j) == "running" for j in p1) == 2


def test_fair_sharing_queue_can_reclaim_its_nominal_quota() -> None:
    """fair_sharing_test.go: Preemption is enabled in fairsharing and there are large values of quota and
    weights / Queue can reclaim its nominal quota

    Kueue's 600 CPUs and workloads of 100 are 6 GPUs and jobs of 1."""
    s = Scenario(
        (
            cq("a", 6, "all", within="lower-priority", reclaim="any", fair=True, weight=300),
            cq("b", 6, "all", within="lower-priority", reclaim="any", fair=True, weight=300),
        )
    )
    a = [f"a-{i}" for i in range(10)]
    for j in a:
        s.create(j, "a", 1)
    s.settle().running(*a)
    # Within its nominal, b takes back what a borrows, whatever the shares.
    s.create("b-0", "b", 5).settle()
    assert len(s.stopped) == 3 and set(s.stopped) < set(a)
    s.running("b-0")
    assert sum(s.phase(j) == "running" for j in a) == 7


def test_fair_sharing_guaranteed_workload_preempts_a_single_best_effort_workload() -> None:
    """fair_sharing_test.go: Preemption is enabled in fairsharing and there are best effort and guaranteed
    workloads / Guaranteed workloads cause preemption of a single best effort workload"""
    s = Scenario(
        (
            cq("best-effort-a", 0, "all", fair=True),
            cq("best-effort-b", 0, "all", fair=True),
            cq("guaranteed", 8, "all", reclaim="any", fair=True),
        )
    )
    s.w.priority_class("p2", 2).priority_class("p1", 1)
    s.create("wlBestEffortA", "best-effort-a", 4, "p2").settle().running("wlBestEffortA")
    s.create("wlBestEffortB", "best-effort-b", 4, "p1").settle().running("wlBestEffortB")
    s.create("wlGuaranteed", "guaranteed", 4).settle()
    # Kueue stops wlBestEffortB: both best-effort queues hold 4 at the moment, equal shares, and
    # its tie-break takes the lower priority. corral takes borrowers from the queue whose share
    # is the highest too, but by history: best-effort-a has held its 4 GPUs longer (admitted
    # first), so it gives back first, whatever its job's priority (DESIGN §5, fair sharing).
    assert s.stopped == ["wlBestEffortA"]
    s.running("wlGuaranteed", "wlBestEffortB")
    s.pending("wlBestEffortA")
