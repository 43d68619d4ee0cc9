"""Small builders for tests: job specs, placements, simulated clusters and logs of records.

They keep tests readable (``job().gpus(8).pack("nvlink").build()``) and put every wire detail
(subjects, envelopes, sequence numbers) in one place, so a test says what happens, not how it is
encoded. The hypothesis strategies at the end build the same things at random.

Admissions claim quota, and the fold voids one that does not name what the job holds or that its
queue cannot give. So ``LogBuilder.admit`` proposes what admission would: the GPUs the job's gang
holds on the quota key its queue counts them on (``projections.quota.admission``), and a log that
admits jobs must first apply their queues (``LogBuilder.queue``; ``AMPLE`` quota unless a test is
about quota). ``running`` does that for the one queue it needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from hypothesis import strategies as st

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    MigSlot,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    JobAccepted,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    Resources,
    RestartPolicy,
    SubmitJob,
    Topology,
    TopologyPack,
)
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeCondition,
    NodeConditionChanged,
    NodeCordoned,
    NodeInventory,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import (
    DEFAULT_PREEMPTION,
    ApplyFairShare,
    ApplyQueue,
    ApplyRetention,
    DeleteQueue,
    FairShareSpec,
    PreemptionPolicy,
    QueueSpec,
    Quota,
    RetentionSpec,
)
from corral.projections import indexes, quota
from corral.projections.fold import fold
from corral.projections.lifecycle import HOLDS_QUOTA, Phase
from corral.projections.state import JobState, State
from corral.services.agent.inventory import cluster

# Quota (whole GPUs, any model) of the queues tests apply when quota is not what they are about:
# more than any test cluster here holds, so only a test that means to meet a quota limit does.
AMPLE = 1024

# -- job specs ------------------------------------------------------------------------------------

# What the jobs tests build run, unless a test is about what a job runs.
TRAIN = ("python", "train.py")


class JobBuilder:
    """An immutable JobSpec under construction: every method returns a new builder."""

    def __init__(self, spec: JobSpec) -> None:
        self._spec = spec

    def _with(self, **changes: Any) -> JobBuilder:
        return JobBuilder(msgspec.structs.replace(self._spec, **changes))

    def _res(self, **changes: Any) -> JobBuilder:
        return self._with(resources=msgspec.structs.replace(self._spec.resources, **changes))

    def queue(self, name: str) -> JobBuilder:
        return self._with(queue=name)

    def gpus(self, n: int) -> JobBuilder:
        return self._res(gpus=n, gpu_milli=1000, mig=None)

    def milli(self, m: int) -> JobBuilder:
        """One shared GPU, ``m`` thousandths of it."""
        return self._res(gpus=1, gpu_milli=m, mig=None)

    def mig(self, profile: str) -> JobBuilder:
        return self._res(gpus=1, mig=profile)

    def cpu(self, milli: int) -> JobBuilder:
        return self._res(cpu_milli=milli)

    def memory(self, mib: int) -> JobBuilder:
        return self._res(memory_mib=mib)

    def models(self, *names: str) -> JobBuilder:
        return self._res(gpu_models=names)

    def gpu_memory(self, mib: int) -> JobBuilder:
        return self._res(min_gpu_memory_mib=mib)

    def replicas(self, n: int, minimum: int | None = None) -> JobBuilder:
        return self._with(replicas=n, min_replicas=minimum)

    def pack(self, pack: TopologyPack, required: bool = False) -> JobBuilder:
        return self._with(topology=Topology(pack, required))

    def restarts(self, n: int, policy: RestartPolicy = "on-failure") -> JobBuilder:
        return self._with(max_restarts=n, restart_policy=policy)

    def priority_class(self, name: str) -> JobBuilder:
        return self._with(priority_class=name)

    def preemptible(self, yes: bool = True) -> JobBuilder:
        return self._with(preemptible=yes)

    def checkpointable(self, yes: bool = True) -> JobBuilder:
        return self._with(checkpointable=yes)

    def estimate(self, seconds: float | None) -> JobBuilder:
        return self._with(runtime_estimate_s=seconds)

    def select(self, **labels: str) -> JobBuilder:
        return self._with(node_selector=labels)

    def build(self) -> JobSpec:
        return self._spec


SpecLike = JobSpec | JobBuilder


def spec_of(spec: SpecLike | None) -> JobSpec:
    if spec is None:
        return job().build()
    return spec.build() if isinstance(spec, JobBuilder) else spec


def job(queue: str = "team-a") -> JobBuilder:
    """A one-worker job asking for one whole GPU, 1 CPU and 1 GiB in ``queue``, running
    ``python train.py`` (admission refuses a job with nothing to run)."""
    return JobBuilder(JobSpec(queue=queue, resources=Resources(gpus=1), command=TRAIN))


# -- queues and admissions ------------------------------------------------------------------------


def queue_spec(
    name: str = "team-a",
    nominal: int = AMPLE,
    *,
    cohort: str | None = None,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    key: str = quota.ANY,
    preemption: PreemptionPolicy = DEFAULT_PREEMPTION,
) -> QueueSpec:
    """A queue with one quota key (any model unless ``key`` names one)."""
    quotas = {key: Quota(nominal, borrowing_limit, lending_limit)}
    return QueueSpec(name, cohort=cohort, quotas=quotas, preemption=preemption)


def admission(
    queue: QueueSpec, job_id: str, spec: SpecLike, attempt: int = 0, replicas: int | None = None
) -> Admission:
    """The faithful admission of job ``job_id`` of ``spec`` in ``queue`` at ``replicas`` (default
    all of them): what the fold expects an admission cycle to propose."""
    waiting = JobState(job_id, "", spec_of(spec), submitted_seq=0, submitted_at=0.0, attempt=attempt)
    return quota.admission(queue, waiting, replicas)


def move_to(state: State, job_id: str, phase: Phase) -> JobState:
    """Put a job of a State built by hand in ``phase``, in the State's indexes too, as a move of
    the fold would (the fold's own moves come from records)."""
    job = state.jobs[job_id]
    before, job.phase = job.phase, phase
    indexes.moved(state, job, before)
    change = (phase in HOLDS_QUOTA) - (before in HOLDS_QUOTA)
    if change:
        quota.count_holding(state, job, change)
    return job


# -- placements -----------------------------------------------------------------------------------


def whole(gpu: int) -> GpuClaim:
    return GpuClaim(gpu)


def share(gpu: int, milli: int) -> GpuClaim:
    return GpuClaim(gpu, milli=milli)


def mig_slot(gpu: int, profile: str, start: int) -> GpuClaim:
    return GpuClaim(gpu, mig=MigSlot(profile, start))


def worker(rank: int, node: str, *claims: GpuClaim) -> WorkerSlot:
    return WorkerSlot(rank, node, claims)


def placement(job_id: str, *workers: WorkerSlot, attempt: int = 0) -> Placement:
    return Placement(job_id, attempt, workers)


def on(node: str, *gpus: int, job_id: str, attempt: int = 0) -> Placement:
    """A one-worker placement of whole GPUs ``gpus`` of ``node``."""
    return placement(job_id, worker(0, node, *(whole(g) for g in gpus)), attempt=attempt)


# -- clusters -------------------------------------------------------------------------------------


class Cluster:
    """Simulated nodes from ``services.agent.inventory.cluster``, as the events their agents send."""

    def __init__(self, count: int = 1, profile: str = "h100-8x", prefix: str = "node") -> None:
        self.nodes: list[tuple[str, NodeInventory]] = cluster(count, profile, prefix)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.nodes]

    def events(self) -> Iterator[NodeRegistered]:
        for name, inventory in self.nodes:
            yield NodeRegistered(node=name, inventory=inventory)


