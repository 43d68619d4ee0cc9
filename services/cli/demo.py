"""``corral demo``: the mission on one machine, narrated as it happens.

An embedded NATS, every service (admission, placer, preemptor, health monitor, one node agent per
node) and three simulated 8×H100 NVSwitch nodes whose agents run real worker processes
(``examples/train.py``, a numpy model that checkpoints and resumes). Every record of the log is
printed as one line in an operator's words, through five acts:

1. two teams from Microsoft's Philly trace share the cluster under one cohort;
2. an 8-rank gang asks for one NVLink island and lands on one node;
3. an urgent job arrives on a full cluster: a checkpointable job checkpoints, stops, and later
   resumes from the step it saved;
4. a GPU reports XID 79 (fallen off the bus): its node is drained and the job moves, resuming from
   its checkpoint;
5. the log is exported and replayed; the replay must equal the live state exactly.

Every wait is on a state the log must reach, with a timeout, never on the clock.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from corral.events import codec, subjects
from corral.events.jobs import CancelJob, JobSpec, Resources, SubmitJob, Topology
from corral.events.log import Append, EventLog, Record
from corral.events.nodes import CheckpointCompleted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections.fold import fold
from corral.projections.lifecycle import FINAL
from corral.projections.state import State
from corral.services.cli import display, logfile, narrate, table
from corral.services.cli.up import Settings, cluster, connect
from corral.services.cli.watch import Watcher
from corral.services.query import present
from corral.services.query.queues import queue_rows
from corral.services.sim.traces import philly

TEAMS = ("team-a", "team-b")
PHILLY_JOBS = 6  # per team
TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
DEMO = Settings(
    tick=0.2,
    agent_tick=0.1,
    heartbeat=0.5,
    suspect_after=4,
    lost_after=10.0,
    probation=2.0,
    restart_backoff=0.5,
    stop_grace=5.0,
)
WAIT = 90.0  # seconds any one act may take before the demo gives up


def _say(text: str) -> None:
    print(text, flush=True)


def _narrate(record: Record, state: State) -> None:
    """Every record as a line, except the periodic checkpoints of running jobs (a checkpoint that
    a preemption asked for is news; the hundredth routine one is not)."""
    if record.subject.startswith("corral.ev.node."):
        body = codec.decode_body(record.subject, record.data).body
        if isinstance(body, CheckpointCompleted):
            job = state.jobs.get(body.job_id)
            if job is None or job.phase != "checkpointing":
                return
    _say(f"{record.seq:>5}  {narrate.line(record)}")


def _act(title: str) -> None:
    _say(f"\n== {title} " + "=" * max(0, 90 - len(title)))


def train(steps: int, pace: float = 0.002, every: int = 250) -> tuple[str, ...]:
    return (
        sys.executable,
        TRAIN,
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--step-seconds",
        str(pace),
        "--log-every",
        "500",
    )


class Demo:
    def __init__(self, log: EventLog, watch: Watcher) -> None:
        self.log = log
        self.watch = watch

    async def request(self, tenant: str, verb: str, body: object, msg_id: str) -> None:
        await self.log.append(Append(subjects.request(tenant, verb), codec.encode(body), msg_id=msg_id))

    async def submit(self, tenant: str, job_id: str, spec: JobSpec) -> None:
        await self.request(tenant, "submit", SubmitJob(request_id=job_id, job=spec), f"submit:{job_id}")

    async def until(self, what: str, predicate: object) -> State:
        try:
            return await self.watch.until(predicate, WAIT)  # type: ignore[arg-type]
        except TimeoutError:
            raise SystemExit(f"corral demo: gave up waiting for {what}") from None

    def phase(self, job_id: str) -> str:
        job = self.watch.state.jobs.get(job_id)
        return job.phase if job is not None else ""


async def setup_queues(d: Demo) -> None:
    classes = (PriorityClassSpec("normal", 0), PriorityClassSpec("urgent", 1000, preemptible=False))
    for pc in classes:
        await d.request("admin", "priority-class", ApplyPriorityClass(priority_class=pc), f"pc:{pc.name}")
    await d.request("admin", "cohort", ApplyCohort(cohort=CohortSpec("org")), "cohort:org")
    research = CohortSpec("research", parent="org")
    await d.request("admin", "cohort", ApplyCohort(cohort=research), "cohort:research")
    for team in TEAMS:
        spec = QueueSpec(team, cohort="research", quotas={"*": Quota(nominal=12)}, tenants=(team,))
        await d.request("admin", "queue", ApplyQueue(queue=spec), f"queue:{team}")


def philly_workload(per_team: int) -> list[tuple[str, str, JobSpec]]:
    """The first jobs of the Philly trace's two busiest virtual clusters, one per corral team;
    each runs the example model for a number of steps that follows its duration in the trace."""
    jobs = list(philly.read(philly.find()))
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.team] = counts.get(j.team, 0) + 1
    busiest = sorted(counts, key=lambda t: -counts[t])[: len(TEAMS)]
    team_of = dict(zip(busiest, TEAMS, strict=True))
    out: list[tuple[str, str, JobSpec]] = []
    taken = dict.fromkeys(TEAMS, 0)
    for j in jobs:
        team = team_of.get(j.team)
        if team is None or taken[team] >= per_team or j.gpus > 4:
            continue
        taken[team] += 1
        steps = int(min(2000, max(200, j.duration / 5)))
        spec = JobSpec(
            queue=team,
            name=f"philly-{j.team}",
            resources=Resources(gpus=j.gpus, cpu_milli=4000 * j.gpus, memory_mib=16_384 * j.gpus),
            runtime_estimate_s=j.duration,
            checkpointable=True,
            command=train(steps),
        )
        out.append((team, f"{team}-{taken[team]:03d}", spec))
    return out


async def act_share(d: Demo) -> None:
    _act(f"both teams submit their first {PHILLY_JOBS} jobs from the Philly trace")
    workload = philly_workload(PHILLY_JOBS)
    for tenant, job_id, spec in workload:
        await d.submit(tenant, job_id, spec)
    ids = [job_id for _, job_id, _ in workload]
    state = await d.until("the Philly jobs to finish", lambda s: all(d.phase(i) in FINAL for i in ids))
    _say("")
    cols = ["id", "queue", "phase", "gpus", "nodes"]
    rows = [present.job_row(state.jobs[i]) for i in ids]
    _say(table.render(cols, display.job_cells(rows, cols)))


async def act_gang(d: Demo) -> str:
    _act("team-a starts an 8-rank training gang that must sit on one NVLink island")
    spec = JobSpec(
        queue="team-a",
        name="llm-pretrain",
        replicas=8,
        resources=Resources(gpus=1, cpu_milli=8000, memory_mib=65_536),
        topology=Topology(pack="nvlink", required=True),
        checkpointable=True,
        command=train(10_000_000),
    )
    await d.submit("team-a", "gang", spec)
    state = await d.until("the gang to run", lambda s: d.phase("gang") == "running")
    placement = state.jobs["gang"].placement
    assert placement is not None
    nodes = {w.node for w in placement.workers}
    node = state.nodes[next(iter(nodes))]
    islands = {node.gpus[c.gpu].info.island for w in placement.workers for c in w.gpus}
    where = ", ".join(sorted(nodes))
    _say(f"\nall 8 ranks on {where}, NVLink island(s) {sorted(islands)}: one NVSwitch fabric")
    return next(iter(nodes))


async def act_preempt(d: Demo) -> None:
    _act("team-b fills the rest of the cluster; then an urgent job arrives and something must give")
    for job_id in ("batch-1", "batch-2"):
        spec = JobSpec(
            queue="team-b",
            name="sweep",
            resources=Resources(gpus=8, cpu_milli=16_000, memory_mib=65_536),
            checkpointable=True,
            grace_seconds=20.0,
            command=train(4000),
        )
        await d.submit("team-b", job_id, spec)

    def checkpointed(s: State) -> bool:
        jobs = [s.jobs.get(j) for j in ("batch-1", "batch-2")]
        return all(j is not None and j.phase == "running" and j.checkpoint is not None for j in jobs)

    await d.until("team-b's jobs to run and checkpoint", checkpointed)
    urgent = JobSpec(
        queue="team-a",
        name="hotfix-eval",
        priority_class="urgent",
        resources=Resources(gpus=8, cpu_milli=16_000, memory_mib=65_536),
        command=train(600),
    )
    await d.submit("team-a", "urgent", urgent)
    state = await d.until("a job to be preempted for the urgent one", lambda s: _preempted(s) != [])
    victims = _preempted(state)
    _say(f"\n{', '.join(victims)} checkpoints and gives its GPUs to the urgent job")
    await d.until("the urgent job to finish", lambda s: d.phase("urgent") == "succeeded")
    state = await d.until(
        "the preempted job to resume",
        lambda s: all(s.jobs[v].attempt > 0 and s.jobs[v].phase in ("running", "succeeded") for v in victims),
    )
    for v in victims:
        job = state.jobs[v]
        step = job.checkpoint.step if job.checkpoint is not None else 0
        _say(f"\n{v} is back on attempt {job.attempt}, resuming from step {step}")


def _preempted(state: State) -> list[str]:
    return sorted(j.id for j in state.jobs.values() if j.preemptions > 0)


async def act_xid(d: Demo, agents: dict[str, object]) -> None:
    _act("a GPU falls off the bus (XID 79): its node is drained and its job moves")

    def victim(s: State) -> tuple[str, str, int] | None:
        for job in s.jobs.values():
            ck = job.checkpoint
            if job.phase == "running" and job.placement is not None and job.spec.replicas == 1 and ck:
                w = job.placement.workers[0]
                return job.id, w.node, w.gpus[0].gpu
        return None

    await d.until("a running job with a checkpoint", lambda s: victim(s) is not None)
    found = victim(d.watch.state)
    assert found is not None
    job_id, node, gpu = found
    attempt = d.watch.state.jobs[job_id].attempt
    _say(f"\ninjecting XID 79 on GPU {gpu} of {node}, under {job_id}")
    agents[node].inject_xid(gpu, 79)  # type: ignore[attr-defined]
    state = await d.until(
        f"{job_id} to run elsewhere",
        lambda s: s.jobs[job_id].attempt > attempt and s.jobs[job_id].phase in ("running", "succeeded"),
    )
    job = state.jobs[job_id]
    where = ", ".join(sorted({w.node for w in job.placement.workers})) if job.placement else "-"
    step = job.checkpoint.step if job.checkpoint else 0
    _say(f"\n{job_id} now runs on {where} (attempt {job.attempt}), from its checkpoint at step {step}")
    _say(
        f"({node} stays cordoned until the GPU is fixed: `corral node uncordon {node} --repaired`"
        " puts it back, its GPU with it)"
    )


async def run_demo(data_dir: Path) -> State:
    shutil.rmtree(data_dir, ignore_errors=True)
    async with cluster(None, 3, "h100-8x", data_dir / "corral", settings=DEMO) as running:
        log = await connect(running.url)
        try:
            async with Watcher(log, _narrate) as watch:
                d = Demo(log, watch)
                _act(f"corral is up at {running.url}: 3 simulated 8×H100 nodes with real workers")
                await d.until("the nodes to register", lambda s: len(s.nodes) == len(running.nodes))
                _act("the platform team sets up two teams under one cohort, 12 GPUs each")
                await setup_queues(d)
                await d.until("the queues", lambda s: len(s.queues) == len(TEAMS))

                await act_share(d)
                await act_gang(d)
                await act_preempt(d)
                await act_xid(d, dict(running.agents))

                _act("team-a cancels its gang; everything else runs to the end")
                await d.request("team-a", "cancel", CancelJob(job_id="gang"), "cancel:gang")
                state = await d.until(
                    "every job to finish",
                    lambda s: all(j.phase in FINAL and not j.live for j in s.jobs.values()),
                )
                await watch.caught_up()
                return summarize(state, watch, data_dir)
        finally:
            await log.close()


def summarize(state: State, watch: Watcher, data_dir: Path) -> State:
    _act("where things ended")
    cols = ["queue", "cohort", "gpu", "nominal", "used", "borrowed", "lent", "pending", "admitted"]
    _say(table.render(cols, [[r[c] for c in cols] for r in queue_rows(state)]))
    _say("")
    jcols = ["id", "queue", "phase", "attempt", "workers", "gpus", "nodes"]
    rows = [present.job_row(j) for j in state.jobs.values()]
    _say(table.render(jcols, display.job_cells(rows, jcols)))
    s = present.summary(state)
    phases = present.phases_text(s["phases"])
    _say(f"\n{s['jobs']} jobs ({phases}); {s['rejected']} records refused ({s['void']} void proposals)")

    _act("the log is the truth: export it and replay it")
    path = data_dir / "corral-log.jsonl"
    n = logfile.write(path, watch.records)
    replayed = fold(logfile.read(path))
    same = replayed == state
    verdict = "equals" if same else "DIFFERS FROM"
    _say(f"exported {n} records to {path}")
    _say(f"replay of the exported log {verdict} the live state at seq {replayed.seq}")
    _say(f"replay it yourself: corral replay {path}")
    if not same or state.faults:
        raise SystemExit("corral demo: the replay diverged from the live state")
    return state
