"""Safety properties of the fold, on logs hypothesis makes up.

- It never raises and never faults, whatever it is fed: random bytes, random subjects, JSON of the
  wrong types, valid events out of order or on the wrong subject.
- A snapshot (msgpack of State) at any cut, plus the tail, is the same state as folding it all.
- Whatever placers race to propose, no GPU is over-allocated, a whole GPU has one holder, and
  the winners are exactly the first proposals that still held, in log order; replicas agree.
- Whatever admissions are proposed, no queue ever holds more than its nominal quota plus its
  borrowing limit, nor a cohort more than its members lend; an admission wins exactly when it
  is faithful and keeps both true.
- Folding is deterministic, and the simulator's decoded path agrees with the wire path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    MigSlot,
    Placement,
    PreemptionRequested,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import (
    AdmissionWithdrawn,
    CancelJob,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    ResizeJob,
    SubmitJob,
)
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    GpuInfo,
    NodeConditionChanged,
    NodeCordoned,
    NodeInventory,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    CordonNode,
    DeleteQueue,
    PriorityClassSpec,
    QueueSpec,
    Quota,
    RetentionSpec,
)
from corral.projections import indexes
from corral.projections.fold import apply_event, fold
from corral.projections.lifecycle import HOLDS_QUOTA
from corral.projections.state import WHOLE, State
from corral.services.agent.inventory import h100_8x_mig, h100_8x_nvswitch
from tests.builders import (
    JobBuilder,
    LogBuilder,
    admission,
    home_subject,
    job,
    job_specs,
    mig_slot,
    names,
    on,
    placement,
    queue_spec,
    service_events,
    share,
    whole,
    worker,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- what the log may hold ------------------------------------------------------------------------

SUBJECTS = [
    "corral.in.alice.submit",
    "corral.in.alice.cancel",
    "corral.in.bob.resize",
    "corral.in.alice.queue",
    "corral.in.admin.queue",
    "corral.in.admin.cohort",
    "corral.in.admin.cordon",
    "corral.in.admin.submit",
    "corral.ev.job.j1",
    "corral.ev.job.j2",
    "corral.ev.node.node-00",
    "corral.ev.node.node-01",
    "corral.ev.decision.placer",
    "corral.ev.decision.admission",
    "corral.ev.decision.preemptor",
    "corral.ev.queue.team-a",
    "corral.in.",
    "corral.ev.",
    "corral.hb.node-00",
]
subjects = st.sampled_from(SUBJECTS) | st.text(max_size=30)
tenants = st.sampled_from(["alice", "bob", "admin"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)

# One quota key's limits; a negative nominal is malformed and refused.
quota_limits = st.builds(
    Quota, st.integers(-1, 8), st.none() | st.integers(0, 4), st.none() | st.integers(0, 4)
)

requests: st.SearchStrategy[tuple[str, Event]] = st.one_of(
    st.tuples(st.just("submit"), st.builds(SubmitJob, request_id=names, job=job_specs)),
    st.tuples(st.just("cancel"), st.builds(CancelJob, job_id=names)),
    st.tuples(st.just("resize"), st.builds(ResizeJob, job_id=names, replicas=st.integers(-1, 4))),
    st.tuples(
        st.just("queue"),
        st.builds(
            ApplyQueue,
            queue=st.builds(
                QueueSpec,
                names,
                cohort=st.none() | names,
                quotas=st.dictionaries(st.sampled_from(["*", "H100-80GB"]), quota_limits, max_size=2),
                weight=st.floats(-1, 2),
            ),
        ),
    ),
    st.tuples(
        st.just("cohort"),
        st.builds(ApplyCohort, cohort=st.builds(CohortSpec, names, parent=st.none() | names)),
    ),
    st.tuples(
        st.just("priority-class"),
        st.builds(
            ApplyPriorityClass,
            priority_class=st.builds(PriorityClassSpec, names, st.integers(-5, 5), preemptible=st.booleans()),
        ),
    ),
    st.tuples(st.just("delete-queue"), st.builds(DeleteQueue, name=names)),
    st.tuples(
        st.just("cordon"), st.builds(CordonNode, node=names, cordoned=st.booleans(), drain=st.booleans())
    ),
    st.tuples(
        st.just("retention"),
        st.builds(
            ApplyRetention, retention=st.builds(RetentionSpec, st.sampled_from([-1.0, 0.0, 5.0, math.nan]))
        ),
    ),
)

inventories = st.builds(
    NodeInventory,
    cpu_milli=st.integers(0, 300_000),
    memory_mib=st.integers(0, 1 << 21),
    gpus=st.integers(0, 3).flatmap(
        lambda n: st.tuples(
            *(
                st.builds(
                    GpuInfo,
                    index=st.just(i) if n < 3 else st.integers(0, 3),
                    uuid=st.just(f"GPU-{i}"),
                    model=st.sampled_from(["H100-80GB", "A100-80GB", "T4"]),
                    memory_mib=st.just(81_920),
                    mig=st.booleans(),
                )
                for i in range(n)
            )
        )
    ),
)
registrations = st.builds(
    NodeRegistered, node=st.sampled_from(["node-00", "node-01", "node-02"]), inventory=inventories
)


def _typed_garbage(t: type[Event], fields: dict[str, Any]) -> bytes:
    """An envelope naming a real type whose body fields hold JSON of any type."""
    body = {"type": t.__name__, **fields}
    return msgspec.json.encode({"id": "x", "type": t.__name__, "time": 0.0, "producer": "p", "body": body})


def _field_names(t: type[Event]) -> list[str]:
    return [f.name for f in msgspec.structs.fields(t)]


typed_garbage = st.sampled_from(codec.EVENT_TYPES).flatmap(
    lambda t: st.dictionaries(st.sampled_from(_field_names(t)), json_values, max_size=4).map(
        lambda fields: _typed_garbage(t, fields)
    )
)


def _sealed(ev: Event) -> bytes:
    return codec.encode(codec.seal(ev, event_id="e", time=0.0, producer="p"))


JOBS = {"j1": "node-00", "j2": "node-00", "j3": "node-01"}  # where each base job can go
# The base jobs (tenant, priority, spec): a whole GPU, half a GPU, a MIG instance, in three queues.
BASE: dict[str, tuple[str, int, JobBuilder]] = {
    "j1": ("alice", 1, job("team-a").gpus(1).restarts(1)),
    "j2": ("bob", 2, job("team-b").milli(500).checkpointable()),
    "j3": ("carol", 3, job("team-c").mig("3g.40gb").restarts(0)),
}
attempts = st.integers(0, 1)


def _admitted(job_id: str, attempt: int) -> JobsAdmitted:
    """Admission of a base job as admission proposes it: the quota its worker holds."""
    spec = BASE[job_id][2]
    return JobsAdmitted(
        based_on=0, now=_T, admissions=(admission(queue_spec(spec.build().queue), job_id, spec, attempt),)
    )


def _claim_for(job_id: str, gpu: int, start: int) -> GpuClaim:
    if job_id == "j1":
        return GpuClaim(gpu)
    if job_id == "j2":
        return GpuClaim(gpu, milli=500)
    return GpuClaim(gpu, mig=MigSlot("3g.40gb", start))


def _node_of(job_id: str, other: bool) -> str:
    node = JOBS.get(job_id, "node-00")
    return ("node-01" if node == "node-00" else "node-00") if other else node


job_ids = st.sampled_from(sorted(JOBS))
node_ids = st.sampled_from(["node-00", "node-01"])
_T = 0.0


def _move(b: str, ab: int, gb: int, v: str, av: int, gv: int, other: bool) -> PreemptionRequested:
    """A consolidation: ``v`` stopped to run elsewhere (on its node, or on the other), so that
    ``b`` is placed where it ran."""
    return PreemptionRequested(
        based_on=0,
        now=_T,
        beneficiary=b,
        victims=(Victim(v, av),),
        deadline=_T,
        moves=(
            Placement(b, ab, (WorkerSlot(0, _node_of(b, False), (_claim_for(b, gb, 0),)),)),
            Placement(v, av, (WorkerSlot(0, _node_of(v, other), (_claim_for(v, gv, 4),)),)),
        ),
    )


# Events that make sense for the base jobs, so the fold goes deep: admissions, placements,
# starts, exits, checkpoints, requeues, preemptions and moves, placement timeouts, health, shutdowns,
# re-registrations that shrink a node or renumber its GPUs.
plausible_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(_admitted, job_ids, attempts),
    st.builds(
        lambda j, a, g, s, other: JobsPlaced(
            based_on=0,
            now=_T,
            placements=(Placement(j, a, (WorkerSlot(0, _node_of(j, other), (_claim_for(j, g, s),)),)),),
        ),
        job_ids,
        attempts,
        st.integers(0, 2),
        st.sampled_from([0, 4]),
        st.sampled_from([False, False, False, True]),
    ),
    st.builds(lambda j, a: WorkerStarted(node=JOBS[j], job_id=j, attempt=a, rank=0), job_ids, attempts),
    st.builds(
        lambda j, a, c, stop: WorkerExited(node=JOBS[j], job_id=j, attempt=a, rank=0, code=c, stopped=stop),
        job_ids,
        attempts,
        st.sampled_from([0, 1, 137]),
        st.booleans(),
    ),
    st.builds(
        lambda j, a: CheckpointCompleted(node=JOBS[j], job_id=j, attempt=a, location="/c", step=1),
        job_ids,
        attempts,
    ),
    st.builds(lambda j, a: JobRequeued(job_id=j, attempt=a, reason=Reason("r", "r")), job_ids, attempts),
    st.builds(
        lambda b, v, a: PreemptionRequested(
            based_on=0, now=_T, beneficiary=b, victims=(Victim(v, a),), deadline=_T
        ),
        job_ids,
        job_ids,
        attempts,
    ),
    st.builds(
        _move,
        job_ids,
        attempts,
        st.integers(0, 2),
        job_ids,
        attempts,
        st.integers(0, 2),
        st.booleans(),
    ),
    st.builds(
        lambda j, a, after: AdmissionWithdrawn(
            job_id=j, attempt=a, reason=Reason("placement-timeout", "placed nowhere"), admit_after=after
        ),
        job_ids,
        attempts,
        st.sampled_from([_T, 30.0]),
    ),
    st.builds(
        lambda n, g, h: GpuHealthChanged(node=n, gpu=g, healthy=h), node_ids, st.integers(0, 2), st.booleans()
    ),
    st.builds(
        lambda n, c: NodeConditionChanged(node=n, condition=c),
        node_ids,
        st.sampled_from(["ready", "suspect", "lost"]),
    ),
    st.builds(lambda n, c: NodeCordoned(node=n, cordoned=c), node_ids, st.booleans()),
    st.builds(lambda n, back: NodeShutdown(node=n, at=_T, registers_again=back), node_ids, st.booleans()),
    st.builds(
        lambda n, k: NodeRegistered(node=n, inventory=_shrunk(n, k)), node_ids, st.sampled_from([0, 1, 2, 8])
    ),
    # a GPU fell off the bus and NVML numbered the rest anew; or the same GPUs in another order
    st.builds(lambda n, d: NodeRegistered(node=n, inventory=_renumbered(n, d)), node_ids, st.integers(0, 7)),
    st.builds(lambda n: NodeRegistered(node=n, inventory=_reordered(n)), node_ids),
)


def _shrunk(node: str, gpus: int) -> NodeInventory:
    inv = h100_8x_nvswitch(node) if node == "node-00" else h100_8x_mig(node)
    return NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus[:gpus], inv.labels)


def _numbered(inv: NodeInventory, gpus: list[GpuInfo]) -> NodeInventory:
    renumbered = tuple(msgspec.structs.replace(g, index=i) for i, g in enumerate(gpus))
    return NodeInventory(inv.cpu_milli, inv.memory_mib, renumbered, inv.labels)


def _renumbered(node: str, dropped: int) -> NodeInventory:
    inv = h100_8x_nvswitch(node) if node == "node-00" else h100_8x_mig(node)
    return _numbered(inv, [g for g in inv.gpus if g.index != dropped])


def _reordered(node: str) -> NodeInventory:
    inv = h100_8x_nvswitch(node) if node == "node-00" else h100_8x_mig(node)
    return _numbered(inv, list(reversed(inv.gpus)))


# One record's (subject, payload): mostly plausible, some hostile.
parts: st.SearchStrategy[tuple[str, bytes]] = st.one_of(
    plausible_events.map(lambda ev: (home_subject(ev), _sealed(ev))),
    plausible_events.map(lambda ev: (home_subject(ev), _sealed(ev))),
    plausible_events.map(lambda ev: (home_subject(ev), _sealed(ev))),
    st.tuples(st.sampled_from(["alice", "bob"]), job_ids).map(
        lambda tj: (subj.request(tj[0], "cancel"), codec.encode(CancelJob(job_id=tj[1])))
    ),
    service_events.map(lambda ev: (home_subject(ev), _sealed(ev))),
    service_events.map(lambda ev: (home_subject(ev), _sealed(ev))),
    registrations.map(lambda ev: (home_subject(ev), _sealed(ev))),
    st.tuples(tenants, requests).map(lambda tr: (subj.request(tr[0], tr[1][0]), codec.encode(tr[1][1]))),
    st.tuples(subjects, service_events.map(_sealed)),
    st.tuples(subjects, st.binary(max_size=40)),
    st.tuples(subjects, json_values.map(msgspec.json.encode)),
    st.tuples(st.sampled_from(SUBJECTS), typed_garbage),
)


def _base() -> LogBuilder:
    """Two real nodes (one in MIG mode) and three jobs in three queues with ample quota, so that
    random events have targets and preemption across queues is possible."""
    log = LogBuilder().node("node-00", h100_8x_nvswitch("node-00")).node("node-01", h100_8x_mig("node-01"))
    log.queues("team-a", "team-b", "team-c")
    for job_id, (tenant, _, spec) in BASE.items():
        log.submit(tenant, job_id, spec)
    for job_id, (_, priority, _) in BASE.items():
        log.accept(job_id, priority=priority)
    return log


def _records(drawn: list[tuple[str, bytes]]) -> list[Record]:
    log = _base()
    for subject, data in drawn:
        log.raw(subject, data)
    return log.records


def _home(ev: Event) -> tuple[str, bytes]:
    return home_subject(ev), _sealed(ev)


@st.composite
def stories(draw: st.DrawFn) -> list[Record]:
    """Each base job's lifecycle, one or two attempts of admit, place, start, exit or checkpoint,
    requeue, interleaved with each other and with failures, preemptions and hostile records."""
    lanes: list[list[tuple[str, bytes]]] = []
    for j, node in JOBS.items():
        lane: list[Event] = []
        for a in range(draw(st.integers(1, 2))):
            claim = _claim_for(j, draw(st.integers(0, 2)), draw(st.sampled_from([0, 4])))
            lane.append(_admitted(j, a))
            if j == "j2" and draw(st.booleans()):  # j1 moved for it, where j1 is at that attempt
                lane.append(_move(j, a, draw(st.integers(0, 2)), "j1", a, draw(st.integers(0, 2)), False))
            lane += [
                JobsPlaced(
                    based_on=0, now=_T, placements=(Placement(j, a, (WorkerSlot(0, node, (claim,)),)),)
                ),
                WorkerStarted(node=node, job_id=j, attempt=a, rank=0),
            ]
            if draw(st.booleans()):
                lane.append(CheckpointCompleted(node=node, job_id=j, attempt=a, location="/c", step=a))
            code = draw(st.sampled_from([0, 1, 137]))
            lane.append(WorkerExited(node=node, job_id=j, attempt=a, rank=0, code=code, stopped=code == 137))
            lane.append(JobRequeued(job_id=j, attempt=a, reason=Reason("r", "r")))
        lanes.append([_home(ev) for ev in lane])
    lanes.append(draw(st.lists(plausible_events.map(_home), max_size=12)))
    lanes.append(draw(st.lists(parts, max_size=4)))

    merged: list[tuple[str, bytes]] = []
    while any(lanes):
        lane_index = draw(st.sampled_from([i for i, lane in enumerate(lanes) if lane]))
        merged.append(lanes[lane_index].pop(0))
    return _records(merged)


logs = st.one_of(st.lists(parts, max_size=40).map(_records), stories())


def check_gpus(state: State) -> None:
    """No GPU over-allocated; a whole GPU has one holder; the books balance."""
    for node in state.nodes.values():
        for g in node.gpus:
            assert 0 <= g.used_milli <= WHOLE, (node.name, g)
            assert g.used_milli == sum(g.holders.values()), (node.name, g)
            if WHOLE in g.holders.values():
                assert len(g.holders) == 1, (node.name, g)
            if g.info.mig:
                assert {i.job_id for i in g.mig.values()} == set(g.holders), (node.name, g)


def check_holders(state: State) -> None:
    """Each GPU's holders are exactly the jobs whose held placement claims it: no hold without
    a claim that gives it back, no claim on a GPU that does not count it."""
    claimed: dict[tuple[str, int], set[str]] = {}
    for held_by in state.jobs.values():
        for w in held_by.held.workers if held_by.held is not None else ():
            node = state.nodes.get(w.node)
            for c in w.gpus:
                if node is not None and 0 <= c.gpu < len(node.gpus):
                    claimed.setdefault((w.node, c.gpu), set()).add(held_by.id)
    for name, node in state.nodes.items():
        for g in node.gpus:
            assert set(g.holders) == claimed.get((name, g.info.index), set()), (name, g.info.index, g.holders)


# -- never raises, never faults -------------------------------------------------------------------


@FAST
@given(logs)
def test_fold_never_raises_and_never_faults(records: list[Record]) -> None:
    state = fold(records)
    assert state.seq == records[-1].seq
    faults = [r for r in state.rejections if r.code == "fault"]
    assert state.faults == 0, faults
    check_gpus(state)
    indexes.check(state)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(subjects, st.binary(max_size=60)), min_size=1, max_size=30))
def test_random_bytes_are_recorded_not_folded(drawn: list[tuple[str, bytes]]) -> None:
    state = fold(_records(drawn))
    base = fold(_base().records)
    assert state.faults == 0 and state.rejected_total >= base.rejected_total


def _story() -> list[Record]:
    """A log of real events: gangs, shares, MIG, failures, restarts, preemption, lost nodes."""
    log = _base().admit("j1", "j2", "j3")
    log.place(on("node-00", 0, job_id="j1"), placement("j2", worker(0, "node-00", share(1, 500))))
    log.place(placement("j3", worker(0, "node-01", mig_slot(0, "3g.40gb", 4))))
    log.started("node-00", "j1").started("node-00", "j2").started("node-01", "j3")
    log.exited("node-00", "j1", code=1).requeue("j1", 0).admit("j1", attempt=1)
    log.place(on("node-00", 2, job_id="j1", attempt=1)).started("node-00", "j1", attempt=1)
    log.submit("carol", "g", job("team-b").gpus(2).replicas(2)).accept("g", priority=9).admit("g", replicas=2)
    log.preempt("g", "j2").checkpoint("node-00", "j2", step=7)  # for g while it waits
    log.place(
        placement("g", worker(0, "node-00", whole(4), whole(5)), worker(1, "node-00", whole(6), whole(7)))
    )
    log.started("node-00", "g", rank=0)
    log.exited("node-00", "j2", code=0, stopped=True).requeue("j2", 0)
    log.started("node-00", "g", rank=1).gpu_health("node-00", 4, False).exited(
        "node-00", "g", rank=0, code=137
    )
    log.condition("node-01", "lost").exited("node-00", "j1", attempt=1).cordon("node-00")
    log.request("carol", "cancel", {"job_id": "g"}).exited("node-00", "g", rank=1, code=143, stopped=True)
    return log.records


STORY = _story()


@FAST
@given(st.permutations(STORY), st.integers(0, len(STORY)))
def test_real_events_out_of_order_never_fault(shuffled: list[Record], n: int) -> None:
    """Real records, shuffled, cut and renumbered: lifecycles arrive backwards, twice, or half."""
    records = [msgspec.structs.replace(r, seq=i + 1) for i, r in enumerate(shuffled[:n])]
    state = fold(records)
    assert state.faults == 0, [r for r in state.rejections if r.code == "fault"]
    check_gpus(state)
    indexes.check(state)


def test_the_story_itself_folds_cleanly() -> None:
    state = fold(STORY)
    assert state.faults == 0 and state.void_total == 0, state.rejections
    check_gpus(state)
    indexes.check(state)


# -- snapshots ------------------------------------------------------------------------------------


@FAST
@given(logs, st.integers(min_value=0))
def test_snapshot_at_any_cut_then_the_tail_equals_folding_everything(records: list[Record], cut: int) -> None:
    cut %= len(records) + 1
    head = fold(records[:cut])
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(head), type=State)
    assert restored == head
    # The indexes' order is part of what a replica must agree on: a snapshot keeps it.
    assert _in_order(restored) == _in_order(head)
    whole = fold(records)
    assert fold(records[cut:], restored) == whole
    assert _in_order(restored) == _in_order(whole)
    indexes.check(whole)


def _in_order(state: State) -> list[tuple[str, str, list[str]]]:
    return [
        (name, key, list(ids))
        for name in ("jobs_by_phase", "queued_by_queue", "holding_by_node")
        for key, ids in getattr(state, name).items()
    ]


# -- racing placers -------------------------------------------------------------------------------

NODES = ("node-a", "node-b")
GPUS_PER_NODE = 3
SHARES = (250, 500, 750)


def _race_node(name: str) -> NodeInventory:
    gpus = tuple(GpuInfo(i, f"GPU-{name}-{i}", "H100-80GB", 81_559, island=0) for i in range(GPUS_PER_NODE))
    return NodeInventory(1_000_000, 1 << 30, gpus)


@st.composite
def races(draw: st.DrawFn) -> tuple[dict[str, JobSpec], list[list[Placement]]]:
    """Admitted jobs (whole GPUs or a share) and several placers' proposals for them, interleaved."""
    specs: dict[str, JobSpec] = {}
    for i in range(draw(st.integers(2, 6))):
        whole_gpus = draw(st.integers(0, 2))
        shape = job().gpus(whole_gpus) if whole_gpus else job().milli(draw(st.sampled_from(SHARES)))
        specs[f"j{i}"] = shape.replicas(draw(st.integers(1, 2))).build()
    events: list[list[Placement]] = []
    for _ in range(draw(st.integers(1, 12))):
        batch = []
        for job_id in draw(st.lists(st.sampled_from(sorted(specs)), min_size=1, max_size=3)):
            spec = specs[job_id]
            workers = []
            for rank in range(spec.replicas):
                node = draw(st.sampled_from(NODES))
                gpu = st.integers(0, GPUS_PER_NODE - 1)
                if spec.resources.gpus == 1 and spec.resources.gpu_milli < WHOLE:
                    claims: tuple[GpuClaim, ...] = (GpuClaim(draw(gpu), milli=spec.resources.gpu_milli),)
                else:
                    picked = draw(st.lists(gpu, min_size=spec.resources.gpus, max_size=spec.resources.gpus))
                    claims = tuple(GpuClaim(g) for g in picked)
                workers.append(WorkerSlot(rank, node, claims))
            batch.append(Placement(job_id, 0, tuple(workers)))
        events.append(batch)
    return specs, events


