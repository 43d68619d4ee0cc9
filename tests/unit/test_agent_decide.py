"""The node agent's pure core: which workers start, checkpoint and stop, with which environment.

Each test folds a small log with ``LogBuilder`` and asks ``decide`` what node-00's agent must do,
given what its runtime runs. Only what the fold accepted for this node may start anything.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import pytest

from corral.events import codec
from corral.events import subjects as subj
from corral.events.decisions import MigSlot
from corral.events.jobs import CancelJob, JobSpec, Mount
from corral.events.nodes import CheckpointCompleted, NodeInventory, WorkerExited, WorkerStarted
from corral.projections import trace_ids
from corral.projections.assignments import (
    PORT_BASE,
    PORT_SPAN,
    GpuBinding,
    master_port,
    node_view,
    preemption_deadline,
)
from corral.projections.state import State
from corral.services.agent.decide import (
    GONE_CODE,
    START_FAILED_CODE,
    STOP_GRACE,
    Action,
    Checkpointed,
    Exited,
    Forget,
    ReportGone,
    RequestCheckpoint,
    Started,
    StartFailed,
    StartGang,
    StartWorker,
    StopWorker,
    WorkerKey,
    WorkerPhase,
    decide,
    report_events,
)
from corral.services.agent.inventory import h100_8x_nvswitch
from tests.builders import Cluster, LogBuilder, job, mig_slot, on, placement, running, whole, worker

N0, N1 = "node-00", "node-01"
ROOT = "/ckpt"
NOW = 5000.0


def fold(log: LogBuilder) -> State:
    state = log.fold()
    assert state.faults == 0
    return state


def act(
    state: State, workers: dict[WorkerKey, WorkerPhase] | None = None, now: float = NOW, node: str = N0
) -> list[Action]:
    return decide(node_view(state, node), workers or {}, now, ROOT)


def starts(actions: list[Action]) -> list[StartWorker]:
    return [w for a in actions if isinstance(a, StartGang) for w in a.workers]


def spec(gpus: int = 1, **changes: object) -> JobSpec:
    return msgspec.structs.replace(job().gpus(gpus).build(), **changes)


def base(nodes: Cluster | None = None) -> LogBuilder:
    """Nodes and both teams' queues, with ample quota."""
    return LogBuilder().nodes(nodes or Cluster(2)).queues("team-a", "team-b")


def placed(
    job_id: str = "j1", s: JobSpec | None = None, *gpus: int, log: LogBuilder | None = None
) -> LogBuilder:
    log = log if log is not None else base()
    return (
        log.submit("alice", job_id, s)
        .accept(job_id)
        .admit(job_id)
        .place(on(N0, *(gpus or (0,)), job_id=job_id))
    )


K = WorkerKey("j1", 0, 0)


# -- starting --------------------------------------------------------------------------------------


def test_an_accepted_placement_starts_its_worker_with_the_rendezvous_environment() -> None:
    s = spec(2, command=("python", "train.py"), env={"LR": "0.1", "RANK": "99"}, grace_seconds=12.0)
    state = fold(placed("j1", s, 2, 3))
    [gang] = act(state)
    assert isinstance(gang, StartGang) and (gang.job_id, gang.attempt) == ("j1", 0)
    [w] = gang.workers
    assert (w.key, w.command, w.grace_seconds) == (K, ("python", "train.py"), 12.0)
    assert [g.index for g in w.gpus] == [2, 3]
    job = state.jobs["j1"]
    trace = trace_ids.job_trace("j1", job.submitted_seq, job.traceparent)
    assert w.env == {
        "LR": "0.1",
        "RANK": "0",  # corral's variables win over the job's
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",  # the simulated nodes' address label
        "MASTER_PORT": str(master_port("j1", 0)),
        "CUDA_VISIBLE_DEVICES": f"GPU-{N0}-02,GPU-{N0}-03",
        "CORRAL_JOB_ID": "j1",
        "CORRAL_ATTEMPT": "0",
        "CORRAL_CHECKPOINT_DIR": f"{ROOT}/j1/run-{job.submitted_seq}/attempt-0/rank-0",
        # the worker's run in its job's trace: the job's own spans join it there
        "TRACEPARENT": trace_ids.traceparent(trace.trace_id, trace.worker_span(0, 0)),
        "OTEL_SERVICE_NAME": "corral-job",
        "OTEL_RESOURCE_ATTRIBUTES": "corral.job.id=j1,corral.attempt=0,corral.rank=0",
    }
    run = f"{ROOT}/j1/run-{job.submitted_seq}"
    assert w.checkpoint_dir == f"{run}/attempt-0/rank-0" and w.job_checkpoint_dir == run


