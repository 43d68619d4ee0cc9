"""Preemption on a live cluster: an urgent 8-GPU job arrives on a full node; a low-priority
checkpointable job running ``examples/train.py`` checkpoints when asked, stops, the urgent job
runs on the GPUs it gave back, and the preempted job later resumes from the step it saved. On
two nodes, only the job on the node the urgent job needs is stopped, in that cycle and after it.
And a consolidation: a job waiting on GPUs scattered over two nodes gets its room by moving a
checkpointing job to the other node, where it resumes from its step.

Real nats-server, every service, a node agent running real processes; the order of what happened
is read from the log (sequence numbers), never from the clock, and the replay of the log must
equal the live state (checked on the way out of ``live``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from corral.events.decisions import PreemptionRequested, Victim
from corral.events.jobs import JobRequeued
from corral.events.nodes import CheckpointCompleted, WorkerExited, WorkerStarted
from corral.events.queues import ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from tests.integration.test_cluster_failures import (
    LONG,
    cancel,
    checkpointed,
    job_spec,
    live,
    node_of,
    phase,
    train,
)

CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))


async def test_an_urgent_job_preempts_a_checkpointing_one_which_resumes_from_its_step(
    tmp_path: Path,
) -> None:
    async with live(tmp_path, nodes=1, classes=CLASSES) as it:
        low = job_spec(
            train(1000, every=100, pace=0.002),
            gpus=8,
            priority_class="batch",
            checkpointable=True,
            grace_seconds=20.0,
        )
        await it.submit("low", low)
        await it.until(checkpointed("low", 100))  # it has made progress worth keeping
        await it.submit("urgent", job_spec(train(100), gpus=8, priority_class="urgent"))

        s = await it.until(lambda s: phase(s, "low") == "succeeded" and phase(s, "urgent") == "succeeded")
        [(asked, request)] = it.events(PreemptionRequested)
        assert (request.beneficiary, request.victims) == ("urgent", (Victim("low", 0),))

        # Asked to checkpoint, it saved its step and stopped (exit 0, stopped by corral) ...
        low_exits = {e.attempt: (seq, e) for seq, e in it.events(WorkerExited, "low")}
        stopped_at, stop = low_exits[0]
        saved = [c for seq, c in it.events(CheckpointCompleted, "low") if asked < seq < stopped_at]
        assert saved and all(c.attempt == 0 for c in saved)
        checkpoint = saved[-1]
        assert (stop.code, stop.stopped) == (0, True)
        [(requeued_at, requeue)] = it.events(JobRequeued, "low")
        assert requeue.resume_from == checkpoint.location and requeued_at > stopped_at

        # ... the urgent job ran on the GPUs it gave back, and only then did it run again.
        [(urgent_started, _)] = it.events(WorkerStarted, "urgent")
        [(urgent_exited, _)] = it.events(WorkerExited, "urgent")
        low_starts = {e.attempt: seq for seq, e in it.events(WorkerStarted, "low")}
        assert stopped_at < urgent_started < urgent_exited < low_starts[1]

        # The resumed run starts at the saved step and finishes the job.
        job = s.jobs["low"]
        assert (job.attempt, job.preemptions, job.restarts) == (1, 1, 0)
        first, second = it.cluster.agents["node-00"].logs("low")
        assert f"rank 0: checkpoint at step {checkpoint.step} " in first.read_text()
        resumed = second.read_text()
        assert f"rank 0: resumed from step {checkpoint.step} " in resumed
        assert "rank 0: done at step 1000" in resumed
        assert checkpoint.step >= 100


async def test_only_the_job_on_the_node_the_urgent_job_needs_is_stopped(tmp_path: Path) -> None:
    # Two nodes: low fills one, b1 (team-b) and a2 (team-a, 1 GPU, priority 0) share the other.
    # Stopping low alone lets urgent in (team-a at 1 + 8 of 16). Once low is requeued and urgent
    # admitted, and before the placer places urgent, low (blocked by team-a's quota) looked as
    # if it would fit on the node freed for urgent if a2 gave its quota back: a2 was stopped.
    sleep = ("sleep", "600")
    async with live(tmp_path, nodes=2, classes=CLASSES) as it:
        team_b = QueueSpec("team-b", quotas={"*": Quota(nominal=8)}, tenants=("team-b",))
        await it.request("admin", "queue", ApplyQueue(queue=team_b), "queue:team-b")
        await it.submit("b1", msgspec.structs.replace(job_spec(sleep, gpus=4), queue="team-b"))
        low = job_spec(LONG, gpus=8, priority_class="batch", checkpointable=True, grace_seconds=20.0)
        await it.submit("low", low)
        await it.until(lambda s: checkpointed("low", 100)(s) and phase(s, "b1") == "running")
        await it.submit("a2", job_spec(sleep, gpus=1))
        await it.until(lambda s: phase(s, "a2") == "running")
        low_node = node_of(it.state, "low")
        await it.submit("urgent", job_spec(sleep, gpus=8, priority_class="urgent"))
        s = await it.until(lambda s: phase(s, "urgent") == "running" and s.jobs["low"].attempt == 1)
        await it.watch.caught_up()
        proposed = [(e.beneficiary, e.victims) for _, e in it.events(PreemptionRequested)]
        assert proposed == [("urgent", (Victim("low", 0),))]
        assert (phase(s, "a2"), s.jobs["a2"].attempt) == ("running", 0)
        assert node_of(s, "urgent") == low_node


async def test_a_job_waiting_on_scattered_gpus_gets_room_by_moving_one_that_checkpoints(
    tmp_path: Path,
) -> None:
    # Two nodes, all team-a's at one priority. a3 (6 GPUs) and a hole-maker (2) fill one node;
    # a1 (4) and mover (2, checkpointing) go on the other; the hole-maker is cancelled: two GPUs
    # free on each node. b (4) waits for room, and no rule lets it stop a job of its own queue's
    # priority. The preemptor moves mover to the other node's free GPUs: it checkpoints, stops,
    # resumes there from its step, and b runs where it was.
    sleep = ("sleep", "600")
    async with live(tmp_path, nodes=2) as it:
        for job_id, gpus in (("a3", 6), ("hole", 2), ("a1", 4)):
            await it.submit(job_id, job_spec(sleep, gpus=gpus))
            await it.until(lambda s, job_id=job_id: phase(s, job_id) == "running")
        await it.submit("mover", job_spec(LONG, gpus=2, checkpointable=True, grace_seconds=20.0))
        await it.until(checkpointed("mover", 100))
        await cancel(it, "hole")
        s = it.state
        first_node = node_of(s, "mover")
        assert node_of(s, "a1") == first_node != node_of(s, "a3") == node_of(s, "hole")
        await it.submit("b", job_spec(sleep, gpus=4))
        s = await it.until(
            lambda s: (
                phase(s, "b") == "running" and s.jobs["mover"].attempt == 1 and phase(s, "mover") == "running"
            )
        )
        await it.watch.caught_up()
        [(_, request)] = it.events(PreemptionRequested)
        assert (request.beneficiary, request.victims) == ("b", (Victim("mover", 0),))
        assert [m.job_id for m in request.moves] == ["b", "mover"]
        assert node_of(s, "b") == first_node and node_of(s, "mover") == node_of(s, "a3")
        [(_, requeue)] = it.events(JobRequeued, "mover")
        assert requeue.resume_from is not None  # it goes on from its checkpoint
        assert [(phase(s, j), s.jobs[j].attempt) for j in ("a1", "a3")] == [("running", 0)] * 2
