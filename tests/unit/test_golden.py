"""Golden payloads: the exact wire bytes of every event type, kept in ``tests/golden/<Type>.json``.

A payload written once must decode forever: fields are only added, with defaults, and a breaking
change is a new tag plus an upcaster. So these files are never regenerated to make a test pass;
a failure here means the wire format broke. Service events are stored sealed in their envelope,
requests bare, as clients publish them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from corral.events import codec
from corral.events.base import Event, Reason
from corral.events.codec import Envelope
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    MigSlot,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
    Unschedulable,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    CancelJob,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    Mount,
    PendingReasonChanged,
    ResizeJob,
    Resources,
    SubmitJob,
    Topology,
)
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
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeletePriorityClass,
    DeleteQueue,
    FairShareSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
    RetentionSpec,
)

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VERB_OF: dict[type[Event], str] = {t: verb for verb, t in codec.ADMIN_VERBS.items()}

_SPEC = JobSpec(
    queue="vision",
    name="resnet-sweep",
    priority_class="high",
    replicas=4,
    min_replicas=2,
    resources=Resources(
        gpus=8,
        cpu_milli=96_000,
        memory_mib=1_048_576,
        gpu_models=("H100-80GB", "A100-80GB"),
        min_gpu_memory_mib=80_000,
    ),
    topology=Topology(pack="nvlink", required=True),
    preemptible=False,
    checkpointable=True,
    grace_seconds=120.0,
    runtime_estimate_s=7200.0,
    restart_policy="always",
    max_restarts=5,
    command=("torchrun", "train.py", "--epochs=90"),
    image="nvcr.io/nvidia/pytorch:24.05-py3",
    env={"NCCL_DEBUG": "WARN"},
    mounts=(Mount("/data/imagenet", "/data"), Mount("/scratch", "/scratch", read_only=False)),
    labels={"team": "vision"},
    node_selector={"rack": "rack-0"},
)

_H100 = GpuInfo(0, "GPU-node-00-00", "H100-80GB", 81_559, island=0, nvlinks=18)
_MIG = GpuInfo(1, "GPU-node-00-01", "H100-80GB", 81_559, island=0, mig=True, nvlinks=18)

# The request each golden file of a request type holds, as a client sends it.
REQUESTS: dict[type[Event], Event] = {
    SubmitJob: SubmitJob(request_id="sweep-0042", job=_SPEC),
    CancelJob: CancelJob(job_id="sweep-0042", reason="wrong learning rate"),
    ResizeJob: ResizeJob(job_id="sweep-0042", replicas=2),
    ApplyQueue: ApplyQueue(
        queue=QueueSpec(
            name="vision",
            cohort="research",
            quotas={"H100-80GB": Quota(16, borrowing_limit=8, lending_limit=4), "*": Quota(2)},
            weight=2.0,
            tenants=("alice", "bob"),
            strategy="strict-fifo",
        )
    ),
    ApplyCohort: ApplyCohort(cohort=CohortSpec("research", parent="org", quotas={"*": Quota(64)})),
    ApplyPriorityClass: ApplyPriorityClass(
        priority_class=PriorityClassSpec(
            "high", 1000, preemptible=False, min_runtime_s=600.0, cooldown_s=60.0, max_preemptions_per_hour=2
        )
    ),
    DeleteQueue: DeleteQueue(name="vision"),
    DeleteCohort: DeleteCohort(name="research"),
    DeletePriorityClass: DeletePriorityClass(name="urgent"),
    CordonNode: CordonNode(node="node-00", cordoned=True, drain=True, reason="xid 79"),
    DeleteNode: DeleteNode(node="node-07"),
    ApplyFairShare: ApplyFairShare(fair_share=FairShareSpec(half_life_s=43_200.0)),
    ApplyRetention: ApplyRetention(retention=RetentionSpec(finished_s=600.0)),
}

# The body of each golden envelope of a service event.
EVENTS: dict[type[Event], Event] = {
    JobAccepted: JobAccepted(job_id="sweep-0042", priority=1000),
    JobPriorityChanged: JobPriorityChanged(
        job_id="sweep-0042",
        priority=0,
        reason=Reason("attained-service", "ran 3600 GPU-seconds: down to the lower queue"),
    ),
    JobRejected: JobRejected(
        job_id="sweep-0042",
        request_seq=17,
        reason=Reason("quota", "queue vision has no H100-80GB quota", preemption_helps=True),
    ),
    PendingReasonChanged: PendingReasonChanged(
        job_id="sweep-0042",
        reasons=(
            Reason("fair-share", "vision is above its fair share"),
            Reason("capacity", "no 8-GPU island free"),
        ),
    ),
    JobsAdmitted: JobsAdmitted(
        based_on=41,
        now=1_717_000_000.5,
        admissions=(Admission("sweep-0042", 0, 4, gpus={"H100-80GB": 32}), Admission("nb-7", 1, 1)),
    ),
    JobRequeued: JobRequeued(
        job_id="sweep-0042",
        attempt=1,
        reason=Reason("preempted", "preempted for llm-1"),
        resume_from="/ckpt/42/900",
    ),
    AdmissionWithdrawn: AdmissionWithdrawn(
        job_id="sweep-0042",
        attempt=1,
        reason=Reason("no-node", "needs 8 GPUs per worker; the largest node has 4"),
    ),
    JobsPlaced: JobsPlaced(
        based_on=43,
        now=1_717_000_001.0,
        placements=(
            Placement(
                "sweep-0042",
                0,
                (
                    WorkerSlot(0, "node-00", (GpuClaim(0), GpuClaim(1))),
                    WorkerSlot(1, "node-01", (GpuClaim(0), GpuClaim(1))),
                ),
            ),
            Placement("nb-7", 1, (WorkerSlot(0, "node-02", (GpuClaim(3, milli=250),)),)),
            Placement("infer-3", 0, (WorkerSlot(0, "node-03", (GpuClaim(1, mig=MigSlot("3g.40gb", 4)),)),)),
        ),
    ),
    JobsUnschedulable: JobsUnschedulable(
        based_on=44,
        now=1_717_000_002.0,
        jobs=(Unschedulable("big-1", 0, (Reason("gang", "no 4 nodes with 8 free H100", True),)),),
    ),
    PreemptionRequested: PreemptionRequested(
        based_on=45,
        now=1_717_000_003.0,
        beneficiary="llm-1",
        victims=(Victim("sweep-0042", 0), Victim("nb-7", 1)),
        deadline=1_717_000_123.0,
    ),
    ShrinkRequested: ShrinkRequested(
        based_on=46,
        now=1_717_000_004.0,
        job_id="elastic-3",
        attempt=0,
        replicas=2,
        beneficiary="llm-1",
        deadline=1_717_000_064.0,
    ),
    NodeRegistered: NodeRegistered(
        node="node-00",
        inventory=NodeInventory(224_000, 2_097_152, (_H100, _MIG), labels={"rack": "rack-0", "zone": "a"}),
    ),
    WorkerStarted: WorkerStarted(node="node-00", job_id="sweep-0042", attempt=0, rank=0, pid=4242),
    WorkerExited: WorkerExited(
        node="node-00", job_id="sweep-0042", attempt=0, rank=0, code=137, stopped=True
    ),
    CheckpointCompleted: CheckpointCompleted(
        node="node-00", job_id="sweep-0042", attempt=0, location="/ckpt/42/900", step=900
    ),
    NodeConditionChanged: NodeConditionChanged(
        node="node-00", condition="lost", reason="no heartbeat for 60s"
    ),
    GpuHealthChanged: GpuHealthChanged(node="node-00", gpu=1, healthy=False, signal="xid:79"),
    NodeCordoned: NodeCordoned(node="node-00", cordoned=True, drain=True, reason="xid 79"),
    NodeShutdown: NodeShutdown(node="node-00", at=1_717_000_009.5, reason="corral up stopped"),
}


def envelope(body: Event) -> Envelope:
    return codec.seal(
        body,
        event_id=f"{type(body).__name__}-1",
        time=1_717_000_010.25,
        producer="corral/replica-0",
        causation="SubmitJob-1",
        correlation="sweep-0042",
        traceparent=TRACE,
    )


def expected(t: type[Event]) -> Any:
    """What the golden file of type ``t`` decodes to."""
    return REQUESTS[t] if t in REQUESTS else envelope(EVENTS[t])


def decode(t: type[Event], data: bytes) -> Any:
    return codec.decode_request(VERB_OF[t], data) if t in REQUESTS else codec.decode_envelope(data)


def wire(t: type[Event]) -> bytes:
    return (GOLDEN / f"{t.__name__}.json").read_bytes().rstrip(b"\n")


TYPES = pytest.mark.parametrize("t", codec.EVENT_TYPES, ids=lambda t: t.__name__)


def test_every_type_has_an_expected_payload() -> None:
    assert set(REQUESTS) | set(EVENTS) == set(codec.EVENT_TYPES)
    assert not set(REQUESTS) & set(EVENTS)
    assert set(REQUESTS) == set(codec.ADMIN_VERBS.values())


def test_no_stray_golden_files() -> None:
    """A golden file for a type that left the catalog means a tag was dropped: never allowed."""
    names = {t.__name__ for t in codec.EVENT_TYPES}
    assert {p.stem for p in GOLDEN.glob("*.json")} <= names


@TYPES
def test_golden_file_exists(t: type[Event]) -> None:
    assert (GOLDEN / f"{t.__name__}.json").is_file(), f"no golden payload for {t.__name__}"


@TYPES
def test_golden_decodes_to_the_expected_event(t: type[Event]) -> None:
    decoded = decode(t, wire(t))
    assert decoded == expected(t)
    body = decoded if t in REQUESTS else decoded.body
    assert type(body) is t


@TYPES
def test_golden_is_what_we_encode(t: type[Event]) -> None:
    """Encoding is stable too: readers in other languages rely on these exact field names."""
    assert codec.encode(expected(t)) == wire(t)


@pytest.mark.parametrize("t", list(EVENTS), ids=lambda t: t.__name__)
def test_golden_envelope_names_its_body(t: type[Event]) -> None:
    env = msgspec.json.decode(wire(t))
    assert env["type"] == env["body"]["type"] == t.__name__
    assert env.get("v", codec.SCHEMA_VERSION) == codec.SCHEMA_VERSION


@pytest.mark.parametrize("t", list(REQUESTS), ids=lambda t: t.__name__)
def test_bare_request_may_omit_its_type(t: type[Event]) -> None:
    """A client that knows only the verb need not know our tags."""
    raw = msgspec.json.decode(wire(t))
    assert raw.pop("type") == t.__name__
    assert codec.decode_request(VERB_OF[t], msgspec.json.encode(raw)) == REQUESTS[t]


def test_minimal_payloads_take_defaults_for_later_fields() -> None:
    """What an early client wrote (only the required fields) still decodes, with defaults."""
    req = codec.decode_request("submit", b'{"request_id":"a","job":{"queue":"q"}}')
    assert req == SubmitJob(request_id="a", job=JobSpec(queue="q"))
    env = codec.decode_envelope(
        b'{"id":"1","type":"JobAccepted","time":1.0,"producer":"p","body":{"type":"JobAccepted","job_id":"a","priority":0}}'
    )
    assert env.body == JobAccepted(job_id="a", priority=0)
    assert env.v == codec.SCHEMA_VERSION and env.causation is None and env.traceparent is None


def test_unknown_fields_are_ignored() -> None:
    """A newer writer's extra fields do not break an older reader."""
    env = codec.decode_envelope(
        b'{"id":"1","type":"JobAccepted","time":1.0,"producer":"p","future":[1],'
        b'"body":{"type":"JobAccepted","job_id":"a","priority":3,"why":"later field"}}'
    )
    assert env.body == JobAccepted(job_id="a", priority=3)