def _race_log(specs: dict[str, JobSpec], events: list[list[Placement]]) -> LogBuilder:
    log = LogBuilder().queue("team-a")
    for name in NODES:
        log.node(name, _race_node(name))
    for job_id, spec in specs.items():
        log.submit("alice", job_id, spec).accept(job_id)
    for job_id, spec in specs.items():
        log.admit(job_id, replicas=spec.replicas)
    for batch in events:
        log.place(*batch)
    return log


def _first_valid_proposals(
    specs: dict[str, JobSpec], events: list[list[Placement]]
) -> tuple[dict[str, Placement], dict[tuple[str, int], dict[str, int]]]:
    """The oracle: walk proposals in log order; one wins iff its job is still unplaced and every
    GPU it names can take its claims at that point. Returns the winners and every GPU's holders."""
    held: dict[tuple[str, int], dict[str, int]] = {(n, g): {} for n in NODES for g in range(GPUS_PER_NODE)}
    won: dict[str, Placement] = {}
    for batch in events:
        for p in batch:
            if p.job_id in won:
                continue
            per_gpu: dict[tuple[str, int], list[int]] = {}
            for w in p.workers:
                for c in w.gpus:
                    per_gpu.setdefault((w.node, c.gpu), []).append(c.milli)
            ok = True
            for key, millis in per_gpu.items():
                holders = held[key]
                if WHOLE in millis:
                    ok &= len(millis) == 1 and not holders
                else:
                    ok &= WHOLE not in holders.values() and sum(holders.values()) + sum(millis) <= WHOLE
            if ok:
                won[p.job_id] = p
                for key, millis in per_gpu.items():
                    held[key][p.job_id] = held[key].get(p.job_id, 0) + sum(millis)
    return won, held


