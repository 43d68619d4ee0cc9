"""A live run on real NATS with simulated nodes makes the same decisions as the simulator on the
same small input.

The simulator runs first and records every event it folded, with who wrote it: the world
(queues, arrivals), the simulated node agents, or a service. Then a real nats-server, the live
admission, placer and preemptor (``services.cli.up.cluster``) and the same simulated nodes get the
same input: the test appends the world's and the agents' records, in the simulator's order, and
lets the live services write their own decisions. The cluster runs no node agents of its own
(the simulator's play that part) and its health monitor expects no heartbeats within the test.

Why the comparison is exact and not a race:

- Batching. The live services decide in cycles over whatever has arrived, so they could see
  the input in other batches than the simulator. Before it appends each world or agent record,
  the test waits until the live state agrees with the simulator's state at that point of its
  log (every job's phase, attempt, admission and placement, and its running workers). So the
  live services always decide on the input the simulator decided on, and an agent reports only
  what the live fold accepted: a worker starts only on the GPUs the live placer chose. Records
  the simulator folded at one time without a decision in between (the exits of a gang's
  workers, a checkpoint and the exits that follow it) change no decision when folded one by one.
- Time. The live fold stamps records with the server's clock and the live services decide with
  the wall clock, so the numbers in time-based arithmetic differ from the simulator's. The
  workload is built so that no decision depends on them: every job is preemptible (so backfill
  never weighs runtime estimates against a reservation), no priority class sets anti-thrash
  guards, at most one preemption candidate set is the cheapest by a wide margin (work lost
  ordering holds for any clock), and two queues never compete for quota with equal current
  usage (the decayed fair-share history only breaks such ties).

What is compared at the end: the admissions in the order the fold accepted them, and every
accepted placement (job, attempt, and each rank's node and GPUs).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from corral.events import codec
from corral.events.base import Event
from corral.events.decisions import JobsPlaced
from corral.events.jobs import JobsAdmitted, JobSpec, Resources
from corral.events.log import Append, EventLog, Record
from corral.events.nodes import NodeRegistered
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, QueueSpec, Quota
from corral.projections.fold import apply, apply_event
from corral.projections.state import State
from corral.services.agent import inventory
from corral.services.cli.up import Settings, cluster, connect
from corral.services.cli.watch import Watcher
from corral.services.sim.driver import AgentModel, SimConfig, SimJob, SimRecord, Simulation
from tests.builders import TRAIN

pytestmark = pytest.mark.integration

NODES = 2  # HGX H100, 8 GPUs each
# Nodes are registered but run no agent: nothing heartbeats, and the health monitor must not
# declare them suspect while the test runs.
LIVE = Settings(agents=False, heartbeat=3600.0, lost_after=86_400.0)
SETUP: list[Event] = [
    ApplyCohort(cohort=CohortSpec("org")),
    ApplyQueue(queue=QueueSpec("team-a", cohort="org", quotas={"*": Quota(nominal=8)}, tenants=("team-a",))),
    ApplyQueue(queue=QueueSpec("team-b", cohort="org", quotas={"*": Quota(nominal=8)}, tenants=("team-b",))),
]


def job(job_id: str, team: str, gpus: int, arrival: float, work: float, **spec: Any) -> SimJob:
    replicas = spec.pop("replicas", 1)
    body = JobSpec(
        queue=team,
        replicas=replicas,
        resources=Resources(gpus=gpus, cpu_milli=2000, memory_mib=8192),
        runtime_estimate_s=work,
        command=TRAIN,
        **spec,
    )
    return SimJob(job_id, team, body, arrival, work)


# team-a fills half the cluster and borrows more; team-b reclaims its quota twice, once from a
# job that checkpoints and resumes, once from a gang that cannot checkpoint and starts over.
WORKLOAD = [
    job("a1", "team-a", 8, 1000.0, 100.0),
    job("a2", "team-a", 4, 1010.0, 150.0, checkpointable=True, grace_seconds=60.0),
    job("b1", "team-b", 8, 1020.0, 200.0),
    job("b2", "team-b", 2, 1060.0, 80.0),
    job("a3", "team-a", 8, 1130.0, 100.0, replicas=2),
    job("b3", "team-b", 8, 1265.0, 50.0),
]


def summary(state: State) -> dict[str, tuple[object, ...]]:
    """What the services decided about each job, and which of its workers run."""
    out: dict[str, tuple[object, ...]] = {}
    for j in state.jobs.values():
        placement = None
        if j.placement is not None:
            placement = tuple((w.rank, w.node, tuple(c.gpu for c in w.gpus)) for w in j.placement.workers)
        replicas = j.admission.replicas if j.admission is not None else None
        out[j.id] = (j.phase, j.attempt, replicas, placement, tuple(sorted(j.live)))
    return out


def decisions(steps: Iterable[tuple[State, Event]]) -> tuple[list[tuple[str, int]], dict[str, list[Any]]]:
    """The admissions the fold accepted, in order, and each job's accepted placements."""
    admitted: list[tuple[str, int]] = []
    placed: dict[str, list[Any]] = {}
    for state, body in steps:
        if isinstance(body, JobsAdmitted):
            for a in body.admissions:
                j = state.jobs.get(a.job_id)
                if j is not None and j.admission == a:
                    admitted.append((a.job_id, a.attempt))
        elif isinstance(body, JobsPlaced):
            for p in body.placements:
                j = state.jobs.get(p.job_id)
                if j is not None and j.placement == p:
                    placed.setdefault(p.job_id, []).append(p)
    return admitted, placed