def reused_id() -> tuple[State, State]:
    """j1 placed on node-00 as alice's; then, that one over and let go, as bob's at the same
    attempt and rank: the state of each placement."""
    first = fold(placed("j1"))
    log = placed("j1")
    log.started(N0, "j1").exited(N0, "j1", code=0).retention(0.0)
    log.submit("bob", "j1").accept("j1").admit("j1")
    return first, fold(log.place(on(N0, 0, job_id="j1")))


def test_a_job_id_used_again_gets_directories_of_its_own() -> None:
    # Once a job is let go its id is free: another tenant's job of the same id must find neither
    # the first one's files nor its checkpoints (a resume from them would read another's work).
    first, second = reused_id()
    assert second.jobs["j1"].tenant == "bob"
    [old] = act(first)[0].workers  # type: ignore[union-attr]
    [new] = act(second)[0].workers  # type: ignore[union-attr]
    assert old.run != new.run and old.job_checkpoint_dir != new.job_checkpoint_dir
    assert not new.checkpoint_dir.startswith(old.job_checkpoint_dir + "/")


def test_an_exited_worker_of_an_earlier_job_of_the_id_does_not_hold_back_the_new_one() -> None:
    # The runtime still holds the earlier j1's exited worker (an agent just restarted, a short
    # retention) when the new j1 is placed at the same attempt and rank: read as the new job's,
    # it was never forgotten, and the new worker never started until its start timed out.
    first, second = reused_id()
    old_run, new_run = first.jobs["j1"].submitted_seq, second.jobs["j1"].submitted_seq
    view = node_view(second, N0)
    held: dict[WorkerKey, WorkerPhase] = {K: "exited"}
    assert decide(view, held, NOW, ROOT, runs={K: old_run}) == [Forget(K)]
    [w] = starts(decide(view, {}, NOW, ROOT, runs={}))  # the next cycle, once it is forgotten
    assert w.run == new_run
    # The new job's own exited worker is still kept until the log has its exit.
    assert Forget(K) not in decide(view, held, NOW, ROOT, runs={K: new_run})


def test_a_running_worker_of_an_earlier_job_of_the_id_is_stopped_not_taken_for_the_new_ones() -> None:
    # The earlier j1's worker still runs under the same key (its node was lost, and came back)
    # when the new j1 is placed here at the same attempt and rank: read as the new job's, it
    # ran on as the new job's rank and its reports were taken as the new job's.
    first, second = reused_id()
    old_run = first.jobs["j1"].submitted_seq
    view = node_view(second, N0)
    stop = StopWorker(K, "superseded", STOP_GRACE)
    assert decide(view, {K: "running"}, NOW, ROOT, runs={K: old_run}) == [stop]
    assert decide(view, {K: "stopping"}, NOW, ROOT, runs={K: old_run}) == []  # nor is the new one started
    # Nor any other rank of the new job: one placed where the earlier worker runs started beside it.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1").accept("j1").admit("j1").place(on(N0, 0, job_id="j1"))
    old_run = fold(log).jobs["j1"].submitted_seq
    log.started(N0, "j1").exited(N0, "j1", code=0).retention(0.0)
    log.submit("bob", "j1", job().gpus(1).replicas(2)).accept("j1").admit("j1", replicas=2)
    view = node_view(fold(log.place(placement("j1", worker(0, N0, whole(1)), worker(1, N0, whole(0))))), N0)
    busy = {K: (GpuBinding(0, f"GPU-{N0}-00"),)}
    assert decide(view, {K: "running"}, NOW, ROOT, runs={K: old_run}, busy=busy) == [stop]


def test_a_placement_on_another_node_starts_nothing_here() -> None:
    state = fold(placed())
    assert act(state, node=N1) == []


def test_a_voided_placement_starts_nothing() -> None:
    log = placed("j1")
    log.submit("alice", "j2").accept("j2").admit("j2").place(on(N0, 0, job_id="j2"))  # GPU 0 is taken
    state = fold(log)
    assert state.jobs["j2"].phase == "admitted" and state.void_total == 1
    assert [w.job_id for w in starts(act(state))] == ["j1"]


