"""A burst of node losses under a steady load: of twenty nodes, two (10 %) die within a minute,
one after the other, each as a machine that loses power (its agent killed with -9, and the
workers it ran with it). Each dead node runs a checkpointing training job when it dies. The health
role, started with a short timing (heartbeats every second, lost after eight seconds of silence),
finds each lost; every job that held GPUs there is requeued, the training job from the checkpoint
the log had for it when the node was found lost, and it resumes from that step on another node.

No storm of preemptions follows, and the bound is derived from the scenario: before the losses
the cluster holds the two training jobs (a node each) and the load's one-GPU jobs of two seconds,
one submitted every half second (a few at a time, never more nodes' worth than are free); after
them eighteen nodes are left, so whole free nodes remain for both requeued training jobs and
every load job fits without stopping anyone. Nothing justifies a preemption: the bound checked
over the log is none from the first loss on. Then the checks of ``harness.Corral.check``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import msgspec
import pytest

from corral.events.decisions import PreemptionRequested, ShrinkRequested
from corral.events.jobs import JobRequeued
from corral.events.nodes import NodeConditionChanged, WorkerStarted
from corral.projections import indexes
from corral.projections.fold import fold
from corral.projections.state import State
from tests.chaos.harness import LEASED, WAIT, Corral, corral, job
from tests.chaos.test_agents import TRAIN, checkpointed, events
from tests.integration import polling

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

NODES = 20
LOST = 2  # 10 % of the nodes
SPREAD = 12.0  # seconds from one loss to the next: within a minute, not at once
HEARTBEAT = 1.0  # seconds between an agent's heartbeats
LOST_AFTER = 8.0  # seconds of silence: past a loaded machine's stalls, well under the test's bound


def lose(c: Corral, node: str) -> None:
    """The node dies: its agent, and every worker it started, at once."""
    c.kill(c.parts[f"agent-{node}"])
    for _, started in events(list(c.watch.records), WorkerStarted):
        if started.node == node and started.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(started.pid, signal.SIGKILL)


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
        trainers = [f"train-{i}" for i in range(LOST)]
        for t in trainers:
            await c.submit(t, trainer)
        state = await c.until(lambda s: all(checkpointed(t, 500)(s) for t in trainers))
        dead = {}
        for t in trainers:
            placement = state.jobs[t].placement
            assert placement is not None
            dead[t] = placement.workers[0].node
        assert len(set(dead.values())) == LOST  # a node each: 8 GPUs of 8

        # The losses, spread: the second node dies SPREAD seconds after the first.
        first = await c.log.last_seq()
        for i, t in enumerate(trainers):
            if i:
                await asyncio.sleep(SPREAD)  # the moment of a fault, not a wait for an outcome
            c.check_alive()
            lose(c, dead[t])

        def lost() -> dict[str, int]:
            found = events(c.watch.records, NodeConditionChanged)
            return {e.node: q for q, e in found if q > first and e.condition == "lost"}

        await c.until(lambda _: set(dead.values()) <= lost().keys())

        def resumed(s: State) -> bool:
            return all(s.jobs[t].attempt == 1 and s.jobs[t].phase == "running" for t in trainers)

        state = await c.until(resumed)
        last = max(int(j.split("-")[1]) for j in c.acked if j.startswith("load-"))
        await c.until(
            lambda s: f"load-{last:04d}" in s.jobs and s.jobs[f"load-{last:04d}"].phase != "pending"
        )
        records = list(c.watch.records)
        # Only the dead nodes were lost: the others' heartbeats went on.
        assert lost().keys() == set(dead.values()), lost()

        for t, node in dead.items():
            lost_at = lost()[node]
            requeued = {e.job_id: e for q, e in events(records, JobRequeued) if q > lost_at}
            # Every job that held GPUs on the node when it was found lost went back to its queue.
            before = fold([r for r in records if r.seq < lost_at])
            held = [jb.id for jb in indexes.holding_on(before, node)]
            assert t in held
            assert set(held) <= requeued.keys(), f"not requeued: {sorted(set(held) - requeued.keys())}"
            # The training job resumed from the checkpoint the log had for it, on another node.
            checkpoint = before.jobs[t].checkpoint
            assert checkpoint is not None and checkpoint.step >= 500
            assert requeued[t].resume_from == checkpoint.location
            moved = state.jobs[t].placement
            assert moved is not None and moved.workers[0].node not in dead.values()
            run = f"run-{state.jobs[t].submitted_seq}"  # its files are its run's (``worker.log_path``)
            log = tmp_path / "nodes" / moved.workers[0].node / "logs" / t / run / "attempt-1.rank-0.log"
            await polling.until(
                lambda log=log, step=checkpoint.step: (
                    log.exists()  # type: ignore[misc]
                    and f"resumed from step {step} " in log.read_text()
                ),
                WAIT,
            )

        # No storm of preemptions: the scenario justifies none (see the module's note).
        stops = [(q, e) for q, e in events(records, PreemptionRequested | ShrinkRequested) if q > first]
        assert not stops, f"{len(stops)} stops after the losses: {stops}"
        await c.check()
