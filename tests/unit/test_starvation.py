"""No starvation inside a queue, end to end on the simulator: admission, placer and preemptor
together, over a stream of work. A best-effort queue lets later jobs go past one that does not
fit; it must not let them keep a large gang out for as long as they keep coming."""

from __future__ import annotations

from corral.events.base import Event
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, QueueSpec, Quota
from corral.services.agent import inventory
from corral.services.sim.driver import SimConfig, SimJob, Simulation
from tests.builders import TRAIN

HOUR = 3600.0


def job(job_id: str, queue: str, at: float, hours: float, gpus: int, replicas: int = 1) -> SimJob:
    spec = JobSpec(
        queue=queue,
        name=job_id,
        replicas=replicas,
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
        checkpointable=True,
        preemptible=True,
        runtime_estimate_s=hours * HOUR,
        command=TRAIN,
    )
    return SimJob(job_id, queue, spec, at, hours * HOUR)


def setup(nominal_a: int, nominal_b: int) -> list[Event]:
    out: list[Event] = [ApplyCohort(cohort=CohortSpec("org"))]
    for name, nominal in (("team-a", nominal_a), ("team-b", nominal_b)):
        q = QueueSpec(name, cohort="org", quotas={"*": Quota(nominal=nominal)}, tenants=(name,))
        out.append(ApplyQueue(queue=q))
    return out


def test_a_gang_is_not_kept_out_by_its_queues_stream_of_small_jobs() -> None:
    # Two nodes of 8 GPUs, all of them team-a's nominal quota. A 4-GPU job of two hours arrives
    # every half hour for a day: four of them keep the quota full. The gang (2 x 8 GPUs, all of
    # it) arrives at 1 h. Letting every small job that fits go first would keep it out until the
    # stream ends (24 h); the gang holds the quota as the running ones end, and starts within the
    # two hours they take.
    smalls = [job(f"s{i:03d}", "team-a", i * HOUR / 2, 2.0, 4) for i in range(48)]
    gang = job("gang", "team-a", HOUR, 1.0, 8, replicas=2)
    sim = Simulation(inventory.cluster(2, "h100-8x"), setup(16, 0), [*smalls, gang], SimConfig()).run()
    assert not sim.unfinished()
    wait = sim.stats["gang"].wait
    assert wait is not None and wait <= 2 * HOUR


def test_a_gang_within_its_nominal_gets_back_what_another_queue_borrows() -> None:
    # Three nodes: team-a's nominal is 16 GPUs, team-b's 8. team-b's long job borrows 8 of
    # team-a's while it is idle; then team-a's small jobs fill the other 8. The gang needs all
    # 16 of team-a's nominal: once its own small jobs have given their quota back, the lent 8
    # are reclaimed for it, not for the small jobs behind it.
    borrower = job("b-long", "team-b", 0.0, 48.0, 8, replicas=2)
    smalls = [job(f"s{i:03d}", "team-a", i * HOUR / 2, 2.0, 4) for i in range(1, 48)]
    gang = job("gang", "team-a", 2 * HOUR, 1.0, 8, replicas=2)
    sim = Simulation(
        inventory.cluster(3, "h100-8x"), setup(16, 8), [borrower, *smalls, gang], SimConfig()
    ).run()
    assert not sim.unfinished()
    wait = sim.stats["gang"].wait
    assert wait is not None and wait <= 2.5 * HOUR