def test_an_admitted_job_without_placement_starts_nothing() -> None:
    state = fold(base(Cluster(1)).submit("alice", "j1").accept("j1").admit("j1"))
    assert act(state) == []


@pytest.mark.parametrize("phase", ["starting", "running", "checkpoint-requested", "stopping", "exited"])
def test_a_worker_the_runtime_has_is_not_started_again(phase: WorkerPhase) -> None:
    state = fold(placed())
    assert starts(act(state, {K: phase})) == []


def test_a_rank_that_started_and_exited_is_not_started_again() -> None:
    g = job().replicas(2).build()
    log = base(Cluster(1)).submit("alice", "j1", g).accept("j1").admit("j1", replicas=2)
    log.place(placement("j1", worker(0, N0, whole(0)), worker(1, N0, whole(1))))
    log.started(N0, "j1", rank=0).started(N0, "j1", rank=1).exited(N0, "j1", rank=0, code=0)
    state = fold(log)
    assert state.jobs["j1"].phase == "running"
    assert act(state, {WorkerKey("j1", 0, 1): "running"}) == []


def test_a_gang_across_two_nodes_gets_local_ranks_and_one_master() -> None:
    nodes = Cluster(2)
    inv = nodes.nodes[0][1]
    nodes.nodes[0] = (N0, NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus, {"address": "10.0.0.7"}))
    g = job().replicas(4).build()
    log = base(nodes).submit("alice", "g", g).accept("g").admit("g", replicas=4)
    log.place(
        placement(
            "g",
            worker(0, N0, whole(0)),
            worker(1, N1, whole(0)),
            worker(2, N0, whole(1)),
            worker(3, N1, whole(1)),
        )
    )
    state = fold(log)
    here, there = starts(act(state, node=N0)), starts(act(state, node=N1))
    assert [(w.rank, w.env["LOCAL_RANK"], w.env["GROUP_RANK"]) for w in here] == [
        (0, "0", "0"),
        (2, "1", "0"),
    ]
    assert [(w.rank, w.env["LOCAL_RANK"], w.env["GROUP_RANK"]) for w in there] == [
        (1, "0", "1"),
        (3, "1", "1"),
    ]
    for w in here + there:
        assert (w.env["WORLD_SIZE"], w.env["LOCAL_WORLD_SIZE"], w.env["MASTER_ADDR"]) == (
            "4",
            "2",
            "10.0.0.7",
        )
        assert w.env["MASTER_PORT"] == str(master_port("g", 0))
    assert len([a for a in act(state) if isinstance(a, StartGang)]) == 1  # one barrier per gang


def test_a_mig_slot_is_a_placeholder_the_runtime_resolves() -> None:
    log = base(Cluster(1, profile="h100-8x-mig"))
    log.submit("alice", "m", job().mig("3g.40gb")).accept("m").admit("m")
    log.place(placement("m", worker(0, N0, mig_slot(5, "3g.40gb", 4))))
    [w] = starts(act(fold(log)))
    assert w.env["CUDA_VISIBLE_DEVICES"] == f"mig:GPU-{N0}-05/3g.40gb@4"
    assert w.gpus[0].mig is not None and w.gpus[0].mig.start == 4


def test_a_shared_gpu_says_its_share() -> None:
    log = base(Cluster(1)).submit("alice", "f", job().milli(250)).accept("f").admit("f")
    log.place(placement("f", worker(0, N0, msgspec.structs.replace(whole(0), milli=250))))
    [w] = starts(act(fold(log)))
    assert (w.env["CUDA_VISIBLE_DEVICES"], w.env["CORRAL_GPU_MILLI"]) == (f"GPU-{N0}-00", "250")


def _held(
    uuid: str, milli: int = 1000, slot: MigSlot | None = None
) -> dict[WorkerKey, tuple[GpuBinding, ...]]:
    """An earlier worker, of job x, still live on GPU ``uuid`` of node-00."""
    return {WorkerKey("x", 0, 0): (GpuBinding(0, uuid, milli, slot),)}


