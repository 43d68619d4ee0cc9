"""Armada's scheduler tables, as corral's whole chain answers them.

The cases follow the table-driven tests of Armada's scheduler (armadaproject/armada,
``internal/scheduler/scheduling/``): ``queue_scheduler_test.go`` (``TestQueueScheduler``),
``preempting_queue_scheduler_test.go`` (``TestPreemptingQueueScheduler``) and
``gang_scheduler_test.go`` (``TestGangScheduler``). Each case carries Armada's name, which its test
id spells, and cites its file and test function. Each asks what corral does on the case: which
submitted jobs end up running, which running jobs are stopped (by checkpoint) for them, and which
are rejected at submission.

Translation.

- Resources. Armada's CPUs are GPUs, one for one; its 32-CPU test node is a node of 32 GPUs with
  CPU and memory to spare, so only GPUs bind. A "large" job (``N32Cpu256Gi...``) asks for a whole
  node's 32 GPUs.
- Queues. An Armada queue has no quota: the pool is shared by the queues' weights (the inverse of
  their ``PriorityFactor``), and a higher priority class preempts across queues whatever the
  shares. In corral all queues of a case sit in one cohort that holds the cluster's GPUs as its
  own quota, shared by weight (``share_own_quota``); each queue has a nominal of 0, so every job
  borrows, is ordered across queues by weighted share and may be stopped by another queue's job
  of a higher priority (corral's default policy: stop lower-priority borrowers when borrowing).
  Armada's balancing preemption (a queue above its fair share loses jobs to one below it) is
  Kueue's fair-sharing preemption in corral: the cases about it turn ``fair_sharing`` on, and
  each round ends long enough before the next that a queue's history is what it holds
  (DESIGN.md §5, "Fair sharing": history, not the moment, makes the share).
- Priority classes. Armada's test classes (``testfixtures.TestPriorityClasses``) are corral
  classes of the same values and preemptibility: ``priority-0`` to ``priority-2`` preemptible,
  ``priority-2-non-preemptible`` and ``priority-3`` not.
- Jobs. A gang (``WithGangAnnotationsJobs``) is one corral job with that many replicas, placed
  whole or not at all. Jobs of one round are submitted in the table's order, queue by queue.
- Rounds. Armada runs its scheduler once a round; corral runs admission, the placer and the
  preemptor until none of them has anything to add, the simulated agents starting what is placed
  and stopping, once checkpointed, what is preempted (``test_volcano_scenarios.settle``). A
  round's outcome is the jobs that run at its end among those it submitted, and the jobs it
  stopped.

Cases left out, and why:

- Rate limits, round limits and per-priority or per-queue resource fractions
  (``MaximumSchedulingBurst``, ``MaximumResourceFractionToSchedule``, ``PerPriorityLimits``,
  ``MaximumResourceFractionPerQueue``, ``MaxQueueLookback`` and the "rescheduled jobs don't
  count towards ..." cases): corral has no scheduling rate; a queue's limits are its quota.
- Taints and tolerations, node affinity with ``NotIn``, away nodes and home/away preemption, the
  optimiser, floating resources, node uniformity labels and market-driven pricing: corral has
  node selectors (equality), GPU models and racks/blocks, none of the rest.
- ``prioritiseLargerJobs`` orderings and ``DominantResourceFairness`` (CPU against memory):
  corral's share is GPUs alone.
- "don't prempt jobs where we don't know the queue": corral refuses a job of a queue that does
  not exist at submission, so no such job runs.
- Per-job priority within a priority class ("job priority"): a corral job's priority is its
  class's.

Where corral differs on purpose, the case asserts corral's answer and says why. Where it differs
and should not, the case asserts Armada's answer and is marked as a known failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from corral.events import subjects as subj
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.nodes import GpuInfo, NodeInventory, NodeRegistered
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyQueue,
    CohortSpec,
    CordonNode,
    FairShareSpec,
    FairSharingStrategy,
    PreemptionPolicy,
    QueueSpec,
    Quota,
)
from corral.projections.quota import ANY
from tests.builders import TRAIN
from tests.unit.test_preemptor import World
from tests.unit.test_volcano_scenarios import settle

QUEUE_SCHEDULER = "internal/scheduler/scheduling/queue_scheduler_test.go TestQueueScheduler"
PREEMPTING = "internal/scheduler/scheduling/preempting_queue_scheduler_test.go TestPreemptingQueueScheduler"
GANG = "internal/scheduler/scheduling/gang_scheduler_test.go TestGangScheduler"

COHORT = "armada"
MODEL = "H100-80GB"
FAIR: tuple[FairSharingStrategy, ...] = ("less-than-or-equal-to-final-share", "less-than-initial-share")
HALF_LIFE_S = 600.0
LATE_S = 30 * HALF_LIFE_S  # after a round, long enough that a queue's history is what it holds

# testfixtures.TestPriorityClasses: name -> (value, preemptible).
CLASSES = {
    "priority-0": (0, True),
    "priority-1": (1, True),
    "priority-2": (2, True),
    "priority-2-non-preemptible": (2, False),
    "priority-3": (3, False),
}
PC0, PC1, PC2, PC2NP, PC3 = CLASSES


# -- the case's vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int = 32
    labels: dict[str, str] = field(default_factory=dict)
    model: str = MODEL


@dataclass(frozen=True)
class Job:
    id: str
    queue: str
    gpus: int = 1
    priority: str = PC0
    replicas: int = 1
    selector: dict[str, str] = field(default_factory=dict)
    models: tuple[str, ...] = ()

    def spec(self) -> JobSpec:
        return JobSpec(
            queue=self.queue,
            priority_class=self.priority,
            replicas=self.replicas,
            resources=Resources(gpus=self.gpus, gpu_models=self.models),
            preemptible=CLASSES[self.priority][1],
            checkpointable=True,
            node_selector=self.selector,
            command=TRAIN,
        )


def jobs(
    q: str, n: int, priority: str = PC0, *, tag: str = "", gpus: int = 1, **kw: object
) -> tuple[Job, ...]:
    """Armada's ``N1Cpu4GiJobs(q, priority, n)``: ``n`` one-GPU jobs, ids ``<q><tag>-<i>``."""
    return tuple(Job(f"{q}{tag}-{i}", q, gpus, priority, **kw) for i in range(n))  # type: ignore[arg-type]


