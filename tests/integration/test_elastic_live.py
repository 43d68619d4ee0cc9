"""Elastic jobs on a live cluster: an elastic job running on a whole node shrinks to make room for
an urgent job instead of being stopped whole, keeps running on the ranks it kept, and grows back
onto the GPUs the urgent job gives back when it ends.

Real nats-server, every service, a node agent running real processes; what happened is read
from the log in sequence order, and the replay of the log must equal the live state (checked on
the way out of ``live``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from corral.events.decisions import PreemptionRequested, ShrinkRequested
from corral.events.jobs import CancelJob, JobsAdmitted
from corral.events.nodes import WorkerExited, WorkerStarted
from corral.events.queues import PriorityClassSpec
from corral.projections.state import State
from tests.integration.test_cluster_failures import LONG, job_spec, live, phase, train

CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))


def running_at(job_id: str, size: int) -> object:
    def ok(s: State) -> bool:
        job = s.jobs.get(job_id)
        return (
            job is not None
            and job.phase == "running"
            and job.admission is not None
            and job.admission.replicas == size
            and job.placement is not None
            and len(job.placement.workers) == size
            and len(job.live) == size
        )

    return ok


async def test_an_elastic_job_shrinks_for_an_urgent_one_and_grows_back_after(tmp_path: Path) -> None:
    async with live(tmp_path, nodes=1, classes=CLASSES) as it:
        elastic = msgspec.structs.replace(
            job_spec(LONG, gpus=1, priority_class="batch", checkpointable=True, grace_seconds=20.0),
            replicas=8,
            min_replicas=2,
        )
        await it.submit("el", elastic)
        await it.until(running_at("el", 8))  # the whole node, one GPU per rank

        await it.submit("urgent", job_spec(train(200), gpus=4, priority_class="urgent"))
        await it.until(lambda s: phase(s, "urgent") == "succeeded")
        s = await it.until(running_at("el", 8))  # grown back onto the GPUs the urgent job left

        # It shrank, by its top four ranks, and nobody was stopped whole.
        [(asked, shrink)] = it.events(ShrinkRequested)
        assert (shrink.job_id, shrink.replicas, shrink.beneficiary) == ("el", 4, "urgent")
        assert it.events(PreemptionRequested) == []
        left = [(seq, e) for seq, e in it.events(WorkerExited, "el") if seq > asked]
        assert sorted(e.rank for _, e in left) == [4, 5, 6, 7] and all(e.stopped for _, e in left)

        # The urgent job started once they were gone, on their GPUs; el kept ranks 0..3 running.
        [(urgent_started, _)] = it.events(WorkerStarted, "urgent")
        assert max(seq for seq, _ in left) < urgent_started
        el = s.jobs["el"]
        assert (el.attempt, el.preemptions, el.restarts) == (0, 0, 0)

        # Then it grew back: admitted at 8 again, its new ranks 4..7 started in the same attempt.
        [(_, urgent_exit)] = it.events(WorkerExited, "urgent")
        grown = [(seq, g) for seq, e in it.events(JobsAdmitted) for g in e.growths if g.job_id == "el"]
        assert [g.replicas for _, g in grown] == [8]
        rejoined = sorted(e.rank for seq, e in it.events(WorkerStarted, "el") if seq > grown[0][0])
        assert rejoined == [4, 5, 6, 7] and urgent_exit.code == 0

        await it.request("team-a", "cancel", CancelJob(job_id="el"), "cancel:el")
        await it.until(lambda s: phase(s, "el") == "cancelled" and s.jobs["el"].held is None)