def test_a_gang_waits_for_a_worker_still_on_its_gpus_to_end() -> None:
    # x's start was under way when x was stopped (its other GPU failed, it was cancelled): the
    # fold gave its GPUs back, no start of it folded, and placed j1 on them. j1's worker ran
    # beside x's on GPU 0 until x's stop took effect.
    view = node_view(fold(placed("j1")), N0)
    gpu0 = f"GPU-{N0}-00"
    assert starts(decide(view, {}, NOW, ROOT, busy=_held(gpu0))) == []
    assert len(starts(decide(view, {}, NOW, ROOT, busy=_held(f"GPU-{N0}-01")))) == 1  # another GPU
    # A share of a GPU starts beside another share while the two fit in it.
    log = base(Cluster(1)).submit("alice", "f", job().milli(250)).accept("f").admit("f")
    view = node_view(
        fold(log.place(placement("f", worker(0, N0, msgspec.structs.replace(whole(0), milli=250))))), N0
    )
    assert len(starts(decide(view, {}, NOW, ROOT, busy=_held(gpu0, milli=750)))) == 1
    assert starts(decide(view, {}, NOW, ROOT, busy=_held(gpu0, milli=751))) == []
    # A MIG instance waits only for one on memory slices it takes.
    log = base(Cluster(1, profile="h100-8x-mig"))
    log.submit("alice", "m", job().mig("3g.40gb")).accept("m").admit("m")
    view = node_view(fold(log.place(placement("m", worker(0, N0, mig_slot(5, "3g.40gb", 4))))), N0)
    gpu5 = f"GPU-{N0}-05"
    assert starts(decide(view, {}, NOW, ROOT, busy=_held(gpu5, slot=MigSlot("1g.10gb", 5)))) == []
    assert len(starts(decide(view, {}, NOW, ROOT, busy=_held(gpu5, slot=MigSlot("3g.40gb", 0))))) == 1


def test_mounts_and_image_travel_with_the_worker() -> None:
    mounts = (Mount("/datasets/imagenet", "/data", read_only=True),)
    [w] = starts(act(fold(placed("j1", spec(mounts=mounts, image="pytorch:2")))))
    assert (w.mounts, w.image) == (mounts, "pytorch:2")


def test_a_restarted_job_resumes_from_its_checkpoint() -> None:
    log = running("j1", log=base()).checkpoint(N0, "j1", step=40).exited(N0, "j1", code=1)
    log.requeue("j1", 0).admit("j1", attempt=1).place(on(N0, 4, job_id="j1", attempt=1))
    state = fold(log)
    [w] = starts(act(state))
    assert (w.key, w.env["CORRAL_RESUME_FROM"], w.env["CORRAL_ATTEMPT"]) == (
        WorkerKey("j1", 1, 0),
        "/ckpt/j1/40",
        "1",
    )
    assert w.env["MASTER_PORT"] == str(master_port("j1", 1))


def test_master_port_is_deterministic_in_range_and_differs_between_attempts() -> None:
    ports = [master_port("job-7", a) for a in range(20)]
    assert ports == [master_port("job-7", a) for a in range(20)]
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert len(set(ports)) > 15


# -- checkpointing and stopping --------------------------------------------------------------------


def preempted(checkpointable: bool = True, grace: float = 30.0) -> State:
    s = spec(checkpointable=checkpointable, grace_seconds=grace)
    log = running("v", s, log=base())
    log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v")
    state = fold(log)
    assert state.jobs["v"].phase == "checkpointing"
    return state


V = WorkerKey("v", 0, 0)


def test_a_preempted_worker_is_asked_to_checkpoint_by_its_grace_deadline() -> None:
    state = preempted(grace=30.0)
    deadline = preemption_deadline(state.jobs["v"])
    assert deadline == state.jobs["v"].phase_since + 30.0
    assert act(state, {V: "running"}, now=deadline - 10) == [RequestCheckpoint(V, deadline)]


def test_an_asked_worker_is_left_alone_until_its_deadline_then_stopped() -> None:
    state = preempted()
    deadline = preemption_deadline(state.jobs["v"])
    assert act(state, {V: "checkpoint-requested"}, now=deadline - 1) == []
    [stop] = act(state, {V: "checkpoint-requested"}, now=deadline)
    assert isinstance(stop, StopWorker) and (stop.key, stop.reason) == (V, "preempted")


def test_a_worker_that_checkpointed_is_stopped_before_its_deadline() -> None:
    state = preempted()
    deadline = preemption_deadline(state.jobs["v"])
    [stop] = act(state, {V: "checkpointed"}, now=deadline - 20)
    assert isinstance(stop, StopWorker) and stop.reason == "preempted" and stop.grace == pytest.approx(20)


