"""KAI-Scheduler's allocate table, as corral's admission and placer answer it.

The cases follow NVIDIA's KAI-Scheduler (github.com/NVIDIA/KAI-Scheduler, the files as of commit
72de64fc), its table-driven tests of the allocate action: what is placed, and where, on a given
cluster with given queues. Each case carries KAI's name, which its test id spells, and the file
it comes from (``Case.source``; the paths below are under ``pkg/scheduler/actions/``):
``allocate/allocate_test.go``, ``allocate/allocateFractionalGpu_test.go``,
``allocate/allocateMIG_test.go``, ``allocate/allocateElastic_test.go``,
``allocate/allocateTopology_test.go``, ``allocate/allocateGang_test.go`` and
``integration_tests/allocate/allocate_test.go``.

Translation.

- Nodes. A KAI node of N GPUs is a node of N H100-80GB GPUs (no NVLink islands) with the 20 CPUs
  and 20 GiB KAI's fake nodes allocate. A MIG node is one whose GPUs are in MIG mode, of the model
  whose profiles the case names (corral carves instances by MIG geometry as it places them). KAI's
  topology labels become corral's ``rack`` and ``block`` labels: of two KAI levels the lower is
  corral's rack and the upper its block; a domain is named by its whole path, so that two upper
  domains never share a lower one (KAI's domains are paths too). KAI's nodeplacement plugin set
  to spread nodes and GPUs is the placer's ``spread`` packing (``PlacerConfig.packing``).
- Queues. Deserved GPUs are the queue's nominal quota (quota key ``"*"``); MaxAllowedGPUs is
  nominal plus borrowing limit (no limit: none). A parent queue (KAI's department) is a cohort:
  its own quota is what its deserved adds to its children's, its limit its borrowing limit, and
  at the top it holds up to the cluster's GPUs (KAI's over-quota comes from the cluster). KAI puts
  every queue without a parent under a default department of unlimited deserved: a cohort
  ``default`` holding what the queues' nominal leaves of the cluster, so a queue borrows what the
  others leave idle, up to the cluster, as over-quota does in KAI.
- Jobs. KAI's priority classes are corral's: train 50, interactive-preemptible 75, build 100,
  inference 125; from build up a job is not preemptible (KAI's ``CalculatePreemptibility``), so
  those classes are not preemptible here. A job's tasks are a gang of that many workers, placed
  whole or not at all; a minAvailable below the tasks makes it an elastic job with that
  ``min_replicas``. A share of a GPU (RequiredGPUsPerTask below 1) is a fraction (``gpu_milli``),
  a MIG instance a MIG profile, a best-effort job (no GPU) a CPU-only worker. KAI creates its
  fake jobs in the table's order after a stable sort by priority; corral's submissions follow it.
  A running task is folded as the fold would hold it: accepted, admitted, placed on its node (on
  its GPU group's GPU for a share) and started, before the pending jobs are submitted.
- Outcomes. KAI's Binding and Running are a job corral placed (placed, starting or running);
  Pending is one it did not place (queued, or admitted without GPUs). corral may reject a job
  outright, which KAI never does.
- The chain. KAI's ``allocate_test`` files run the allocate action alone, which never stops
  anything: corral's admission and placer decide, as the simulator runs them (its services with
  the preemptor off), at the moment the pending jobs are submitted. KAI's integration tests run
  every action (allocate, consolidation, reclaim, preempt) for several rounds: there the
  preemptor runs too, and the simulated agents checkpoint and stop its victims, for up to ten
  minutes of log time. The simulator grows no elastic job (its agents run a gang at one size),
  so the cases of a running elastic job run admission, growth included, and placer in a loop of
  their own until neither proposes anything.

Where corral answers otherwise on purpose, the case expects corral's answer and says why: a job
no node or quota could ever hold is rejected at submission (README), a best-effort queue's first
job that does not fit holds its share of the nominal (README), packing is FGD's (DESIGN §6), an
elastic job is admitted at the largest size that fits (README), and a queue's share is over all
the quota of its cohort tree, not its own deserved (DESIGN §5). Where corral's answer looks wrong
the case expects KAI's and is marked ``xfail``, saying why.

Cases left out, and why (a long name is cut with "..."):

The same question as a kept case, answered alike:
- "No jobs", "No nodes": nothing to place, nothing to place on.
- "queue0 has no deserved GPUs, queue1 has deserved - ...": as "Both queues have deserved of 2, ...".
- "2 running jobs and 1 pending, allocate preemptible interactive with over quota": as "Allow
  allocation of fractional training when over quota ...".
- "Fraction job on MIG node": rejected, as "Do not allocate regular GPU task on dynamic MIG node".
- "Allocate inference before train": as "Allocate inference before build".
- "allocate job with multiple pods but does not allow it because department to go over ...":
  rejected, as its "project" twin.
- The second "1 shared gpu job running, ... - queue will be overused, don't allocate": the same table.
- "1 whole gpu job running, 1 pending interactive shared gpu job - allocate": as "1 shared gpu
  interactive job running, 1 pending whole gpu job - allocate".
- "Verify allocated fractional GPU jobs are counted in the overall number of GPUs ...": as above.
- The second "Allow allocation of fractional training when over quota ...": a whole GPU running.
- "Allocate elastic job - partial allocate": as "Allocate elastic job - full allocate".
- "Allocate elastic job - full allocate - partially running": as "... - some pods already running".
- "Allocate 2 elastic jobs - full and partial allocate": as "... - both partial allocate".
- "Required topology with multiple levels - schedule all tasks on the same spine": as "... rack".
- "single level queue hierarchy - allocate job": as "three level queue hierarchy - ...".
- "four level queue hierarchy - allocate job at deepest level": as "three level ...".
- "allocate according to creation time when share is equal": as "Both queues has exactly ...".

Not expressible in corral:
- "DRF - over quota", "DRF - order": quota of CPU and memory (corral's quota counts GPUs).
- "don't allow job over QUEUE deserved CPU", "... DEPARTMENT deserved CPU": the same.
- "Spread jobs across GPUs", "Spread jobs across free GPUs": KAI's GPU strategy apart from its
  node strategy (corral's placer has one packing policy).
- "Pack nodes, spread GPUs", "Spread nodes, pack GPUs": the same.
- "Pipeline fractional interactive gpu task when a task is evicting - ...": pipelining onto GPUs
  still being released (corral places on GPUs free now).
- "test gpuSharingOrder for a node that has a gpu reservation pod pending - two pods": the same.
- "Pipeline if resource aren't currently allocatable" (allocateGang_test.go): the same, a gang.
- "MIG job requesting unavailable MIG device": KAI's fixed MIG instances (corral carves them by
  geometry, so an A100-40GB offers 1g.10gb).
- "MIG job requesting MIG device on node with Legacy MIG jobs", "Pending legacy MIG job": legacy
  MIG tasks.
- "MIG job with multiple tasks requesting MIG device": tasks of different shapes, two instances
  in one task (corral's workers share one shape).
- "Allocate elastic job - partial allocate - with priority": a priority per task.
- "Required topology level - could not schedule on first domain due to affinity, ...": one
  task's node affinity.
- "elastic job" (TestHandleElasticJobCommitFailure): a failing bind.
- "allocate according to priority": queue priority (corral's queues have none).
- "Allocate Departments with smaller ratio 1st": a department deserving less than its queues (a
  cohort holds its members' nominal in full).
- "Don't allow allocation of interactive jobs above the department's deserved GPUs": the same.
- "Over provisioning with over quota, many queues to few GPUs - ...": its pending_job0 names no
  queue.
- "Combined preferred and required topology constraints - schedule job although ...": a required
  and a preferred level together (corral's topology names one level).
- "Combined preferred and required topology constraints - preferred level respected ...": the same.
- "Required and preferred topology constraints with single unconstrained level": subgroups (a
  job of several gangs, each with a topology of its own).
- "Required topology at multiple subgroup hierarchy levels - subgroup on the same rack ...",
  "... - rack, spine and zone", "Required topology constraint - prefer packed domain",
  "Preferred topology at multiple subgroup hierarchy levels - rack and zone", "Required and
  preferred topology constraints combined at different levels - rack and zone", "Elastic
  subgroups with required topology constraints", "Hierarchical Preferred Topology - ...",
  "Hierarchical Conflicting Preferred Topology - ...": subgroups, as above.
- "Bin Packing - allocate on domain with least free resources (most occupied)": packing a lone
  worker into the busiest domain (corral's racks and blocks keep a gang together; a one-worker
  job is packed by node, and between idle nodes its choice says nothing of domains).
- "Bin Packing - Pack Top-Most domain first": the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from corral.events import routing, subjects
from corral.events.base import Event
from corral.events.decisions import GpuClaim, JobsPlaced, MigSlot, Placement, WorkerSlot
from corral.events.jobs import (
    JobAccepted,
    JobsAdmitted,
    JobSpec,
    Resources,
    SubmitJob,
    Topology,
    TopologyPack,
)
from corral.events.nodes import GpuInfo, NodeInventory, NodeRegistered, WorkerStarted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import mig, quota
from corral.projections.fold import apply_event
from corral.projections.placement.plugins.packing import Policy
from corral.projections.placement.stack import PlacerConfig
from corral.projections.state import WHOLE, State
from corral.services.admission.decide import AdmissionConfig
from corral.services.admission.decide import decide as admission_decide
from corral.services.placer.decide import decide as placer_decide
from corral.services.preemptor.decide import PreemptorConfig
from corral.services.sim.driver import SimConfig, Simulation
from tests.builders import TRAIN

ALLOCATE = "allocate/allocate_test.go"
FRACTION = "allocate/allocateFractionalGpu_test.go"
MIG = "allocate/allocateMIG_test.go"
ELASTIC = "allocate/allocateElastic_test.go"
TOPOLOGY = "allocate/allocateTopology_test.go"
GANG = "allocate/allocateGang_test.go"
INTEGRATION = "integration_tests/allocate/allocate_test.go"

# KAI's priority classes (pkg/scheduler/constants/priorities.go); from build up a job may not be
# preempted.
CLASSES = (
    PriorityClassSpec("train", 50),
    PriorityClassSpec("interactive-preemptible", 75),
    PriorityClassSpec("build", 100, preemptible=False),
    PriorityClassSpec("inference", 125, preemptible=False),
)
VALUE = {c.name: c.value for c in CLASSES}
TENANT = "kai"
FOREVER = 1e9  # a job's work: none ends within a case
GPU_MEMORY = {"A100-40GB": 40_960, "A100-80GB": 81_920, "H100-80GB": 81_559}

# -- KAI's test topology, as data ---------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """KAI's TestNodeBasic: its GPUs (in MIG mode: ``mig``) and labels."""

    gpus: int = 0
    model: str = "H100-80GB"
    mig: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Q:
    """KAI's queue: deserved GPUs, MaxAllowedGPUs (None: no limit), parent queue."""

    name: str
    deserved: int | None
    limit: int | None = None
    parent: str | None = None


