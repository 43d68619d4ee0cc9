"""A synthetic log with the shape of a busy cluster's, for the benchmarks.

``synthetic_log(n)`` plays job lifecycles on a simulated cluster (``services.agent.inventory.cluster``)
in scheduling cycles, and writes what each writer would append for them: admin requests setting
up queues, node registrations, tenants' submit requests (bare JSON on
``corral.in.<tenant>.submit``), admission's acceptances, requeues and batched admissions, the
placer's batched placements (and unschedulable reports), node agents' worker starts, exits and
checkpoints. Whole-GPU gangs, single workers, fractional GPUs and MIG slices all appear; a few
workers fail and their jobs go round again at the next attempt.

Invariant: the log folds with no faults and no rejections. The generator folds what it writes
as it goes, and admits only what the fold's own quota ledger says fits; it keeps a book of free
GPUs, CPU and memory mirroring the fold's, so every placement it proposes holds. It is
deterministic for a given ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from msgspec.structs import replace

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    MigSlot,
    Placement,
    Unschedulable,
    WorkerSlot,
)
from corral.events.jobs import (
    Admission,
    CancelJob,
    JobAccepted,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    Resources,
    SubmitJob,
    Topology,
)
from corral.events.log import Append, Record
from corral.events.nodes import (
    CheckpointCompleted,
    NodeInventory,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
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
from corral.projections.state import State
from corral.services.agent.inventory import cluster

T0 = 1_700_000_000.0  # stream time of the first record
RATE = 100.0  # records a second of stream time
TENANTS = ("vision", "speech", "llm", "recsys", "research")
PRIORITIES = {"low": -10, "normal": 0, "high": 100}
GIB = 1024
MAX_PER_DECISION = 100  # proposals per admission or placement event
BACKLOG = 64  # tenants stop submitting while this many jobs wait, so the queue stays bounded


@dataclass
class _Gpu:
    model: str
    mig: bool
    used_milli: int = 0
    mig_used: int = 0


@dataclass
class _Node:
    name: str
    inventory: NodeInventory
    gpus: list[_Gpu]
    cpu_free: int
    memory_free: int
    models: frozenset[str] = frozenset()  # of its GPUs not in MIG mode
    mig: bool = False  # whether any GPU is in MIG mode
    idle: int = 0  # GPUs not in MIG mode that nothing holds


@dataclass
class _Job:
    id: str
    tenant: str
    spec: JobSpec
    trace: str
    attempt: int = 0
    restarts: int = 0
    placement: Placement | None = None
    ends: int = 0
    reported: bool = False  # told unschedulable in this attempt
    # The last release epoch in which admission (and the placer) tried this job and found no
    # room: nothing is tried again until something is given back.
    tried_admit: int = -1
    tried_place: int = -1
    steps: int = 0


@dataclass
class _Claim:
    node: _Node
    gpu: int
    milli: int
    mig_mask: int = 0


@dataclass
class _Book:
    """Free capacity, as the fold will see it."""

    nodes: list[_Node]
    held: dict[str, list[tuple[_Node, Resources, list[_Claim]]]] = field(default_factory=dict)


def _spec(rng: random.Random, tenant: str) -> JobSpec:
    kind = rng.choices(("gang", "node", "small", "frac", "mig"), weights=(1, 2, 5, 3, 3))[0]
    pc = rng.choices(tuple(PRIORITIES), weights=(2, 6, 1))[0]
    base = JobSpec(
        queue=tenant,
        priority_class=pc,
        command=("python", "train.py", f"--config={tenant}.yaml"),
        env={"WANDB_PROJECT": tenant},
        checkpointable=kind in ("gang", "node"),
        runtime_estimate_s=float(rng.randint(60, 36_000)),
    )
    if kind == "gang":
        model = rng.choice(("H100-80GB", "A100-80GB"))
        res = Resources(gpus=8, cpu_milli=64_000, memory_mib=256 * GIB, gpu_models=(model,))
        return replace(base, replicas=rng.randint(2, 3), resources=res, topology=Topology("block"))
    if kind == "node":
        res = Resources(gpus=8, cpu_milli=64_000, memory_mib=256 * GIB, gpu_models=("H100-80GB",))
        return replace(base, resources=res, topology=Topology("nvlink", required=True))
    if kind == "small":
        g = rng.choice((1, 1, 2, 4))
        return replace(base, resources=Resources(gpus=g, cpu_milli=8_000 * g, memory_mib=32 * GIB * g))
    if kind == "frac":
        res = Resources(gpus=1, gpu_milli=rng.choice((250, 500)), cpu_milli=2_000, memory_mib=8 * GIB)
        return replace(base, resources=res)
    profile = rng.choice(("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))
    return replace(base, resources=Resources(gpus=1, mig=profile, cpu_milli=4_000, memory_mib=16 * GIB))


def _fit_worker(node: _Node, res: Resources) -> list[_Claim] | None:
    """The claims one worker would take on ``node``, or None if it does not fit there."""
    if node.cpu_free < res.cpu_milli or node.memory_free < res.memory_mib:
        return None
    if res.mig is not None:
        if not node.mig:
            return None
        for i, g in enumerate(node.gpus):
            if g.mig:
                p = mig.profile(g.model, res.mig)
                starts = mig.free_starts(g.model, res.mig, g.mig_used)
                if p is not None and starts:
                    return [_Claim(node, i, p.size * 1000 // mig.SLICES, mig.mask(p, starts[0]))]
        return None
    if res.gpu_models and not any(m in node.models for m in res.gpu_models):
        return None
    if res.gpu_milli >= 1000 and node.idle < res.gpus:
        return None
    usable = [
        i for i, g in enumerate(node.gpus) if not g.mig and (not res.gpu_models or g.model in res.gpu_models)
    ]
    if res.gpus == 1 and res.gpu_milli < 1000:
        # Shared GPUs: fill one that is already shared before opening another.
        for i in sorted(usable, key=lambda i: -node.gpus[i].used_milli):
            if node.gpus[i].used_milli + res.gpu_milli <= 1000:
                return [_Claim(node, i, res.gpu_milli)]
        return None
    free = [i for i in usable if node.gpus[i].used_milli == 0]
    if len(free) < res.gpus:
        return None
    return [_Claim(node, i, 1000) for i in free[: res.gpus]]


def _take(node: _Node, res: Resources, claims: list[_Claim]) -> None:
    node.cpu_free -= res.cpu_milli
    node.memory_free -= res.memory_mib
    for c in claims:
        g = node.gpus[c.gpu]
        if not g.mig and g.used_milli == 0:
            node.idle -= 1
        g.used_milli += c.milli
        g.mig_used |= c.mig_mask


def _give_back(node: _Node, res: Resources, claims: list[_Claim]) -> None:
    node.cpu_free += res.cpu_milli
    node.memory_free += res.memory_mib
    for c in claims:
        g = node.gpus[c.gpu]
        g.used_milli -= c.milli
        g.mig_used &= ~c.mig_mask
        if not g.mig and g.used_milli == 0:
            node.idle += 1


def _place(book: _Book, job: _Job, rng: random.Random) -> Placement | None:
    """Place the whole gang (each rank on its own node) or nothing."""
    res = job.spec.resources
    taken: list[tuple[_Node, Resources, list[_Claim]]] = []
    offset = rng.randrange(len(book.nodes))
    order = book.nodes[offset:] + book.nodes[:offset]
    used: set[str] = set()
    for _ in range(job.spec.replicas):
        for node in order:
            if node.name in used:
                continue
            claims = _fit_worker(node, res)
            if claims is not None:
                _take(node, res, claims)
                taken.append((node, res, claims))
                used.add(node.name)
                break
        else:
            for node, r, claims in taken:
                _give_back(node, r, claims)
            return None
    book.held[job.id] = taken
    workers = []
    for rank, (node, _, claims) in enumerate(taken):
        gpus = []
        for c in claims:
            if res.mig is not None:
                start = (c.mig_mask & -c.mig_mask).bit_length() - 1
                gpus.append(GpuClaim(c.gpu, mig=MigSlot(res.mig, start)))
            else:
                gpus.append(GpuClaim(c.gpu, milli=c.milli))
        workers.append(WorkerSlot(rank, node.name, tuple(gpus)))
    return Placement(job.id, job.attempt, tuple(workers))


class _Writer:
    """Appends in log order, each stamped (envelope and stream alike) with the stream time that
    ``records`` gives it, and folds each as it goes."""

    def __init__(self, rng: random.Random) -> None:
        self.out: list[Append] = []
        self.rng = rng
        self.last_decision: dict[str, int] = {}
        self.state = State()  # what the fold makes of the log so far

    @property
    def seq(self) -> int:
        return len(self.out)

    @property
    def now(self) -> float:
        """The stream time of the next append."""
        return T0 + self.seq / RATE

    def request(self, tenant: str, verb: str, body: Event, msg_id: str, trace: str | None = None) -> None:
        headers = {"traceparent": self._span(trace)} if trace else None
        subject = subj.request(tenant, verb)
        now = self.now
        self.out.append(Append(subject, codec.encode(body), msg_id, None, headers))
        apply_event(self.state, self.seq, subject, body, now, tenant)

    def event(self, subject: str, body: Event, msg_id: str, producer: str, trace: str | None = None) -> None:
        now = self.now
        tp = self._span(trace) if trace else None
        env = codec.seal(
            body, event_id=msg_id, time=now, producer=producer, traceparent=tp, correlation=trace
        )
        headers = {"traceparent": tp} if tp else None
        expected = None
        if subject.startswith(f"{subj.EV}.decision."):
            # Decisions are fenced on their role's subject, as the services write them.
            expected = self.last_decision.get(subject, 0)
            self.last_decision[subject] = self.seq + 1
        self.out.append(Append(subject, codec.encode(env), msg_id, expected, headers))
        apply_event(self.state, self.seq, subject, body, now)

    def _span(self, trace: str | None) -> str:
        return f"00-{trace}-{self.rng.getrandbits(64):016x}-01"


def synthetic_log(n_events: int, seed: int = 0, nodes: int = 40) -> list[Append]:
    """``n_events`` appends of a cluster of ``nodes`` simulated nodes at work."""
    rng = random.Random(seed)
    w = _Writer(rng)
    _setup(w)
    book = _Book([])
    for name, inv in cluster(nodes):
        gpus = [_Gpu(g.model, g.mig) for g in inv.gpus]
        models = frozenset(g.model for g in gpus if not g.mig)
        idle = sum(not g.mig for g in gpus)
        node = _Node(name, inv, gpus, inv.cpu_milli, inv.memory_mib, models, any(g.mig for g in gpus), idle)
        book.nodes.append(node)
        w.event(
            subj.node(name), NodeRegistered(node=name, inventory=inv), f"register:{name}", f"agent/{name}"
        )

    queued: list[_Job] = []  # accepted or requeued, waiting for admission
    admitted: list[_Job] = []
    running: list[_Job] = []
    cycle = 0
    serial = 0
    epoch = 0  # counts the cycles in which GPUs and quota were given back
    appended = 0  # the log's length when the cycle before began
    while len(w.out) < n_events:
        cycle += 1
        if cycle > 1 and not running and len(w.out) == appended:
            # Jammed: nothing runs and the last cycle wrote nothing, so what waits can never be
            # admitted or placed (a gang this cluster cannot host holding the quota others
            # need). Its owners cancel it all, and the next cycle starts afresh.
            for job in (*admitted, *queued):
                cancel = CancelJob(job_id=job.id, reason="cannot run on this cluster")
                w.request(job.tenant, "cancel", cancel, f"cancel:{job.id}:{job.attempt}", job.trace)
            admitted, queued = [], []
            epoch += 1
        appended = len(w.out)

        # Workers finish (or fail) and give their GPUs back.
        still: list[_Job] = []
        for job in running:
            if job.ends > cycle:
                if job.spec.resources.gpus >= 8 and rng.random() < 0.05:
                    _checkpoint(w, job)
                still.append(job)
                continue
            if _finish(w, book, job, rng):
                queued.append(job)
        if len(still) < len(running):
            epoch += 1
        running = still

        # Tenants submit; admission accepts.
        if len(queued) + len(admitted) < BACKLOG:
            for _ in range(rng.randint(2, 12)):
                serial += 1
                tenant = rng.choice(TENANTS)
                job = _Job(
                    f"{tenant}-{serial:07d}", tenant, _spec(rng, tenant), f"{rng.getrandbits(128):032x}"
                )
                w.request(
                    tenant,
                    "submit",
                    SubmitJob(request_id=job.id, job=job.spec),
                    f"submit:{job.id}",
                    job.trace,
                )
                accepted = JobAccepted(job_id=job.id, priority=PRIORITIES[job.spec.priority_class])
                w.event(subj.job(job.id), accepted, f"accept:{job.id}", "admission", job.trace)
                queued.append(job)

        # Admission admits whole gangs within quota, a cycle's worth per event; the rest waits.
        ledger = quota.Ledger.from_state(w.state)
        room: dict[tuple[str, str], int] = {}  # what was available, an upper bound for the cycle
        admissions: list[Admission] = []
        waiting_quota: list[_Job] = []
        over: set[tuple[object, ...]] = set()  # (queue, shape) that did not fit: usage only grows
        for job in queued:
            shape = (job.spec.queue, job.spec.replicas, job.spec.resources)
            skip = shape in over or job.tried_admit == epoch
            adm = None if skip else _admission(ledger, room, w.state, job)
            if adm is None:
                over.add(shape)
                job.tried_admit = epoch
                waiting_quota.append(job)
            else:
                admissions.append(adm)
                admitted.append(job)
        for lo in range(0, len(admissions), MAX_PER_DECISION):
            chunk = tuple(admissions[lo : lo + MAX_PER_DECISION])
            body_a = JobsAdmitted(based_on=w.seq, now=w.now, admissions=chunk)
            w.event(subj.decision("admission"), body_a, f"admit:{cycle}:{lo}", "admission")
        queued = waiting_quota

        # The placer places what fits, whole gangs at once, and says why the rest waits.
        placed: list[_Job] = []
        waiting: list[_Job] = []
        full: set[tuple[int, Resources]] = set()  # shapes that did not fit: free capacity only shrinks
        for job in admitted:
            gang = (job.spec.replicas, job.spec.resources)
            skip = gang in full or job.tried_place == epoch
            p = None if skip else _place(book, job, rng)
            if p is None:
                full.add(gang)
                job.tried_place = epoch
                waiting.append(job)
            else:
                job.placement = p
                placed.append(job)
        for lo in range(0, len(placed), MAX_PER_DECISION):
            placements = tuple(
                j.placement for j in placed[lo : lo + MAX_PER_DECISION] if j.placement is not None
            )
            body_p = JobsPlaced(based_on=w.seq, now=w.now, placements=placements)
            w.event(subj.decision("placer"), body_p, f"place:{cycle}:{lo}", "placer")
        news = [j for j in waiting if not j.reported]
        if news:
            why = (Reason("insufficient-gpus", "no node has the free GPUs this gang needs", True),)
            body_u = JobsUnschedulable(
                based_on=w.seq, now=w.now, jobs=tuple(Unschedulable(j.id, j.attempt, why) for j in news)
            )
            w.event(subj.decision("placer"), body_u, f"unschedulable:{cycle}", "placer")
            for j in news:
                j.reported = True
        admitted = waiting

        # Node agents start the placed workers.
        for job in placed:
            assert job.placement is not None
            for slot in job.placement.workers:
                body_s = WorkerStarted(
                    node=slot.node,
                    job_id=job.id,
                    attempt=job.attempt,
                    rank=slot.rank,
                    pid=rng.randint(1000, 99999),
                )
                msg_id = f"start:{job.id}:{job.attempt}:{slot.rank}"
                w.event(subj.node(slot.node), body_s, msg_id, f"agent/{slot.node}", job.trace)
            job.ends = cycle + rng.randint(1, 30)
            running.append(job)
    return w.out[:n_events]


def _setup(w: _Writer) -> None:
    for name, value in PRIORITIES.items():
        pc = PriorityClassSpec(name, value, preemptible=name != "high")
        w.request(subj.ADMIN, "priority-class", ApplyPriorityClass(priority_class=pc), f"pc:{name}")
    w.request(subj.ADMIN, "cohort", ApplyCohort(cohort=CohortSpec("research-org")), "cohort:research-org")
    for tenant in TENANTS:
        # Together the queues' nominal quota is about the cluster's GPUs (240 on 40 nodes).
        quotas = {"*": Quota(nominal=48, borrowing_limit=48, lending_limit=24)}
        q = QueueSpec(tenant, cohort="research-org", quotas=quotas, tenants=(tenant,))
        w.request(subj.ADMIN, "queue", ApplyQueue(queue=q), f"queue:{tenant}")


def _admission(
    ledger: quota.Ledger, room: dict[tuple[str, str], int], state: State, job: _Job
) -> Admission | None:
    """The admission of the whole gang against the first quota key it fits, charged to the
    ledger; None while no key has room. ``room`` keeps what each (queue, key) had available
    when first asked this cycle: availability only shrinks as admissions are charged."""
    spec = job.spec
    for key in quota.candidate_keys(ledger.spec(spec.queue), spec.resources):
        milli = quota.worker_milli(spec.resources, key) * spec.replicas
        bound = room.get((spec.queue, key))
        if bound is None:
            bound = room[spec.queue, key] = ledger.available(spec.queue, key)
        if milli > bound or not ledger.fits(spec.queue, key, milli):
            continue  # claim would refuse it too, after composing an explanation
        adm = Admission(job.id, job.attempt, spec.replicas, quota.admission_gpus(key, milli))
        if ledger.claim(state.jobs[job.id], adm) is None:
            return adm
    return None


def _checkpoint(w: _Writer, job: _Job) -> None:
    assert job.placement is not None
    job.steps += 1000
    node = job.placement.workers[0].node
    body = CheckpointCompleted(
        node=node,
        job_id=job.id,
        attempt=job.attempt,
        location=f"s3://ckpt/{job.id}/{job.steps}",
        step=job.steps,
    )
    w.event(subj.node(node), body, f"ckpt:{job.id}:{job.attempt}:{job.steps}", f"agent/{node}", job.trace)


def _finish(w: _Writer, book: _Book, job: _Job, rng: random.Random) -> bool:
    """Every worker exits; True if one failed and the job goes back to its queue."""
    assert job.placement is not None
    fails = job.restarts < job.spec.max_restarts and rng.random() < 0.05
    for slot in job.placement.workers:
        # A failed rank breaks the gang: the agents stop the others.
        code = (1 if slot.rank == 0 else 143) if fails else 0
        body = WorkerExited(
            node=slot.node,
            job_id=job.id,
            attempt=job.attempt,
            rank=slot.rank,
            code=code,
            stopped=fails and code == 143,
        )
        msg_id = f"exit:{job.id}:{job.attempt}:{slot.rank}"
        w.event(subj.node(slot.node), body, msg_id, f"agent/{slot.node}", job.trace)
    for node, res, claims in book.held.pop(job.id):
        _give_back(node, res, claims)
    if not fails:
        return False
    requeue = JobRequeued(
        job_id=job.id, attempt=job.attempt, reason=Reason("restarting", "rank 0 exited with code 1")
    )
    w.event(subj.job(job.id), requeue, f"requeue:{job.id}:{job.attempt}", "admission", job.trace)
    job.restarts += 1
    job.attempt += 1
    job.placement = None
    job.reported = False
    job.tried_admit = job.tried_place = -1
    return True


def records(appends: Sequence[Append]) -> list[Record]:
    """The records a stream would hold for ``appends``: sequences from 1, ``RATE`` a second from
    ``T0`` (the times the synthetic log's envelopes carry)."""
    return [Record(i + 1, a.subject, a.data, a.headers, T0 + i / RATE) for i, a in enumerate(appends)]