def large(q: str, n: int, priority: str = PC0, *, tag: str = "", **kw: object) -> tuple[Job, ...]:
    """Armada's ``N32Cpu256GiJobsWithLargeJobToleration``: jobs of a whole 32-GPU node."""
    return jobs(q, n, priority, tag=tag, gpus=32, **kw)


def gang(job_id: str, q: str, replicas: int, gpus: int = 1, priority: str = PC0) -> Job:
    """Armada's ``WithGangAnnotationsJobs``: ``replicas`` jobs that run together or not at all."""
    return Job(job_id, q, gpus, priority, replicas=replicas)


def ids(q: str, which: range | tuple[int, ...], tag: str = "") -> tuple[str, ...]:
    """The ids of Armada's ``IntRange`` (both ends in, as Armada's are: pass ``range(a, b + 1)``)."""
    return tuple(f"{q}{tag}-{i}" for i in which)


@dataclass(frozen=True)
class Round:
    """One of Armada's ``SchedulingRound``: ``submit`` in order; ``running``, the jobs it submitted
    that run at its end; ``stopped``, the running jobs stopped during it; ``cordon``, nodes
    cordoned before it."""

    submit: tuple[Job, ...] = ()
    running: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    cordon: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    source: str
    nodes: tuple[Node, ...]
    weights: dict[str, float]
    rounds: tuple[Round, ...]
    fair_sharing: bool = False


def nodes(n: int, gpus: int = 32, **labels: str) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", gpus, dict(labels)) for i in range(n))


# -- the world and the chain -------------------------------------------------------------------------


def _inventory(n: Node) -> NodeInventory:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{n.name}-{i:02d}", model=n.model, memory_mib=81_559)
        for i in range(n.gpus)
    )
    spare = max(1, n.gpus)
    return NodeInventory(cpu_milli=spare * 64_000, memory_mib=spare * 512 * 1024, gpus=gpus, labels=n.labels)