@dataclass(frozen=True)
class Task:
    """A running task: its node and, for a share of a GPU, which GPU (KAI's GPU group)."""

    node: str
    gpu: int | None = None


@dataclass(frozen=True)
class J:
    """KAI's TestJobBasic: ``tasks`` tasks of ``gpus`` GPUs each (a share below one; a MIG
    profile with ``mig``), a gang unless ``min_available`` says fewer; ``running``: the tasks
    already running, in rank order (the rest are pending)."""

    name: str
    queue: str
    gpus: float = 1.0
    tasks: int = 1
    priority: str = "train"
    min_available: int | None = None
    running: tuple[Task, ...] = ()
    mig: str | None = None
    pack: TopologyPack = "none"
    required: bool = False

    def spec(self) -> JobSpec:
        if self.mig is not None:
            res = Resources(gpus=1, mig=self.mig)
        elif 0 < self.gpus < 1:
            res = Resources(gpus=1, gpu_milli=round(self.gpus * WHOLE))
        else:
            res = Resources(gpus=int(self.gpus))
        return JobSpec(
            queue=self.queue,
            priority_class=self.priority,
            replicas=self.tasks,
            min_replicas=self.min_available,
            resources=res,
            topology=Topology(self.pack, self.required),
            checkpointable=True,
            command=TRAIN,
        )