# -- upcasters ------------------------------------------------------------------------------------

# A fabricated retired tag: once, "NodeLost" said what NodeConditionChanged(condition="lost") says.
OLD = (
    b'{"id":"e-9","type":"NodeLost","time":5.0,"producer":"health",'
    b'"body":{"type":"NodeLost","host":"node-03","why":"no heartbeat"}}'
)


def _node_lost_to_condition(body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "NodeConditionChanged", "node": body["host"], "condition": "lost", "reason": body["why"]}


def test_old_tag_without_upcaster_is_malformed() -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode_envelope(OLD)


def test_upcaster_turns_an_old_payload_into_the_new_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.UPCASTERS, "NodeLost", _node_lost_to_condition)
    env = codec.decode_envelope(OLD)
    assert env.body == NodeConditionChanged(node="node-03", condition="lost", reason="no heartbeat")
    assert env.id == "e-9" and env.producer == "health"


def test_upcaster_output_is_still_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.UPCASTERS, "NodeLost", lambda body: {"type": "NodeConditionChanged"})
    with pytest.raises(codec.DecodeError):
        codec.decode_envelope(OLD)


def test_raising_upcaster_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.UPCASTERS, "NodeLost", lambda body: body["missing"])
    with pytest.raises(codec.DecodeError):
        codec.decode_envelope(OLD)


def test_upcasted_event_folds_like_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.events.log import Record
    from corral.projections.fold import apply
    from corral.projections.state import State
    from corral.services.agent.inventory import h100_8x_nvswitch

    monkeypatch.setitem(codec.UPCASTERS, "NodeLost", _node_lost_to_condition)
    state = State()
    node = NodeRegistered(node="node-03", inventory=h100_8x_nvswitch("node-03"))
    apply(state, Record(1, "corral.ev.node.node-03", codec.encode(envelope(node))))
    apply(state, Record(2, "corral.ev.node.node-03", OLD))
    assert state.nodes["node-03"].condition == "lost"
    assert state.rejected_total == 0 and state.faults == 0