@settings(max_examples=200, deadline=None)
@given(races())
def test_racing_placements_never_share_a_gpu_and_the_first_valid_one_wins(
    race: tuple[dict[str, JobSpec], list[list[Placement]]],
) -> None:
    specs, events = race
    records = _race_log(specs, events).records
    state = fold(records)
    assert state.faults == 0
    check_gpus(state)
    indexes.check(state)
    won, held = _first_valid_proposals(specs, events)
    placed = {j.id: j.placement for j in state.jobs.values() if j.phase == "placed"}
    assert placed == won
    for (node, index), holders in held.items():
        assert state.nodes[node].gpus[index].holders == holders
    replica = fold(records)  # another service, folding the same log on its own
    assert replica == state


# -- determinism ----------------------------------------------------------------------------------


@FAST
@given(logs)
def test_folding_the_same_log_twice_gives_the_same_state(records: list[Record]) -> None:
    assert fold(records) == fold(records)


def _fold_decoded(records: list[Record]) -> State:
    """The simulator's path: events decoded first, then folded with ``apply_event``."""
    state = State()
    for r in records:
        try:
            body, tenant, _ = codec.decode_body(r.subject, r.data, r.headers)
        except codec.DecodeError:
            continue
        apply_event(state, r.seq, r.subject, body, r.time, tenant)
    return state


