"""Volcano's scheduler action tables, as corral's whole chain answers them.

The cases follow the table-driven tests of Volcano's actions (volcano-sh/volcano):
``pkg/scheduler/actions/allocate/allocate_test.go`` (``TestAllocate``, ``TestFareShareAllocate``,
``TestAllocateWithNetWorkTopologies``), ``pkg/scheduler/actions/preempt/preempt_test.go``
(``TestPreempt``, ``TestTopologyAwarePreempt``, ``TestNormalPreemptRechecksPredicateAfterEviction``)
and ``pkg/scheduler/actions/reclaim/reclaim_test.go`` (``TestReclaim``). Each case carries
Volcano's name, which its test id spells, and cites its file and test function. Each asks what
corral does on the cluster state of the case: which waiting jobs end up placed, which running jobs
are stopped (by checkpoint) for them, and which are rejected at submission.

Translation.

- Resources. Volcano's CPUs are GPUs, one for one, unless a case says it scales them (a queue's
  share must come out a whole number of GPUs: corral's quota is whole GPUs). Memory is left out:
  no kept case depends on it. Nodes have one GPU per Volcano CPU and CPU and memory to spare, so
  only GPUs bind.
- Queues. All queues of a case sit in one cohort, so a queue's idle quota is lent to the others,
  as Volcano's proportion plugin hands a queue's unused share to queues that ask for more. A
  queue's nominal quota is its weight's share of the cluster's GPUs, or its ``deserved`` where
  Volcano gives one; ``capability`` caps the nominal and is nominal plus borrowing limit. The
  preemption fields are corral's defaults (stop lower priorities within the queue, take back any
  lent quota, stop lower-priority borrowers when borrowing) unless a case says otherwise.
- Jobs. A PodGroup whose ``minMember`` is its pod count is a gang: one job with that many
  replicas, placed whole or not at all. One whose ``minMember`` is below its pod count is an
  elastic job (``min_replicas`` the larger of ``minMember`` and 1) where its pods are alike ("do
  not preempt if job is pipelined", "two Jobs on one node, as elastic jobs"). Where its pods
  differ (a corral job has one ``preemptible`` flag and one priority; Volcano's pods each have
  their own ``preemptable`` annotation and may have their own priority), or ``minMember`` is 0
  or 1 and the case is about single pods, each pod is a job of its own: Volcano schedules and
  evicts such a group's pods one by one. Volcano's priority classes are corral priority classes
  of the same values; a PodGroup naming a class the case does not define has priority 0.
- Running pods are jobs admitted and placed on the named node before the case starts, in the
  table's order; pending pods are jobs submitted after them, in the table's order, and judged by
  admission as any submission is.
- Outcomes. Volcano runs one action in one session; corral runs admission, the placer and the
  preemptor until none of them has anything to add, the simulated agents starting what is placed
  and stopping, once checkpointed, what is preempted. Volcano's "evicted" is a job corral stops;
  "bound" (by allocate, or after the eviction that made room) is a job corral places. Where
  Volcano's preempt or reclaim action evicts and leaves binding to the next allocate, corral's
  chain places the beneficiary on what was freed, which the case checks too.

Cases left out, and why:

- Task roles with their own minimum members (``minTaskMember``), which a corral job cannot
  express (a job has one worker shape; a gang has one minimum): "prepredicate failed and tasks
  are not used up, continue on until min member meet", "master's min member can not be
  allocated, break from allocating" (``TestAllocate``).
- Kubernetes objects corral does not have: ``TestAllocateWithPVC`` (volumes),
  ``TestAllocateWithDRA`` (dynamic resource claims); "preempt low-priority pod when high-priority
  pod has PodAntiAffinity conflict" (pod anti-affinity; ``TestTopologyAwarePreempt``).
- Best-effort pods, which ask for nothing and are bounded only by a node's pod count:
  "unBestEffort high-priority pod preempt BestEffort low-priority pod in same queue", "BestEffort
  high-priority pod preempt BestEffort low-priority pod in same queue" (``TestPreempt``,
  ``TestTopologyAwarePreempt``), and ``TestPickUpPendingTasks`` of
  ``pkg/scheduler/actions/backfill/backfill_test.go`` (the order Volcano's backfill takes
  best-effort pods in; corral's backfill is the placer's reservation, covered elsewhere).
- Queue priority (``Queue.spec.priority``), which orders reclaim victims in Volcano; corral queues
  have none: "sort reclaimees when reclaiming from overusing queues with different queue
  priority", "Node available resources should be included in reclaimed resources" (which also
  binds on memory) (``TestReclaim``).
- Closed queues (a queue may be open or deleted in corral, never closed with jobs in it): "can
  not reclaim resources when queue is not open(proportion plugin)" and "...(capacity plugin)".
- A preemption policy per pod within one job (corral's is per queue): "Reclaim succeeds for
  second task when first task has PreemptionPolicy=Never" (``TestReclaim``).
- A queue whose pods that may not be evicted hold more than its share: corral admits a job that
  may not be preempted only within its queue's nominal quota, so the state cannot arise: "Two
  Queue with one Queue overusing resource, should reclaim" (``TestReclaim``).
- Duplicates: ``TestTopologyAwarePreempt`` reruns ``TestPreempt``'s cases under Volcano's
  topology-aware preemption mode, with the same names and outcomes; corral has one search, so
  each is kept once (from ``TestPreempt``), and of that function only "preemption with priority
  queues" is new. The benchmark fixture (``newNormalPreemptBenchmarkFixture``) is the device-fit
  case again.
- Node-level scoring and placement internals, which pick nodes rather than decide who runs:
  ``TestNodeLevelScoreWithNetWorkTopologies``, ``TestHyperNodeBinpackWithNetWorkTopologies``,
  ``TestAllocateWithPartitionPolicyNetworkTopology`` (sub-group partitions of a job),
  the worksheet and nomination unit tests (``TestWorksheet*``, ``TestInvalidateSubJobNomination``,
  ``TestAllocateFromNomination_*``, ``TestValidateNomination_MissBranches``,
  ``TestAllocate_FlatPathHonorsAndClearsNomination``), and of ``TestAllocateWithNetWorkTopologies``
  the cases about a job's tasks rescheduled into the hyperNode they ran in, three-tier trees and
  node affinity among hyperNodes (corral packs a gang in one rack or block by node labels; it has
  no memory of where a job ran and no tier limit beyond that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.events import subjects as subj
from corral.events.base import Event
from corral.events.decisions import GpuClaim, PreemptionRequested, ShrinkRequested
from corral.events.jobs import JobSpec, Resources, SubmitJob, Topology, TopologyPack
from corral.events.nodes import GpuInfo, NodeInventory, NodeRegistered, WorkerExited
from corral.events.queues import (
    ApplyQueue,
    BorrowWithinCohort,
    PreemptionPolicy,
    QueueSpec,
    Quota,
    ReclaimWithinCohort,
    WithinQueue,
)
from corral.projections.quota import ANY
from corral.projections.state import State
from corral.services.admission.decide import decide as admission
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import decide as preemptor
from tests.builders import TRAIN
from tests.unit.test_preemptor import World

ALLOCATE = "pkg/scheduler/actions/allocate/allocate_test.go"
PREEMPT = "pkg/scheduler/actions/preempt/preempt_test.go"
RECLAIM = "pkg/scheduler/actions/reclaim/reclaim_test.go"

COHORT = "volcano"

# The priority classes of Volcano's preempt tests, and of its reclaim tests.
PREEMPT_CLASSES = {"low-priority": 10, "high-priority": 100000}
RECLAIM_CLASSES = {"low-priority": 100, "mid-priority": 500, "high-priority": 1000}


# -- the case's vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int
    labels: dict[str, str] = field(default_factory=dict)


def node(name: str, gpus: int, **labels: str) -> Node:
    return Node(name, gpus, labels)


def queue(
    name: str,
    nominal: int,
    capability: int | None = None,
    *,
    within: WithinQueue = "lower-priority",
    reclaim: ReclaimWithinCohort = "any",
    borrow: BorrowWithinCohort = "lower-priority",
) -> QueueSpec:
    """A Volcano queue: ``nominal`` its share (weight or ``deserved``) in GPUs, ``capability``
    the most it may hold."""
    limit = None if capability is None else capability - nominal
    policy = PreemptionPolicy(within_queue=within, reclaim_within_cohort=reclaim, borrow_within_cohort=borrow)
    quotas = {ANY: Quota(nominal, borrowing_limit=limit)}
    return QueueSpec(name, cohort=COHORT, quotas=quotas, preemption=policy)


@dataclass(frozen=True)
class Job:
    """A pod (or a gang of them): ``gpus`` per worker; ``on``: the node of each running worker,
    empty for a pending job."""

    id: str
    queue: str
    gpus: int
    priority: str = "normal"
    preemptible: bool = True
    replicas: int = 1
    min_replicas: int | None = None
    on: tuple[str, ...] = ()
    selector: dict[str, str] = field(default_factory=dict)
    pack: TopologyPack = "none"
    required: bool = False

    def spec(self) -> JobSpec:
        return JobSpec(
            queue=self.queue,
            priority_class=self.priority,
            replicas=self.replicas,
            min_replicas=self.min_replicas,
            resources=Resources(gpus=self.gpus),
            topology=Topology(pack=self.pack, required=self.required),
            preemptible=self.preemptible,
            checkpointable=True,
            node_selector=self.selector,
            command=TRAIN,
        )


def running(
    job_id: str, q: str, gpus: int, on: str, prio: str = "normal", *, preemptible: bool = True
) -> Job:
    return Job(job_id, q, gpus, prio, preemptible, on=(on,))


def pending(job_id: str, q: str, gpus: int, prio: str = "normal", **kw: Any) -> Job:
    return Job(job_id, q, gpus, prio, **kw)


@dataclass(frozen=True)
class Case:
    """One Volcano table case: ``placed``, the pending jobs that end up running; ``stopped``,
    the running jobs stopped for them; ``rejected``, the pending jobs refused at submission
    (Volcano leaves them pending)."""

    source: str
    nodes: tuple[Node, ...]
    queues: tuple[QueueSpec, ...]
    jobs: tuple[Job, ...]
    placed: frozenset[str] = frozenset()
    stopped: frozenset[str] = frozenset()
    rejected: frozenset[str] = frozenset()
    classes: dict[str, int] = field(default_factory=dict)
    # Replicas an elastic job ends up admitted with, where that is the point of the case.
    replicas: dict[str, int] = field(default_factory=dict)
    # Elastic jobs that give up ranks (a shrink, not a stop); None: not the point of the case.
    shrunk: frozenset[str] | None = frozenset()


def case(
    source: str,
    nodes: tuple[Node, ...],
    queues: tuple[QueueSpec, ...],
    *jobs: Job,
    placed: tuple[str, ...] = (),
    stopped: tuple[str, ...] = (),
    rejected: tuple[str, ...] = (),
    classes: dict[str, int] | None = None,
    replicas: dict[str, int] | None = None,
    shrunk: tuple[str, ...] | None = (),
) -> Case:
    return Case(
        source,
        nodes,
        queues,
        jobs,
        frozenset(placed),
        frozenset(stopped),
        frozenset(rejected),
        dict(classes or {}),
        dict(replicas or {}),
        None if shrunk is None else frozenset(shrunk),
    )


# -- the world and the chain -------------------------------------------------------------------------


def _inventory(n: Node) -> NodeInventory:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{n.name}-{i:02d}", model="H100-80GB", memory_mib=81_559)
        for i in range(n.gpus)
    )
    # CPU and memory to spare: only GPUs bind, as only CPUs bind in Volcano's cases.
    spare = max(1, n.gpus)
    return NodeInventory(cpu_milli=spare * 64_000, memory_mib=spare * 512 * 1024, gpus=gpus, labels=n.labels)


def build(c: Case) -> World:
    w = World(nodes=0)
    for n in c.nodes:
        w.emit(subj.node(n.name), NodeRegistered(node=n.name, inventory=_inventory(n)))
    w.cohort(COHORT)
    for q in c.queues:
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    for name, value in c.classes.items():
        w.priority_class(name, value)
    free = {n.name: 0 for n in c.nodes}  # the next free GPU of each node
    for j in c.jobs:
        if not j.on:
            continue
        workers = []
        for name in j.on:
            claims = tuple(GpuClaim(free[name] + i) for i in range(j.gpus))
            free[name] += j.gpus
            workers.append((name, claims))
        # An elastic job may run below its most workers: admitted at the size it runs at.
        w.submit(j.id, j.spec(), c.classes.get(j.priority, 0)).admit(j.id, len(workers))
        w.place(j.id, *workers).start(j.id)
    for j in c.jobs:
        if not j.on:
            w.emit(subj.request("alice", "submit"), SubmitJob(request_id=j.id, job=j.spec()), "alice")
    return w


@dataclass
class Outcome:
    stopped: set[str] = field(default_factory=set)
    shrunk: set[str] = field(default_factory=set)


ROLES: tuple[Callable[[State, float], list[Event]], ...] = (
    lambda s, now: admission(s, now),
    lambda s, now: placer(s, now),
    lambda s, now: preemptor(s, now),
)


def settle(w: World, rounds: int = 40) -> Outcome:
    """Admission, placer and preemptor decide in turn, and the agents act on what the fold
    accepted, until nobody has anything to add. Every proposal must be folded (World.emit fails
    on a void or refused record)."""
    out = Outcome()
    for _ in range(rounds):
        moved = False
        for role in ROLES:
            events = w.cycle(role)
            moved = moved or bool(events)
            for e in events:
                if isinstance(e, PreemptionRequested):
                    out.stopped.update(v.job_id for v in e.victims)
                elif isinstance(e, ShrinkRequested):
                    out.shrunk.add(e.job_id)
        # The agents: a placed gang starts; a job asked to checkpoint saves and stops; the ranks
        # a shrink took away exit.
        for job in list(w.state.jobs.values()):
            if job.phase == "placed":
                w.start(job.id)
                moved = True
            elif job.phase == "checkpointing":
                w.wait(5.0)
                w.checkpoint(job.id, 1)
                w.stop(job.id)
                moved = True
            elif job.leaving:
                assert job.placement is not None
                for wk in job.placement.workers:
                    if wk.rank in job.leaving:
                        body = WorkerExited(
                            node=wk.node,
                            job_id=job.id,
                            attempt=job.attempt,
                            rank=wk.rank,
                            code=0,
                            stopped=True,
                        )
                        w.emit(subj.node(wk.node), body)
                moved = True
        if not moved:
            return out
        w.wait(1.0)
    raise AssertionError(f"the chain did not settle in {rounds} rounds")


def _check(c: Case) -> None:
    w = build(c)
    out = settle(w)
    jobs = w.state.jobs
    waiting = [j.id for j in c.jobs if not j.on]
    placed = {j for j in waiting if jobs[j].phase == "running"}
    rejected = {j for j in waiting if jobs[j].phase == "rejected"}
    assert (placed, out.stopped, rejected) == (c.placed, c.stopped, c.rejected)
    if c.shrunk is not None:
        assert out.shrunk == c.shrunk
    # A gang runs whole: every worker its admission counts holds its GPUs.
    for j in placed:
        job = jobs[j]
        assert job.admission is not None and job.placement is not None
        assert len(job.placement.workers) == job.admission.replicas
    for j, n in c.replicas.items():
        held = jobs[j].admission
        assert held is not None and held.replicas == n, (j, held)
    # A gang that must sit in one rack (or block) sits in one.
    labels = {n.name: n.labels for n in c.nodes}
    for j in c.jobs:
        if j.id in placed and j.required and j.pack in ("rack", "block"):
            workers = jobs[j.id].placement.workers  # type: ignore[union-attr]
            assert len({labels[wk.node][j.pack] for wk in workers}) == 1, workers
    # Whoever was not stopped still runs.
    for j in c.jobs:
        if j.on and j.id not in c.stopped:
            assert jobs[j.id].phase == "running", (j.id, jobs[j.id].phase)


def _id(name: str) -> str:
    return name.replace(" ", "-").replace(",", "").replace(":", "").replace("'", "")


def _case(name: str, c: Case, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(c, id=_id(name), marks=marks)


# -- allocate ----------------------------------------------------------------------------------------

ALLOCATE_CASES = [
    # pg1 (minMember 1) schedules its pods one by one; p1 asks for a node role no node has.
    # Volcano binds p2 and leaves p1 pending; corral places p2 and rejects p1 at submission, as
    # it does any job no node could ever host (README, "A job no node could ever host ...").
    _case(
        "prepredicate failed: node selector does not match",
        case(
            f"{ALLOCATE} TestAllocate",
            (node("n1", 2, nodeRole="worker"),),
            (queue("c1", 2),),
            pending("p1", "c1", 1, selector={"nodeRole": "master"}),
            pending("p2", "c1", 1, selector={"nodeRole": "worker"}),
            placed=("p2",),
            rejected=("p1",),
        ),
    ),
    _case(
        "one Job with two Pods on one node",
        case(
            f"{ALLOCATE} TestAllocate",
            (node("n1", 2),),
            (queue("c1", 2),),
            pending("p1", "c1", 1),
            pending("p2", "c1", 1),
            placed=("p1", "p2"),
        ),
    ),
    # Two queues of weight 1 share a 2-GPU node: one GPU each. Each queue's first pod is within
    # its share; the second would borrow the other's, which that queue's own first pod needs.
    _case(
        "two Jobs on one node",
        case(
            f"{ALLOCATE} TestAllocate",
            (node("n1", 2),),
            (queue("c1", 1), queue("c2", 1)),
            pending("pg1-p-1", "c1", 1),
            pending("pg1-p-2", "c1", 1),
            pending("pg2-p-1", "c2", 1),
            pending("pg2-p-2", "c2", 1),
            placed=("pg1-p-1", "pg2-p-1"),
        ),
    ),
    # The same PodGroups as elastic jobs of 1 to 2 workers (minMember 0 < 2 pods). Volcano binds
    # one pod of each. Corral's admission keeps each queue's free nominal for its first job's
    # minimum before anyone borrows, so neither is admitted at 2 into the other's GPU (which
    # the other would then take back by stopping it, and never be stopped for in turn).
    _case(
        "two Jobs on one node, as elastic jobs",
        case(
            f"{ALLOCATE} TestAllocate",
            (node("n1", 2),),
            (queue("c1", 1), queue("c2", 1)),
            pending("pg1", "c1", 1, replicas=2, min_replicas=1),
            pending("pg2", "c2", 1, replicas=2, min_replicas=1),
            placed=("pg1", "pg2"),
            replicas={"pg1": 1, "pg2": 1},
            shrunk=None,
        ),
    ),
    # p1 (3 GPUs) can never fit the 2-GPU node: Volcano skips it and binds p2; corral rejects it
    # at submission (README, as above) and places p2.
    _case(
        "high priority queue should not block others",
        case(
            f"{ALLOCATE} TestAllocate",
            (node("n1", 2),),
            (queue("c1", 1), queue("c2", 1)),
            pending("p1", "c1", 3),
            pending("p2", "c2", 1),
            placed=("p2",),
            rejected=("p1",),
        ),
    ),
    # TestFareShareAllocate: two queues of weight 1 on a 5-CPU node, so GPUs are CPUs times two
    # (a share of 5 GPUs each). q-1 already holds 2; both waiting jobs would borrow, and the
    # queue that holds less (q-2) goes first. Its 6 leave 2 free, too few for q-1's 4.
    _case(
        "queue with low DRF share value has high priority, should allocate first",
        case(
            f"{ALLOCATE} TestFareShareAllocate",
            (node("node-1", 10),),
            (queue("q-1", 5), queue("q-2", 5)),
            running("pod-small-1", "q-1", 2, "node-1"),
            pending("pod-large-1", "q-1", 4),
            pending("pod-large-2", "q-2", 6),
            placed=("pod-large-2",),
        ),
    ),
    # The same cluster: q-2's 4 is within its share and goes first; then q-1 (holding 2) and
    # q-2 (holding 4) each have a job that would borrow, and q-1, now holding less, goes next:
    # the node is full and pod-small-2 waits.
    _case(
        "queue's DRF share value will be updated and its priority will change before it is put back "
        "into the priority queue",
        case(
            f"{ALLOCATE} TestFareShareAllocate",
            (node("node-1", 10),),
            (queue("q-1", 5), queue("q-2", 5)),
            running("pod-small-1", "q-1", 2, "node-1"),
            pending("pod-large-1", "q-1", 4),
            pending("pod-large-2", "q-2", 4),
            pending("pod-small-2", "q-2", 2),
            placed=("pod-large-1", "pod-large-2"),
        ),
    ),
    _case(
        "queue's one jobs has no pending tasks, should be put back to queues for next job",
        case(
            f"{ALLOCATE} TestFareShareAllocate",
            (node("node-1", 5),),
            (queue("q-1", 5),),
            running("pod-1", "q-1", 1, "node-1"),
            pending("pod-2", "q-1", 2),
            placed=("pod-2",),
        ),
    ),
]

# TestAllocateWithNetWorkTopologies: four 2-GPU nodes; hyperNodes s0 and s1 (tier 1) are racks
# of two nodes each, s2 (tier 2) the block holding both. A soft constraint is a preferred pack,
# a hard one with highestTierAllowed 1 a required rack, 2 a required block. The pods of the
# PodGroup are one job: a gang where minMember is the pod count, else elastic.
RACKS = (
    node("s0-n1", 2, rack="s0", block="s2"),
    node("s0-n2", 2, rack="s0", block="s2"),
    node("s1-n3", 2, rack="s1", block="s2"),
    node("s1-n4", 2, rack="s1", block="s2"),
)
TOPOLOGY = f"{ALLOCATE} TestAllocateWithNetWorkTopologies"

TOPOLOGY_CASES = [
    _case(
        "soft network topology constrain, can allocate job when resources are enough",
        case(
            TOPOLOGY,
            RACKS,
            (queue("q1", 8),),
            pending("pg1", "q1", 2, replicas=3, pack="rack"),
            placed=("pg1",),
        ),
    ),
    _case(
        "soft network topology constrain, can allocate job when minavailable < replicas",
        case(
            TOPOLOGY,
            RACKS,
            (queue("q1", 8),),
            pending("pg1", "q1", 2, replicas=2, min_replicas=1, pack="rack"),
            placed=("pg1",),
            replicas={"pg1": 2},
        ),
    ),
    # Three 2-GPU pods within one rack of 4 GPUs: Volcano binds none; corral rejects the gang
    # at submission, as one no rack could ever hold (README, "A job no node could ever host").
    _case(
        "hard network topology constrain, can not allocate job when cross highestTierAllowed tier",
        case(
            TOPOLOGY,
            RACKS,
            (queue("q1", 8),),
            pending("pg1", "q1", 2, replicas=3, pack="rack", required=True),
            rejected=("pg1",),
        ),
    ),
    _case(
        "hard network topology constrain, can allocate job when highestTierAllowed not reached",
        case(
            TOPOLOGY,
            RACKS,
            (queue("q1", 8),),
            pending("pg1", "q1", 2, replicas=3, pack="block", required=True),
            placed=("pg1",),
        ),
    ),
    _case(
        "hard network topology constrain, can allocate job when minavailable < replicas",
        case(
            TOPOLOGY,
            RACKS,
            (queue("q1", 8),),
            pending("pg1", "q1", 2, replicas=2, min_replicas=1, pack="rack", required=True),
            placed=("pg1",),
            replicas={"pg1": 2},
        ),
    ),
]


@pytest.mark.parametrize("c", ALLOCATE_CASES + TOPOLOGY_CASES)
def test_volcano_allocate(c: Case) -> None:
    _check(c)


# -- preempt -----------------------------------------------------------------------------------------

PREEMPT_CASES = [
    # pg1's pods, two running and one pending, are three jobs (a corral gang never runs in
    # part). There is room: nothing is stopped, and the pending one is placed.
    _case(
        "do not preempt if there are enough idle resources",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 10),),
            (queue("q1", 10),),
            running("preemptee1", "q1", 1, "n1"),
            running("preemptee2", "q1", 1, "n1"),
            pending("preemptor1", "q1", 1),
            placed=("preemptor1",),
        ),
    ),
    # pg1 and pg2 (minMember 1, two pods each, all alike) are elastic jobs of 1 to 2 workers;
    # pg1 runs both, pg2 one (preemptee3) and waits to grow into preemptor2's. The node is full
    # and pg2 has its minimum: it stays at one worker, and nobody is stopped or shrunk.
    _case(
        "do not preempt if job is pipelined",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 3),),
            (queue("q1", 3),),
            Job("pg1", "q1", 1, replicas=2, min_replicas=1, on=("n1", "n1")),
            Job("pg2", "q1", 1, replicas=2, min_replicas=1, on=("n1",)),
            replicas={"pg1": 2, "pg2": 1},
        ),
    ),
    # preemptee2 is not preemptible, so only one of the two high-priority pods gets a GPU.
    _case(
        "preempt one task of different job to fit both jobs on one node",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 2),),
            (queue("q1", 2),),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            running("preemptee2", "q1", 1, "n1", "low-priority", preemptible=False),
            pending("preemptor1", "q1", 1, "high-priority"),
            pending("preemptor2", "q1", 1, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    _case(
        "preempt enough tasks to fit large task of different job",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 6),),
            (queue("q1", 6),),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            running("preemptee2", "q1", 1, "n1", "low-priority"),
            running("preemptee3", "q1", 1, "n1", "low-priority", preemptible=False),
            pending("preemptor1", "q1", 5, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee1", "preemptee2"),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # The queue's capability (4 of the node's 12) is what blocks, not the node.
    _case(
        "preempt low priority job in same queue",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 12),),
            (queue("q1", 4, 4),),
            running("preemptee1", "q1", 3, "n1", "low-priority"),
            pending("preemptor1", "q1", 3, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    _case(
        "preempt low priority job in same queue: allocatable and has enough resource, don't preempt",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 12),),
            (queue("q1", 6, 6),),
            running("preemptee1", "q1", 3, "n1", "low-priority"),
            pending("preemptor1", "q1", 3, "high-priority"),
            placed=("preemptor1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # preemptee3 runs at the preemptor's own priority (its pod's priority class), preemptee1 is
    # not preemptible: preemptee2 is the only candidate.
    _case(
        "preempt low priority job in same queue but not pod with preemptable=false or higher priority",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 12),),
            (queue("q1", 3, 3),),
            running("preemptee1", "q1", 1, "n1", "low-priority", preemptible=False),
            running("preemptee2", "q1", 1, "n1", "low-priority"),
            running("preemptee3", "q1", 1, "n1", "high-priority"),
            pending("preemptor1", "q1", 1, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee2",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # The preemptor's pod says PreemptionPolicy Never; corral has no such setting per job, and
    # its queue's ``within_queue = "never"`` says the same for the queue's jobs.
    _case(
        "can not preempt resources when task preemption policy is never",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 1),),
            (queue("q1", 1, within="never"),),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            pending("preemptor1", "q1", 1, "high-priority"),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # 4 GPUs in a queue whose capability is 3 can never be had: Volcano evicts nothing; corral
    # rejects the job at submission (README: "more GPUs than the quota can ever give").
    _case(
        "rollback evictions when preemptor exceeds queue capacity after evicting victims",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 10),),
            (queue("q1", 3, 3),),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            running("preemptee2", "q1", 1, "n1", "low-priority"),
            pending("preemptor1", "q1", 4, "high-priority"),
            rejected=("preemptor1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # The queue (capability 6) holds 5 and the preemptor asks 3: 2 must be freed. preemptee1 (1,
    # on n1) is not enough; preemptee2 (4, on n2) is, and alone.
    _case(
        "only commit evictions on the node where preemption succeeds",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 3), node("n2", 4)),
            (queue("q1", 6, 6),),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            running("preemptee2", "q1", 4, "n2", "low-priority"),
            pending("preemptor1", "q1", 3, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee2",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # q1 and q2 (weight 1 each, q2 capped at 4) share a 2-GPU node; q1's job is within q1's
    # share, so only q2's own lower-priority job may go.
    _case(
        "multi-queue: preemptorTasks must not be overwritten by intra-job preemption of another queue",
        case(
            f"{PREEMPT} TestPreempt",
            (node("n1", 2),),
            (queue("q1", 1), queue("q2", 1, 4)),
            running("q1-runner1", "q1", 1, "n1"),
            running("q2-preemptee1", "q2", 1, "n1", "low-priority"),
            pending("q2-preemptor1", "q2", 1, "high-priority"),
            placed=("q2-preemptor1",),
            stopped=("q2-preemptee1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # Volcano's test plugin hides a device the preemptee holds; on a GPU cluster that device is
    # the node's one GPU.
    _case(
        "normal preemption evicts a victim when hidden device capacity remains unavailable",
        case(
            f"{PREEMPT} TestNormalPreemptRechecksPredicateAfterEviction",
            (node("n1", 1),),
            (queue("q1", 1),),
            running("preemptee", "q1", 1, "n1", "low-priority"),
            pending("preemptor", "q1", 1, "high-priority"),
            placed=("preemptor",),
            stopped=("preemptee",),
            classes=PREEMPT_CLASSES,
        ),
    ),
    # q1 and q2 each deserve 1 and may hold no more. Volcano orders queues by their priority
    # (q2 first); corral has no queue priority, and the answer does not depend on it: the
    # preemptor's own queue holds the only lower-priority job.
    _case(
        "preemption with priority queues",
        case(
            f"{PREEMPT} TestTopologyAwarePreempt",
            (node("n1", 2),),
            (queue("q1", 1, 1), queue("q2", 1, 1)),
            running("preemptee2", "q2", 1, "n1", "high-priority"),
            running("preemptee1", "q1", 1, "n1", "low-priority"),
            pending("preemptor1", "q1", 1, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee1",),
            classes=PREEMPT_CLASSES,
        ),
    ),
]


@pytest.mark.parametrize("c", PREEMPT_CASES)
def test_volcano_preempt(c: Case) -> None:
    _check(c)


# -- reclaim -----------------------------------------------------------------------------------------

RECLAIM_CASES = [
    # Three queues of weight 1 on 4 CPUs: GPUs are CPUs times three, a share of 4 each. q1 and
    # q2 each hold 6; q3's 3 are within its share. Of the borrowers, the lowest priority goes.
    _case(
        "sort reclaimees when reclaiming from overusing queue",
        case(
            f"{RECLAIM} TestReclaim",
            (node("n1", 12),),
            (queue("q1", 4), queue("q2", 4), queue("q3", 4)),
            running("preemptee1-1", "q1", 3, "n1", "mid-priority"),
            running("preemptee1-2", "q1", 3, "n1", "mid-priority"),
            running("preemptee2-1", "q2", 3, "n1", "low-priority"),
            running("preemptee2-2", "q2", 3, "n1", "low-priority", preemptible=False),
            pending("preemptor1", "q3", 3, "high-priority"),
            placed=("preemptor1",),
            stopped=("preemptee2-1",),
            classes=RECLAIM_CLASSES,
        ),
    ),
    # Weights 5 and 10 on 1 CPU: GPUs are CPUs times three, shares of 1 and 2. The preemptor's
    # PreemptionPolicy Never is its queue's policy here (corral has none per job): q2 stops
    # nobody, and its job waits for q1's to end.
    _case(
        "can not reclaim resources when task preemption policy is never",
        case(
            f"{RECLAIM} TestReclaim",
            (node("n1", 3),),
            (queue("q1", 1), queue("q2", 2, within="never", reclaim="never", borrow="never")),
            running("preemptee1", "q1", 3, "n1", "low-priority"),
            pending("preemptor1", "q2", 3, "high-priority"),
            classes={"low-priority": 100, "high-priority": 1000},
        ),
    ),
    # Weights 1 and 9 on 10 CPUs: shares of 1 and 9. q1 borrows 1, but the node has 8 free and
    # q2's 3 are within its share: nobody is stopped.
    _case(
        "only commit evictions on the node where reclaim succeeds",
        case(
            f"{RECLAIM} TestReclaim",
            (node("n1", 10),),
            (queue("q1", 1), queue("q2", 9)),
            running("victim-n1", "q1", 2, "n1", "low-priority"),
            pending("preemptor1", "q2", 3, "low-priority"),
            placed=("preemptor1",),
            classes={"low-priority": 100},
        ),
    ),
]


@pytest.mark.parametrize("c", RECLAIM_CASES)
def test_volcano_reclaim(c: Case) -> None:
    _check(c)