# -- logs -----------------------------------------------------------------------------------------


class LogBuilder:
    """Records as the stream would store them: sequences from 1 up, stream time ``step`` seconds
    apart (one unless told; ``at`` moves the clock on).

    ``request`` publishes a bare request as a client does; ``event`` seals a service event in an
    envelope. The named shortcuts put each service event on the subject it belongs on.
    """

    def __init__(self, start_seq: int = 1, start_time: float = 1000.0, step: float = 1.0) -> None:
        self.records: list[Record] = []
        self._seq = start_seq
        self._time = start_time
        self._step = step
        # What ``admit`` needs to propose faithful admissions: each job's spec as first submitted
        # (a later duplicate is refused by the fold) and each queue as the admin last applied it.
        self._specs: dict[str, JobSpec] = {}
        self._queues: dict[str, QueueSpec] = {}

    @property
    def last_seq(self) -> int:
        return self._seq - 1

    @property
    def time(self) -> float:
        """The stream time the next record gets."""
        return self._time

    def at(self, time: float) -> LogBuilder:
        """Stamp the next records from stream time ``time`` on."""
        self._time = time
        return self

    def raw(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> LogBuilder:
        self.records.append(Record(self._seq, subject, data, headers, self._time))
        self._seq += 1
        self._time += self._step
        return self

    def request(self, tenant: str, verb: str, body: Event | dict[str, Any]) -> LogBuilder:
        if isinstance(body, SubmitJob) and verb == "submit":
            self._specs.setdefault(body.request_id, body.job)
        elif tenant == subj.ADMIN and isinstance(body, ApplyQueue) and verb == "queue":
            self._queues[body.queue.name] = body.queue
        elif tenant == subj.ADMIN and isinstance(body, DeleteQueue) and verb == "delete-queue":
            self._queues.pop(body.name, None)
        return self.raw(subj.request(tenant, verb), codec.encode(body))

    def event(self, subject: str, body: Event) -> LogBuilder:
        envelope = codec.seal(body, event_id=f"ev-{self._seq}", time=self._time, producer="tests")
        return self.raw(subject, codec.encode(envelope))

    # requests

    def submit(self, tenant: str, job_id: str, spec: SpecLike | None = None) -> LogBuilder:
        return self.request(tenant, "submit", SubmitJob(request_id=job_id, job=spec_of(spec)))

    def admin(self, verb: str, body: Event) -> LogBuilder:
        return self.request(subj.ADMIN, verb, body)

    def queue(self, spec: QueueSpec | str = "team-a") -> LogBuilder:
        """The admin applies a queue: ``spec``, or one of that name with ``AMPLE`` quota."""
        q = queue_spec(spec) if isinstance(spec, str) else spec
        return self.admin("queue", ApplyQueue(queue=q))

    def fair_share(self, half_life_s: float) -> LogBuilder:
        """The admin sets the fair-share half-life."""
        return self.admin("fair-share", ApplyFairShare(fair_share=FairShareSpec(half_life_s=half_life_s)))

    def retention(
        self,
        finished_s: float,
        jobs_per_tenant: int = RetentionSpec().jobs_per_tenant,
        spec_bytes_per_tenant: int = RetentionSpec().spec_bytes_per_tenant,
    ) -> LogBuilder:
        """The admin sets how long finished jobs stay in the state, and how many a tenant may have
        there, holding how much."""
        spec = RetentionSpec(
            finished_s=finished_s,
            jobs_per_tenant=jobs_per_tenant,
            spec_bytes_per_tenant=spec_bytes_per_tenant,
        )
        return self.admin("retention", ApplyRetention(retention=spec))

    def queues(self, *names: str) -> LogBuilder:
        """The admin applies each queue of ``names`` with ``AMPLE`` quota."""
        for name in names:
            self.queue(name)
        return self

    # admission

    def accept(self, job_id: str, priority: int = 0) -> LogBuilder:
        return self.event(subj.job(job_id), JobAccepted(job_id=job_id, priority=priority))

    def admit(self, *job_ids: str, attempt: int = 0, replicas: int = 1) -> LogBuilder:
        """One admission cycle admitting ``job_ids`` in order, each as admission would propose it."""
        return self.admit_as(*(self.admission(j, attempt, replicas) for j in job_ids))

    def admit_as(self, *admissions: Admission) -> LogBuilder:
        """One admission cycle proposing exactly ``admissions``, faithful or not."""
        body = JobsAdmitted(based_on=self.last_seq, now=self._time, admissions=admissions)
        return self.event(subj.decision("admission"), body)

    def admission(self, job_id: str, attempt: int = 0, replicas: int = 1) -> Admission:
        """The faithful admission of a job submitted to this log, in its queue as applied so far.
        A job this log never submitted holds nothing; a queue never applied counts on ``"*"``."""
        spec = self._specs.get(job_id)
        if spec is None:
            return Admission(job_id, attempt, replicas)
        return admission(self._queues.get(spec.queue, QueueSpec(spec.queue)), job_id, spec, attempt, replicas)

    def grow(self, job_id: str, replicas: int, attempt: int = 0) -> LogBuilder:
        """One admission cycle growing running elastic job ``job_id`` to ``replicas`` in all."""
        body = JobsAdmitted(
            based_on=self.last_seq,
            now=self._time,
            admissions=(),
            growths=(self.admission(job_id, attempt, replicas),),
        )
        return self.event(subj.decision("admission"), body)

    def withdraw(
        self, job_id: str, attempt: int = 0, why: str = "no node can host it", admit_after: float = 0.0
    ) -> LogBuilder:
        """Admission withdraws the job's admission: no node can host it, or (``admit_after``) it
        was placed nowhere for the placement timeout and backs off until then."""
        code = "placement-timeout" if admit_after else "no-node"
        body = AdmissionWithdrawn(
            job_id=job_id, attempt=attempt, reason=Reason(code, why), admit_after=admit_after
        )
        return self.event(subj.job(job_id), body)

    def requeue(self, job_id: str, attempt: int, code: str = "retry") -> LogBuilder:
        body = JobRequeued(job_id=job_id, attempt=attempt, reason=Reason(code, code))
        return self.event(subj.job(job_id), body)

    # placer and preemptor

    def place(self, *placements: Placement) -> LogBuilder:
        body = JobsPlaced(based_on=self.last_seq, now=self._time, placements=placements)
        return self.event(subj.decision("placer"), body)

    def preempt(
        self, beneficiary: str, *victims: str, attempt: int = 0, decided_at: float | None = None
    ) -> LogBuilder:
        """The preemptor asks ``victims`` to stop within 30 s; ``decided_at``: its ``now``, when
        its clock is not the stream's."""
        now = self._time if decided_at is None else decided_at
        body = PreemptionRequested(
            based_on=self.last_seq,
            now=now,
            beneficiary=beneficiary,
            victims=tuple(Victim(v, attempt) for v in victims),
            deadline=now + 30.0,
        )
        return self.event(subj.decision("preemptor"), body)

    def shrink(
        self, job_id: str, replicas: int, beneficiary: str, attempt: int = 0, decided_at: float | None = None
    ) -> LogBuilder:
        now = self._time if decided_at is None else decided_at
        body = ShrinkRequested(
            based_on=self.last_seq,
            now=now,
            job_id=job_id,
            attempt=attempt,
            replicas=replicas,
            beneficiary=beneficiary,
            deadline=now + 30.0,
        )
        return self.event(subj.decision("preemptor"), body)

    # nodes and workers

    def nodes(self, nodes: Cluster) -> LogBuilder:
        for ev in nodes.events():
            self.event(subj.node(ev.node), ev)
        return self

    def node(self, name: str, inventory: NodeInventory) -> LogBuilder:
        return self.event(subj.node(name), NodeRegistered(node=name, inventory=inventory))

    def started(self, node: str, job_id: str, rank: int = 0, attempt: int = 0) -> LogBuilder:
        body = WorkerStarted(node=node, job_id=job_id, attempt=attempt, rank=rank)
        return self.event(subj.node(node), body)

    def exited(
        self, node: str, job_id: str, rank: int = 0, code: int = 0, attempt: int = 0, stopped: bool = False
    ) -> LogBuilder:
        body = WorkerExited(node=node, job_id=job_id, attempt=attempt, rank=rank, code=code, stopped=stopped)
        return self.event(subj.node(node), body)

    def checkpoint(self, node: str, job_id: str, step: int, attempt: int = 0) -> LogBuilder:
        body = CheckpointCompleted(
            node=node, job_id=job_id, attempt=attempt, location=f"/ckpt/{job_id}/{step}", step=step
        )
        return self.event(subj.node(node), body)

    def shutdown(self, node: str, reason: str = "", registers_again: bool = True) -> LogBuilder:
        body = NodeShutdown(node=node, at=self.time, reason=reason, registers_again=registers_again)
        return self.event(subj.node(node), body)

    def condition(self, node: str, condition: NodeCondition) -> LogBuilder:
        return self.event(subj.node(node), NodeConditionChanged(node=node, condition=condition))

    def gpu_health(self, node: str, gpu: int, healthy: bool, signal: str = "xid:79") -> LogBuilder:
        body = GpuHealthChanged(node=node, gpu=gpu, healthy=healthy, signal=signal)
        return self.event(subj.node(node), body)

    def cordon(self, node: str, cordoned: bool = True, drain: bool = False) -> LogBuilder:
        return self.event(subj.node(node), NodeCordoned(node=node, cordoned=cordoned, drain=drain))

    # folding

    def fold(self, state: State | None = None) -> State:
        return fold(self.records, state)


def running(
    job_id: str = "j1",
    spec: SpecLike | None = None,
    *,
    node: str = "node-00",
    gpus: tuple[int, ...] = (0,),
    tenant: str = "alice",
    log: LogBuilder | None = None,
    nodes: Cluster | None = None,
) -> LogBuilder:
    """A log in which one single-worker job runs on whole GPUs ``gpus`` of ``node``. A new log
    starts with the nodes and the job's queue; a given ``log`` must have applied the queue."""
    if log is None:
        log = LogBuilder().nodes(nodes or Cluster()).queue(spec_of(spec).queue)
    return (
        log.submit(tenant, job_id, spec)
        .accept(job_id)
        .admit(job_id)
        .place(on(node, *gpus, job_id=job_id))
        .started(node, job_id)
    )


# -- hypothesis strategies ------------------------------------------------------------------------

# Ids of jobs, nodes, queues and tenants drawn from one small pool, so that they collide across kinds.
names = st.sampled_from(["j1", "j2", "j3", "node-00", "node-01", "team-a", "alice", "admin"])
small_ints = st.integers(min_value=-2, max_value=9)

job_specs: st.SearchStrategy[JobSpec] = st.builds(
    JobSpec,
    queue=st.sampled_from(["team-a", "team-b"]),
    replicas=st.integers(min_value=0, max_value=3),
    resources=st.builds(
        Resources,
        gpus=st.integers(min_value=0, max_value=3),
        gpu_milli=st.sampled_from([250, 500, 1000]),
        mig=st.none() | st.sampled_from(["1g.10gb", "3g.40gb", "1g.10gb+me", "7g.80gb"]),
    ),
    restart_policy=st.sampled_from(["never", "on-failure", "always"]),
    max_restarts=st.integers(min_value=0, max_value=2),
    min_replicas=st.none() | st.integers(min_value=0, max_value=2),
)

gpu_claims: st.SearchStrategy[GpuClaim] = st.builds(
    GpuClaim,
    gpu=small_ints,
    milli=st.sampled_from([250, 500, 1000, 0, -1]),
    mig=st.none()
    | st.builds(MigSlot, st.sampled_from(["1g.10gb", "3g.40gb", "1g.10gb+me", "9g"]), small_ints),
)

placements: st.SearchStrategy[Placement] = st.builds(
    Placement,
    job_id=names,
    attempt=small_ints,
    workers=st.lists(
        st.builds(WorkerSlot, rank=small_ints, node=names, gpus=st.lists(gpu_claims, max_size=3).map(tuple)),
        max_size=3,
    ).map(tuple),
)

_T = 1000.0

admissions = st.builds(
    Admission,
    names,
    small_ints,
    small_ints,
    st.dictionaries(st.sampled_from([quota.ANY, "H100-80GB"]), small_ints, max_size=2),
)

# Every service event and request, valid in shape but with arbitrary ids, attempts and indices.
service_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(JobAccepted, job_id=names, priority=small_ints),
    st.builds(JobRequeued, job_id=names, attempt=small_ints, reason=st.just(Reason("r", "r"))),
    st.builds(
        JobsAdmitted,
        based_on=st.just(0),
        now=st.just(_T),
        admissions=st.lists(admissions, max_size=3).map(tuple),
        growths=st.lists(admissions, max_size=2).map(tuple),
    ),
    st.builds(
        JobsPlaced,
        based_on=st.just(0),
        now=st.just(_T),
        placements=st.lists(placements, max_size=3).map(tuple),
    ),
    st.builds(
        PreemptionRequested,
        based_on=st.just(0),
        now=st.just(_T),
        beneficiary=names,
        victims=st.lists(st.builds(Victim, names, small_ints), max_size=3).map(tuple),
        deadline=st.just(_T),
    ),
    st.builds(
        ShrinkRequested,
        based_on=st.just(0),
        now=st.just(_T),
        job_id=names,
        attempt=small_ints,
        replicas=small_ints,
        beneficiary=names,
        deadline=st.just(_T),
    ),
    st.builds(WorkerStarted, node=names, job_id=names, attempt=small_ints, rank=small_ints),
    st.builds(
        WorkerExited,
        node=names,
        job_id=names,
        attempt=small_ints,
        rank=small_ints,
        code=small_ints,
        stopped=st.booleans(),
    ),
    st.builds(
        CheckpointCompleted, node=names, job_id=names, attempt=small_ints, location=names, step=small_ints
    ),
    st.builds(NodeConditionChanged, node=names, condition=st.sampled_from(["ready", "suspect", "lost"])),
    st.builds(GpuHealthChanged, node=names, gpu=small_ints, healthy=st.booleans(), signal=names),
    st.builds(NodeCordoned, node=names, cordoned=st.booleans(), drain=st.booleans()),
    st.builds(NodeShutdown, node=names, at=st.just(_T), reason=names, registers_again=st.booleans()),
)


def home_subject(ev: Event) -> str:
    """The subject a service event belongs on (where the fold accepts it from its writer)."""
    if isinstance(ev, JobsAdmitted):
        return subj.decision("admission")
    if isinstance(ev, JobsPlaced | JobsUnschedulable):
        return subj.decision("placer")
    if isinstance(ev, PreemptionRequested | ShrinkRequested):
        return subj.decision("preemptor")
    node = getattr(ev, "node", None)
    if node is not None:
        return subj.node(node)
    return subj.job(ev.job_id)  # type: ignore[attr-defined]