@FAST
@given(logs)
def test_decoded_path_agrees_with_the_wire_path(records: list[Record]) -> None:
    """Apart from the records that never decode (kept only as rejections), both paths agree."""
    wire, decoded = fold(records), _fold_decoded(records)
    assert decoded.faults == 0
    assert (wire.jobs, wire.nodes, wire.queues, wire.cohorts) == (
        decoded.jobs,
        decoded.nodes,
        decoded.queues,
        decoded.cohorts,
    )
    assert wire.priority_classes == decoded.priority_classes and wire.void_total == decoded.void_total
    assert _in_order(wire) == _in_order(decoded)
    indexes.check(decoded)


# -- admissions within quota ----------------------------------------------------------------------

QUEUES = ("team-a", "team-b", "team-c")
COHORT = "org"


@dataclass(frozen=True)
class Ask:
    """One admission proposed: ``lie`` is what the proposal adds to the GPUs the gang holds."""

    job_id: str
    replicas: int
    lie: int = 0


Step = list[Ask] | str  # an admission cycle, or the owner cancelling a job


@dataclass
class QuotaStory:
    queues: dict[str, QueueSpec]
    specs: dict[str, JobSpec]
    steps: list[Step]


@st.composite
def quota_stories(draw: st.DrawFn) -> QuotaStory:
    """Three queues, each alone or in one cohort with its own limits; whole-GPU gangs, some
    elastic; admission cycles asking for several of them at once (some twice, some out of their
    elastic range, some naming the wrong GPUs), and cancels that give quota back."""
    limits = st.integers(0, 8).flatmap(  # a queue lends its nominal at most
        lambda n: st.builds(
            Quota, st.just(n), st.none() | st.integers(0, 4), st.none() | st.integers(0, min(n, 4))
        )
    )
    queues = {
        q: QueueSpec(q, cohort=draw(st.none() | st.just(COHORT)), quotas={"*": draw(limits)}) for q in QUEUES
    }
    specs: dict[str, JobSpec] = {}
    for i in range(draw(st.integers(2, 8))):
        replicas = draw(st.integers(1, 3))
        spec = job(draw(st.sampled_from(QUEUES))).gpus(draw(st.integers(1, 4)))
        specs[f"j{i}"] = spec.replicas(replicas, draw(st.none() | st.integers(1, replicas))).build()

    def asks(job_id: str) -> st.SearchStrategy[Ask]:
        n = specs[job_id].replicas  # mostly the whole gang, sometimes any size, even a wrong one
        lies = st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1])
        return st.builds(Ask, st.just(job_id), st.just(n) | st.just(n) | st.integers(0, n + 1), lies)

    cycle: st.SearchStrategy[Step] = st.lists(
        st.sampled_from(sorted(specs)).flatmap(asks), min_size=1, max_size=4
    )
    cancel: st.SearchStrategy[Step] = st.sampled_from(sorted(specs))
    steps = draw(st.lists(st.one_of(cycle, cycle, cycle, cancel), min_size=1, max_size=10))
    return QuotaStory(queues, specs, steps)


