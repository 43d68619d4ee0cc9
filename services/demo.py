"""``corral demo``: the mission on one machine, narrated as it happens.

An embedded NATS, every service, simulated GPU nodes, and a real workload: the first jobs of the
two busiest teams of Microsoft's Philly trace share the cluster. Every record of the log is
printed as one line in an operator's words. At the end the log is exported and replayed, and the
replay must equal the live state exactly.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from events import codec, subjects
from events.jobs import JobSpec, Resources, SubmitJob
from events.log import Append, EventLog
from events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from projections.fold import fold
from projections.state import State
from services import logfile, present, table
from services.traces import philly
from services.up import cluster
from services.watch import Watcher

TEAMS = ("team-a", "team-b")
JOBS_PER_TEAM = 12


def _say(text: str) -> None:
    print(text, flush=True)


def _act(title: str) -> None:
    _say(f"\n== {title} " + "=" * max(0, 72 - len(title)))


async def _publish(log: EventLog, tenant: str, verb: str, body: object, msg_id: str) -> None:
    await log.append(Append(subjects.request(tenant, verb), codec.encode(body), msg_id=msg_id))


async def _setup_queues(log: EventLog) -> None:
    await _publish(
        log,
        "admin",
        "priority-class",
        ApplyPriorityClass(priority_class=PriorityClassSpec("normal", 0)),
        "pc:normal",
    )
    await _publish(
        log,
        "admin",
        "priority-class",
        ApplyPriorityClass(priority_class=PriorityClassSpec("urgent", 100, preemptible=False)),
        "pc:urgent",
    )
    await _publish(log, "admin", "cohort", ApplyCohort(cohort=CohortSpec("org")), "cohort:org")
    await _publish(
        log, "admin", "cohort", ApplyCohort(cohort=CohortSpec("research", parent="org")), "cohort:research"
    )
    for team in TEAMS:
        spec = QueueSpec(team, cohort="research", quotas={"*": Quota(nominal=16)}, tenants=(team,))
        await _publish(log, "admin", "queue", ApplyQueue(queue=spec), f"queue:{team}")


def philly_workload(per_team: int) -> list[tuple[str, SubmitJob]]:
    """The first jobs of the trace's two busiest virtual clusters, one per corral team."""
    jobs = list(philly.read(philly.find()))
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.team] = counts.get(j.team, 0) + 1
    busiest = sorted(counts, key=lambda t: -counts[t])[: len(TEAMS)]
    team_of = dict(zip(busiest, TEAMS, strict=True))
    out: list[tuple[str, SubmitJob]] = []
    taken = dict.fromkeys(TEAMS, 0)
    for j in jobs:
        team = team_of.get(j.team)
        if team is None or taken[team] >= per_team or j.gpus > 8:
            continue
        taken[team] += 1
        # Philly's multi-GPU jobs are gangs of 1-GPU workers when they span more than one node's
        # worth; here a job of n GPUs is one worker of n GPUs (n ≤ 8) so it fits one node.
        spec = JobSpec(
            queue=team,
            name=f"philly-{team}-{taken[team]}",
            resources=Resources(gpus=j.gpus, cpu_milli=4000 * j.gpus, memory_mib=16_384 * j.gpus),
            runtime_estimate_s=j.duration,
            checkpointable=True,
        )
        out.append((team, SubmitJob(request_id=f"{team}-{taken[team]:03d}", job=spec)))
    return out


async def run_demo(data_dir: Path, clock: Callable[[], float] = time.time) -> State:
    shutil.rmtree(data_dir, ignore_errors=True)
    async with cluster(None, 6, "mixed", data_dir / "nats") as running:
        from services.up import connect

        log = await connect(running.url)
        try:
            async with Watcher(log, _say) as watch:
                _act(f"corral is up at {running.url}: {len(running.nodes)} simulated nodes")
                await watch.until(lambda s: len(s.nodes) == len(running.nodes))

                _act("the platform team sets up two teams under one cohort, 16 GPUs each")
                await _setup_queues(log)
                await watch.until(lambda s: len(s.queues) == len(TEAMS))

                _act(f"both teams submit their first {JOBS_PER_TEAM} jobs from the Philly trace")
                workload = philly_workload(JOBS_PER_TEAM)
                for tenant, req in workload:
                    await _publish(log, tenant, "submit", req, f"submit:{tenant}:{req.request_id}")
                ids = [req.request_id for _, req in workload]
                await watch.until(lambda s: all(i in s.jobs and s.jobs[i].phase != "submitted" for i in ids))
                await watch.caught_up()

                _act("where things stand")
                state = watch.state
                _say(
                    table.render(
                        [
                            "queue",
                            "cohort",
                            "gpu",
                            "nominal",
                            "used",
                            "borrowed",
                            "lent",
                            "pending",
                            "admitted",
                        ],
                        [
                            [
                                r[c]
                                for c in (
                                    "queue",
                                    "cohort",
                                    "gpu",
                                    "nominal",
                                    "used",
                                    "borrowed",
                                    "lent",
                                    "pending",
                                    "admitted",
                                )
                            ]
                            for r in _queue_rows(state)
                        ],
                    )
                )
                _say("")
                cols = ["id", "queue", "phase", "per_worker", "reason"]
                _say(table.render(cols, [[present.job_row(j)[c] for c in cols] for j in state.jobs.values()]))

                _act("the log is the truth: export it and replay it")
                path = data_dir / "corral-log.jsonl"
                n = logfile.write(path, watch.records)
                replayed = fold(logfile.read(path))
                same = replayed == watch.state
                _say(f"exported {n} records to {path}")
                verdict = "equals" if same else "DIFFERS FROM"
                _say(f"replay of the exported log {verdict} the live state at seq {replayed.seq}")
                _say(f"replay it yourself: corral replay {path}")
                if not same:
                    raise SystemExit("replay diverged from the live state")
                return watch.state
        finally:
            await log.close()


def _queue_rows(state: State) -> list[dict[str, object]]:
    from services.queues_view import queue_rows

    return queue_rows(state)