def build(c: Case) -> World:
    w = World(nodes=0)
    for n in c.nodes:
        w.emit(subj.node(n.name), NodeRegistered(node=n.name, inventory=_inventory(n)))
    w.emit(
        subj.admin("fair-share"),
        ApplyFairShare(fair_share=FairShareSpec(half_life_s=HALF_LIFE_S)),
        subj.ADMIN,
    )
    # The cluster's GPUs are the cohort's own quota, shared by weight; the queues have none.
    pool = CohortSpec(COHORT, quotas={ANY: Quota(sum(n.gpus for n in c.nodes))}, share_own_quota=True)
    w.emit(subj.admin("cohort"), ApplyCohort(cohort=pool), subj.ADMIN)
    policy = PreemptionPolicy(fair_sharing=FAIR if c.fair_sharing else ())
    for q, weight in c.weights.items():
        spec = QueueSpec(q, cohort=COHORT, quotas={ANY: Quota(0)}, weight=weight, preemption=policy)
        w.emit(subj.admin("queue"), ApplyQueue(queue=spec), subj.ADMIN)
    for name, (value, preemptible) in CLASSES.items():
        w.priority_class(name, value, preemptible=preemptible)
    return w


def _check(c: Case) -> None:
    w = build(c)
    for i, r in enumerate(c.rounds):
        for name in r.cordon:
            w.emit(subj.admin("cordon"), CordonNode(node=name), subj.ADMIN)
        for j in r.submit:
            w.emit(subj.request("alice", "submit"), SubmitJob(request_id=j.id, job=j.spec()), "alice")
        out = settle(w, rounds=80)
        jobs_ = w.state.jobs
        running = {j.id for j in r.submit if jobs_[j.id].phase == "running"}
        rejected = {j.id for j in r.submit if jobs_[j.id].phase == "rejected"}
        got = (sorted(running), sorted(out.stopped), sorted(rejected))
        want = (sorted(r.running), sorted(r.stopped), sorted(r.rejected))
        assert got == want, f"round {i}"
        # A gang runs whole.
        for j in running:
            job = jobs_[j]
            assert job.admission is not None and job.placement is not None
            assert len(job.placement.workers) == job.admission.replicas
        w.wait(LATE_S)


def _case(name: str, c: Case, *marks: pytest.MarkDecorator) -> object:
    ident = name.replace(" ", "-").replace(",", "").replace("'", "").replace("(", "").replace(")", "")
    return pytest.param(c, id=ident, marks=marks)


# -- TestQueueScheduler ------------------------------------------------------------------------------

QUEUE_CASES = [
    _case(
        "simple success",
        Case(QUEUE_SCHEDULER, nodes(1), {"A": 1}, (Round(jobs("A", 32), ids("A", range(32))),)),
    ),
    _case(
        "simple failure",
        Case(QUEUE_SCHEDULER, nodes(1), {"A": 1}, (Round(jobs("A", 33), ids("A", range(32))),)),
    ),
    _case(
        "multiple nodes",
        Case(QUEUE_SCHEDULER, nodes(2), {"A": 1}, (Round(jobs("A", 64), ids("A", range(64))),)),
    ),
    # Armada schedules both (they fit); neither is stopped.
    _case(
        "preempt lower-priority jobs",
        Case(
            QUEUE_SCHEDULER,
            nodes(1),
            {"A": 1},
            (Round(jobs("A", 1, PC0, tag="lo") + jobs("A", 1, PC1, tag="hi"), ("Alo-0", "Ahi-0")),),
        ),
    ),
    _case(
        "no preemption of higher-priority jobs",
        Case(
            QUEUE_SCHEDULER,
            nodes(1),
            {"A": 1},
            (Round(large("A", 1, PC1, tag="big") + jobs("A", 1, PC0, tag="small"), ("Abig-0",)),),
        ),
    ),
    # The large jobs need more than the 31 GPUs left, which no quota holds for them (a job past
    # its queue's nominal holds nothing: services/admission/order.py), so the small job behind
    # them runs, as in Armada.
    _case(
        "unschedulable jobs do not block schedulable jobs",
        Case(
            QUEUE_SCHEDULER,
            nodes(1),
            {"A": 1},
            (Round(jobs("A", 1) + large("A", 10, tag="big") + jobs("A", 1, tag="x"), ("A-0", "Ax-0")),),
        ),
    ),
    _case(
        "fairness two queues",
        Case(
            QUEUE_SCHEDULER,
            nodes(1),
            {"A": 1, "B": 1},
            (Round(jobs("A", 32) + jobs("B", 32), ids("A", range(16)) + ids("B", range(16))),),
        ),
    ),
    # 32 over three queues: 11, 11, 10 in Armada; in corral the queue that goes first at equal
    # shares (by name) gets the odd GPU.
    _case(
        "fairness three queues",
        Case(
            QUEUE_SCHEDULER,
            nodes(1),
            {"A": 1, "B": 1, "C": 1},
            (
                Round(
                    jobs("A", 32) + jobs("B", 32) + jobs("C", 32),
                    ids("A", range(11)) + ids("B", range(11)) + ids("C", range(10)),
                ),
            ),
        ),
    ),
    # PriorityFactor 1 and 2: weights 1 and 1/2.
    _case(
        "weighted fairness two queues",
        Case(
            QUEUE_SCHEDULER,
            nodes(3),
            {"A": 1.0, "B": 0.5},
            (Round(jobs("A", 96) + jobs("B", 96), ids("A", range(64)) + ids("B", range(32))),),
        ),
    ),
    # PriorityFactor 1, 2 and 10.
    _case(
        "weighted fairness three queues",
        Case(
            QUEUE_SCHEDULER,
            nodes(3),
            {"A": 1.0, "B": 0.5, "C": 0.1},
            (
                Round(
                    jobs("A", 96) + jobs("B", 96) + jobs("C", 96),
                    ids("A", range(60)) + ids("B", range(30)) + ids("C", range(6)),
                ),
            ),
        ),
    ),
    _case(
        "Node selector",
        Case(
            QUEUE_SCHEDULER,
            (Node("n0"), Node("n1", labels={"foo": "foo"})),
            {"A": 1},
            (Round(large("A", 2, selector={"foo": "foo"}), ("A-0",)),),
        ),
    ),
    _case(
        "gang success",
        Case(QUEUE_SCHEDULER, nodes(2), {"A": 1}, (Round((gang("g", "A", 2, gpus=32),), ("g",)),)),
    ),
    # Armada leaves the gang pending; corral rejects at submission a gang no node set could ever
    # hold (DESIGN.md §6 admission, "A job that no node could ever host ... is rejected").
    _case(
        "gang failure",
        Case(QUEUE_SCHEDULER, nodes(2), {"A": 1}, (Round((gang("g", "A", 3, gpus=32),), rejected=("g",)),)),
    ),
]