def _guaranteed(q: Quota) -> int:
    """What a queue of a cohort keeps for itself: all but what it may lend (nothing if unlimited)."""
    return max(0, q.nominal - q.lending_limit) if q.lending_limit is not None else 0


def _within_quota(queues: dict[str, QueueSpec], usage: dict[str, int]) -> bool:
    """Every queue holds at most its nominal plus its borrowing limit (its nominal alone with no
    cohort to borrow from), and the cohort lends no more than its members may lend."""
    lent = lendable = 0
    for name, spec in queues.items():
        q, used = spec.quotas["*"], usage.get(name, 0)
        if spec.cohort is None:
            if used > q.nominal:
                return False
            continue
        if q.borrowing_limit is not None and used > q.nominal + q.borrowing_limit:
            return False
        g = _guaranteed(q)
        lent += max(0, used - g)
        lendable += q.nominal - g
    return lent <= lendable


def _usage(state: State) -> dict[str, int]:
    """GPUs each queue holds, from the jobs' own sizes and admitted replicas (not from what the
    admissions say they hold)."""
    usage: dict[str, int] = {}
    for j in state.jobs.values():
        if j.phase in HOLDS_QUOTA and j.admission is not None:
            used = j.spec.resources.gpus * j.admission.replicas
            usage[j.spec.queue] = usage.get(j.spec.queue, 0) + used
    return usage


