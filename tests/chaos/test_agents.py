"""A node agent killed with -9 under a steady load, and started again on the same work directory,
as a supervisor restarts it; each test then makes the checks of ``harness.Corral.check``.

- Mid-gang-start: the agent of one of the gang's two nodes is frozen (SIGSTOP) before the gang is
  placed, so that the other node's rank starts and its own cannot; it is then killed. The gang
  never runs in part: every attempt either has all its ranks started, or every rank it started
  has exited; and its last attempt runs whole.
- Mid-checkpoint: an urgent job preempts a checkpointing training job (``examples/train.py``),
  and the victim's agent is killed as soon as the preemption is in the log, while it asks its
  worker to checkpoint. The checkpoint either completes or the job resumes from the one before:
  its next attempt is handed a checkpoint the log recorded as complete, whose file is whole and
  holds that step, and the worker resumes from that very step. Among the end checks, over the
  log: no preemption the fold accepted was for a beneficiary already placed in its attempt
  (``check_no_stop_for_a_placed_job``): work is never stopped for the urgent job once it has
  its GPUs, whatever the preemptor proposed from an older state.
"""

from __future__ import annotations

import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import TypeVar

import msgspec
import numpy as np
import pytest

from corral.events import codec
from corral.events.decisions import PreemptionRequested
from corral.events.jobs import JobRequeued
from corral.events.log import Record
from corral.events.nodes import CheckpointCompleted, WorkerExited, WorkerStarted
from corral.projections import indexes
from corral.projections.state import State
from tests.chaos.harness import LEASED, ROOT, WAIT, corral, job
from tests.integration import polling

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]


def ranks(records: list[Record], job_id: str, kind: type) -> dict[int, set[int]]:
    """Per attempt, the ranks of ``job_id`` with a ``kind`` report."""
    out: dict[int, set[int]] = defaultdict(set)
    for r in records:
        if r.subject.startswith("corral.ev.node."):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, kind) and body.job_id == job_id:
                out[body.attempt].add(body.rank)
    return out


async def test_an_agent_killed_mid_gang_start_leaves_no_gang_running_in_part(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(nats_server, tmp_path, dict.fromkeys(LEASED, 1)) as c:
        c.start_load()
        await c.until(lambda s: "load-0002" in s.jobs and s.jobs["load-0002"].phase == "running")
        # The gang needs both nodes whole, and a frozen agent reports no exit: a load job left on
        # node-1 would hold its GPUs until the node is lost. So the load pauses until node-1 is
        # empty and the gang is half started (before node-1's silence makes it suspect), and goes
        # on through the agent's death and restart.
        await c.stop_load()
        await c.until(lambda s: not indexes.holding_on(s, "node-1"))
        frozen = c.parts["agent-node-1"]
        c.kill(frozen, signal.SIGSTOP)
        await c.submit("gang", job(("sleep", "20"), gpus=8, replicas=2, priority_class="batch"))

        def half_started(s: object) -> bool:
            return bool(ranks(c.watch.records, "gang", WorkerStarted).get(0))

        await c.until(lambda s: half_started(s))  # the other node's rank runs, this one's cannot
        c.start_load()
        c.kill(frozen)
        c.agent("node-1")  # its supervisor starts it again, on the same work directory

        def whole(_: object) -> bool:
            job_ = c.watch.state.jobs.get("gang")
            started = ranks(c.watch.records, "gang", WorkerStarted)
            return job_ is not None and job_.phase == "running" and started.get(job_.attempt) == {0, 1}

        state = await c.until(whole)
        attempt = state.jobs["gang"].attempt
        records = list(c.watch.records)
        await c.check()

    started, exited = ranks(records, "gang", WorkerStarted), ranks(records, "gang", WorkerExited)
    for a, got in started.items():
        if a != attempt:
            assert got <= exited.get(a, set()), (
                f"attempt {a}: ranks {got - exited.get(a, set())} left running"
            )
    assert started[attempt] == {0, 1}


E = TypeVar("E")


def events(records: list[Record], kind: type[E]) -> list[tuple[int, E]]:
    """Every ``kind`` event of the log, with its seq."""
    out: list[tuple[int, E]] = []
    for r in records:
        if r.subject.startswith("corral.ev."):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, kind):
                out.append((r.seq, body))
    return out


