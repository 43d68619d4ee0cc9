"""A live corral survives failures: real nats-server, every service, node agents running
``examples/train.py`` as real processes, and the health monitor on real heartbeats.

- a training job runs to success and its log is kept;
- a worker killed with SIGKILL is restarted (attempt + 1) and resumes from its checkpoint;
- a node that dies (agent, heartbeats and workers gone) is marked suspect, then lost, and its job
  resumes on the other node from the step it last checkpointed.

Each test ends by replaying the records it watched with the one fold and comparing with the live
state, checking that no worker start or exit was stored twice or refused, and that no process
outlives the cluster. Nothing sleeps: every wait is ``Watcher.until`` with a timeout.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import CancelJob, JobRequeued, JobSpec, Resources, SubmitJob
from corral.events.log import Append, Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.projections.fold import fold
from corral.projections.lifecycle import FINAL
from corral.projections.state import State
from corral.services.cli.up import Cluster, Settings, cluster, connect
from corral.services.cli.watch import Watcher

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
WAIT = 60.0  # generous: a loaded 2-core machine starts Python with numpy slowly
# Short intervals; a node is lost only after 10 s, so a busy machine never loses one by accident.
FAST = Settings(
    tick=0.1,
    agent_tick=0.05,
    heartbeat=0.2,
    suspect_after=5,
    lost_after=10.0,
    probation=0.5,
    restart_backoff=0.2,
    stop_grace=2.0,
)
# A node is lost after 2 s of silence (suspect after 0.6 s), for the tests that kill one.
DYING = dataclasses.replace(FAST, suspect_after=3, lost_after=2.0)
E = TypeVar("E", bound=Event)


@dataclass
class Live:
    cluster: Cluster
    log: JetStreamLog
    watch: Watcher

    @property
    def state(self) -> State:
        return self.watch.state

    async def request(self, tenant: str, verb: str, body: Event, msg_id: str) -> None:
        await self.log.append(Append(subjects.request(tenant, verb), codec.encode(body), msg_id=msg_id))

    async def submit(self, job_id: str, spec: JobSpec) -> None:
        await self.request(spec.queue, "submit", SubmitJob(request_id=job_id, job=spec), f"submit:{job_id}")

    async def until(self, predicate: Callable[[State], bool], timeout: float = WAIT) -> State:
        return await self.watch.until(predicate, timeout)

    def events(self, kind: type[E], job_id: str | None = None) -> list[tuple[int, E]]:
        return events_of(self.watch.records, kind, job_id)


def events_of(records: Iterable[Record], kind: type[E], job_id: str | None = None) -> list[tuple[int, E]]:
    """(seq, body) of every service event of type ``kind`` (about ``job_id``, if given)."""
    out: list[tuple[int, E]] = []
    for r in records:
        if not r.subject.startswith("corral.ev."):
            continue
        body = codec.decode_envelope(r.data).body
        if isinstance(body, kind) and (job_id is None or getattr(body, "job_id", None) == job_id):
            out.append((r.seq, body))
    return out


def train(steps: int, every: int = 0, pace: float = 0.0) -> tuple[str, ...]:
    cmd = [sys.executable, TRAIN, "--steps", str(steps), "--log-every", "100"]
    if every:
        cmd += ["--checkpoint-every", str(every)]
    if pace:
        cmd += ["--step-seconds", str(pace)]
    return tuple(cmd)


# A job that runs far longer than any test: tests that move it end it by cancelling it, so that no
# assertion races its completion. It checkpoints every 100 steps.
LONG = train(1_000_000, every=100, pace=0.002)


def job_spec(
    command: tuple[str, ...],
    gpus: int = 1,
    *,
    priority_class: str = "normal",
    checkpointable: bool = False,
    grace_seconds: float = 30.0,
) -> JobSpec:
    return JobSpec(
        queue="team-a",
        resources=Resources(gpus=gpus),
        command=command,
        priority_class=priority_class,
        checkpointable=checkpointable,
        grace_seconds=grace_seconds,
    )


@asynccontextmanager
async def live(
    tmp_path: Path, nodes: int = 1, settings: Settings = FAST, classes: Iterable[PriorityClassSpec] = ()
) -> AsyncIterator[Live]:
    """A cluster of ``nodes`` simulated H100 nodes with queue ``team-a`` (16 GPUs nominal), and
    a watcher of its log. On the way out: the replay and no-leak checks."""
    async with cluster(None, nodes, "h100-8x", tmp_path / "corral", settings=settings) as c:
        log = await connect(c.url)
        try:
            async with Watcher(log) as watch:
                it = Live(c, log, watch)
                for pc in classes:
                    await it.request(
                        "admin", "priority-class", ApplyPriorityClass(priority_class=pc), pc.name
                    )
                queue = QueueSpec("team-a", quotas={"*": Quota(nominal=16)}, tenants=("team-a",))
                await it.request("admin", "queue", ApplyQueue(queue=queue), "queue:team-a")
                await it.until(lambda s: "team-a" in s.queues and len(s.nodes) == nodes)
                yield it
                await watch.caught_up()
                check_replay(watch)
        finally:
            await log.close()
    pids = [body.pid for _, body in events_of(watch.records, WorkerStarted) if body.pid]
    assert pids and not [p for p in pids if alive(p)], "worker processes outlived the cluster"


def check_replay(watch: Watcher) -> None:
    """The log replayed equals the live state; no start or exit stored twice; none refused."""
    assert fold(watch.records) == watch.state
    assert watch.state.faults == 0
    # A worker is its job, attempt, rank and pid: an elastic job's rank may run twice in one attempt.
    starts = [(e.job_id, e.attempt, e.rank, e.pid) for _, e in events_of(watch.records, WorkerStarted)]
    exits = [(e.job_id, e.attempt, e.rank, e.pid) for _, e in events_of(watch.records, WorkerExited)]
    assert len(starts) == len(set(starts)) and len(exits) == len(set(exits)), "a report was stored twice"
    assert {e[:3] for e in exits} <= {s[:3] for s in starts}, "an exit without its start"
    refused = [r for r in watch.state.rejections if r.subject.startswith("corral.ev.node.")]
    assert not refused, refused


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def phase(s: State, job_id: str) -> str:
    job = s.jobs.get(job_id)
    return job.phase if job is not None else ""


def checkpointed(job_id: str, at_least: int, attempt: int = 0) -> Callable[[State], bool]:
    def ok(s: State) -> bool:
        job = s.jobs.get(job_id)
        return (
            job is not None
            and job.phase == "running"
            and job.checkpoint is not None
            and job.checkpoint.attempt == attempt
            and job.checkpoint.step >= at_least
        )

    return ok


def resumed_step(it: Live, job_id: str, attempt: int = 1) -> int:
    """The step ``attempt`` was handed back: the job's checkpoint as the log had it when that
    attempt's rank 0 started (the one its requeue named, or a later one saved meanwhile)."""
    [requeue] = [e for _, e in it.events(JobRequeued, job_id) if e.attempt == attempt - 1]
    assert requeue.resume_from is not None, "requeued without its checkpoint"
    [started] = [seq for seq, e in it.events(WorkerStarted, job_id) if e.attempt == attempt and e.rank == 0]
    saved = [
        c.step for seq, c in it.events(CheckpointCompleted, job_id) if seq < started and c.attempt < attempt
    ]
    return max(saved)