@dataclass(frozen=True)
class Case:
    nodes: Mapping[str, Node]
    queues: tuple[Q, ...]
    jobs: tuple[J, ...]
    # What each job must come to: "pending" (not placed), "rejected", "placed" (anywhere), its
    # workers' nodes ("node2+node3", sorted), its workers' GPUs ("node0:1"), "within:a,b" (every
    # worker on one of those nodes) or "N placed" (an elastic job's workers placed).
    want: Mapping[str, str]
    source: str
    default_department: bool = True  # KAI's DisableDefaultDepartment, or departments of its own
    preempt: bool = False  # every action, as KAI's integration tests run them
    grow: bool = False  # a running elastic job may grow
    packing: Policy = "corral"  # KAI's nodeplacement strategy, where a case sets one


# -- KAI's queues as corral's cohorts and queues ------------------------------------------------------


def setup(case: Case) -> list[Event]:
    """The priority classes, cohorts and queues of a case (the module docstring's translation)."""
    cluster = sum(n.gpus for n in case.nodes.values())
    queues = list(case.queues)
    if case.default_department:
        queues = [q if q.parent else Q(q.name, q.deserved, q.limit, "default") for q in queues]
        queues.append(Q("default", None))
    children: dict[str, list[Q]] = {}
    for q in queues:
        if q.parent:
            children.setdefault(q.parent, []).append(q)
    parent = {q.name: q.parent for q in queues}

    def entitled(q: Q) -> int:
        """What a KAI queue's subtree is entitled to: its deserved, at least its children's."""
        return max(sum(entitled(c) for c in children.get(q.name, ())), q.deserved or 0)

    def depth(name: str) -> int:
        up = parent[name]
        return 0 if up is None else 1 + depth(up)

    out: list[Event] = [ApplyPriorityClass(priority_class=c) for c in CLASSES]
    leaves: list[QueueSpec] = []
    for q in sorted(queues, key=lambda q: depth(q.name)):  # a cohort's parent before it
        if q.name not in children:
            nominal = q.deserved or 0
            limit = None if q.limit is None else q.limit - nominal
            leaves.append(QueueSpec(q.name, cohort=q.parent, quotas={quota.ANY: Quota(nominal, limit)}))
            continue
        below = sum(entitled(c) for c in children[q.name])
        if q.parent is None:  # the top: up to the cluster, or its limit
            cap = cluster if q.limit is None else min(q.limit, cluster)
            own, limit = max(0, cap - below), None
        else:
            own = max(0, (q.deserved or 0) - below)
            limit = None if q.limit is None else max(0, q.limit - own - below)
        spec = CohortSpec(q.name, parent=q.parent, quotas={quota.ANY: Quota(own, limit)})
        out.append(ApplyCohort(cohort=spec))
    out += [ApplyQueue(queue=q) for q in leaves]
    return out


# -- the cluster's state, folded as the log would hold it ---------------------------------------------


class World:
    """A State built record by record through the fold, and what its GPUs hold."""

    def __init__(self) -> None:
        self.state = State()
        self.seq = 0
        self.now = 1000.0
        self.free: dict[tuple[str, int], int] = {}  # (node, GPU) -> milli-GPU free
        self.slices: dict[tuple[str, int], int] = {}  # (node, GPU) -> MIG memory slices taken
        self.models: dict[str, str] = {}

    def fold(self, body: Event, tenant: str | None = None) -> None:
        self.seq += 1
        if tenant is None:
            subject = routing.subject_of(body)
        elif tenant == subjects.ADMIN:
            verbs = {ApplyPriorityClass: "priority-class", ApplyCohort: "cohort", ApplyQueue: "queue"}
            subject = subjects.request(tenant, verbs[type(body)])
        else:
            subject = subjects.request(tenant, "submit")
        before = self.state.rejected_total
        apply_event(self.state, self.seq, subject, body, self.now, tenant)
        assert self.state.rejected_total == before, self.state.rejections[-1]

    def claim(self, job: J, task: Task) -> tuple[GpuClaim, ...]:
        """The GPUs a running task of ``job`` holds on its node."""
        node = task.node
        gpus = sorted(g for (n, g) in self.free if n == node)
        if task.gpu is not None:
            gpus = [task.gpu]
        if job.mig is not None:
            model = self.models[node]
            profile = mig.profile(model, job.mig)
            assert profile is not None, (model, job.mig)
            for g in gpus:
                starts = mig.free_starts(model, job.mig, self.slices[(node, g)])
                if starts:
                    self.slices[(node, g)] |= mig.mask(profile, starts[0])
                    return (GpuClaim(g, mig=MigSlot(job.mig, starts[0])),)
        elif job.gpus < 1:
            milli = round(job.gpus * WHOLE)
            for g in gpus:
                if self.free[(node, g)] >= milli:
                    self.free[(node, g)] -= milli
                    return (GpuClaim(g, milli=milli),)
        else:
            whole = [g for g in gpus if self.free[(node, g)] == WHOLE][: int(job.gpus)]
            if len(whole) == int(job.gpus):
                for g in whole:
                    self.free[(node, g)] = 0
                return tuple(GpuClaim(g) for g in whole)
        raise AssertionError(f"no room for {job.name} on {node}")