# Trains for far longer than the test, a step every 2 ms, a checkpoint every 500 steps (a second).
TRAIN = (sys.executable, str(ROOT / "examples" / "train.py"), "--steps", "1000000", "--log-every", "500",
         "--checkpoint-every", "500", "--step-seconds", "0.002")  # fmt: skip


def checkpointed(job_id: str, at_least: int):  # type: ignore[no-untyped-def]
    def ok(s: State) -> bool:
        jb = s.jobs.get(job_id)
        return jb is not None and jb.checkpoint is not None and jb.checkpoint.step >= at_least

    return ok


async def test_an_agent_killed_mid_checkpoint_leaves_its_job_a_whole_checkpoint_to_resume_from(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(nats_server, tmp_path, dict.fromkeys(LEASED, 1)) as c:
        c.start_load()
        await c.until(lambda s: "load-0002" in s.jobs and s.jobs["load-0002"].phase == "running")
        # Both nodes are taken by a checkpointing batch job, so the urgent job must stop one: the
        # load pauses until they run, then goes on (pending behind them).
        await c.stop_load()
        low = msgspec.structs.replace(
            job(TRAIN, gpus=8, priority_class="batch"), checkpointable=True, grace_seconds=20.0
        )
        for i in range(2):
            await c.submit(f"low-{i}", low)
        await c.until(lambda s: all(checkpointed(f"low-{i}", 500)(s) for i in range(2)))
        c.start_load()
        await c.submit("urgent", job(("sleep", "2"), gpus=8, priority_class="urgent"))

        def for_urgent() -> list[tuple[int, PreemptionRequested]]:
            # (The batch jobs may have stopped load jobs to start: those preemptions are not this.)
            found = events(c.watch.records, PreemptionRequested)
            return [(q, e) for q, e in found if e.beneficiary == "urgent"]

        state = await c.until(lambda _: bool(for_urgent()))
        _, request = for_urgent()[0]
        [victim] = request.victims
        placement = state.jobs[victim.job_id].placement
        assert placement is not None
        node = placement.workers[0].node
        before = state.jobs[victim.job_id].checkpoint  # the one it resumes from if it saves none
        assert before is not None
        c.kill(c.parts[f"agent-{node}"])  # as its agent asks the worker to checkpoint
        c.agent(node)

        def resumed(s: State) -> bool:
            jb = s.jobs.get(victim.job_id)
            return jb is not None and jb.attempt == 1 and jb.phase == "running"

        await c.until(lambda s: resumed(s) and s.jobs["urgent"].phase in ("running", "succeeded"))
        records = list(c.watch.records)
        [(_, requeue)] = [(q, e) for q, e in events(records, JobRequeued) if e.job_id == victim.job_id]
        saved = {
            e.location: e.step for _, e in events(records, CheckpointCompleted) if e.job_id == victim.job_id
        }
        resume = requeue.resume_from
        # A checkpoint the worker reported whole, this one or a later one (the checkpoint asked
        # for completed), never a file it was still writing.
        assert resume in saved, f"resumed from {resume}, not a completed checkpoint"
        step = saved[resume]
        assert step >= before.step
        with np.load(resume) as ckpt:
            assert int(ckpt["step"]) == step
        run = f"run-{state.jobs[victim.job_id].submitted_seq}"  # its files are its run's
        logs = [
            tmp_path / "nodes" / n / "logs" / victim.job_id / run / "attempt-1.rank-0.log"
            for n in ("node-0", "node-1")
        ]

        def said_resumed() -> bool:
            return any(f"resumed from step {step} " in p.read_text() for p in logs if p.exists())

        await polling.until(said_resumed, WAIT)
        await c.check()