async def resumes_elsewhere(it: Live, job_id: str, left: str) -> str:
    """Wait until the job runs again on another node and checkpoints there; check that it went
    on from a checkpoint of the attempt before, no older than the one its requeue handed back
    (the first checkpoint of a run resumed at step S is at S + 100), as its log says. Returns
    the node it runs on now.

    Which checkpoint that is depends on timing: a node cut off while its agent lives goes on
    saving checkpoints until it is told to stop, and the new attempt starts from the newest its
    agent had folded when it started the worker; the worker's own log says which."""
    s = await it.until(checkpointed(job_id, 0, attempt=1))
    node = node_of(s, job_id)
    [log] = it.cluster.agents[node].logs(job_id)
    said = re.search(r"rank 0: resumed from step (\d+) ", log.read_text())
    assert said is not None, "the new attempt did not resume from a checkpoint"
    step = int(said.group(1))
    [requeue] = [e for _, e in it.events(JobRequeued, job_id) if e.attempt == 0]
    checkpoints = [c for _, c in it.events(CheckpointCompleted, job_id)]
    handed = next(c.step for c in checkpoints if c.location == requeue.resume_from)
    saved = {c.step for c in checkpoints if c.attempt == 0}
    first = next(c for c in checkpoints if c.attempt == 1)
    assert node != left and step in saved and step >= handed >= 100 and first.step == step + 100
    return node