def test_a_job_that_cannot_checkpoint_is_stopped_with_its_grace() -> None:
    state = preempted(checkpointable=False, grace=15.0)
    deadline = preemption_deadline(state.jobs["v"])
    [stop] = act(state, {V: "running"}, now=deadline - 15)
    assert isinstance(stop, StopWorker) and stop.grace == pytest.approx(15)


def cancelled() -> LogBuilder:
    return running("j1", log=base()).request("alice", "cancel", CancelJob(job_id="j1"))


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        pytest.param(cancelled(), "cancelled", id="cancelled"),
        pytest.param(running("j1", log=base()).gpu_health(N0, 0, False), "interrupted", id="bad-gpu"),
        # A job that is over with nothing live here has left the node's view: whatever of it
        # still runs is superseded.
        pytest.param(
            running("j1", job().restarts(0), log=base()).exited(N0, "j1", code=9),
            "superseded",
            id="finished",
        ),
    ],
)
def test_a_worker_whose_job_is_over_or_interrupted_is_stopped(log: LogBuilder, reason: str) -> None:
    state = fold(log)
    assert state.rejected_total == 0
    [stop] = act(state, {K: "running"})
    assert isinstance(stop, StopWorker) and (stop.key, stop.reason) == (K, reason)


def test_a_worker_already_stopping_is_not_stopped_twice() -> None:
    assert act(fold(cancelled()), {K: "stopping"}) == []


@pytest.mark.parametrize(
    "key",
    [WorkerKey("j1", 0, 5), WorkerKey("nope", 0, 0), WorkerKey("j1", 7, 0)],
    ids=["rank", "job", "attempt"],
)
def test_a_worker_the_log_does_not_know_is_stopped_as_superseded(key: WorkerKey) -> None:
    state = fold(placed())
    stops = [a for a in act(state, {K: "running", key: "running"}) if isinstance(a, StopWorker)]
    assert stops == [StopWorker(key, "superseded", stops[0].grace)]


def test_an_old_attempt_is_stopped_when_the_job_moved_on() -> None:
    log = running("j1", log=base()).gpu_health(N0, 0, False).requeue("j1", 0).admit("j1", attempt=1)
    state = fold(log.place(on(N1, 0, job_id="j1", attempt=1)))
    assert act(state, {K: "running"}) == [StopWorker(K, "superseded", 10.0)]


# -- reconciling with the log ----------------------------------------------------------------------


def test_a_worker_live_in_the_log_but_not_running_here_is_reported_gone() -> None:
    state = fold(running("j1", log=base()))
    assert act(state, {}) == [ReportGone(K, state.jobs["j1"].submitted_seq)]  # where its files are
    assert report_events(N0, Exited(K, GONE_CODE))[0] == WorkerExited(
        node=N0, job_id="j1", attempt=0, rank=0, code=GONE_CODE
    )


def test_an_exited_worker_is_kept_until_the_log_has_its_exit() -> None:
    log = running("j1", log=base())
    assert act(fold(log), {K: "exited"}) == []  # exit reported, not folded yet: no ReportGone either
    assert act(fold(log.exited(N0, "j1", code=3)), {K: "exited"}) == [Forget(K)]


def test_a_failed_start_is_kept_until_the_log_has_its_start_and_exit() -> None:
    log = placed()
    assert act(fold(log), {K: "exited"}) == []  # not started again before the fold saw the failure
    log.started(N0, "j1").exited(N0, "j1", code=START_FAILED_CODE)
    assert act(fold(log), {K: "exited"}) == [Forget(K)]


def test_decide_is_deterministic() -> None:
    log = placed("a")
    placed("b", None, 1, log=log)
    placed("c", None, 2, log=log)
    state = fold(log)
    assert act(state) == act(state) and len(starts(act(state))) == 3


# -- reports into events ---------------------------------------------------------------------------


