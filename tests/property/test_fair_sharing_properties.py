"""Fair-sharing preemption over time, on the simulator: random teams, quotas and bursts of jobs of
one priority, every queue sharing fairly with Kueue's default strategies. Whatever the workload,
no job is stopped twice for the same beneficiary, no job is stopped more often than its class
allows, the fold accepts what the preemptor proposes, and every job ends."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events.decisions import PreemptionRequested
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.services.agent import inventory
from corral.services.sim.driver import SimConfig, SimJob, Simulation
from tests.builders import TRAIN

NORMAL = PriorityClassSpec("normal", 0, min_runtime_s=300.0, max_preemptions=3)
FAIR = PreemptionPolicy(fair_sharing=("less-than-or-equal-to-final-share", "less-than-initial-share"))
TEAMS = ("team-a", "team-b", "team-c")


@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict[str, int], list[SimJob]]:
    """Nominal quotas of the three teams adding up to the 16 GPUs, and up to 24 jobs."""
    a = draw(st.integers(0, 16))
    b = draw(st.integers(0, 16 - a))
    quotas = dict(zip(TEAMS, (a, b, 16 - a - b), strict=True))
    jobs = []
    shapes = st.tuples(
        st.sampled_from(TEAMS),
        st.sampled_from([1, 1, 2, 4, 8]),
        st.floats(0, 4 * 3600),  # arrival
        st.floats(60, 6 * 3600),  # work
        st.booleans(),  # checkpoints
    )
    for i, (team, gpus, arrival, work, saves) in enumerate(draw(st.lists(shapes, min_size=4, max_size=24))):
        spec = JobSpec(
            queue=team,
            name=f"j{i}",
            priority_class="normal",
            resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
            checkpointable=saves,
            # One that may not be preempted stays within its queue's nominal (never larger).
            preemptible=saves or gpus > quotas[team],
            grace_seconds=60.0,
            runtime_estimate_s=work,
            command=TRAIN,
        )
        jobs.append(SimJob(f"j{i:02d}", team, spec, arrival, work))
    jobs.sort(key=lambda j: (j.arrival, j.id))
    return quotas, jobs


@settings(max_examples=12, deadline=None)
@given(workloads())
def test_fair_sharing_stops_no_job_twice_for_one_beneficiary(
    work: tuple[dict[str, int], list[SimJob]],
) -> None:
    quotas, jobs = work
    setup = [ApplyPriorityClass(priority_class=NORMAL), ApplyCohort(cohort=CohortSpec("org"))]
    for team, nominal in quotas.items():
        spec = QueueSpec(team, cohort="org", quotas={"*": Quota(nominal)}, preemption=FAIR, tenants=(team,))
        setup.append(ApplyQueue(queue=spec))
    cluster = list(inventory.cluster(2, "h100-8x"))
    sim = Simulation(cluster, setup, jobs, SimConfig(cycle_s=60.0), record=True).run()  # type: ignore[arg-type]
    assert not sim.unfinished()
    refused = {r.seq for r in sim.state.rejections}
    assert sim.state.rejected_total == len(refused)  # every refusal is still listed
    pairs: list[tuple[str, str]] = []
    for r in sim.records or ():
        if isinstance(r.body, PreemptionRequested) and r.seq not in refused:
            pairs += [(v.job_id, r.body.beneficiary) for v in r.body.victims]
    assert len(pairs) == len(set(pairs)), "a job was stopped twice for the same beneficiary"
    assert max((s.preemptions for s in sim.stats.values()), default=0) <= 3
    assert sum(s.preemptions for s in sim.stats.values()) == len(pairs)