def _quota_oracle(story: QuotaStory) -> dict[str, tuple[str, int]]:
    """Walk the story: an admission wins iff its job is queued, its replicas are within the
    elastic range, it names exactly the GPUs the gang holds, and the queues stay within quota."""
    phase = {j: "queued" for j in story.specs}
    replicas = dict.fromkeys(story.specs, 0)
    usage: dict[str, int] = {}
    for step in story.steps:
        if isinstance(step, str):
            if phase[step] != "cancelled":
                phase[step] = "cancelled"
                queue = story.specs[step].queue
                usage[queue] = usage.get(queue, 0) - story.specs[step].resources.gpus * replicas[step]
            continue
        for ask in step:
            spec = story.specs[ask.job_id]
            lo = spec.min_replicas if spec.min_replicas is not None else spec.replicas
            if phase[ask.job_id] != "queued" or not lo <= ask.replicas <= spec.replicas or ask.lie:
                continue
            after = dict(usage)
            after[spec.queue] = after.get(spec.queue, 0) + spec.resources.gpus * ask.replicas
            if _within_quota(story.queues, after):
                usage, phase[ask.job_id], replicas[ask.job_id] = after, "admitted", ask.replicas
    return {j: (phase[j], replicas[j] if phase[j] == "admitted" else 0) for j in story.specs}