def build(case: Case) -> World:
    w = World()
    for name, node in case.nodes.items():
        gpus = tuple(
            GpuInfo(
                index=i, uuid=f"{name}-{i}", model=node.model, memory_mib=GPU_MEMORY[node.model], mig=node.mig
            )
            for i in range(node.gpus)
        )
        inv = NodeInventory(cpu_milli=20_000, memory_mib=20_480, gpus=gpus, labels=dict(node.labels))
        w.fold(NodeRegistered(node=name, inventory=inv))
        w.models[name] = node.model
        for i in range(node.gpus):
            w.free[(name, i)] = WHOLE
            w.slices[(name, i)] = 0
    for req in setup(case):
        w.fold(req, subjects.ADMIN)
    for job in sorted(case.jobs, key=lambda j: -VALUE[j.priority]):
        w.fold(SubmitJob(request_id=job.name, job=job.spec()), TENANT)
        if not job.running:
            continue
        w.fold(JobAccepted(job_id=job.name, priority=VALUE[job.priority]))
        admission = quota.admission(w.state.queues[job.queue], w.state.jobs[job.name], len(job.running))
        w.fold(JobsAdmitted(based_on=w.seq, now=w.now, admissions=(admission,)))
        workers = tuple(WorkerSlot(r, t.node, w.claim(job, t)) for r, t in enumerate(job.running))
        w.fold(JobsPlaced(based_on=w.seq, now=w.now, placements=(Placement(job.name, 0, workers),)))
        for r, t in enumerate(job.running):
            w.fold(WorkerStarted(node=t.node, job_id=job.name, attempt=0, rank=r))
    return w


# -- what corral makes of it ------------------------------------------------------------------------


def grown(w: World) -> State:
    """Admission (growth included) and placer on ``w``'s state until neither proposes anything."""
    config = AdmissionConfig(grow=True)
    for _ in range(16):
        events = admission_decide(w.state, w.now, config)
        for ev in events:
            w.fold(ev)
        placed = placer_decide(w.state, w.now)
        for ev in placed:
            w.fold(ev)
        if not events and not placed:
            return w.state
    raise AssertionError("admission and placer did not settle")


def decide(case: Case) -> State:
    w = build(case)
    if case.grow:
        return grown(w)
    config = SimConfig(
        admission=AdmissionConfig(grow=False),
        placer=PlacerConfig(packing=case.packing),
        preemptor=PreemptorConfig(shrink=False) if case.preempt else None,
    )
    sim = Simulation.resume(w.state, w.now, config, lambda job: FOREVER)
    sim.run(until=w.now + (600.0 if case.preempt else 0.0))
    assert sim.state.faults == 0
    return sim.state


def outcome(state: State, job_id: str, want: str) -> str:
    """What became of the job, in the terms ``want`` is written in."""
    job = state.jobs[job_id]
    if job.phase == "rejected":
        return "rejected"
    if job.phase not in ("placed", "starting", "running") or job.placement is None:
        return "pending"
    workers = job.placement.workers
    if want == "placed":
        return want
    if want.endswith(" placed"):
        return f"{len(workers)} placed"
    if want.startswith("within:") and all(w.node in want.removeprefix("within:").split(",") for w in workers):
        return want
    if ":" in want:
        return "+".join(sorted(f"{w.node}:{','.join(str(c.gpu) for c in w.gpus)}" for w in workers))
    return "+".join(sorted(w.node for w in workers))


# -- the table --------------------------------------------------------------------------------------


def case(name: str, source: str, *, xfail: str = "", **kw: object) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(Case(source=source, **kw), id=name, marks=marks)  # type: ignore[arg-type]


def gpus(*counts: int) -> dict[str, Node]:
    """Nodes node0, node1, ... with these many GPUs."""
    return {f"node{i}": Node(n) for i, n in enumerate(counts)}


def racks(per_node: int = 1, **paths: str) -> dict[str, Node]:
    """Nodes of ``per_node`` GPUs in topology domains: ``"rack1"`` (corral's rack) or
    ``"upper/lower"`` (KAI's two levels: the upper corral's block, the path corral's rack)."""
    out = {}
    for name, path in paths.items():
        upper = path.rpartition("/")[0]
        labels = {"block": upper, "rack": path} if upper else {"rack": path}
        out[name] = Node(per_node, labels=labels)
    return out


def run(name: str, queue: str, *on: str, gpus: float = 1.0, priority: str = "train") -> J:
    """A running job of one task per node named."""
    return J(name, queue, gpus, tasks=len(on), priority=priority, running=tuple(Task(n) for n in on))


def share(name: str, queue: str, gpus: float, node: str, gpu: int, priority: str = "train") -> J:
    """A running one-task job holding a share of GPU ``gpu`` of ``node``."""
    return J(name, queue, gpus, priority=priority, running=(Task(node, gpu),))


def pend(name: str, queue: str, gpus: float = 1.0, **kw: object) -> J:
    return J(name, queue, gpus, **kw)  # type: ignore[arg-type]


