"""A node agent restarting keeps its node's work alive: a live corral (real nats-server, every
service, real worker processes), one node's agent stopped on purpose (``NodeAgent.leave``) and a
new one started on the same work directory.

- a job runs on through the restart, with no exit, interruption or restart in its log, and
  succeeds at attempt 0;
- a worker that ends while no agent watches has its exit reported once, by the agent that
  comes back;
- a worker taken back has its run in its job's trace: a span under its attempt, from the taking
  back to its exit, marked re-attached;
- an agent that stays away past the lost-node timeout still makes its node lost: the job moves
  on, uncharged, and the worker the returning agent takes back is stopped as superseded;
- a whole corral stopped (its agents stop their workers) and started again on the same data
  directory: the job is charged no restart and resumes from its last checkpoint, on its node,
  before the job holding the reservation on that node's GPUs is placed there.

The harness (``live``) replays the log and checks that no report was stored twice or refused,
and that no worker process outlives the corral. Nothing sleeps: every wait has a timeout.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.events.decisions import JobsPlaced
from corral.events.jobs import JobRequeued
from corral.events.nodes import NodeConditionChanged, NodeShutdown, WorkerExited, WorkerStarted
from corral.projections.lifecycle import FINAL
from corral.services.agent.decide import WorkerKey
from corral.services.agent.handover import keeper_dir
from corral.services.agent.keeper import start_time
from corral.services.runtime import tracing
from tests.integration import polling
from tests.integration.test_cluster_failures import (
    DYING,
    LONG,
    WAIT,
    Live,
    cancel,
    checkpointed,
    job_spec,
    live,
    phase,
    resumed_step,
)
from tests.otlp import Receiver

# Prints a step at a time until the file named by its arguments appears, then exits 0: the test
# says when it ends, so that it ends neither before the restart nor during it by chance. (The
# directory is an argument of its own: a sandbox binds the host's /tmp paths a command names.)
STEPS = (
    "import os, sys, time\n"
    "step = 0\n"
    "while not os.path.exists(os.path.join(sys.argv[1], sys.argv[2])):\n"
    "    step += 1\n"
    "    print('step', step, flush=True)\n"
    "    time.sleep(0.02)\n"
    "print('done at step', step, flush=True)\n"
)


def stepping(finish: Path) -> tuple[str, ...]:
    return (sys.executable, "-c", STEPS, str(finish.parent), finish.name)


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    await polling.until(predicate, timeout)


async def running(it: Live, job_id: str) -> tuple[str, int]:
    """Wait until the job runs and its worker has taken a step; (its node, its rank 0's pid)."""
    s = await it.until(lambda s: phase(s, job_id) == "running")
    placement = s.jobs[job_id].placement
    assert placement is not None
    [(_, started)] = it.events(WorkerStarted, job_id)
    node = placement.workers[0].node
    agent = it.cluster.agents[node]
    await until(lambda: any("step 1\n" in p.read_text() for p in agent.logs(job_id)))
    return node, started.pid


def alive(pid: int) -> bool:
    return start_time(pid) is not None


async def test_a_job_runs_on_through_its_agent_restarting(tmp_path: Path) -> None:
    finish = tmp_path / "finish"
    async with live(tmp_path) as it:
        await it.submit("kept", job_spec(stepping(finish)))
        node, pid = await running(it, "kept")
        assert it.cluster.restart_agent is not None
        agent = await it.cluster.restart_agent(node, None)
        # The new agent took the worker back: the same process, running.
        assert agent.runtime.workers() == {WorkerKey("kept", 0, 0): "running"}
        assert agent.runtime.pid(WorkerKey("kept", 0, 0)) == pid and alive(pid)
        finish.touch()
        s = await it.until(lambda s: phase(s, "kept") in FINAL)
        job = s.jobs["kept"]
        assert (job.phase, job.attempt, job.restarts) == ("succeeded", 0, 0), job.reasons
        exits = [(e.attempt, e.code, e.stopped, e.pid) for _, e in it.events(WorkerExited, "kept")]
        assert exits == [(0, 0, False, pid)]
        assert len(it.events(WorkerStarted, "kept")) == 1 and not it.events(JobRequeued, "kept")
        text = agent.logs("kept")[0].read_text()
        assert "step 1\n" in text and "done at step" in text


async def test_a_worker_taken_back_has_its_run_in_its_job_s_trace(
    tmp_path: Path, collector: Receiver
) -> None:
    finish = tmp_path / "finish"
    async with live(tmp_path) as it:
        await it.submit("kept", job_spec(stepping(finish)))
        node, pid = await running(it, "kept")
        assert it.cluster.restart_agent is not None
        await it.cluster.restart_agent(node, None)
        finish.touch()
        await it.until(lambda s: phase(s, "kept") in FINAL)

        def worker_span() -> bool:
            return any(s.name == "worker rank 0" for s in collector.snapshot())

        await until(worker_span)
    tracing.shutdown()
    spans = collector.snapshot()
    [worker] = [s for s in spans if s.name == "worker rank 0"]
    [attempt] = [s for s in spans if s.name == "attempt 0" and s.attributes["corral.job.id"] == "kept"]
    assert (worker.trace_id, worker.parent) == (attempt.trace_id, attempt.span_id)
    assert worker.attributes["corral.reattached"] is True and worker.attributes["process.pid"] == pid
    assert [name for name, _ in worker.events] == ["re-attached", "exited"]
    assert worker.duration > 0 and not worker.error


async def test_a_worker_that_ends_while_its_agent_is_away_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.agent")
    finish = tmp_path / "finish"
    async with live(tmp_path) as it:
        await it.submit("away", job_spec(stepping(finish)))
        node, pid = await running(it, "away")
        exit_file = keeper_dir(tmp_path / "corral" / "nodes" / node, WorkerKey("away", 0, 0)) / "exit"

        async def ends_meanwhile() -> None:
            finish.touch()
            await until(exit_file.exists)  # its keeper saw it end; no agent did
            assert not it.events(WorkerExited, "away")

        assert it.cluster.restart_agent is not None
        await it.cluster.restart_agent(node, ends_meanwhile)
        s = await it.until(lambda s: phase(s, "away") in FINAL)
        job = s.jobs["away"]
        assert (job.phase, job.attempt, job.restarts) == ("succeeded", 0, 0), job.reasons
        await it.watch.caught_up()
        exits = [(e.attempt, e.code, e.stopped, e.pid) for _, e in it.events(WorkerExited, "away")]
        assert exits == [(0, 0, False, pid)]
    # The agent that came back says the worker had ended, not that it runs.
    said = [r.getMessage() for r in caplog.records if r.name == "corral.agent" and "away" in r.getMessage()]
    assert any("had ended" in m for m in said) and not any("left running" in m for m in said), said


async def test_an_agent_away_past_the_lost_node_timeout_loses_its_node(tmp_path: Path) -> None:
    finish = tmp_path / "finish"
    async with live(tmp_path, nodes=2, settings=DYING) as it:
        await it.submit("moved", job_spec(stepping(finish), gpus=8))
        gone, pid = await running(it, "moved")

        async def lost_and_moved() -> None:
            await it.until(lambda s: s.nodes[gone].condition == "lost")
            s = await it.until(lambda s: s.jobs["moved"].attempt == 1 and phase(s, "moved") == "running")
            placement = s.jobs["moved"].placement
            assert placement is not None and placement.workers[0].node != gone
            assert alive(pid)  # no agent there to stop it

        assert it.cluster.restart_agent is not None
        await it.cluster.restart_agent(gone, lost_and_moved)
        # Back, the agent takes its worker back, sees the job moved on, and stops it.
        await it.until(lambda s: any(e.attempt == 0 for _, e in it.events(WorkerExited, "moved")))
        conditions = [e.condition for _, e in it.events(NodeConditionChanged) if e.node == gone]
        assert "lost" in conditions
        assert it.state.jobs["moved"].restarts == 0  # a lost node is not the job's failure
        await cancel(it, "moved")
        exits = [(e.node, e.attempt, e.stopped, e.pid) for _, e in it.events(WorkerExited, "moved")]
        assert exits[0] == (gone, 0, True, pid)


async def test_a_corral_stopped_and_started_again_charges_its_job_nothing_and_it_resumes(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as it:
        await it.submit("long", job_spec(LONG, checkpointable=True))
        await it.until(checkpointed("long", 100))
    # Stopped as ``corral up`` stops: the services, then the agent, which stopped the worker
    # (``live`` checked it is gone). Started again on the same data directory:
    async with live(tmp_path) as it:
        s = await it.until(checkpointed("long", 0, attempt=1))
        job = s.jobs["long"]
        assert (job.attempt, job.restarts) == (1, 0), job.reasons
        [(shut, _)] = it.events(NodeShutdown)
        exits = [(seq, e) for seq, e in it.events(WorkerExited, "long") if e.attempt == 0]
        assert exits and all(seq > shut and e.stopped for seq, e in exits), (shut, exits)
        step = resumed_step(it, "long")
        first, second = it.cluster.agents["node-00"].logs("long")
        assert step >= 100 and f"rank 0: resumed from step {step} " in second.read_text()
        await cancel(it, "long")


async def test_a_corral_stopped_and_started_again_gives_its_running_job_its_place_back(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as it:
        await it.submit("long", job_spec(LONG, gpus=8, checkpointable=True))
        await it.until(checkpointed("long", 100))
        # Admitted behind it (the queue holds 16 GPUs), with the reservation on its node's GPUs.
        await it.submit("next", job_spec(LONG, gpus=8))
        await it.until(lambda s: phase(s, "next") == "admitted" and bool(s.jobs["next"].reasons))
    async with live(tmp_path) as it:
        back = checkpointed("long", 0, attempt=1)
        s = await it.until(lambda s: back(s) or phase(s, "next") != "admitted")
        assert phase(s, "next") == "admitted", (phase(s, "next"), s.jobs["long"].reasons)
        # Placed first as the node came back: the job of the reservation never had its GPUs.
        placed = [p.job_id for _, ev in it.events(JobsPlaced) for p in ev.placements]
        assert placed == ["long", "long"], placed
        await cancel(it, "long")
        await cancel(it, "next")