def sim_steps(records: list[SimRecord]) -> Iterable[tuple[State, Event]]:
    state = State()
    for r in records:
        apply_event(state, r.seq, r.subject, r.body, r.time, r.tenant)
        yield state, r.body


def live_steps(records: list[Record]) -> Iterable[tuple[State, Event]]:
    state = State()
    for r in records:
        apply(state, r)
        body = codec.decode_body(r.subject, r.data, r.headers).body
        yield state, body


async def reach(watch: Watcher, want: dict[str, tuple[object, ...]], where: str) -> None:
    """Wait until the live state agrees with the simulator's; on a timeout, show how not."""

    def agrees(state: State) -> bool:
        return summary(state) == want

    try:
        await watch.until(agrees, timeout=20)
    except TimeoutError:
        assert summary(watch.state) == want, f"the live services diverged from the simulator {where}"


async def append(log: EventLog, r: SimRecord) -> None:
    """Append one of the simulator's world or agent records as its writer would."""
    if r.tenant is not None:
        data = codec.encode(r.body)
    else:
        env = codec.seal(r.body, event_id=f"sim:{r.seq}", time=time.time(), producer=r.source)
        data = codec.encode(env)
    await log.append(Append(r.subject, data, msg_id=f"sim:{r.seq}"))


def simulate() -> Simulation:
    agents = AgentModel(checkpoint_interval_s=25.0, checkpoint_save_s=30.0)
    nodes = inventory.cluster(NODES, "h100-8x")
    return Simulation(nodes, SETUP, WORKLOAD, SimConfig(agents=agents), record=True).run()


def test_the_workload_exercises_what_it_should() -> None:
    sim = simulate()
    assert sim.state.faults == 0 and sim.state.void_total == 0
    assert not sim.unfinished()
    assert sim.stats["a2"].preemptions == 1 and sim.stats["a3"].preemptions == 1
    admitted, placed = decisions(sim_steps(sim.records or []))
    assert len(placed["a2"]) == 2 and len(placed["a3"]) == 2
    assert len({w.node for w in placed["a3"][0].workers}) == 2  # the gang spans both nodes


async def test_live_services_decide_as_the_simulator(tmp_path: Path) -> None:
    sim = simulate()
    records = sim.records or []
    async with cluster(None, NODES, "h100-8x", tmp_path / "nats", settings=LIVE) as running:
        log = await connect(running.url)
        try:
            async with Watcher(log) as watch:
                await watch.until(lambda s: len(s.nodes) == NODES, timeout=30)
                expected = State()
                for r in records:
                    if isinstance(r.body, NodeRegistered):
                        # ``cluster`` registered the same nodes, as their agents would.
                        assert watch.state.nodes[r.body.node].inventory == r.body.inventory
                    elif r.source in ("world", "agent"):
                        await reach(watch, summary(expected), f"before seq {r.seq} ({r.body})")
                        await append(log, r)
                    apply_event(expected, r.seq, r.subject, r.body, r.time, r.tenant)
                await reach(watch, summary(sim.state), "at the end")
                live = decisions(live_steps(watch.records))
                assert live == decisions(sim_steps(records))
                assert watch.state.faults == 0
        finally:
            await log.close()