CASES = [
    # -- allocate/allocate_test.go
    case(
        "1 job running on node0 from queue0, 3 pending jobs from queue1 and 1 pending job from queue0 "
        "- allocate them according to their the queue shares",
        ALLOCATE,
        nodes=gpus(2, 2),
        queues=(Q("queue0", 1), Q("queue1", 1)),
        jobs=(
            run("running_job0", "queue0", "node0"),
            pend("pending_job0", "queue0"),
            pend("pending_job1", "queue1"),
            pend("pending_job2", "queue1"),
            pend("pending_job3", "queue1"),
        ),
        # every GPU is taken: which node each went to says nothing
        want={
            "running_job0": "node0",
            "pending_job0": "placed",
            "pending_job1": "placed",
            "pending_job2": "placed",
            "pending_job3": "pending",
        },
    ),
    case(
        "1 job running on node0, 3 pending jobs - allocate them according to their order",
        ALLOCATE,
        nodes=gpus(4, 4),
        queues=(Q("queue1", 2),),
        jobs=(
            run("running_job0", "queue1", "node0", gpus=2),
            pend("pending_job0", "queue1", 4),
            pend("pending_job1", "queue1", 2),
            pend("pending_job2", "queue1", 2),
        ),
        want={
            "running_job0": "node0",
            "pending_job0": "node1",
            "pending_job1": "node0",
            "pending_job2": "pending",
        },
    ),
    case(
        "1 job running on node0, 3 pending jobs - only build job should be allocated",
        ALLOCATE,
        nodes=gpus(4),
        queues=(Q("queue1", 2),),
        jobs=(
            run("running_job0", "queue1", "node0", gpus=2),
            pend("pending_job0", "queue1", 4),
            pend("pending_job1", "queue1", 2),
            pend("pending_job2", "queue1", 2, priority="build"),
        ),
        want={
            "running_job0": "node0",
            "pending_job0": "pending",
            "pending_job1": "pending",
            "pending_job2": "node0",
        },
    ),
    case(
        "1 job running on node0, 3 pending jobs, not enough deserved GPUs for build job - allocate train job",
        ALLOCATE,
        # KAI leaves the job that may not be preempted pending; it needs more than its queue's
        # nominal, all a job that may not be preempted may hold, so corral refuses it at submission.
        nodes=gpus(4),
        queues=(Q("queue1", 1),),
        jobs=(
            run("running_job0", "queue1", "node0", gpus=2),
            pend("pending_job0", "queue1", 4),
            pend("pending_job1", "queue1", 2),
            pend("pending_job2", "queue1", 2, priority="build"),
        ),
        want={
            "running_job0": "node0",
            "pending_job0": "pending",
            "pending_job1": "node0",
            "pending_job2": "rejected",
        },
    ),
    case(
        "1 build job running on 2 GPU, assign pending jobs of best effort",
        ALLOCATE,
        nodes=gpus(2),
        queues=(Q("queue1", 2),),
        jobs=(
            run("running_job0", "queue1", "node0", gpus=2, priority="build"),
            pend("pending_job0", "queue1", 0),
            pend("pending_job1", "queue1", 0),
        ),
        want={"running_job0": "node0", "pending_job0": "node0", "pending_job1": "node0"},
    ),
    case(
        "Both queues have deserved of 2, overall 4 gpus, queue0 will pass the deserved if its pending jobs "
        "will be allocated - allocate a job from queue1",
        ALLOCATE,
        nodes=gpus(4),
        queues=(Q("queue0", 2), Q("queue1", 2)),
        jobs=(
            run("running_job0", "queue0", "node0"),
            run("running_job1", "queue1", "node0"),
            pend("pending_job0", "queue0", 2),
            pend("pending_job1", "queue1", 1),
        ),
        want={
            "running_job0": "node0",
            "running_job1": "node0",
            "pending_job0": "pending",
            "pending_job1": "node0",
        },
    ),
    case(
        "queue0 has deserved of 3, queue 1 has deserved of 2, they will both have a share of 1 if allocated "
        "their task, yet for fair convergence - queue1 should allocate the task",
        ALLOCATE,
        nodes=gpus(4),
        queues=(Q("queue0", 3), Q("queue1", 2)),
        jobs=(
            run("running_job0", "queue0", "node0", gpus=2),
            pend("pending_job0", "queue0", 1),
            pend("pending_job1", "queue1", 2),
        ),
        want={"running_job0": "node0", "pending_job0": "pending", "pending_job1": "node0"},
    ),
    case(
        "Both queues has the same share, give the one with smaller job - allocate jobs queue1",
        ALLOCATE,
        nodes=gpus(5),
        queues=(Q("queue0", 4), Q("queue1", 2)),
        jobs=(
            run("running_job0", "queue0", "node0", gpus=2),
            run("running_job1", "queue1", "node0"),
            pend("pending_job0", "queue0", 2),
            pend("pending_job1", "queue1", 1),
        ),
        want={
            "running_job0": "node0",
            "running_job1": "node0",
            "pending_job0": "pending",
            "pending_job1": "node0",
        },
    ),
    case(
        "Both queues has exactly the same share - give priority to the created 1st (queue0)",
        ALLOCATE,
        nodes=gpus(5),
        queues=(Q("queue0", 2), Q("queue1", 2)),
        jobs=(
            run("running_job0", "queue0", "node0", gpus=2),
            run("running_job1", "queue1", "node0", gpus=2),
            pend("pending_job0", "queue0", 1),
            pend("pending_job1", "queue1", 1),
        ),
        want={
            "running_job0": "node0",
            "running_job1": "node0",
            "pending_job0": "node0",
            "pending_job1": "pending",
        },
    ),
    case(
        "1 running jobs and 1 build pending, allocate build interactive with over quota",
        ALLOCATE,
        nodes=gpus(5),
        queues=(Q("queue0", 2),),
        jobs=(
            run("running_job0", "queue0", "node0", gpus=2, priority="interactive-preemptible"),
            pend("pending_job0", "queue0", 2, priority="build"),
        ),
        want={"running_job0": "node0", "pending_job0": "node0"},
    ),
    case(
        "Do not allocate regular GPU task on dynamic MIG node",
        ALLOCATE,
        nodes={"node0": Node(1, "A100-40GB", mig=True)},
        queues=(Q("queue0", 1),),
        jobs=(pend("pending_job0", "queue0", 1, priority="build"),),
        # No node has a GPU a whole-GPU worker may take: rejected at submission, not left
        # pending (README, "A job no node could ever host ...").
        want={"pending_job0": "rejected"},
    ),
    case(
        "Allocate task according to nodepack - to the node with the least free GPUs",
        ALLOCATE,
        nodes=gpus(2, 2),
        queues=(Q("queue0", 2),),
        jobs=(run("running_job0", "queue0", "node1"), pend("pending_job0", "queue0")),
        want={"running_job0": "node1", "pending_job0": "node1"},
    ),
    case(
        "Allocate task according to nodespread - to the node with the most free GPUs",
        ALLOCATE,
        packing="spread",
        nodes=gpus(2, 2),
        queues=(Q("queue0", 2),),
        jobs=(run("running_job0", "queue0", "node1"), pend("pending_job0", "queue0")),
        want={"running_job0": "node1", "pending_job0": "node0"},
    ),
    case(
        "Allocate inference before build",
        ALLOCATE,
        nodes=gpus(1),
        queues=(Q("queue0", 1),),
        jobs=(
            pend("pending_job0", "queue0", priority="build"),
            pend("pending_job1", "queue0", priority="inference"),
            pend("pending_job2", "queue0", priority="build"),
        ),
        want={"pending_job0": "pending", "pending_job1": "node0", "pending_job2": "pending"},
    ),
    case(
        "Attempt to allocate inference over quota",
        ALLOCATE,
        # KAI leaves the job that may not be preempted pending; it needs more than its queue's
        # nominal, all a job that may not be preempted may hold, so corral refuses it at submission.
        nodes=gpus(1),
        queues=(Q("queue0", 0), Q("queue1", 1)),
        jobs=(pend("pending_job0", "queue0", priority="inference"),),
        want={"pending_job0": "rejected"},
    ),
    # -- allocate/allocateFractionalGpu_test.go
    case(
        "allocate job with multiple pods but does not allow it because project goes over allowance",
        FRACTION,
        nodes=gpus(4),
        queues=(Q("queue0", 1, limit=1, parent="department-a"), Q("department-a", 1, limit=1)),
        default_department=False,
        jobs=(pend("pending_job0", "queue0", 0.5, tasks=3),),
        # 1.5 GPUs where the queue may never hold more than 1: rejected at submission (README,
        # "rejected by admission: ... more GPUs than the quota can ever give").
        want={"pending_job0": "rejected"},
    ),
    case(
        "1 shared gpu job running, 1 pending interactive shared gpu job, allocate to same gpu",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.5, "node0", 1, "build"),
            pend("pending_shared_gpu_job1", "queue0", 0.5, priority="build"),
        ),
        want={"running_shared_gpu_job0": "node0:1", "pending_shared_gpu_job1": "node0:1"},
    ),
    case(
        "1 shared gpu job running, 1 pending interactive shared gpu job, allocate to same gpu - even if "
        "multiple nodes, to check gpusharingorder plugin",
        FRACTION,
        nodes=gpus(2, 2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.5, "node1", 1, "build"),
            pend("pending_shared_gpu_job1", "queue0", 0.5, priority="build"),
        ),
        want={"running_shared_gpu_job0": "node1:1", "pending_shared_gpu_job1": "node1:1"},
    ),
    case(
        "1 shared gpu job running, 1 pending interactive shared gpu job - allocate to new gpu",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.6, "node0", 0, "build"),
            pend("pending_shared_gpu_job1", "queue0", 0.5, priority="build"),
        ),
        want={"running_shared_gpu_job0": "node0:0", "pending_shared_gpu_job1": "node0:1"},
    ),
    case(
        "1 shared gpu job running, 1 pending interactive shared gpu job - queue will be overused, "
        "don't allocate",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 1),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.6, "node0", 0, "build"),
            pend("pending_shared_gpu_job1", "queue0", 0.5, priority="build"),
        ),
        want={"running_shared_gpu_job0": "node0:0", "pending_shared_gpu_job1": "pending"},
    ),
    case(
        "1 shared gpu interactive job running, 1 pending whole gpu job - allocate",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.5, "node0", 1, "build"),
            pend("pending_whole_gpu_job1", "queue0", 1),
        ),
        want={"running_shared_gpu_job0": "node0:1", "pending_whole_gpu_job1": "node0:0"},
    ),
    case(
        "1 interactive shared gpu job running, 4 pending interactive shared gpus pending - allocate 3 of the "
        "shared GPUs jobs",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_shared_gpu_job0", "queue0", 0.5, "node0", 0, "build"),
            pend("pending_shared_gpu_job0", "queue0", 0.6, priority="build"),
            pend("pending_shared_gpu_job1", "queue0", 0.5, priority="build"),
            pend("pending_shared_gpu_job2", "queue0", 0.5, priority="build"),
            pend("pending_shared_gpu_job3", "queue0", 0.3, priority="build"),
        ),
        # KAI places job3's 0.3 beside job0 too. corral's queue is best-effort FIFO: job2, its
        # first job that does not fit (0.5 where 0.4 of the nominal is left), holds that share
        # against the jobs behind it, and job3 would leave it 0.1 (README, `strategy`: "the first
        # job that does not fit holds its share while later ones that leave it room go").
        want={
            "running_shared_gpu_job0": "node0:0",
            "pending_shared_gpu_job0": "node0:1",
            "pending_shared_gpu_job1": "node0:0",
            "pending_shared_gpu_job2": "pending",
            "pending_shared_gpu_job3": "pending",
        },
    ),
    case(
        "Allow allocation of fractional training when over quota with fractional jobs",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 1),),
        jobs=(
            share("running_job0", "queue0", 0.5, "node0", 0, "build"),
            share("running_job1", "queue0", 0.5, "node0", 0, "build"),
            pend("pending_job0", "queue0", 0.5),
        ),
        want={"running_job0": "node0:0", "running_job1": "node0:0", "pending_job0": "node0:1"},
    ),
    case(
        "Pack jobs on nodes",
        FRACTION,
        nodes=gpus(2, 2),
        queues=(Q("queue0", 4),),
        jobs=(share("running_job0", "queue0", 0.5, "node0", 0), pend("pending_job0", "queue0", 0.2)),
        # KAI puts the 0.2 beside the 0.5. corral's packing is FGD's (DESIGN §6, placer): 0.3 left
        # beside the 0.5 is a fragment no 0.5 task can use, so the 0.2 goes to an idle GPU, here
        # on the idle node.
        want={"running_job0": "node0:0", "pending_job0": "node1:0"},
    ),
    case(
        "Pack jobs on GPUs",
        FRACTION,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(
            share("running_job0", "queue0", 0.5, "node0", 1),
            share("running_job1", "queue0", 0.7, "node0", 0),
            pend("pending_job0", "queue0", 0.2),
        ),
        want={"running_job0": "node0:1", "running_job1": "node0:0", "pending_job0": "node0:0"},
    ),
    case(
        "Spread across nodes, when 1 node has shared GPU",
        FRACTION,
        packing="spread",
        nodes=gpus(2, 2),
        queues=(Q("queue0", 2),),
        jobs=(share("running_job0", "queue0", 0.5, "node0", 0), pend("pending_job0", "queue0", 0.2)),
        want={"running_job0": "node0:0", "pending_job0": "node1:0"},
    ),
    # -- allocate/allocateMIG_test.go
    case(
        "MIG job requesting single MIG device",
        MIG,
        nodes={"node0": Node(1, "A100-80GB", mig=True)},
        queues=(Q("queue0", 1),),
        jobs=(pend("pending_job-0", "queue0", mig="1g.10gb"),),
        want={"pending_job-0": "node0"},
    ),
    case(
        "MIG job requesting MIG device on node with no available MIG devices",
        MIG,
        nodes={"node0": Node(1, "A100-80GB", mig=True)},
        queues=(Q("queue0", 1),),
        # no instance free: the GPU's whole geometry is held
        jobs=(
            J("running_job-0", "queue0", mig="7g.80gb", running=(Task("node0"),)),
            pend("pending_job-0", "queue0", mig="1g.10gb"),
        ),
        want={"running_job-0": "node0", "pending_job-0": "pending"},
    ),
    # -- allocate/allocateElastic_test.go
    case(
        "Allocate elastic job - full allocate",
        ELASTIC,
        nodes=gpus(2),
        queues=(Q("queue0", 1),),
        jobs=(pend("pending_job0", "queue0", tasks=2, min_available=1),),
        want={"pending_job0": "node0+node0"},
    ),
    case(
        "Allocate elastic job - partial allocate - some pods already running",
        ELASTIC,
        grow=True,
        nodes=gpus(2),
        queues=(Q("queue0", 1),),
        jobs=(J("pending_job0", "queue0", tasks=3, min_available=1, running=(Task("node0"),)),),
        want={"pending_job0": "node0+node0"},
    ),
    case(
        "Allocate 2 elastic jobs - both partial allocate",
        ELASTIC,
        nodes=gpus(5),
        queues=(Q("queue0", 5),),
        jobs=(
            pend("pending_job0", "queue0", tasks=4, min_available=1),
            pend("pending_job1", "queue0", tasks=4, min_available=1),
        ),
        # KAI gives 3 and 2. corral admits an elastic job at the largest size its quota allows
        # (README, "An elastic job gives a range"): the first gets all 4, the second the 1 left.
        want={"pending_job0": "4 placed", "pending_job1": "1 placed"},
    ),
    # -- allocate/allocateGang_test.go: a gang is placed whole or not at all
    case(
        "Allocate train gang job",
        GANG,
        # Deserved 1, two tasks: the train job borrows the second GPU from the default department.
        nodes=gpus(2),
        queues=(Q("queue0", 1),),
        jobs=(pend("pending_job0", "queue0", tasks=2),),
        want={"pending_job0": "node0+node0"},
    ),
    case(
        "Allocate build gang job",
        GANG,
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(pend("pending_job0", "queue0", tasks=2, priority="build"),),
        want={"pending_job0": "node0+node0"},
    ),
    case(
        "Allocate build gang job on 2 nodes",
        GANG,
        nodes=gpus(1, 1),
        queues=(Q("queue0", 2),),
        jobs=(pend("pending_job0", "queue0", tasks=2, priority="build"),),
        want={"pending_job0": "node0+node1"},
    ),
    case(
        "Don't allocate gang job if not all tasks are allocatable",
        GANG,
        # Four GPUs on a cluster of two, and more than the queue's nominal of 2 for a job that may
        # not be preempted: nothing could ever hold the gang, so corral rejects it at submission
        # where KAI leaves it pending (README, "A job no node could ever host ...").
        nodes=gpus(2),
        queues=(Q("queue0", 2),),
        jobs=(pend("pending_job0", "queue0", 2, tasks=2, priority="build"),),
        want={"pending_job0": "rejected"},
    ),
    case(
        "Don't allocate gang interactive job if it will go over quota",
        GANG,
        # Four GPUs of a job that may not be preempted, in a queue of 3: KAI leaves it pending; it
        # needs more than its queue's nominal, all such a job may hold, so corral refuses it at
        # submission (README: "One larger than its queue's nominal is refused at submission").
        nodes=gpus(10),
        queues=(Q("queue0", 3),),
        jobs=(pend("pending_job0", "queue0", 2, tasks=2, priority="build"),),
        want={"pending_job0": "rejected"},
    ),
    # -- allocate/allocateTopology_test.go
    case(
        "Required topology level - schedule all tasks on the same rack",
        TOPOLOGY,
        nodes=racks(node0="rack1", node1="rack1", node2="rack2", node3="rack2"),
        queues=(Q("queue0", 4, parent="department-a"), Q("department-a", 4)),
        default_department=False,
        jobs=(
            run("running_job0", "queue0", "node0"),
            pend("pending_job0", "queue0", tasks=2, pack="rack", required=True),
        ),
        want={"running_job0": "node0", "pending_job0": "node2+node3"},
    ),
    case(
        "Required topology with multiple levels - schedule all tasks on the same rack",
        TOPOLOGY,
        nodes=racks(
            2, node0="rack1/spine1", node1="rack1/spine2", node2="rack2/spine1", node3="rack2/spine2"
        ),
        queues=(Q("queue0", 8, parent="department-a"), Q("department-a", 8)),
        default_department=False,
        jobs=(
            run("running_job0", "queue0", "node0"),
            pend("pending_job0", "queue0", tasks=4, pack="block", required=True),
        ),
        want={"running_job0": "node0", "pending_job0": "node2+node2+node3+node3"},
    ),
    case(
        "Required topology with multiple levels - schedule all tasks on the same partially occupied rack",
        TOPOLOGY,
        nodes=racks(2, node0="rack1/spine1", node1="rack1/spine2"),
        queues=(Q("queue0", 8, parent="department-a"), Q("department-a", 8)),
        default_department=False,
        jobs=(
            run("running_job0", "queue0", "node0"),
            pend("pending_job0", "queue0", tasks=2, pack="block", required=True),
        ),
        # The rack is what the case asks for. KAI fills node0's last GPU first and puts the
        # second worker on node1; corral keeps both workers on node1, which has room for both.
        want={"running_job0": "node0", "pending_job0": "within:node0,node1"},
    ),
    case(
        "Required topology with multiple levels - job remains pending as no available rack can be found",
        TOPOLOGY,
        nodes=racks(
            2, node0="rack1/spine1", node1="rack1/spine2", node2="rack2/spine1", node3="rack2/spine2"
        ),
        queues=(Q("queue0", 8, parent="department-a"), Q("department-a", 8)),
        default_department=False,
        jobs=(
            run("running_job0", "queue0", "node0"),
            run("running_job1", "queue0", "node2"),
            pend("pending_job0", "queue0", tasks=4, pack="block", required=True),
        ),
        want={"running_job0": "node0", "running_job1": "node2", "pending_job0": "pending"},
    ),
    case(
        "Preferred topology - schedule job on the same rack",
        TOPOLOGY,
        nodes=racks(2, node0="rack1", node1="rack2"),
        queues=(Q("queue0", 4, parent="department-a"), Q("department-a", 4)),
        default_department=False,
        jobs=(run("running_job0", "queue0", "node0"), pend("pending_job0", "queue0", tasks=2, pack="rack")),
        want={"running_job0": "node0", "pending_job0": "node1+node1"},
    ),
    case(
        "Preferred topology - schedule job even if preferred constraint can't be met",
        TOPOLOGY,
        nodes=racks(2, node0="rack1", node1="rack2"),
        queues=(Q("queue0", 4, parent="department-a"), Q("department-a", 4)),
        default_department=False,
        jobs=(
            run("running_job0", "queue0", "node0"),
            run("running_job1", "queue0", "node1"),
            pend("pending_job0", "queue0", tasks=2, pack="rack"),
        ),
        want={"running_job0": "node0", "running_job1": "node1", "pending_job0": "node0+node1"},
    ),
    # -- integration_tests/allocate/allocate_test.go: every action, several rounds
    case(
        "allocate job but does not allow to project to go over allowance",
        INTEGRATION,
        preempt=True,
        nodes=gpus(4),
        queues=(Q("queue0", 2, limit=2, parent="department-a"), Q("department-a", 2)),
        default_department=False,
        jobs=(pend("pending_job0", "queue0", 2), pend("pending_job1", "queue0", 2)),
        want={"pending_job0": "node0", "pending_job1": "pending"},
    ),
    case(
        "allocate job but does not allow to department to go over allowance",
        INTEGRATION,
        preempt=True,
        nodes=gpus(4),
        queues=(Q("queue0", 2, parent="department-a"), Q("department-a", 2, limit=2)),
        default_department=False,
        jobs=(pend("pending_job0", "queue0", 2), pend("pending_job1", "queue0", 2)),
        want={"pending_job0": "node0", "pending_job1": "pending"},
    ),
    case(
        "allocate pending jobs, allow over quota for train jobs (with interactive jobs)",
        INTEGRATION,
        preempt=True,
        nodes=gpus(2),
        queues=(Q("queue0", 1), Q("queue1", 1)),
        jobs=(pend("pending_job0", "queue0", priority="build"), pend("pending_job1", "queue0")),
        want={"pending_job0": "node0", "pending_job1": "node0"},
    ),
    case(
        "don't allocate over quota build jobs",
        INTEGRATION,
        # KAI leaves the job that may not be preempted pending; it needs more than its queue's
        # nominal, all a job that may not be preempted may hold, so corral refuses it at submission.
        preempt=True,
        nodes=gpus(4),
        queues=(Q("queue0", 1), Q("queue1", 1)),
        jobs=(pend("pending_job0", "queue0", 2, priority="build"),),
        want={"pending_job0": "rejected"},
    ),
    case(
        "1 build job pending for each queue with different share - allocate the second",
        INTEGRATION,
        preempt=True,
        nodes=gpus(1),
        queues=(Q("queue0", 1), Q("queue1", 2)),
        jobs=(
            pend("pending_job0", "queue0", priority="build"),
            pend("pending_job1", "queue1", priority="build"),
        ),
        # KAI weighs what a queue would hold against its own deserved (1 of 1 against 1 of 2).
        # corral's share is what a queue holds over all the quota of its cohort tree (DESIGN §5,
        # fair sharing), the same for both here, and the tie goes to the job submitted first.
        want={"pending_job0": "node0", "pending_job1": "pending"},
    ),
    case(
        "6 pending train jobs - allocate the 1st 2 of each queue (verify the share is being updated during "
        "the allocation)",
        INTEGRATION,
        preempt=True,
        nodes=gpus(4),
        queues=(Q("queue0", 1), Q("queue1", 1)),
        jobs=tuple(pend(f"pending_job{i}", "queue0" if i < 3 else "queue1") for i in range(6)),
        want={
            "pending_job0": "node0",
            "pending_job1": "node0",
            "pending_job2": "pending",
            "pending_job3": "node0",
            "pending_job4": "node0",
            "pending_job5": "pending",
        },
    ),
    case(
        "try to allocate interactive after train when over-quota - train should be preempted for interactive "
        "to run",
        INTEGRATION,
        preempt=True,
        nodes=gpus(2),
        queues=(Q("queue0", 1, limit=1),),
        jobs=(
            run("running_job_train", "queue0", "node0"),
            pend("pending_job_interactive", "queue0", priority="build"),
        ),
        want={"running_job_train": "pending", "pending_job_interactive": "node0"},
    ),
    case(
        "try to allocate train after interactive when over-quota - train should not run",
        INTEGRATION,
        preempt=True,
        nodes=gpus(2),
        queues=(Q("queue0", 1, limit=1),),
        jobs=(
            run("pending_job_interactive0", "queue0", "node0", priority="build"),
            pend("pending_job_train1", "queue0"),
        ),
        want={"pending_job_interactive0": "node0", "pending_job_train1": "pending"},
    ),
    case(
        "three level queue hierarchy - allocate jobs across teams",
        INTEGRATION,
        preempt=True,
        nodes=gpus(4),
        queues=(
            Q("org", 4),
            Q("dept1", 2, parent="org"),
            Q("team1", 1, parent="dept1"),
            Q("team2", 1, parent="dept1"),
        ),
        default_department=False,
        jobs=(pend("job_team1", "team1"), pend("job_team2", "team2")),
        want={"job_team1": "node0", "job_team2": "node0"},
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_kai_allocate(case: Case) -> None:
    state = decide(case)
    got = {job: outcome(state, job, want) for job, want in case.want.items()}
    assert got == dict(case.want), case.source
