"""The query view after folding a small log, and which jobs each kind of record concerns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corral.events import codec, subjects
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
    Unschedulable,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import (
    Admission,
    CancelJob,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    PendingReasonChanged,
    ResizeJob,
    Resources,
    SubmitJob,
)
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    CordonNode,
    DeleteQueue,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections.fold import fold
from corral.projections.state import State
from corral.projections.views import QueryView, job_ids_of
from corral.services.inventory import h100_8x_nvswitch, t4_2x

TRAIN = JobSpec(queue="team-a", name="llm", replicas=2, resources=Resources(gpus=4))
INFER = JobSpec(queue="team-a", resources=Resources(gpus=1, gpu_milli=500))


def whole(*gpus: int) -> tuple[GpuClaim, ...]:
    return tuple(GpuClaim(gpu=g) for g in gpus)


class Log:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def raw(self, subject: str, data: bytes) -> None:
        seq = len(self.records) + 1
        self.records.append(Record(seq, subject, data, time=float(seq)))

    def event(self, subject: str, body: Event) -> None:
        env = codec.seal(body, event_id=f"e{len(self.records)}", time=0.0, producer="test")
        self.raw(subject, codec.encode(env))

    def request(self, tenant: str, verb: str, body: Event) -> None:
        self.raw(subjects.request(tenant, verb), codec.encode(body))


def small_log() -> Log:
    """Two nodes; ``train`` (alpha's 2×4 GPU gang) runs, checkpoints and loses its node;
    ``infer`` (beta's half GPU) has one placement voided, then lands on the T4 box."""
    log = Log()
    log.event(subjects.node("gpu-a"), NodeRegistered(node="gpu-a", inventory=h100_8x_nvswitch("gpu-a")))
    log.event(subjects.node("gpu-b"), NodeRegistered(node="gpu-b", inventory=t4_2x("gpu-b")))
    log.request(subjects.ADMIN, "queue", ApplyQueue(queue=QueueSpec(name="team-a", quotas={"*": Quota(16)})))
    log.request("alpha", "submit", SubmitJob(request_id="train", job=TRAIN))
    log.request("beta", "submit", SubmitJob(request_id="infer", job=INFER))
    log.request("beta", "cancel", CancelJob(job_id="train"))  # not beta's job: refused, not shown
    log.event(subjects.job("train"), JobAccepted(job_id="train", priority=10))
    log.event(subjects.job("infer"), JobAccepted(job_id="infer", priority=0))
    # What each gang holds of team-a's quota: 2×4 GPUs, and half a GPU rounded up to one.
    admissions = (
        Admission(job_id="train", attempt=0, replicas=2, gpus={"*": 8}),
        Admission(job_id="infer", attempt=0, replicas=1, gpus={"*": 1}),
    )
    log.event(subjects.decision("admission"), JobsAdmitted(based_on=8, now=9.0, admissions=admissions))
    train = Placement(
        job_id="train",
        attempt=0,
        workers=(WorkerSlot(0, "gpu-a", whole(0, 1, 2, 3)), WorkerSlot(1, "gpu-a", whole(4, 5, 6, 7))),
    )
    on_a = Placement(job_id="infer", attempt=0, workers=(WorkerSlot(0, "gpu-a", (GpuClaim(0, 500),)),))
    placer = subjects.decision("placer")
    log.event(placer, JobsPlaced(based_on=9, now=10.0, placements=(train, on_a)))  # infer's is void
    for rank in (0, 1):
        log.event(subjects.node("gpu-a"), WorkerStarted(node="gpu-a", job_id="train", attempt=0, rank=rank))
    on_b = Placement(job_id="infer", attempt=0, workers=(WorkerSlot(0, "gpu-b", (GpuClaim(0, 500),)),))
    log.event(placer, JobsPlaced(based_on=12, now=13.0, placements=(on_b,)))
    checkpoint = CheckpointCompleted(node="gpu-a", job_id="train", attempt=0, location="/ckpt/100", step=100)
    log.event(subjects.node("gpu-a"), checkpoint)
    log.raw(subjects.job("train"), b"not an event")
    log.event(subjects.node("gpu-a"), NodeConditionChanged(node="gpu-a", condition="lost", reason="timeout"))
    return log


async def view_of(records: list[Record], chunk: int | None = None) -> tuple[QueryView, State]:
    """A view updated after every ``chunk`` records (all at once if None)."""
    view = await QueryView.open(":memory:")
    state = State()
    step = chunk or max(len(records), 1)
    for i in range(0, len(records), step):
        batch = records[i : i + step]
        fold(batch, state)
        await view.update(state, batch)
    return view, state


async def contents(view: QueryView) -> tuple[object, ...]:
    jobs = await view.jobs()
    events = [await view.job_events(j.id) for j in jobs]
    return jobs, await view.nodes(), events, await view.seq()


async def test_the_view_shows_jobs_nodes_and_each_jobs_history() -> None:
    log = small_log()
    view, state = await view_of(log.records)
    async with view:
        train, infer = await view.jobs()
        assert (train.id, train.tenant, train.queue, train.name) == ("train", "alpha", "team-a", "llm")
        assert (train.phase, train.attempt, train.priority, train.replicas, train.gpus) == (
            "interrupted",
            0,
            10,
            2,
            4.0,
        )
        assert train.nodes == ("gpu-a",)
        assert [r.code for r in train.reasons] == ["interrupted"]
        assert train.updated_seq == state.seq
        assert (infer.phase, infer.gpus, infer.mig, infer.nodes) == ("placed", 0.5, None, ("gpu-b",))
        assert await view.jobs(tenant="beta") == [infer]
        assert await view.jobs(phase="interrupted") == [train]
        assert await view.jobs(tenant="beta", phase="interrupted") == []
        assert await view.job("train") == train
        assert await view.job("nope") is None

        a, b = await view.nodes()
        assert (a.name, a.condition, a.gpu_models, a.gpus_total, a.gpus_free, a.gpus_healthy) == (
            "gpu-a",
            "lost",
            ("H100-80GB",),
            8,
            8,  # the lost node's jobs gave their GPUs back
            8,
        )
        assert (a.cpu_used, a.memory_used) == (0, 0)
        assert (b.name, b.gpu_models, b.gpus_total, b.gpus_free, b.cpu_used) == ("gpu-b", ("T4",), 2, 1, 1000)
        assert not b.cordoned and not b.draining

        history = await view.job_events("train")
        assert [e.type for e in history] == [
            "SubmitJob",
            "JobAccepted",
            "JobsAdmitted",
            "JobsPlaced",
            "WorkerStarted",
            "WorkerStarted",
            "CheckpointCompleted",
        ]
        assert not any(e.refused for e in history)
        assert history[3].summary == "placed attempt 0: 2 workers on gpu-a"
        assert history[6].summary == "checkpoint at step 100: /ckpt/100"
        assert [e.seq for e in history] == sorted(e.seq for e in history)

        placements = [e for e in await view.job_events("infer") if e.type == "JobsPlaced"]
        assert [bool(e.refused) for e in placements] == [True, False]
        assert placements[0].refused.startswith("void: ") and "GPU 0 of gpu-a" in placements[0].refused
        assert placements[0].seq == history[3].seq  # one record, an entry for each job it names
        assert await view.seq() == state.seq == len(log.records)


async def test_updating_record_by_record_gives_the_same_view_as_one_update() -> None:
    records = small_log().records
    whole_view, _ = await view_of(records)
    stepwise, _ = await view_of(records, chunk=1)
    chunked, _ = await view_of(records, chunk=4)
    async with whole_view, stepwise, chunked:
        expected = await contents(whole_view)
        assert await contents(stepwise) == expected
        assert await contents(chunked) == expected


async def test_an_update_seen_twice_adds_nothing() -> None:
    records = small_log().records
    view, state = await view_of(records)
    async with view:
        before = await contents(view)
        await view.update(state, records)
        assert await contents(view) == before


async def test_a_reader_sees_the_writers_view_and_a_reopened_writer_resumes(tmp_path: Path) -> None:
    path = str(tmp_path / "view.db")
    records = small_log().records
    state = fold(records[:10])
    async with await QueryView.open(path) as writer:
        await writer.update(state, records[:10])
        async with await QueryView.open(path, readonly=True) as reader:
            assert await reader.seq() == 10
            assert [j.id for j in await reader.jobs()] == ["train", "infer"]
            fold(records[10:], state)
            await writer.update(state, records[10:])
            assert await reader.seq() == len(records)
            assert (await reader.jobs())[0].phase == "interrupted"
    async with await QueryView.open(path) as again:
        assert await again.seq() == len(records)
        assert len(await again.job_events("train")) == 7


async def test_a_view_of_another_format_is_dropped_and_rebuilt(tmp_path: Path) -> None:
    path = str(tmp_path / "view.db")
    records = small_log().records
    async with await QueryView.open(path) as view:
        await view.update(fold(records), records)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = 0 WHERE key = 'format'")
    async with await QueryView.open(path) as view:
        assert await view.seq() == 0
        assert await view.jobs() == [] and await view.nodes() == []


async def test_a_fresh_view_of_a_restored_state_shows_every_job() -> None:
    """A service restored from a snapshot updates a new view with only the tail: the jobs and
    nodes are all there; the history only from the tail on."""
    records = small_log().records
    state = fold(records[:-1])
    async with await QueryView.open(":memory:") as view:
        fold(records[-1:], state)
        await view.update(state, records[-1:])
        assert [j.id for j in await view.jobs()] == ["train", "infer"]
        assert [n.name for n in await view.nodes()] == ["gpu-a", "gpu-b"]
        assert await view.job_events("train") == []


# -- which jobs a record concerns ---------------------------------------------------------------

REASON = Reason("quota", "over quota")
PLACEMENT_A = Placement(job_id="a", attempt=0, workers=(WorkerSlot(0, "n", whole(0)),))
PLACEMENT_B = Placement(job_id="b", attempt=1, workers=(WorkerSlot(0, "n", whole(1)),))
INV = h100_8x_nvswitch("n")

NAMES_JOBS: dict[str, tuple[Event, list[str]]] = {
    "submit": (SubmitJob(request_id="a", job=TRAIN), ["a"]),
    "cancel": (CancelJob(job_id="a"), ["a"]),
    "resize": (ResizeJob(job_id="a", replicas=1), ["a"]),
    "accepted": (JobAccepted(job_id="a", priority=0), ["a"]),
    "rejected": (JobRejected(job_id="a", request_seq=1, reason=REASON), ["a"]),
    "pending": (PendingReasonChanged(job_id="a", reasons=(REASON,)), ["a"]),
    "requeued": (JobRequeued(job_id="a", attempt=0, reason=REASON), ["a"]),
    "admitted": (
        JobsAdmitted(based_on=1, now=0.0, admissions=(Admission("a", 0, 1), Admission("b", 0, 2))),
        ["a", "b"],
    ),
    "admitted-and-grown": (
        JobsAdmitted(
            based_on=1, now=0.0, admissions=(Admission("a", 0, 1),), growths=(Admission("e", 0, 3),)
        ),
        ["a", "e"],
    ),
    "placed": (JobsPlaced(based_on=1, now=0.0, placements=(PLACEMENT_A, PLACEMENT_B)), ["a", "b"]),
    "unschedulable": (
        JobsUnschedulable(
            based_on=1, now=0.0, jobs=(Unschedulable("b", 0, (REASON,)), Unschedulable("a", 0, ()))
        ),
        ["b", "a"],
    ),
    "preemption": (
        PreemptionRequested(
            based_on=1, now=0.0, beneficiary="a", victims=(Victim("b", 0), Victim("c", 2)), deadline=30.0
        ),
        ["a", "b", "c"],
    ),
    "shrink": (
        ShrinkRequested(
            based_on=1, now=0.0, job_id="e", attempt=0, replicas=2, beneficiary="a", deadline=9.0
        ),
        ["a", "e"],
    ),
    "worker-started": (WorkerStarted(node="n", job_id="a", attempt=0, rank=0), ["a"]),
    "worker-exited": (WorkerExited(node="n", job_id="a", attempt=0, rank=0, code=1), ["a"]),
    "checkpoint": (CheckpointCompleted(node="n", job_id="a", attempt=0, location="/c", step=1), ["a"]),
    "node-registered": (NodeRegistered(node="n", inventory=INV), []),
    "node-condition": (NodeConditionChanged(node="n", condition="lost"), []),
    "gpu-health": (GpuHealthChanged(node="n", gpu=0, healthy=False), []),
    "node-cordoned": (NodeCordoned(node="n", cordoned=True), []),
    "apply-queue": (ApplyQueue(queue=QueueSpec(name="q")), []),
    "apply-cohort": (ApplyCohort(cohort=CohortSpec(name="c")), []),
    "apply-priority-class": (ApplyPriorityClass(priority_class=PriorityClassSpec(name="p", value=1)), []),
    "delete-queue": (DeleteQueue(name="q"), []),
    "cordon-request": (CordonNode(node="n"), []),
}


@pytest.mark.parametrize(("body", "expected"), NAMES_JOBS.values(), ids=NAMES_JOBS.keys())
def test_job_ids_of(body: Event, expected: list[str]) -> None:
    assert job_ids_of(body) == expected


def test_every_event_type_is_in_the_job_ids_table() -> None:
    """A new event type must say here which jobs it concerns, or the view will miss them."""
    assert {type(body) for body, _ in NAMES_JOBS.values()} == set(codec.EVENT_TYPES)