async def cancel(it: Live, job_id: str) -> None:
    """Cancel the job and wait until its workers are gone."""
    await it.request("team-a", "cancel", CancelJob(job_id=job_id), f"cancel:{job_id}")
    await it.until(lambda s: s.jobs[job_id].phase == "cancelled" and s.jobs[job_id].held is None)


def node_of(s: State, job_id: str) -> str:
    placement = s.jobs[job_id].placement
    assert placement is not None
    return placement.workers[0].node


async def test_a_training_job_runs_to_success_and_its_log_is_kept(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        await it.submit("fit", job_spec(train(300), gpus=2))
        s = await it.until(lambda s: phase(s, "fit") in FINAL)
        job = s.jobs["fit"]
        assert (job.phase, job.attempt, job.exit_codes) == ("succeeded", 0, {0: 0}), job.reasons
        [path] = it.cluster.agents["node-00"].logs("fit")
        text = path.read_text()
        assert "rank 0: starting from step 0" in text and "rank 0: done at step 300" in text
        assert it.cluster.health is not None and it.cluster.health.heartbeats > 0
        assert not it.events(NodeConditionChanged)  # a healthy node stays ready, silently


async def test_a_worker_killed_with_sigkill_is_restarted_and_resumes(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        await it.submit("kill", job_spec(train(1000, every=100, pace=0.002)))
        await it.until(checkpointed("kill", 100))
        it.cluster.agents["node-00"].kill_worker("kill", 0)
        s = await it.until(lambda s: phase(s, "kill") in FINAL)
        job = s.jobs["kill"]
        assert (job.phase, job.attempt, job.restarts) == ("succeeded", 1, 1), job.reasons
        exits = [(e.attempt, e.code, e.stopped) for _, e in it.events(WorkerExited, "kill")]
        assert exits == [(0, 128 + 9, False), (1, 0, False)]
        step = resumed_step(it, "kill")
        first, second = it.cluster.agents["node-00"].logs("kill")
        assert f"rank 0: resumed from step {step} " in second.read_text()
        assert "rank 0: done at step 1000" in second.read_text()
        assert step >= 100 and "done at step" not in first.read_text()


async def test_a_job_that_keeps_failing_is_restarted_up_to_its_limit_then_fails(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        crash = (sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)")
        await it.submit("bad", msgspec.structs.replace(job_spec(crash), max_restarts=2))
        s = await it.until(lambda s: phase(s, "bad") in FINAL)
        job = s.jobs["bad"]
        assert (job.phase, job.attempt, job.restarts) == ("failed", 2, 2)
        assert "rank 0 exited with code 3; no restarts left" in job.reasons[0].message
        exits = [(e.attempt, e.code, e.stopped) for _, e in it.events(WorkerExited, "bad")]
        assert exits == [(0, 3, False), (1, 3, False), (2, 3, False)]
        logs = it.cluster.agents["node-00"].logs("bad")
        assert [p.read_text() for p in logs] == ["boom\n"] * 3


async def test_a_lost_node_s_job_resumes_elsewhere_from_its_checkpoint(tmp_path: Path) -> None:
    async with live(tmp_path, nodes=2, settings=DYING) as it:
        await it.submit("lost", job_spec(LONG, gpus=8))
        s = await it.until(checkpointed("lost", 100))
        gone = node_of(s, "lost")
        await it.cluster.agents[gone].crash()
        s = await it.until(lambda s: s.nodes[gone].condition == "lost")
        conditions = [e.condition for _, e in it.events(NodeConditionChanged) if e.node == gone]
        # Suspect first, unless the monitor's cycle came late past both limits (a loaded
        # machine): then it says lost at once, as for a node silent from the start.
        assert conditions in (["suspect", "lost"], ["lost"])
        other = await resumes_elsewhere(it, "lost", gone)
        await cancel(it, "lost")
        exits = [(e.node, e.attempt, e.stopped) for _, e in it.events(WorkerExited, "lost")]
        assert exits == [(other, 1, True)]  # the dead node said nothing; the fold let its worker go
        assert it.state.jobs["lost"].restarts == 0  # a lost node is not the job's failure


async def test_a_node_cut_off_is_lost_its_agent_stops_the_worker_and_trust_returns(tmp_path: Path) -> None:
    async with live(tmp_path, nodes=2, settings=DYING) as it:
        await it.submit("cut", job_spec(LONG, gpus=8))
        s = await it.until(checkpointed("cut", 100))
        cut = node_of(s, "cut")
        agent = it.cluster.agents[cut]
        agent.pause_heartbeats()  # the agent lives on, and still reads the log
        await it.until(lambda s: s.nodes[cut].condition == "lost")
        other = await resumes_elsewhere(it, "cut", cut)
        # Its job moved on: the agent stops the worker it still ran there, and says so; that
        # straggler's exit must not free the GPUs the job's new attempt runs on.
        await it.until(lambda s: any(e.attempt == 0 for _, e in it.events(WorkerExited, "cut")))
        job = it.state.jobs["cut"]
        assert job.held is not None and job.held.attempt == 1 and job.live == {0}
        assert all(g.used_milli == 1000 for g in it.state.nodes[other].gpus)
        agent.resume_heartbeats()
        await it.until(lambda s: s.nodes[cut].condition == "ready")  # after its probation
        conditions = [e.condition for _, e in it.events(NodeConditionChanged) if e.node == cut]
        assert conditions == ["suspect", "lost", "ready"]
        await cancel(it, "cut")
        exits = [(e.node, e.attempt, e.stopped) for _, e in it.events(WorkerExited, "cut")]
        assert exits == [(cut, 0, True), (other, 1, True)]


async def test_a_gpu_fallen_off_the_bus_drains_its_node_and_the_job_moves(tmp_path: Path) -> None:
    async with live(tmp_path, nodes=2) as it:
        await it.submit("xid", job_spec(LONG))
        s = await it.until(checkpointed("xid", 100))
        bad = node_of(s, "xid")
        placement = s.jobs["xid"].placement
        assert placement is not None
        gpu = placement.workers[0].gpus[0].gpu
        it.cluster.agents[bad].inject_xid(gpu, 13)  # the application's fault: the GPU is fine
        it.cluster.agents[bad].inject_xid(gpu, 79)  # fallen off the bus: the node needs a reboot
        await resumes_elsewhere(it, "xid", bad)
        s = it.state
        health = [(e.node, e.gpu, e.healthy, e.signal) for _, e in it.events(GpuHealthChanged)]
        assert health == [(bad, gpu, False, "xid:79")]
        assert [(e.node, e.cordoned, e.drain) for _, e in it.events(NodeCordoned)] == [(bad, True, True)]
        assert s.nodes[bad].cordoned and not s.nodes[bad].gpus[gpu].healthy
        assert s.jobs["xid"].restarts == 0
        await cancel(it, "xid")


async def test_a_node_that_cannot_start_workers_is_quarantined_and_its_jobs_run_elsewhere(
    tmp_path: Path,
) -> None:
    # node-00's agent cannot make its workers' directories (where they go is a file: a broken
    # disk). Every job placed there failed at once, charged to the job, and the node, free again,
    # took the next. Now its jobs are requeued uncharged, and from its third start so in a row
    # the health monitor cordons it; every job runs on node-01.
    bad = "node-00"
    work = tmp_path / "corral" / "nodes" / bad / "work"
    async with live(tmp_path, nodes=2) as it:
        work.parent.mkdir(parents=True, exist_ok=True)
        work.write_text("not a directory")
        jobs = [f"j{i}" for i in range(4)]
        for jid in jobs:
            await it.submit(jid, job_spec(train(20), gpus=8))
        s = await it.until(lambda s: s.nodes[bad].cordoned and all(phase(s, j) == "succeeded" for j in jobs))
        [(_, cordon)] = it.events(NodeCordoned)
        assert (cordon.node, cordon.cordoned, cordon.drain) == (bad, True, False)
        assert cordon.reason.startswith(
            "quarantined: the starts of 3 jobs in a row failed for the node's own fault"
        )
        faults = [e for _, e in it.events(WorkerExited) if e.node_fault]
        assert len(faults) == 3 and {e.node for e in faults} == {bad}
        assert all("cannot prepare directories" in e.node_fault for e in faults)
        assert [s.jobs[j].restarts for j in jobs] == [0] * len(jobs)  # none charged
        assert {node_of(s, j) for j in jobs} == {"node-01"}
