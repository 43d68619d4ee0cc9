"""A burst of node losses under a steady load: of ten nodes, one (10 %) dies at once, its agent
killed with -9 and the workers it ran with it, as a machine that loses power. The health role,
started with a short timing (heartbeats every second, lost after ten seconds of silence), finds
it lost; every job that held GPUs there is requeued, the checkpointing one from the checkpoint
the log had for it, and it resumes from that step on another node. No storm of preemptions
follows: after the loss, the only preemption the requeued jobs justify is one for the
checkpointing batch job (the load jobs rank below it and equal to each other), which may need a
whole node back from the load; so the bound checked is at most one preemption, for that job, of
lower-priority victims. Then the checks of ``harness.Corral.check``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import msgspec
import pytest

from corral.events.decisions import PreemptionRequested
from corral.events.jobs import JobRequeued
from corral.events.nodes import NodeConditionChanged, WorkerStarted
from corral.projections import indexes
from corral.projections.fold import fold
from corral.projections.state import State
from tests.chaos.harness import LEASED, WAIT, corral, job
from tests.chaos.test_agents import TRAIN, checkpointed, events
from tests.integration import polling

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

NODES = 10
HEARTBEAT = 1.0  # seconds between an agent's heartbeats
LOST_AFTER = 10.0  # seconds of silence: well past a loaded machine's stalls, well under the test's bound


async def test_a_burst_of_node_losses_requeues_their_jobs_from_checkpoints_without_a_preemption_storm(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(
        nats_server, tmp_path, dict.fromkeys(LEASED, 1), NODES, heartbeat=HEARTBEAT, lost_after=LOST_AFTER
    ) as c:
        c.start_load()
        trainer = msgspec.structs.replace(
            job(TRAIN, gpus=8, priority_class="batch"), checkpointable=True, grace_seconds=20.0
        )
        await c.submit("train", trainer)
        state = await c.until(checkpointed("train", 500))
        placement = state.jobs["train"].placement
        assert placement is not None
        dead = placement.workers[0].node
        await c.until(lambda s: "load-0010" in s.jobs)  # the load goes on around it

        # The node dies: its agent, and every worker it started, at once.
        killed_at = await c.log.last_seq()
        c.kill(c.parts[f"agent-{dead}"])
        for _, started in events(list(c.watch.records), WorkerStarted):
            if started.node == dead and started.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(started.pid, signal.SIGKILL)

        def lost() -> list[tuple[int, NodeConditionChanged]]:
            found = events(c.watch.records, NodeConditionChanged)
            return [(q, e) for q, e in found if q > killed_at and e.condition == "lost"]

        await c.until(lambda _: bool(lost()))
        [(lost_at, _)] = lost()

        def resumed(s: State) -> bool:
            jb = s.jobs["train"]
            return jb.attempt == 1 and jb.phase == "running"

        state = await c.until(resumed)
        last = max(int(j.split("-")[1]) for j in c.acked if j.startswith("load-"))
        await c.until(
            lambda s: f"load-{last:04d}" in s.jobs and s.jobs[f"load-{last:04d}"].phase != "pending"
        )
        records = list(c.watch.records)
        requeued = {e.job_id: e for q, e in events(records, JobRequeued) if q > lost_at}

        # Every job that held GPUs on the node when it was found lost went back to its queue.
        before = fold([r for r in records if r.seq < lost_at])
        held = [jb.id for jb in indexes.holding_on(before, dead)]
        assert "train" in held
        assert set(held) <= requeued.keys(), f"not requeued: {sorted(set(held) - requeued.keys())}"
        # Only the dead node was lost: the others' heartbeats went on.
        assert [e.node for _, e in lost()] == [dead]

        # The checkpointing job resumed from the checkpoint the log had for it, on another node.
        checkpoint = before.jobs["train"].checkpoint
        assert checkpoint is not None and checkpoint.step >= 500
        assert requeued["train"].resume_from == checkpoint.location
        moved = state.jobs["train"].placement
        assert moved is not None and moved.workers[0].node != dead
        log = tmp_path / "nodes" / moved.workers[0].node / "logs" / "train" / "attempt-1.rank-0.log"
        await polling.until(
            lambda: log.exists() and f"resumed from step {checkpoint.step} " in log.read_text(), WAIT
        )

        # No storm of preemptions: at most one after the loss, for the requeued batch job, of
        # jobs ranking below it.
        after = [(q, e) for q, e in events(records, PreemptionRequested) if q > killed_at]
        assert len(after) <= 1, f"{len(after)} preemptions after one node's loss: {after}"
        for _, asked in after:
            assert asked.beneficiary == "train", asked
            for v in asked.victims:
                assert state.jobs[v.job_id].priority < state.jobs["train"].priority, asked
        await c.check()
