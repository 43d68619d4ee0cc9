"""Preemption over time, on the simulator: random teams in one cohort (random nominal quotas and
preemption policies), random jobs of random priorities arriving over time, every service and the
fold running until the work is done. Whatever the policies:

- no job is stopped twice for the same beneficiary: what was taken for it is not given back to
  the victim (or to anyone else) while it waits, so it never needs the same victim again;
- the fold voids nothing the services propose, and every job its cohort's quota can hold ends.

That a job within its nominal never waits for a lower-priority one is
``test_preemptor_properties.test_a_job_within_its_nominal_never_waits_for_a_lower_priority_one``;
that usage never exceeds nominal plus what may be borrowed,
``test_admission_properties.test_repeated_cycles_keep_quota_invariants``.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st

from corral.events.base import Event
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
from corral.services.sim.driver import SimJob, Simulation
from tests.builders import TRAIN

TEAMS = ("team-a", "team-b", "team-c")
CLASSES = {"low": 0, "mid": 5, "high": 10}

policies = st.builds(
    PreemptionPolicy,
    within_queue=st.sampled_from(["never", "lower-priority", "lower-or-newer-equal-priority"]),
    reclaim_within_cohort=st.sampled_from(["never", "lower-priority", "any"]),
    borrow_within_cohort=st.sampled_from(["never", "lower-priority"]),
)

jobs = st.lists(
    st.tuples(
        st.sampled_from(TEAMS),
        st.sampled_from(sorted(CLASSES)),
        st.sampled_from([1, 2, 4, 8]),  # GPUs
        st.integers(0, 3600),  # arrival
        st.integers(300, 7200),  # work seconds
    ),
    min_size=4,
    max_size=14,
)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Event], list[SimJob]]:
    setup: list[Event] = [ApplyCohort(cohort=CohortSpec("org"))]
    for name, value in CLASSES.items():
        setup.append(ApplyPriorityClass(priority_class=PriorityClassSpec(name, value)))
    for team in TEAMS:
        nominal = draw(st.integers(0, 8))
        q = QueueSpec(team, cohort="org", quotas={"*": Quota(nominal)}, preemption=draw(policies))
        setup.append(ApplyQueue(queue=q))
    work = []
    for i, (team, pc, n, arrival, seconds) in enumerate(draw(jobs)):
        spec = JobSpec(
            queue=team,
            priority_class=pc,
            resources=Resources(gpus=n, cpu_milli=1000, memory_mib=1024),
            checkpointable=True,
            grace_seconds=60.0,
            command=TRAIN,
        )
        work.append(SimJob(f"j{i:02d}", team, spec, float(arrival), float(seconds)))
    return setup, work


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_no_job_is_stopped_twice_for_the_same_beneficiary(workload: tuple[list[Event], list[SimJob]]) -> None:
    setup, work = workload
    nodes = list(inventory.cluster(2, "h100-8x"))
    sim = Simulation(nodes, setup, work, record=True).run()  # type: ignore[arg-type]
    state = sim.state
    assert state.void_total == 0, state.rejections[-3:]
    assert state.faults == 0
    pairs: Counter[tuple[str, str]] = Counter()
    for rec in sim.records:
        if isinstance(rec.body, PreemptionRequested):
            for v in rec.body.victims:
                pairs[v.job_id, rec.body.beneficiary] += 1
    event(f"preemptions: {min(3, sum(pairs.values()))}+")
    policies = {q.name: q.preemption for q in state.queues.values()}
    assert [p for p, n in pairs.items() if n > 1] == [], policies
    # Every job ends that the cohort's quota can hold (each fits a node).
    total = sum(q.quotas["*"].nominal for q in state.queues.values())
    for sj in work:
        needs = sj.spec.resources.gpus
        if needs <= total:
            assert sim.stats[sj.id].phase == "succeeded", (sj.id, sim.stats[sj.id].phase)