def test_reports_become_node_events() -> None:
    assert report_events(N0, Started(K, 42)) == [
        WorkerStarted(node=N0, job_id="j1", attempt=0, rank=0, pid=42)
    ]
    assert report_events(N0, Exited(K, 143, stopped=True)) == [
        WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=143, stopped=True)
    ]
    assert report_events(N0, StartFailed(K, "no such file")) == [
        WorkerStarted(node=N0, job_id="j1", attempt=0, rank=0, failed=True),
        WorkerExited(
            node=N0, job_id="j1", attempt=0, rank=0, code=START_FAILED_CODE, start_error="no such file"
        ),
    ]
    assert report_events(N0, StartFailed(K, "disk full", node_fault=True))[1] == WorkerExited(
        node=N0, job_id="j1", attempt=0, rank=0, code=START_FAILED_CODE, node_fault="disk full"
    )
    assert report_events(N0, Checkpointed(K, 7, "/c/7")) == [
        CheckpointCompleted(node=N0, job_id="j1", attempt=0, location="/c/7", step=7)
    ]
    assert (
        report_events(N0, Checkpointed(WorkerKey("j1", 0, 1), 7, "/c/7")) == []
    )  # rank 0 speaks for the job


def test_a_failed_start_restarts_the_gang_through_the_fold() -> None:
    log = placed("j1", job().restarts(2).build())
    for ev in report_events(N0, StartFailed(K, "bwrap: cannot mount")):
        log.event(subj.node(N0), ev)
    j = fold(log).jobs["j1"]
    assert (j.phase, j.restarts, j.held) == ("interrupted", 1, None)
    assert j.reasons[0].message == "rank 0 could not start: bwrap: cannot mount; restart 1"  # not "code 127"


def test_simulated_inventory_matches_its_profile() -> None:
    assert Cluster(1).nodes[0][1].gpus == h100_8x_nvswitch(N0).gpus


def test_an_agent_given_relative_directories_hands_workers_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers run in their own working directory: a relative checkpoint path would point
    # somewhere else there, and the agent would never see the checkpoints they write.
    from corral.events.log import InMemoryLog
    from corral.services.agent.service import NodeAgent

    monkeypatch.chdir(tmp_path)
    from corral.services.runtime.views import MemoryViews

    agent = NodeAgent(
        N0, InMemoryLog(), MemoryViews(), work_dir="data/nodes/node-00", checkpoint_root="data/checkpoints"
    )
    assert Path(agent.checkpoint_root) == tmp_path / "data" / "checkpoints"
    assert agent.work_dir == tmp_path / "data" / "nodes" / "node-00"


async def test_a_job_id_used_again_reports_facts_of_its_own_not_duplicates(tmp_path: Path) -> None:
    # Two runs of job "j" (its id used again once the first was let go), each with attempt 0,
    # rank 0, checkpoint step 10, and workers that start no process (no pid): the second run's
    # facts were stored as duplicates of the first's within the stream's duplicate window, and
    # its start and checkpoint were never folded.
    from corral.events.log import InMemoryLog
    from corral.events.nodes import CheckpointCompleted, WorkerStarted
    from corral.projections.assignments import Assignment, NodeView
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    log = InMemoryLog()
    agent = NodeAgent(N0, log, MemoryViews(), work_dir=tmp_path)
    facts = [
        WorkerStarted(node=N0, job_id="j", attempt=0, rank=0),
        CheckpointCompleted(node=N0, job_id="j", attempt=0, step=10, location="s3://ckpt/j/10"),
    ]
    stored = []
    for run in (7, 9):
        agent.view = NodeView(N0, jobs=(Assignment("j", 0, "running", run=run),))
        for body in facts:
            stored.append(await log.append(agent._append(body, 1.0)))
        # The same fact of the same run, reported again (an agent restarted), is a duplicate.
        assert (await log.append(agent._append(facts[0], 2.0))).duplicate
    assert [a.duplicate for a in stored] == [False] * 4
    # Each fact names its run, so the fold takes none for the other run's.
    runs = [codec.decode_body(r.subject, r.data, r.headers).body.run for r in log.records]  # type: ignore[attr-defined]
    assert runs == [7, 7, 9, 9]