def _quota_log(story: QuotaStory) -> LogBuilder:
    log = LogBuilder()
    for q in story.queues.values():
        log.queue(q)
    for job_id, spec in story.specs.items():
        log.submit("alice", job_id, spec).accept(job_id)
    for step in story.steps:
        if isinstance(step, str):
            log.request("alice", "cancel", CancelJob(job_id=step))
            continue
        proposals = []
        for ask in step:
            adm = log.admission(ask.job_id, replicas=ask.replicas)
            proposals.append(msgspec.structs.replace(adm, gpus={"*": adm.gpus.get("*", 0) + ask.lie}))
        log.admit_as(*proposals)
    return log


@FAST
@given(quota_stories())
def test_admissions_keep_every_queue_within_quota_and_win_exactly_when_they_fit(
    story: QuotaStory,
) -> None:
    state = State()
    for record in _quota_log(story).records:
        fold([record], state)
        assert _within_quota(story.queues, _usage(state)), (record.seq, _usage(state), state.rejections)
    assert state.faults == 0 and state.queues == story.queues
    got = {
        j.id: (j.phase, j.admission.replicas if j.phase == "admitted" and j.admission is not None else 0)
        for j in state.jobs.values()
    }
    assert got == _quota_oracle(story)


# -- a refusal changes nothing --------------------------------------------------------------------

# What a refusal itself writes: the log position and the rejection books.
_BOOKS = (
    "seq",
    "time",
    "rejections",
    "rejections_lost",
    "rejections_lost_floor",
    "rejections_kept",
    "rejected_total",
    "void_total",
    "faults",
)


def _without_books(state: State) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(state)
    for name in _BOOKS:
        out.pop(name, None)
    return out


def _gang_story() -> list[Record]:
    """A gang whose rank 1 dies while rank 0 runs on, requeued; reports of both attempts, and an
    elastic job shrunk, grown back and stopped."""
    log = _base().submit("dave", "g2", job().replicas(2)).accept("g2").admit("g2", replicas=2)
    log.place(placement("g2", worker(0, "node-00", whole(0)), worker(1, "node-00", whole(1))))
    log.started("node-00", "g2", rank=0).started("node-00", "g2", rank=1)
    log.exited("node-00", "g2", rank=1, code=1).requeue("g2", 0)
    log.exited("node-00", "g2", rank=0, code=1, attempt=1).exited("node-00", "g2", rank=0, code=143)
    log.submit("erin", "el", job().replicas(4, minimum=1)).accept("el").admit("el", replicas=3)
    log.place(placement("el", *(worker(r, "node-00", whole(2 + r)) for r in range(3))))
    for r in range(3):
        log.started("node-00", "el", rank=r)
    log.submit("frank", "b", job("team-a")).accept("b", priority=50).shrink("el", 1, "b")
    log.exited("node-00", "el", rank=2, code=143, stopped=True).exited("node-00", "el", rank=1, code=0)
    log.grow("el", 3).place(placement("el", *(worker(r, "node-00", whole(2 + r)) for r in range(3))))
    log.started("node-00", "el", rank=1).started("node-00", "el", rank=2)
    log.request("erin", "cancel", {"job_id": "el"})
    for r in range(3):
        log.exited("node-00", "el", rank=r, code=143, stopped=True)
    return log.records


