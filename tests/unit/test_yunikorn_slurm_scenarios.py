"""Apache YuniKorn's preemption and queue tests, and Slurm's documented semantics, as corral's
whole chain answers them.

YuniKorn cases follow apache/yunikorn-core: ``pkg/scheduler/objects/preemption_test.go`` (the
``TestTryPreemption*`` functions: a queue under its guaranteed resources takes back what a
sibling over its own holds, never pushing the sibling below its guarantee) and
``pkg/scheduler/tests/smoke_test.go`` (``TestFairnessAllocationForQueues``,
``TestSchedulingOverMaxCapacity``). Slurm cases follow its documentation
(slurm.schedmd.com): ``sched_config.html`` and ``slurm.conf.html`` on backfill ("lower priority
jobs are started only if doing so does not delay the expected start time of any higher priority
job"), ``preempt.html`` (``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``/``OFF``),
``sbatch.html`` (``--nodes``, ``--constraint``) and ``scontrol.html`` (``State=DRAIN``/``RESUME``).
Each case cites its source.

Translation.

- Resources. YuniKorn's ``first``/``vcores`` and Slurm's GPUs are GPUs, one for one; nodes have
  CPU and memory to spare, so only GPUs bind.
- YuniKorn queues. A parent queue is a cohort; a leaf its queue. A leaf's ``guaranteed`` is its
  nominal quota and its ``max`` its nominal plus borrowing limit. What of the cluster no leaf is
  guaranteed is the cohort's own quota, which any of its queues may borrow (YuniKorn lets a leaf
  use the cluster up to its max). A parent's ``max`` is a nested cohort's borrowing limit.
  YuniKorn's preemption (a queue under guaranteed takes from one over it) is corral's reclaim:
  ``reclaim_within_cohort="any"``, victims lowest priority first.
- Slurm. A partition's ``PriorityTier`` (and a job's priority) is a priority class; a partition
  of ``PreemptMode=OFF`` holds jobs of a class that may not be preempted; ``PreemptMode=REQUEUE``
  is corral's checkpoint, stop and requeue. A job's ``--time`` is its runtime estimate. Slurm has
  no quota: the case's one queue holds the cluster's GPUs as its nominal. ``--nodes=N`` of whole
  nodes is a gang of N replicas; ``--constraint`` a node selector; a node in ``DRAIN`` a cordoned
  node (its jobs run on; corral's ``drain`` moves them, which Slurm's does not).
- Steps. A case is a sequence of steps: jobs submitted in order, jobs that finish, nodes cordoned
  or resumed; after each, admission, the placer and the preemptor run until none of them has
  anything to add (``test_volcano_scenarios.settle``). A step's outcome is every job running at
  its end, the jobs stopped during it and those it submitted that were rejected.

Left out, and why:

- YuniKorn's ``preemption_test.go`` cases about several resource types (``AskResTypesDifferent``,
  ``*_With_OG_And_UG_ResTypes``): corral's quota is GPUs. ``TestTryPreemption_VictimsAvailable_
  InsufficientResource`` and ``..._VictimsOnDifferentNodes_InsufficientResource`` hinge on a
  parent ``max`` below its children's guarantees, which corral's quota tree cannot state; the
  ``TestCheckPreconditions`` delays and ``TestTryPreemption_VictimReleased_*`` (a victim released
  mid-search) are YuniKorn's machinery. YuniKorn's preemption within one queue does not exist
  (a queue cannot be both under and over its guarantee); corral's ``within_queue`` is Kueue's.
- YuniKorn's gang placeholders (``application_test.go`` ``TestTimeoutPlaceholder*``): a
  placeholder holds part of a gang's resources, idle, until the gang completes or times out.
  Corral holds no part of a gang: it places the gang whole or not at all and reserves for it
  (the Slurm gang case below checks the whole-or-nothing part).
- Slurm's time-sliced gang scheduling (``gang_scheduling.html``, ``OverSubscribe=FORCE``):
  corral never runs two jobs on one GPU in turn. Slurm's multifactor priority weights (age, job
  size, QOS) and ``PreemptMode=SUSPEND``: a corral job's priority is its class's, and a stopped
  job checkpoints, it is never suspended in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from corral.events import subjects as subj
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.nodes import NodeRegistered
from corral.events.queues import (
    ApplyCohort,
    ApplyQueue,
    CohortSpec,
    CordonNode,
    PreemptionPolicy,
    QueueSpec,
    Quota,
)
from corral.projections.quota import ANY
from tests.builders import TRAIN
from tests.unit.test_armada_scenarios import Node, _inventory
from tests.unit.test_preemptor import World
from tests.unit.test_volcano_scenarios import settle

YK_PREEMPTION = "yunikorn-core pkg/scheduler/objects/preemption_test.go"
YK_SMOKE = "yunikorn-core pkg/scheduler/tests/smoke_test.go"
SLURM_BACKFILL = "slurm sched_config.html, slurm.conf.html SchedulerType=sched/backfill"
SLURM_PREEMPT = "slurm preempt.html PreemptType=preempt/partition_prio"
SLURM_SBATCH = "slurm sbatch.html"
SLURM_DRAIN = "slurm scontrol.html State=DRAIN, State=RESUME"

# name -> (value, may be preempted). YuniKorn's priority 1000 ask is "high".
CLASSES = {
    "low": (0, True),
    "normal": (100, True),
    "high": (1000, True),
    "low-np": (0, False),
    "normal-np": (100, False),
    "high-np": (1000, False),
}
HOUR = 3600.0


# -- the case's vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: str
    queue: str
    gpus: int = 1
    priority: str = "normal"
    replicas: int = 1
    est: float | None = None  # Slurm's --time
    selector: dict[str, str] = field(default_factory=dict)

    def spec(self) -> JobSpec:
        return JobSpec(
            queue=self.queue,
            priority_class=self.priority,
            replicas=self.replicas,
            resources=Resources(gpus=self.gpus),
            preemptible=CLASSES[self.priority][1],
            checkpointable=True,
            runtime_estimate_s=self.est,
            node_selector=self.selector,
            command=TRAIN,
        )


def jobs(q: str, n: int, gpus: int = 1, priority: str = "normal", *, tag: str = "") -> tuple[Job, ...]:
    """``n`` alike jobs of queue ``q``, ids ``<q><tag>-<i>`` from 1, in submission order."""
    return tuple(Job(f"{q}{tag}-{i}", q, gpus, priority) for i in range(1, n + 1))


@dataclass(frozen=True)
class Step:
    submit: tuple[Job, ...] = ()
    finish: tuple[str, ...] = ()
    cordon: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    # Every job of the case running at the step's end; the jobs the step stopped; the jobs it
    # submitted that were rejected.
    running: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    wait_s: float = 0.0  # log time passed before the step


@dataclass(frozen=True)
class Case:
    source: str
    nodes: tuple[Node, ...]
    cohorts: tuple[CohortSpec, ...]
    queues: tuple[QueueSpec, ...]
    steps: tuple[Step, ...]


def nodes(*gpus: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", g) for i, g in enumerate(gpus))


def cohort(name: str, own: int = 0, *, parent: str | None = None, max_: int | None = None) -> CohortSpec:
    """A YuniKorn parent queue: ``own``, what of the cluster no leaf is guaranteed; ``max_``, its
    ``max`` (the most it may borrow is ``max_ - own``)."""
    limit = None if max_ is None else max_ - own
    return CohortSpec(name, parent=parent, quotas={ANY: Quota(own, borrowing_limit=limit)})


RECLAIM = PreemptionPolicy(reclaim_within_cohort="any")


def queue(name: str, cohort_: str | None, guaranteed: int = 0, max_: int | None = None) -> QueueSpec:
    """A YuniKorn leaf (or a Slurm partition's queue): ``guaranteed`` its nominal, ``max_`` its
    nominal plus borrowing limit."""
    limit = None if max_ is None else max_ - guaranteed
    quotas = {ANY: Quota(guaranteed, borrowing_limit=limit)}
    return QueueSpec(name, cohort=cohort_, quotas=quotas, preemption=RECLAIM)


# -- the world and the chain -------------------------------------------------------------------------


def build(c: Case) -> World:
    w = World(nodes=0)
    for n in c.nodes:
        w.emit(subj.node(n.name), NodeRegistered(node=n.name, inventory=_inventory(n)))
    for co in c.cohorts:
        w.emit(subj.admin("cohort"), ApplyCohort(cohort=co), subj.ADMIN)
    for q in c.queues:
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    for name, (value, preemptible) in CLASSES.items():
        w.priority_class(name, value, preemptible=preemptible)
    return w


def _check(c: Case) -> None:
    w = build(c)
    for i, s in enumerate(c.steps):
        w.wait(s.wait_s)
        for name in s.cordon:
            w.emit(subj.admin("cordon"), CordonNode(node=name), subj.ADMIN)
        for name in s.resume:
            w.emit(subj.admin("cordon"), CordonNode(node=name, cordoned=False), subj.ADMIN)
        for job_id in s.finish:
            w.finish(job_id)
        for j in s.submit:
            w.emit(subj.request("alice", "submit"), SubmitJob(request_id=j.id, job=j.spec()), "alice")
        out = settle(w, rounds=80)
        jobs_ = w.state.jobs
        running = {j for j, job in jobs_.items() if job.phase == "running"}
        rejected = {j.id for j in s.submit if jobs_[j.id].phase == "rejected"}
        got = (sorted(running), sorted(out.stopped), sorted(rejected))
        want = (sorted(s.running), sorted(s.stopped), sorted(s.rejected))
        assert got == want, f"step {i}"
        for j in running:  # a gang runs whole
            job = jobs_[j]
            assert job.admission is not None and job.placement is not None
            assert len(job.placement.workers) == job.admission.replicas


def _case(name: str, c: Case, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(c, id=name, marks=marks)


def ids(q: str, which: range, tag: str = "") -> tuple[str, ...]:
    return tuple(f"{q}{tag}-{i}" for i in which)


# -- YuniKorn ----------------------------------------------------------------------------------------

YUNIKORN_CASES = [
    # Two 5-GPU nodes; child1 (guaranteed 5, max 10) runs two 5-GPU jobs, the second on child2's
    # guarantee; child2 (guaranteed 5) asks for 5: one of child1's, the younger, is stopped, the
    # other is within child1's guarantee.
    _case(
        "TestTryPreemptionOnNode",
        Case(
            f"{YK_PREEMPTION} TestTryPreemptionOnNode",
            nodes(5, 5),
            (cohort("parent", max_=20),),
            (queue("child1", "parent", 5, 10), queue("child2", "parent", 5, 10)),
            (
                Step(jobs("child1", 2, 5), running=("child1-1", "child1-2")),
                Step(jobs("child2", 1, 5), running=("child1-1", "child2-1"), stopped=("child1-2",)),
            ),
        ),
    ),
    # child2's ask of 6 fits no 5-GPU node: YuniKorn finds no victims and leaves it pending;
    # corral rejects at submission a job no node could ever host (DESIGN.md §6 admission).
    _case(
        "TestTryPreemption_NodeWithCapacityLesserThanAsk",
        Case(
            f"{YK_PREEMPTION} TestTryPreemption_NodeWithCapacityLesserThanAsk",
            nodes(5, 5),
            (cohort("parent", max_=20),),
            (queue("child1", "parent", 5, 10), queue("child2", "parent", 6, 10)),
            (
                Step(jobs("child1", 2, 5), running=("child1-1", "child1-2")),
                Step(jobs("child2", 1, 6), running=("child1-1", "child1-2"), rejected=("child2-1",)),
            ),
        ),
    ),
    # The parent (guaranteed 2) is over its guarantee through child1 (none), which runs six
    # 1-GPU jobs on two 3-GPU nodes; child2 (guaranteed 1) asks for 1: one of child1's goes.
    _case(
        "TestTryPreemptionOnNodeWithOGParentAndUGPreemptor",
        Case(
            f"{YK_PREEMPTION} TestTryPreemptionOnNodeWithOGParentAndUGPreemptor",
            nodes(3, 3),
            (cohort("parent", 5, max_=20),),
            (queue("child1", "parent"), queue("child2", "parent", 1, 10)),
            (
                Step(jobs("child1", 6), running=ids("child1", range(1, 7))),
                Step(
                    jobs("child2", 1),
                    running=ids("child1", range(1, 6)) + ("child2-1",),
                    stopped=("child1-6",),
                ),
            ),
        ),
    ),
    # The parent's max (18) binds, not the nodes: child1 (no guarantee) runs two 5-GPU jobs,
    # child3 (none) one of priority 1000; child2 (guaranteed 15) asks for 10. The two
    # lower-priority jobs go; the high-priority one is left alone.
    _case(
        "TestTryPreemption_OnQueue_VictimsAvailable_LowerPriority",
        Case(
            f"{YK_PREEMPTION} TestTryPreemption_OnQueue_VictimsAvailable_LowerPriority",
            nodes(30, 30),
            (cohort("parent", 3, max_=18),),
            (queue("child1", "parent"), queue("child2", "parent", 15), queue("child3", "parent")),
            (
                Step(
                    jobs("child1", 2, 5, "low") + jobs("child3", 1, 5, "high"),
                    running=("child1-1", "child1-2", "child3-1"),
                ),
                Step(
                    jobs("child2", 1, 10, "low"),
                    running=("child2-1", "child3-1"),
                    stopped=("child1-1", "child1-2"),
                ),
            ),
        ),
    ),
    # parent1 (guaranteed 10) on a 2-GPU node; neither child has a guarantee. child1 runs two
    # jobs; child2's ask may not stop them: both children only use the parent's share, and
    # taking from one to give the other would loop.
    _case(
        "TestTryPreemption_OnNode_UGParent_With_GNotSetOnBothChilds",
        Case(
            f"{YK_PREEMPTION} TestTryPreemption_OnNode_UGParent_With_GNotSetOnBothChilds",
            nodes(2),
            (cohort("parent1", 2),),
            (queue("child1", "parent1"), queue("child2", "parent1")),
            (
                Step(jobs("child1", 2), running=("child1-1", "child1-2")),
                Step(jobs("child2", 1), running=("child1-1", "child1-2")),
            ),
        ),
    ),
    _case(
        "TestTryPreemption_OnNode_UGParent_With_UGPreemptorChild_GNotSetOnVictimChild_As_Siblings",
        Case(
            YK_PREEMPTION,  # the function its id names
            nodes(2),
            (cohort("parent1", 1),),
            (queue("child1", "parent1"), queue("child2", "parent1", 1)),
            (
                Step(jobs("child1", 2), running=("child1-1", "child1-2")),
                Step(jobs("child2", 1), running=("child1-1", "child2-1"), stopped=("child1-2",)),
            ),
        ),
    ),
    _case(
        "TestTryPreemption_OnNode_UGParent_With_UGPreemptorChild_OGVictimChild_As_Siblings",
        Case(
            YK_PREEMPTION,  # the function its id names
            nodes(2),
            (cohort("parent1"),),
            (queue("child1", "parent1", 1), queue("child2", "parent1", 1)),
            (
                Step(jobs("child1", 2), running=("child1-1", "child1-2")),
                Step(jobs("child2", 1), running=("child1-1", "child2-1"), stopped=("child1-2",)),
            ),
        ),
    ),
    # Two nodes of 10 (YuniKorn's memory binds at 10 asks a node), two leaves with no guarantee,
    # 20 asks each, all of leaf1's first: they end up 10 and 10.
    _case(
        "TestFairnessAllocationForQueues",
        Case(
            f"{YK_SMOKE} TestFairnessAllocationForQueues",
            nodes(10, 10),
            (CohortSpec("root", quotas={ANY: Quota(20)}, share_own_quota=True),),
            (queue("leaf1", "root"), queue("leaf2", "root")),
            (
                Step(
                    jobs("leaf1", 20) + jobs("leaf2", 20),
                    running=ids("leaf1", range(1, 11)) + ids("leaf2", range(1, 11)),
                ),
            ),
        ),
    ),
    # A 15-GPU node, a leaf of max 10, 12 asks: 10 run; once they are released the other 2 do.
    _case(
        "TestSchedulingOverMaxCapacity-scheduleOverLeafQueueCapacity",
        Case(
            f"{YK_SMOKE} TestSchedulingOverMaxCapacity scheduleOverLeafQueueCapacity",
            nodes(15),
            (cohort("root", 15),),
            (queue("default", "root", 0, 10),),
            (
                Step(jobs("default", 12), running=ids("default", range(1, 11))),
                Step(finish=ids("default", range(1, 11)), running=("default-11", "default-12")),
            ),
        ),
    ),
    # The same under a parent of max 10 over two leaves with no max of their own.
    _case(
        "TestSchedulingOverMaxCapacity-scheduleOverParentQueueCapacity",
        Case(
            f"{YK_SMOKE} TestSchedulingOverMaxCapacity scheduleOverParentQueueCapacity",
            nodes(15),
            (cohort("root", 15), cohort("parent", parent="root", max_=10)),
            (queue("child-1", "parent"), queue("child-2", "parent")),
            (
                Step(jobs("child-1", 12), running=ids("child-1", range(1, 11))),
                Step(finish=ids("child-1", range(1, 11)), running=("child-1-11", "child-1-12")),
            ),
        ),
    ),
]


@pytest.mark.parametrize("c", YUNIKORN_CASES)
def test_yunikorn(c: Case) -> None:
    _check(c)


# -- Slurm -------------------------------------------------------------------------------------------


def slurm(*gpus: int) -> tuple[tuple[CohortSpec, ...], tuple[QueueSpec, ...]]:
    """Slurm has no quota: one queue holds every GPU of the cluster."""
    return (), (QueueSpec("batch", quotas={ANY: Quota(sum(gpus))}),)


def job(job_id: str, gpus: int, priority: str = "normal-np", **kw: object) -> Job:
    return Job(job_id, "batch", gpus, priority, **kw)  # type: ignore[arg-type]


SLURM_CASES = [
    # One 8-GPU node. R runs on 6 for an hour; H (higher priority) needs all 8 and is reserved the
    # node for when R ends. Of the lower-priority jobs behind it, the one whose time limit ends
    # before then starts at once; the ones that would run past it (or have no limit) wait.
    _case(
        "backfill-does-not-delay-the-reservation",
        Case(
            SLURM_BACKFILL,
            nodes(8),
            *slurm(8),
            (
                Step((job("R", 6, est=HOUR),), running=("R",)),
                Step(
                    (
                        job("H", 8, "high-np", est=HOUR),
                        job("short", 2, "low-np", est=HOUR / 4),
                        job("long", 2, "low-np", est=4 * HOUR),
                        job("untimed", 2, "low-np"),
                    ),
                    running=("R", "short"),
                ),
            ),
        ),
    ),
    # Two nodes: R holds n0 for an hour, S half of n1 for two. H, needing a whole node, is reserved
    # n0 for when R ends; a long job on n1's free half delays nobody, and starts. With the queue's
    # nominal the cluster's GPUs, admission's hold for H answers as the placer's reservation does
    # (DESIGN.md §6 admission: it leaves H its room once R ends).
    _case(
        "backfill-on-nodes-the-reservation-does-not-need",
        Case(
            SLURM_BACKFILL,
            nodes(8, 8),
            *slurm(8, 8),
            (
                Step((job("R", 8, est=HOUR), job("S", 4, est=2 * HOUR)), running=("R", "S")),
                Step(
                    (job("H", 8, "high-np", est=HOUR), job("long", 4, "low-np", est=10 * HOUR)),
                    running=("R", "S", "long"),
                ),
            ),
        ),
    ),
    # Corral differs on purpose: a preemptible job of lower priority than the reserved one may use
    # the reserved GPUs whatever its time limit, since the reserved job may stop it when they
    # free (DESIGN.md §6 placer, "backfills smaller jobs that will finish before it, or that are
    # preemptible and of a lower priority than it"). Slurm would hold it back.
    _case(
        "backfill-of-a-preemptible-job-past-the-reservation",
        Case(
            SLURM_BACKFILL,
            nodes(8),
            *slurm(8),
            (
                Step((job("R", 6, est=HOUR),), running=("R",)),
                Step(
                    (job("H", 8, "high-np", est=HOUR), job("long", 2, "low", est=4 * HOUR)),
                    running=("R", "long"),
                ),
            ),
        ),
    ),
    # PreemptMode=REQUEUE: a job of a higher PriorityTier partition stops the lower one's job,
    # which is requeued and runs again once the node is free.
    _case(
        "partition-priority-preempts-and-requeues",
        Case(
            SLURM_PREEMPT,
            nodes(8),
            *slurm(8),
            (
                Step((job("L", 8, "low"),), running=("L",)),
                Step((job("H", 8, "high-np"),), running=("H",), stopped=("L",)),
                Step(finish=("H",), running=("L",)),
            ),
        ),
    ),
    # PreemptMode=OFF on the lower partition: its jobs are never preempted; the higher waits.
    _case(
        "preempt-mode-off-is-never-preempted",
        Case(
            SLURM_PREEMPT,
            nodes(8),
            *slurm(8),
            (
                Step((job("L", 8, "low-np"),), running=("L",)),
                Step((job("H", 8, "high-np"),), running=("L",)),
                Step(finish=("L",), running=("H",)),
            ),
        ),
    ),
    # partition_prio preempts only across PriorityTiers: partitions of the same tier do not.
    _case(
        "same-priority-tier-does-not-preempt",
        Case(
            SLURM_PREEMPT,
            nodes(8),
            *slurm(8),
            (
                Step((job("A", 8, "normal"),), running=("A",)),
                Step((job("B", 8, "normal"),), running=("A",)),
            ),
        ),
    ),
    # --nodes=2 --exclusive: the job's nodes are allocated together or not at all.
    _case(
        "multi-node-job-starts-whole",
        Case(
            f"{SLURM_SBATCH} --nodes",
            nodes(8, 8),
            *slurm(8, 8),
            (
                Step((job("R", 4),), running=("R",)),
                Step((job("G", 8, replicas=2),), running=("R",)),
                Step(finish=("R",), running=("G",)),
            ),
        ),
    ),
    # --constraint: a job runs only on nodes with the feature; a feature no node has is refused at
    # submission (sbatch: "Requested node configuration is not available").
    _case(
        "constraint-selects-nodes",
        Case(
            f"{SLURM_SBATCH} --constraint",
            (Node("n0", 8), Node("n1", 8, {"feature": "ib"})),
            *slurm(8, 8),
            (
                Step(
                    (
                        job("ib", 8, selector={"feature": "ib"}),
                        job("ib2", 8, selector={"feature": "ib"}),
                        job("nvme", 1, selector={"feature": "nvme"}),
                    ),
                    running=("ib",),
                    rejected=("nvme",),
                ),
            ),
        ),
    ),
    # A drained node takes no new job, its running jobs run on; once resumed it takes work again.
    _case(
        "drained-node-takes-no-new-work",
        Case(
            SLURM_DRAIN,
            nodes(8, 8, 8),
            *slurm(8, 8, 8),
            (
                Step(cordon=("n0",), submit=(job("J1", 8), job("J2", 8), job("J3", 8)), running=("J1", "J2")),
                Step(cordon=("n1", "n2"), running=("J1", "J2")),
                Step(resume=("n0",), running=("J1", "J2", "J3")),
            ),
        ),
    ),
]


@pytest.mark.parametrize("c", SLURM_CASES)
def test_slurm(c: Case) -> None:
    _check(c)
