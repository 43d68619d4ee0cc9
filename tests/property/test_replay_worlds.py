"""The Philly experiment's three policies on random small worlds: whatever the slice (teams, arrivals,
durations, gangs up to the cluster's size), the cluster, the share of the entitlements pooled,
the share of jobs that checkpoint and whether the services decide at every event or once a
minute, every policy settles at every instant (no decision asked again and again without
end), the fold refuses none of its records as a fault, and every job ends.

Worlds of this kind find the Tiresias baseline asking, at every pass of one instant, a stop the
fold refuses, as it did before the walk asked only stops the fold allows (one in a few hundred:
``test_tiresias.test_a_job_starved_back_up_does_not_ask_again_for_a_stop_the_fold_refused``
keeps one of them).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.projections import indexes
from corral.services.sim import philly
from corral.services.sim.driver import Simulation

GPUS = (1, 2, 4, 8, 16)


@st.composite
def worlds(draw: st.DrawFn) -> philly.Experiment:
    nodes = draw(st.integers(1, 2))
    teams = draw(st.integers(1, 3))
    # Jobs of a minute to about six hours arriving over about six hours: long enough for
    # Tiresias's jobs to drop to its low queue, starve there and come back up.
    jobs = []
    for i in range(draw(st.integers(4, 30))):
        arrival = 1.5e9 + draw(st.integers(0, 20_000))
        duration = float(draw(st.integers(60, 20_000)))
        gpus = min(draw(st.sampled_from(GPUS)), nodes * 8)
        jobs.append(
            philly.TraceJob(f"p{i:03d}", f"vc-{draw(st.integers(0, teams - 1))}", arrival, duration, gpus)
        )
    trace = tuple(sorted(jobs, key=lambda j: (j.arrival, j.id)))  # the slice is in arrival order
    return philly.Experiment(
        trace,
        nodes,
        checkpointable=draw(st.sampled_from((0.0, 0.5, 1.0))),
        seed=draw(st.integers(0, 3)),
        cycle_s=draw(st.sampled_from((0.0, 60.0))),
        pool=draw(st.sampled_from((0.0, 0.5, 1.0))),
    )


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_every_policy_settles_and_ends_every_job(exp: philly.Experiment) -> None:
    for policy in philly.POLICIES:
        sim = Simulation(exp.cluster(), exp.setup(policy), exp.jobs(policy), exp.config(policy))
        sim.run()  # raises SimError if the services never settle at some instant
        assert sim.state.faults == 0, (policy, sim.state.rejections)
        assert not sim.unfinished(), (policy, sim.unfinished())
        indexes.check(sim.state)