GANG_STORY = _gang_story()


def test_the_gang_story_itself_folds_cleanly() -> None:
    state = fold(GANG_STORY)
    assert state.faults == 0
    assert [r.message for r in state.rejections] == ["rank 0 of job g2 is not running"]
    assert state.jobs["el"].phase == "cancelled" and state.jobs["el"].held is None
    check_gpus(state)
    indexes.check(state)


@FAST
@given(st.one_of(logs, st.permutations(STORY), st.permutations(GANG_STORY)))
def test_after_every_record_each_gpus_holders_are_the_jobs_that_hold_it(records: list[Record]) -> None:
    """Whatever the writers: random proposals of any role, reports out of order, nodes that
    register again shrunk, renumbered or reordered."""
    from corral.projections.fold import apply

    state = State()
    for i, r in enumerate(records):
        apply(state, msgspec.structs.replace(r, seq=i + 1))
        check_gpus(state)
        indexes.check(state)
        check_holders(state)
        indexes.check(state)


@st.composite
def preemptions_of_running_jobs(draw: st.DrawFn) -> list[Record]:
    """The base jobs all running, then preemptions and shrinks any writer might propose, between
    any of them, mixed with the rest of the plausible events."""
    lane: list[Event] = []
    for j, node in JOBS.items():
        claim = _claim_for(j, draw(st.integers(0, 2)), draw(st.sampled_from([0, 4])))
        lane += [
            _admitted(j, 0),
            JobsPlaced(based_on=0, now=_T, placements=(Placement(j, 0, (WorkerSlot(0, node, (claim,)),)),)),
            WorkerStarted(node=node, job_id=j, attempt=0, rank=0),
        ]
    stops = st.builds(
        lambda b, v: PreemptionRequested(
            based_on=0, now=_T, beneficiary=b, victims=(Victim(v, 0),), deadline=_T
        ),
        job_ids,
        job_ids,
    )
    lane += draw(st.lists(st.one_of(stops, plausible_events), min_size=1, max_size=8))
    return _records([_home(ev) for ev in lane])


@FAST
@given(st.one_of(preemptions_of_running_jobs(), logs, st.permutations(STORY), st.permutations(GANG_STORY)))
def test_no_writer_stops_a_job_the_rules_protect(records: list[Record]) -> None:
    """Whatever preemptions and shrinks any writer proposes, a job is stopped (or shrunk) for
    another only if it may be preempted, and, unless it is moved (a move takes no quota), the
    other is of its queue with a higher priority or of a queue of its cohort tree. Judged without
    the rule's code: the queues of these logs are each their own tree, so no job is ever stopped
    for another queue's."""
    from corral.projections.fold import apply

    state = State()
    for i, r in enumerate(records):
        before = {
            j.id: (j.preempted_for, j.priority, j.spec.queue, j.spec.preemptible) for j in state.jobs.values()
        }
        apply(state, msgspec.structs.replace(r, seq=i + 1))
        for stopped in state.jobs.values():
            was = before.get(stopped.id)
            if not stopped.preempted_for or was is None or was[0] == stopped.preempted_for:
                continue
            _, priority, queue, preemptible = was
            beneficiary = state.jobs[stopped.preempted_for]
            cohorts = {state.queues[q].cohort for q in (queue, beneficiary.spec.queue) if q in state.queues}
            assert preemptible, (stopped.id, "may not be preempted")
            if stopped.moved_to is not None:
                continue  # moved: a move takes no one's quota, whatever the queues (``moves.may_move``)
            if beneficiary.spec.queue == queue:
                assert priority < beneficiary.priority, (stopped.id, beneficiary.id)
            else:
                assert None not in cohorts and len(cohorts) == 1, (stopped.id, beneficiary.id, cohorts)


@FAST
@given(st.one_of(logs, st.permutations(STORY), st.permutations(GANG_STORY)))
def test_a_refused_record_changes_nothing_but_the_rejection_books(records: list[Record]) -> None:
    """A request or report the fold refuses leaves the state as it was. (A batch decision is
    judged item by item: its valid items stand, so batches are left out here. Log time passes
    whatever a record says: finished jobs whose retention ran out are let go first, refused
    record or not, so a record that lets one go is not judged here.)"""
    from corral.projections import retention
    from corral.projections.fold import apply

    state = State()
    for i, r in enumerate(records):
        r = msgspec.structs.replace(r, seq=i + 1)
        lets_go = retention.is_due(state, max(state.time, r.time))
        before = _without_books(state)
        refused = state.rejected_total
        apply(state, r)
        batch = r.subject in (subj.decision("admission"), subj.decision("placer"))
        if state.rejected_total > refused and not batch and not lets_go:
            assert _without_books(state) == before, state.rejections[-1]