async def test_a_failed_exit_names_the_xids_seen_on_its_workers_gpus(tmp_path: Path) -> None:
    # The driver reported XID 48 on GPU 2 as the worker died of it; the heartbeat that carries
    # it to the health monitor comes seconds later. The exit names it, so the fold charges the
    # GPU, not the job; the heartbeat still carries it.
    from corral.events.log import InMemoryLog
    from corral.events.nodes import WorkerExited
    from corral.services.agent.service import NodeAgent, SimulatedGpus
    from corral.services.runtime.views import MemoryViews

    inventory = h100_8x_nvswitch(N0)
    agent = NodeAgent(N0, InMemoryLog(), MemoryViews(), work_dir=tmp_path, gpus=SimulatedGpus(inventory))
    mine = (GpuBinding(2, inventory.gpus[2].uuid),)
    agent.runtime.gpus_of = lambda key: mine if key == K else ()  # type: ignore[method-assign]
    agent.gpus.inject_xid(2, 48)
    agent.gpus.inject_xid(5, 48)  # another GPU's: not this worker's
    [failed] = agent._events_of(Exited(K, 1))
    assert isinstance(failed, WorkerExited)
    assert [(x.xid, x.uuid) for x in failed.xids] == [(48, inventory.gpus[2].uuid)]
    [stopped] = agent._events_of(Exited(K, 143, stopped=True))
    assert isinstance(stopped, WorkerExited) and stopped.xids == ()  # corral stopped it: no fault
    beat = await agent._heartbeat()
    assert sorted(x.gpu for x in beat.xids) == [2, 5]
    # One seen before the worker started (its GPU repaired and used again since) is not its.
    ticks = itertools.count(agent.clock() + 3600.0)  # an hour on: the XIDs above are long past
    agent.clock = lambda: float(next(ticks))
    agent.gpus.inject_xid(2, 48)
    agent._take_xids()
    agent._events_of(Started(K, 1))
    [later] = agent._events_of(Exited(K, 1))
    assert isinstance(later, WorkerExited) and later.xids == ()
    # A start the agent takes late (its cycle busy appending) counts from when it was reported.
    agent.reports.put_nowait(Started(K, 1))
    agent.gpus.inject_xid(2, 48)
    agent._take_xids()  # a heartbeat took it meanwhile
    agent._events_of(agent.reports.get_nowait())
    [late] = agent._events_of(Exited(K, 1))
    assert isinstance(late, WorkerExited) and [x.xid for x in late.xids] == [48]
    # Nor does an application's flood of XIDs push the GPU's own out of what is kept.
    agent._events_of(Started(K, 1))
    agent.gpus.inject_xid(2, 48)
    for _ in range(300):
        agent.gpus.inject_xid(5, 31)
    [flooded] = agent._events_of(Exited(K, 1))
    assert isinstance(flooded, WorkerExited) and [x.xid for x in flooded.xids] == [48]
    # What waits for a heartbeat is bounded too (heartbeats off, or failing, a long while): one
    # carrying every XID of an outage outgrew the server's largest message, and none was sent.
    for _ in range(5_000):
        agent.gpus.inject_xid(5, 31)
    agent._take_xids()
    assert len(agent._xids_unsent) <= 512


async def test_the_exit_of_an_earlier_runs_worker_names_its_run_though_it_is_forgotten_at_once(
    tmp_path: Path,
) -> None:
    # The earlier j1's worker exited; the cycle that saw it forgot it (decide's Forget) before
    # its exit was appended, and the runtime no longer knew its run: the exit was stamped with
    # the new j1's, a fact about the new job that never happened.
    from corral.events.log import InMemoryLog
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    first, second = reused_id()
    old = first.jobs["j1"].submitted_seq

    class Forgets:
        """A runtime holding the earlier j1's exited worker until told to forget it."""

        def __init__(self) -> None:
            self.known = {K: old}

        def workers(self) -> dict[WorkerKey, WorkerPhase]:
            return {k: "exited" for k in self.known}

        def runs(self) -> dict[WorkerKey, int]:
            return dict(self.known)

        def run_of(self, key: WorkerKey) -> int | None:
            return self.known.get(key)

        async def act(self, action: Action) -> None:
            if isinstance(action, Forget):
                self.known.pop(action.key, None)

        async def leave(self) -> None:  # the agent leaves its workers to the next one
            self.known.clear()

    log = InMemoryLog()
    agent = NodeAgent(N0, log, MemoryViews(), work_dir=tmp_path)
    agent.runtime = Forgets()  # type: ignore[assignment]
    agent.view = node_view(second, N0)
    agent.reports.put_nowait(Exited(K, 143, stopped=True))
    await agent.cycle()
    # The same when the agent leaves: the runtime lets its workers go before the last flush.
    agent.runtime = Forgets()  # type: ignore[assignment]
    agent.reports.put_nowait(Exited(K, 1, pid=4242))  # another run of the rank: another fact
    await agent._shut_down("leave")
    runs = [codec.decode_body(r.subject, r.data, r.headers).body.run for r in log.records]  # type: ignore[attr-defined]
    assert runs == [old, old]