@pytest.mark.parametrize("c", QUEUE_CASES)
def test_queue_scheduler(c: Case) -> None:
    _check(c)


# -- TestPreemptingQueueScheduler --------------------------------------------------------------------

PREEMPTING_CASES = [
    _case(
        "balancing three queues",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1, "C": 1},
            (
                Round(jobs("A", 32), ids("A", range(32))),
                Round(jobs("B", 32), ids("B", range(16)), ids("A", range(16, 32))),
                Round(jobs("C", 10), ids("C", range(10)), ids("A", range(11, 16)) + ids("B", range(11, 16))),
                Round(jobs("A", 1, tag="x") + jobs("B", 1, tag="x") + jobs("C", 1, tag="x")),
            ),
            fair_sharing=True,
        ),
    ),
    _case(
        "balancing two queues weighted",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 0.5, "B": 1},
            (
                Round(jobs("A", 32), ids("A", range(32))),
                Round(jobs("B", 32), ids("B", range(21)), ids("A", range(11, 32))),
                Round(jobs("A", 1, tag="x") + jobs("B", 1, tag="x")),
            ),
            fair_sharing=True,
        ),
    ),
    _case(
        "avoid preemption when not improving fairness",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (Round(jobs("A", 32), ids("A", range(32))), Round(large("B", 1))),
            fair_sharing=True,
        ),
    ),
    _case(
        "preemption when improving fairness",
        Case(
            PREEMPTING,
            nodes(2),
            {"A": 1, "B": 1},
            (
                Round(jobs("A", 64), ids("A", range(64))),
                Round(large("B", 1), ("B-0",), ids("A", range(32, 64))),
            ),
            fair_sharing=True,
        ),
    ),
    _case(
        "urgency-based preemption - gangs",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (Round((gang("a", "A", 32, priority=PC0), gang("b", "B", 32, priority=PC1)), ("b",)), Round()),
        ),
    ),
    _case(
        "urgency-based preemption stability",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (
                Round(jobs("A", 33, PC2), ids("A", range(32))),
                Round(jobs("B", 1, PC3), ("B-0",), ("A-31",)),
                Round(jobs("A", 1, PC2, tag="x")),
                Round(),
            ),
        ),
    ),
    _case(
        "avoid urgency-based preemption when possible",
        Case(
            PREEMPTING,
            nodes(2),
            {"A": 1},
            (Round(large("A", 1, PC0), ("A-0",)), Round(large("A", 1, PC1, tag="x"), ("Ax-0",))),
        ),
    ),
    _case(
        "preempt in order of priority",
        Case(
            PREEMPTING,
            nodes(2),
            {"A": 1},
            (
                Round(large("A", 1, PC1, tag="p1"), ("Ap1-0",)),
                Round(large("A", 1, PC0, tag="p0"), ("Ap0-0",)),
                Round(large("A", 1, PC2, tag="p2"), ("Ap2-0",), ("Ap0-0",)),
            ),
        ),
    ),
    # D's job may not be preempted (priority-3), and corral keeps what such jobs of a queue hold
    # within its part of the pool, here a quarter of 96 GPUs: a job larger than that is refused
    # at submission (DESIGN.md §5, "Only what can be stopped is borrowed"). Armada runs it.
    _case(
        "avoid urgency-based preemption when possible cross-queue",
        Case(
            PREEMPTING,
            nodes(3),
            {"A": 1, "B": 1, "C": 1, "D": 1},
            (
                Round(large("A", 1, PC1), ("A-0",)),
                Round(large("B", 1, PC0), ("B-0",)),
                Round(large("C", 1, PC2), ("C-0",)),
                Round(large("D", 1, PC3), rejected=("D-0",)),
            ),
        ),
    ),
    # The same with D's part of the pool large enough for its job (weight 3: 48 of 96 GPUs): D
    # stops the lowest priority of the three, B's, as in Armada.
    _case(
        "avoid urgency-based preemption when possible cross-queue (D's part a node)",
        Case(
            PREEMPTING,
            nodes(3),
            {"A": 1, "B": 1, "C": 1, "D": 3},
            (
                Round(large("A", 1, PC1), ("A-0",)),
                Round(large("B", 1, PC0), ("B-0",)),
                Round(large("C", 1, PC2), ("C-0",)),
                Round(large("D", 1, PC3), ("D-0",), ("B-0",)),
            ),
        ),
    ),
    _case(
        "gang preemption",
        Case(
            PREEMPTING,
            nodes(2),
            {"A": 1, "B": 1, "C": 1},
            (
                Round(jobs("A", 16) + jobs("B", 16), ids("A", range(16)) + ids("B", range(16))),
                Round((gang("c", "C", 32),), ("c",)),
                Round(jobs("A", 17, PC1, tag="x"), ids("A", range(17), "x"), ("c",)),
            ),
        ),
        # A's 17 jobs are one run of like jobs: planned one by one, the first 16 would each take
        # one of B's one-GPU jobs (the least work lost for one GPU) and the 17th the gang, whose
        # 32 GPUs do for all 17; the preemptor finds what the run needs together first, so B's
        # jobs are not stopped for nothing.
    ),
    _case(
        "gang preemption avoid cascading preemption",
        Case(
            PREEMPTING,
            nodes(3),
            {"A": 1, "B": 1},
            (
                Round((gang("g1", "A", 33, priority=PC1),), ("g1",)),
                # Armada's second gang has 31 members of priority-1 and one of priority-0, whose
                # preemption takes the gang with it: a corral job has one priority, its lowest.
                Round((gang("g2", "A", 32, priority=PC0),), ("g2",)),
                Round(large("B", 1, PC1), ("B-0",), ("g2",)),
            ),
        ),
    ),
    _case(
        "priority class preemption two classes",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1},
            (Round(large("A", 1, PC0), ("A-0",)), Round(large("A", 1, PC1, tag="x"), ("Ax-0",), ("A-0",))),
        ),
    ),
    _case(
        "priority class preemption cross-queue",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (Round(large("A", 1, PC0), ("A-0",)), Round(large("B", 1, PC1), ("B-0",), ("A-0",))),
        ),
    ),
    _case(
        "priority class preemption not scheduled",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1},
            (Round(large("A", 1, PC0, tag="lo") + large("A", 1, PC1, tag="hi"), ("Ahi-0",)),),
        ),
    ),
    _case(
        "priority class preemption through multiple levels",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1, "C": 1},
            (
                Round(jobs("A", 16, PC0) + jobs("B", 16, PC1), ids("A", range(16)) + ids("B", range(16))),
                Round(jobs("C", 17, PC2), ids("C", range(17)), ids("A", range(16)) + ids("B", (15,))),
            ),
        ),
    ),
    _case(
        "priority class preemption four classes",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1},
            (
                Round(
                    jobs("A", 10, PC0, tag="p0")
                    + jobs("A", 10, PC1, tag="p1")
                    + jobs("A", 10, PC2, tag="p2"),
                    ids("A", range(10), "p0") + ids("A", range(10), "p1") + ids("A", range(10), "p2"),
                ),
                Round(
                    jobs("A", 24, PC3, tag="p3"),
                    ids("A", range(24), "p3"),
                    ids("A", range(10), "p0") + ids("A", range(10), "p1") + ids("A", (8, 9), "p2"),
                ),
            ),
        ),
    ),
    _case(
        "Queued jobs are not preempted cross queue",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (Round(jobs("A", 32, PC0) + jobs("B", 32, PC1), ids("B", range(32))), Round()),
        ),
    ),
    _case(
        "Queued jobs are not preempted cross queue with some scheduled",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (
                Round(jobs("A", 32, PC0) + jobs("B", 31, PC1), ids("A", range(1)) + ids("B", range(31))),
                Round(),
            ),
        ),
    ),
    _case(
        "Queued jobs are not preempted cross queue with non-preemptible jobs",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            # B's jobs may not be preempted: they hold at most B's part of the pool, 16 GPUs
            # (DESIGN.md §5, "Only what can be stopped is borrowed"), and A's take the rest.
            # Armada runs B's 32. Nothing is stopped either way.
            (
                Round(jobs("A", 32, PC0) + jobs("B", 32, PC3), ids("A", range(16)) + ids("B", range(16))),
                Round(),
            ),
        ),
    ),
    _case(
        "Queued jobs are not preempted cross queue multiple rounds",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (
                Round(jobs("A", 16, PC1), ids("A", range(16))),
                Round(jobs("A", 16, PC0, tag="x") + jobs("B", 32, PC1), ids("B", range(16))),
                Round(),
            ),
        ),
    ),
    _case(
        "Oversubscribed eviction does not evict non-preemptible",
        Case(
            PREEMPTING,
            nodes(2),
            {"A": 1, "B": 1},
            (
                # A's jobs that may not be preempted hold at most A's part of the pool, 32 GPUs
                # (DESIGN.md §5, "Only what can be stopped is borrowed"): the third waits, where
                # Armada runs it.
                Round(
                    jobs("A", 1, PC2, gpus=16, tag="p") + jobs("A", 3, PC2NP, gpus=16),
                    ("Ap-0",) + ids("A", range(2)),
                ),
                # So B's priority-3 job finds 16 GPUs free and stops nobody, where Armada stops
                # A's preemptible job for it; B's second job (priority 2) may not stop A's job
                # of its own priority, in corral as in Armada. A's non-preemptible jobs keep
                # running in both.
                Round(jobs("B", 1, PC3, gpus=16) + jobs("B", 1, PC2NP, gpus=16, tag="np"), ("B-0",)),
                Round(),
            ),
        ),
    ),
    _case(
        "Cordoning prevents scheduling new jobs but not re-scheduling running jobs",
        Case(
            PREEMPTING,
            nodes(1),
            {"A": 1, "B": 1},
            (
                Round(jobs("A", 1, PC1), ("A-0",)),
                Round(jobs("B", 1, PC1), cordon=("n0",)),
                Round(jobs("B", 1, PC1, tag="x")),
                Round(),
            ),
        ),
    ),
]


@pytest.mark.parametrize("c", PREEMPTING_CASES)
def test_preempting_queue_scheduler(c: Case) -> None:
    _check(c)


# -- TestGangScheduler -------------------------------------------------------------------------------

GANG_CASES = [
    _case("simple success", Case(GANG, nodes(1), {"A": 1}, (Round((gang("g", "A", 32),), ("g",)),))),
    # Armada leaves the gang unscheduled; corral refuses at submission a gang no nodes could hold
    # (DESIGN.md §6 admission, "A job that no node could ever host ... is rejected").
    _case("simple failure", Case(GANG, nodes(1), {"A": 1}, (Round((gang("g", "A", 33),), rejected=("g",)),))),
    # The second gang fits once the first ends: it waits, placed nowhere in part.
    _case(
        "one success and one failure",
        Case(GANG, nodes(1), {"A": 1}, (Round((gang("g1", "A", 32), gang("g2", "A", 1)), ("g1",)),)),
    ),
    _case("multiple nodes", Case(GANG, nodes(2), {"A": 1}, (Round((gang("g", "A", 64),), ("g",)),))),
]


@pytest.mark.parametrize("c", GANG_CASES)
def test_gang_scheduler(c: Case) -> None:
    _check(c)
