"""The discrete-event simulator on small inputs: jobs run to completion, a preemption costs what
the checkpoint model says, FIFO and fair share order two teams as expected, and a run is
deterministic and is exactly what the fold makes of its own log."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import msgspec
import pytest

from corral.events.base import Event
from corral.events.decisions import JobsPlaced
from corral.events.jobs import JobSpec, Resources
from corral.events.nodes import CheckpointCompleted
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    FairShareSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
    RetentionSpec,
)
from corral.projections.fold import fold
from corral.services.agent import inventory
from corral.services.cli.jobfile import BadInput
from corral.services.sim import eta, philly
from corral.services.sim.driver import AgentModel, SimConfig, SimJob, Simulation
from corral.services.sim.traces import philly as philly_trace
from tests.builders import TRAIN


def gpus(n: int, queue: str = "team-a", work: float = 100.0, **spec: object) -> JobSpec:
    return JobSpec(
        queue=queue,
        resources=Resources(gpus=n, cpu_milli=1000, memory_mib=1024),
        runtime_estimate_s=work,
        command=TRAIN,
        **spec,  # type: ignore[arg-type]
    )


def sim_job(job_id: str, spec: JobSpec, arrival: float, work: float = 100.0) -> SimJob:
    return SimJob(job_id, spec.queue, spec, arrival, work)


def one_queue(name: str = "team-a", nominal: int = 8, strategy: str = "best-effort-fifo") -> list[Event]:
    return [ApplyQueue(queue=QueueSpec(name, quotas={"*": Quota(nominal=nominal)}, strategy=strategy))]


def two_teams(nominal: int = 4) -> list[Event]:
    """team-a and team-b, ``nominal`` GPUs each, in one cohort: idle quota is lent."""
    out: list[Event] = [ApplyCohort(cohort=CohortSpec("org"))]
    for team in ("team-a", "team-b"):
        q = QueueSpec(team, cohort="org", quotas={"*": Quota(nominal=nominal)}, tenants=(team,))
        out.append(ApplyQueue(queue=q))
    return out


def nodes(count: int = 1) -> list[tuple[str, object]]:
    return list(inventory.cluster(count, "h100-8x"))


def run(
    jobs: list[SimJob], setup: list[Event], config: SimConfig | None = None, count: int = 1
) -> Simulation:
    sim = Simulation(nodes(count), setup, jobs, config, record=True).run()  # type: ignore[arg-type]
    state = sim.state
    assert state.faults == 0
    assert state.void_total == 0, state.rejections
    return sim


# -- jobs run to completion ----------------------------------------------------------------------------


def test_jobs_run_to_completion_and_wait_for_room() -> None:
    jobs = [sim_job(f"j{i}", gpus(4), 0.0, 100.0) for i in range(3)]
    sim = run(jobs, one_queue())
    st = sim.stats
    assert [st[j].first_start for j in ("j0", "j1", "j2")] == [0.0, 0.0, 100.0]
    assert [st[j].finished for j in ("j0", "j1", "j2")] == [100.0, 100.0, 200.0]
    assert {sim.state.jobs[j].phase for j in st} == {"succeeded"}
    assert st["j2"].wait == 100.0 and st["j2"].jct == 200.0
    assert all(s.lost_gpu_s == 0 and s.held_gpu_s == 4 * 100.0 for s in st.values())
    assert not sim.unfinished()


def test_gangs_of_several_workers_start_and_end_together() -> None:
    spec = msgspec.structs.replace(gpus(8), replicas=2)
    sim = run([sim_job("gang", spec, 10.0, 50.0)], one_queue(nominal=16), count=2)
    job = sim.state.jobs["gang"]
    assert job.phase == "succeeded"
    assert {w.node for w in job.placement.workers} == {"node-00", "node-01"}  # type: ignore[union-attr]
    assert sim.stats["gang"].finished == 60.0
    assert sim.stats["gang"].held_gpu_s == 16 * 50.0


def test_periodic_checkpoints_are_written_while_running() -> None:
    spec = gpus(1, checkpointable=True)
    config = SimConfig(agents=AgentModel(checkpoint_interval_s=30.0))
    sim = run([sim_job("j", spec, 0.0, 100.0)], one_queue(), config)
    steps = [r.body.step for r in sim.records or () if isinstance(r.body, CheckpointCompleted)]
    assert steps == [30, 60, 90]


# -- preemption and checkpoints --------------------------------------------------------------------------


def reclaim(borrower: JobSpec, config: SimConfig) -> Simulation:
    """team-a's 8-GPU job borrows team-b's idle quota from t=0 (1,000 s of work left at t=1000);
    team-b wants its 4 GPUs back at t=1000 for 500 s."""
    jobs = [
        SimJob("a", "team-a", borrower, 0.0, 2000.0),
        SimJob("b", "team-b", gpus(4, "team-b", 500.0), 1000.0, 500.0),
    ]
    return run(jobs, two_teams(4), config)


AGENTS = AgentModel(checkpoint_interval_s=300.0, checkpoint_save_s=30.0)


def test_a_preempted_job_that_checkpoints_in_time_loses_only_the_save() -> None:
    spec = gpus(8, work=2000.0, checkpointable=True, grace_seconds=60.0)
    sim = reclaim(spec, SimConfig(agents=AGENTS))
    a, b = sim.stats["a"], sim.stats["b"]
    assert a.preemptions == 1
    assert b.first_start == 1030.0  # a saved its work for 30 s, then stopped
    # a resumes once b gives the quota back, with the 1,000 s it saved done
    assert a.finished == 1530.0 + 1000.0
    assert a.lost_gpu_s == 8 * 30.0
    requeued = [r.body for r in sim.records or () if type(r.body).__name__ == "JobRequeued"]
    assert [b.resume_from for b in requeued] == ["sim://a/0/1000"]  # type: ignore[attr-defined]


def test_a_preempted_job_that_cannot_save_in_its_grace_loses_the_time_since_its_last_checkpoint() -> None:
    spec = gpus(8, work=2000.0, checkpointable=True, grace_seconds=60.0)
    slow = AgentModel(checkpoint_interval_s=300.0, checkpoint_save_s=120.0)
    sim = reclaim(spec, SimConfig(agents=slow))
    a, b = sim.stats["a"], sim.stats["b"]
    assert b.first_start == 1060.0  # killed at the grace deadline
    # the last periodic checkpoint was at 900 s of work: 160 s on 8 GPUs are lost
    assert a.lost_gpu_s == 8 * 160.0
    assert a.finished == 1560.0 + (2000.0 - 900.0)


def test_a_preempted_job_that_cannot_checkpoint_starts_over() -> None:
    spec = gpus(8, work=2000.0, checkpointable=False)
    sim = reclaim(spec, SimConfig(agents=AGENTS))
    a, b = sim.stats["a"], sim.stats["b"]
    assert b.first_start == 1000.0  # stopped at once
    assert a.lost_gpu_s == 8 * 1000.0
    assert a.finished == 1500.0 + 2000.0


def test_a_forecast_counts_a_victims_save_from_when_it_was_asked_and_then_its_deadline() -> None:
    # A forecast takes over the jobs stopping: the save began when the stop was asked, not at
    # each forecast; one still there past the save the agents are taken to need is gone by
    # its deadline at the latest.
    spec = gpus(8, work=2000.0, checkpointable=True, grace_seconds=600.0)
    jobs = [
        SimJob("a", "team-a", spec, 0.0, 2000.0),
        SimJob("b", "team-b", gpus(4, "team-b", 500.0), 1000.0, 500.0),
    ]
    config = SimConfig(agents=AGENTS)
    sim = Simulation(nodes(), two_teams(4), jobs, config).run(until=1010.0)  # type: ignore[arg-type]
    a = sim.state.jobs["a"]
    assert (a.phase, a.phase_since, a.preempt_deadline) == ("checkpointing", 1000.0, 1600.0)
    ahead = {"hold_s": None, "batch_s": None}
    assert eta.forecast(sim.state, 1010.0, config, **ahead).starts["b"] == 1030.0  # type: ignore[arg-type]
    assert eta.forecast(sim.state, 1100.0, config, **ahead).starts["b"] == 1600.0  # type: ignore[arg-type]


def test_without_a_preemptor_the_lender_waits() -> None:
    spec = gpus(8, work=2000.0, checkpointable=True)
    sim = reclaim(spec, SimConfig(preemptor=None))
    assert sim.stats["a"].preemptions == 0
    assert sim.stats["b"].first_start == 2000.0


# -- FIFO and fair share -----------------------------------------------------------------------------


def burst_then_one() -> list[SimJob]:
    """team-a submits four whole-node jobs, then team-b one (runs without a preemptor: none is
    stopped; each may borrow, as a job that may not be preempted would not)."""
    out = [SimJob(f"a{i}", "team-a", gpus(8, "team-a"), float(i), 100.0) for i in range(4)]
    out.append(SimJob("b0", "team-b", gpus(8, "team-b"), 4.0, 100.0))
    return out


def start_order(sim: Simulation) -> list[str]:
    return sorted(sim.stats, key=lambda j: (sim.stats[j].first_start, j))


def test_fifo_runs_the_burst_first_and_fair_share_lets_the_other_team_in() -> None:
    fifo_jobs = [
        SimJob(j.id, j.tenant, msgspec.structs.replace(j.spec, queue="fifo"), j.arrival, j.work_s)
        for j in burst_then_one()
    ]
    fifo = run(fifo_jobs, one_queue("fifo", 8, "strict-fifo"), SimConfig(preemptor=None))
    fair = run(burst_then_one(), two_teams(4), SimConfig(preemptor=None))
    assert start_order(fifo) == ["a0", "a1", "a2", "a3", "b0"]
    assert start_order(fair) == ["a0", "b0", "a1", "a2", "a3"]
    assert fifo.stats["b0"].first_start == 400.0
    assert fair.stats["b0"].first_start == 100.0


# -- determinism and the fold --------------------------------------------------------------------------


def mixed() -> list[SimJob]:
    out = []
    for i in range(24):
        team = "team-a" if i % 3 else "team-b"
        n = (1, 2, 4, 8)[i % 4]
        spec = gpus(n, team, 50.0 + 37 * (i % 7), checkpointable=i % 2 == 0, grace_seconds=60.0)
        out.append(SimJob(f"m{i:02d}", team, spec, 13.0 * i, 50.0 + 37 * (i % 7)))
    return out


def decisions(sim: Simulation) -> list[tuple[float, str, bytes]]:
    return [(r.time, r.subject, msgspec.json.encode(r.body)) for r in sim.records or ()]


def test_the_same_input_gives_the_same_run() -> None:
    config = SimConfig(agents=AgentModel(checkpoint_interval_s=60.0))
    one = run(mixed(), two_teams(4), config, count=2)
    two = run(mixed(), two_teams(4), config, count=2)
    assert decisions(one) == decisions(two)
    assert one.stats == two.stats
    assert one.state == two.state
    assert not one.unfinished()
    assert any(s.preemptions for s in one.stats.values())  # the workload exercises preemption


def test_folding_the_simulations_log_gives_its_state() -> None:
    sim = run(mixed(), two_teams(4), SimConfig(agents=AgentModel(checkpoint_interval_s=60.0)), count=2)
    assert fold(sim.log()) == sim.state


def keep_finished(seconds: float) -> ApplyRetention:
    return ApplyRetention(retention=RetentionSpec(finished_s=seconds))


def test_letting_finished_jobs_go_changes_no_decision() -> None:
    """The fold letting each finished job go at once (a retention period of 0) makes every
    decision it makes when it keeps them all: no decision reads a finished job."""
    config = SimConfig(agents=AgentModel(checkpoint_interval_s=60.0))
    kept = run(mixed(), [keep_finished(1e9), *two_teams(4)], config, count=2)
    let_go = run(mixed(), [keep_finished(0.0), *two_teams(4)], config, count=2)

    def records(sim: Simulation) -> list[tuple[float, str, bytes]]:
        return [d for d in decisions(sim) if b"ApplyRetention" not in d[2]]

    assert records(kept) == records(let_go)
    assert kept.stats == let_go.stats
    assert kept.state.let_go == 0 and not let_go.state.jobs.keys() - kept.state.jobs.keys()
    assert let_go.state.let_go >= len(mixed()) - 1 and len(let_go.state.jobs) <= 1
    assert (let_go.state.gpu_time, let_go.state.quota_held) == (kept.state.gpu_time, kept.state.quota_held)


def test_a_gang_placed_at_a_coarse_decision_runs_from_when_its_last_gpus_were_freed() -> None:
    """b needs all 8 GPUs: 4 free from 60, while the services decided at 60 and 90, the other 4
    from 80. It runs from 80, as deciding at every event; the GPUs free since before the
    decision at 60 did not hold it back."""
    jobs = [
        sim_job("a", gpus(4), 0.0, 80.0),
        sim_job("x", gpus(4), 0.0, 60.0),
        sim_job("b", gpus(8), 0.0, 10.0),
    ]
    fine = run(jobs, one_queue(), SimConfig())
    coarse = run(jobs, one_queue(), SimConfig(resolution=0.5))
    assert fine.stats["b"].first_start == coarse.stats["b"].first_start == 80.0
    placed = [r.time for r in coarse.records or () if isinstance(r.body, JobsPlaced)]
    assert placed == [0.0, 90.0]


def test_decision_cycles_on_a_timer_wait_for_the_tick() -> None:
    jobs = [sim_job("j", gpus(1), 5.0, 100.0)]
    sim = run(jobs, one_queue(), SimConfig(cycle_s=60.0))
    assert sim.stats["j"].first_start == 60.0
    assert sim.stats["j"].finished == 160.0


def test_a_coarser_resolution_decides_less_often_the_further_it_ran() -> None:
    """With ``resolution`` r, the services decide again no sooner than the last decision plus
    r times the time simulated up to it: c's room frees at 110, but the last decision was at
    100, so the next is at 100 + 0.5 * 100. c runs from 110 all the same, when its GPUs were
    freed; it ended before 150, so the services decide again at once and place d, which runs
    from 120, and so on up to f, which ends at 150 itself: g is placed by the next decision, at
    225, and runs from 150. The GPUs stood idle no more than with a decision at every event."""
    jobs = [sim_job("a", gpus(8), 0.0, 100.0)] + [sim_job(j, gpus(8), 0.0, 10.0) for j in "bcdefgh"]
    fine = run(jobs, one_queue(), SimConfig())
    coarse = run(jobs, one_queue(), SimConfig(resolution=0.5))
    starts = [0.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0]
    assert [fine.stats[j].first_start for j in "abcdefgh"] == starts
    assert [coarse.stats[j].first_start for j in "abcdefgh"] == starts
    assert [coarse.stats[j].finished for j in "abcdefgh"] == [*starts[1:], 170.0]
    placed = [
        (p.job_id, r.time)
        for r in coarse.records or ()
        if isinstance(r.body, JobsPlaced)
        for p in r.body.placements
    ]
    assert placed == [("a", 0.0), ("b", 100.0), *((j, 150.0) for j in "cdef"), ("g", 225.0), ("h", 225.0)]
    on_a_timer = run(jobs, one_queue(), SimConfig(cycle_s=60.0, resolution=0.5))
    assert on_a_timer.stats["c"].first_start == 110.0


# -- the Philly experiment's parts -----------------------------------------------------------------------


def test_gang_shapes_fit_8_gpu_nodes() -> None:
    assert philly.gang_shape(1) == (1, 1)
    assert philly.gang_shape(8) == (1, 8)
    assert philly.gang_shape(16) == (2, 8)
    assert philly.gang_shape(12) == (2, 6)
    assert philly.gang_shape(128) == (16, 8)


def test_corral_guarantees_half_of_each_entitlement_and_pools_the_rest() -> None:
    trace = (
        philly.TraceJob("1", "vc-a", 0.0, 3000.0, 2),
        philly.TraceJob("2", "vc-b", 0.0, 1000.0, 2),
        philly.TraceJob("3", "vc-c", 0.0, 1.0, 1),
    )
    exp = philly.Experiment(trace, nodes=2)
    setup = exp.setup("corral")
    (cohort,) = [e.cohort for e in setup if isinstance(e, ApplyCohort)]
    queues = {e.queue.name: e.queue for e in setup if isinstance(e, ApplyQueue)}
    nominal = {t: q.quotas["*"].nominal for t, q in queues.items()}
    # Half of each entitlement (rounded down) is the team's; the cohort holds the rest.
    assert nominal == {t: n // 2 for t, n in exp.quotas.items()}
    assert sum(nominal.values()) + cohort.quotas["*"].nominal == exp.gpus
    assert all(q.weight == exp.quotas[t] and q.preemption.fair_sharing for t, q in queues.items())
    # Shares forget within hours, not the default day: a burst is judged by what its team held lately.
    (fair,) = [e.fair_share for e in setup if isinstance(e, ApplyFairShare)]
    assert fair.half_life_s == philly.HALF_LIFE_S < FairShareSpec().half_life_s
    # FIFO and Tiresias run on the same cluster, one queue holding all of it.
    for policy in ("fifo", "tiresias"):
        (q,) = [e.queue for e in exp.setup(policy) if isinstance(e, ApplyQueue)]
        assert q.quotas["*"].nominal == exp.gpus
    whole = philly.Experiment(trace, nodes=2, pool=0.0)
    assert {
        e.queue.name: e.queue.quotas["*"].nominal for e in whole.setup("corral") if isinstance(e, ApplyQueue)
    } == (whole.quotas)
    # No borrowing limit unless asked: a team borrows whatever the cohort has idle.
    assert all(q.quotas["*"].borrowing_limit is None for q in queues.values())
    capped = philly.Experiment(trace, nodes=2, borrow=1.5)
    limits = {
        e.queue.name: e.queue.quotas["*"].borrowing_limit
        for e in capped.setup("corral")
        if isinstance(e, ApplyQueue)
    }
    # times the entitlement, rounded down
    assert limits == {t: math.floor(1.5 * n) for t, n in capped.quotas.items()}
    assert limits["vc-c"] == 1  # the one-GPU team
    none = philly.Experiment(trace, nodes=2, borrow=0.0)
    assert {
        e.queue.quotas["*"].borrowing_limit for e in none.setup("corral") if isinstance(e, ApplyQueue)
    } == {0}


def test_quotas_follow_gpu_hours_and_fill_the_cluster() -> None:
    trace = [
        philly.TraceJob("1", "vc-a", 0.0, 3000.0, 2),
        philly.TraceJob("2", "vc-b", 0.0, 1000.0, 2),
        philly.TraceJob("3", "vc-c", 0.0, 1.0, 1),
    ]
    quotas = philly.nominal_quotas(trace, 16)
    assert sum(quotas.values()) == 16
    assert quotas["vc-c"] == 1 and quotas["vc-a"] > quotas["vc-b"] > 1


def test_water_fill_gives_the_unsatisfied_the_rest_by_weight() -> None:
    got = philly.water_fill(10.0, {"a": 2.0, "b": 100.0, "c": 100.0}, {"a": 1.0, "b": 1.0, "c": 3.0})
    assert got["a"] == 2.0
    assert got["b"] == pytest.approx(2.0)
    assert got["c"] == pytest.approx(6.0)


def test_jain_is_one_when_everyone_gets_their_entitlement() -> None:
    f = philly.Fairness(8.0, {"a": 1.0, "b": 1.0}, (0.0, 10.0))
    f(0.0, 10.0, {"a": 4.0, "b": 4.0}, {"a": 10.0, "b": 10.0})
    assert f.jain() == pytest.approx(1.0)
    assert f.utilisation() == pytest.approx(1.0)
    unfair = philly.Fairness(8.0, {"a": 1.0, "b": 1.0}, (0.0, 10.0))
    unfair(0.0, 10.0, {"a": 8.0, "b": 0.0}, {"a": 10.0, "b": 10.0})
    assert unfair.jain() == pytest.approx(0.5)


def trace_or_skip() -> Path:
    try:
        return philly_trace.find()
    except FileNotFoundError:
        pytest.skip("the Philly trace is not here")


def test_a_small_philly_slice_runs_under_every_policy() -> None:
    sliced = philly.load_slice(trace_or_skip(), jobs=150)
    exp = philly.Experiment(tuple(sliced), nodes=4)
    outcomes = philly.run(exp, parallel=False)
    assert [o.policy for o in outcomes] == ["corral", "fifo", "tiresias"]
    for o in outcomes:
        assert o.overall.finished == o.overall.jobs == 150
        assert 0 < o.utilisation <= 1
        assert 0 < o.jain <= 1
        assert o.overall.max_preemptions <= o.overall.preemptions
        team, wait = o.worst_team
        assert wait == max(f.p99_wait_s for f in o.teams.values()) and o.teams[team].p99_wait_s == wait
    assert outcomes[1].overall.preemptions == 0  # FIFO stops nobody
    text = philly.table(exp, outcomes)
    assert "worst team's p99 wait" in text
    for o in outcomes:
        assert any(line.startswith(o.policy) for line in text.splitlines())
    data = philly.to_json(exp, outcomes)["policies"]
    assert set(data) == {"corral", "fifo", "tiresias"}
    assert {"max_preemptions", "p99_jct_s", "gpu_hours_lost"} <= set(data["tiresias"]["overall"])
    assert data["tiresias"]["worst_team_p99_wait"]["team"] in data["tiresias"]["teams"]


@pytest.mark.parametrize("parallel", [False, True], ids=["in this process", "in worker processes"])
def test_philly_progress_counts_every_job_of_every_policy_once(parallel: bool) -> None:
    """What ``corral sim``'s bar is told: jobs over, summed over the policies, never going back."""
    sliced = philly.load_slice(trace_or_skip(), jobs=60)
    exp = philly.Experiment(tuple(sliced), nodes=4)
    told: list[int] = []
    philly.run(exp, ["corral", "fifo"], parallel=parallel, progress=told.append)
    assert sum(told) == 2 * 60 and all(n >= 0 for n in told)


def test_tiresias_stops_jobs_of_its_low_queue_on_a_few_hundred_philly_jobs() -> None:
    """A busy morning of the trace on 4 nodes: jobs that ran an hour of GPU-time are stopped for
    newcomers, each one a checkpoint and a restart, and every job still ends."""
    sliced = philly.load_slice(trace_or_skip(), jobs=300)
    exp = philly.Experiment(tuple(sliced), nodes=4)
    sim = Simulation(exp.cluster(), exp.setup("tiresias"), exp.jobs("tiresias"), exp.config("tiresias")).run()
    assert sim.state.void_total == 0 and sim.state.faults == 0, sim.state.rejections
    assert not sim.unfinished()
    stats = list(sim.stats.values())
    figures = philly.Figures.of(stats)
    assert figures.preemptions > 0
    assert figures.max_preemptions == max(s.preemptions for s in stats) >= 1
    assert figures.gpu_hours_lost > 0
    # only jobs that can checkpoint are stopped
    spec = {j.id: j.spec for j in exp.jobs("tiresias")}
    assert all(spec[s.id].checkpointable for s in stats if s.preemptions)


# -- corral sim ----------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    from corral.services.cli.sim import add_parser

    p = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-o", "--output", choices=["table", "json"], default="table")
    add_parser(p.add_subparsers(dest="verb"), common)
    return p.parse_args(["sim", *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ("--trace", "philly", "--nodes", "many"),
        ("--trace", "philly", "--policies", "lottery"),
        ("--trace", "philly", "--pods", "x.csv"),
        ("--trace", "philly", "--checkpointable", "2"),
        ("--trace", "alibaba", "--seeds", "x-y"),
        ("--trace", "alibaba", "--nodes", "/nonexistent/nodes.csv"),
        ("--trace", "alibaba", "--jobs", "5"),
    ],
    ids=[
        "nodes-not-a-number",
        "unknown-policy",
        "pods-for-philly",
        "share-above-1",
        "bad-seeds",
        "no-file",
        "jobs-for-alibaba",
    ],
)
def test_mistakes_are_one_line_bad_input(argv: tuple[str, ...]) -> None:
    args = parse(*argv)
    with pytest.raises(BadInput) as e:
        args.fn(args)
    assert "\n" not in str(e.value)


def test_corral_sim_philly_prints_every_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace_or_skip()
    png = tmp_path / "philly.png"
    args = parse("--trace", "philly", "--jobs", "60", "--nodes", "4", "-o", "json", "--plot", str(png))
    args.fn(args)
    import json

    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"corral", "fifo", "tiresias"}
    assert out["slice"]["jobs"] == 60
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_job_that_can_never_fit_is_rejected_and_asks_for_nothing() -> None:
    seen: list[float] = []
    jobs = [sim_job("huge", gpus(16), 0.0), sim_job("small", gpus(1), 10.0)]
    sim = Simulation(
        nodes(1),  # type: ignore[arg-type]
        one_queue(nominal=8),
        jobs,
        observers=[lambda t0, t1, held, demand: seen.append(demand.get("team-a", 0.0))],
    ).run()
    assert sim.stats["huge"].phase == "rejected"
    assert sim.unfinished() == ["huge"]
    assert sim.stats["small"].finished == 110.0
    assert seen == [0.0, 1.0]  # nothing asked for until 10, then the small job until 110


def small_alibaba_lists(tmp_path: Path) -> tuple[Path, Path]:
    """Six nodes (2xT4, 4xV100M16) and 30 pods of every kind: shared, whole, 2-GPU, CPU-only,
    some bound to V100M16."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},32000,131072,{(2, 4)[i % 2]},{('T4', 'V100M16')[i % 2]}\n" for i in range(6))
    )
    pods = tmp_path / "pods.csv"
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    rows = [
        f"p{i:02d},{1000 * (1 + i % 4)},4096,{(1, 1, 2, 0)[i % 4]},{(500, 1000, 1000, 0)[i % 4]},"
        f"{'V100M16' if i % 5 == 0 else ''},LS,Running,0,10,0\n"
        for i in range(30)
    ]
    pods.write_text(head + "scheduled_time\n" + "".join(rows))
    return nodes, pods


def test_corral_sim_alibaba_takes_any_lists_in_the_published_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes, pods = small_alibaba_lists(tmp_path)
    args = parse(
        "--trace", "alibaba", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "42-43",
        "--policies", "BestFit,corral", "-o", "json",
    )  # fmt: skip
    args.fn(args)
    import json

    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"BestFit", "corral"}
    assert set(out["policies"]["corral"]["seeds"]) == {"42", "43"}
    assert 0 < out["policies"]["corral"]["mean_at_130"] <= 100


def test_corral_sim_alibaba_replays_a_variant_through_fgd_and_corral(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes, pods = small_alibaba_lists(tmp_path)
    args = parse(
        "--trace", "alibaba", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "42-43",
        "--policies", "FGD,corral", "--variant", "multigpu50", "-o", "json",
    )  # fmt: skip
    args.fn(args)
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["variant"] == "multigpu50"
    assert "published" not in out  # the published figures are the default list's
    versus = out["corral_vs_FGD"]
    assert versus["seeds"] == 2
    assert versus["corral"] == out["policies"]["corral"]["mean_at_130"]
    assert versus["FGD"] == out["policies"]["FGD"]["mean_at_130"]


def test_corral_sim_alibaba_runs_several_variants_and_compares(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes, pods = small_alibaba_lists(tmp_path)
    args = parse(
        "--trace", "alibaba", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "42",
        "--policies", "FGD,corral", "--variant", "default,gpushare100,cpu300",
    )  # fmt: skip
    args.fn(args)
    text = capsys.readouterr().out
    for variant in ("default", "gpushare100", "cpu300"):
        assert f"variant: {variant}" in text
    assert "worst seed" in text  # the comparison table across variants


@pytest.mark.parametrize(
    "argv",
    [("--variant", "multigpu60"), ("--variant", ""), ("--trace", "philly", "--variant", "cpu300")],
    ids=["unknown", "empty", "variant-for-philly"],
)
def test_a_variant_mistake_is_one_line_bad_input(argv: tuple[str, ...], tmp_path: Path) -> None:
    nodes, pods = small_alibaba_lists(tmp_path)
    trace = () if "--trace" in argv else ("--trace", "alibaba", "--nodes", str(nodes), "--pods", str(pods))
    args = parse(*trace, *argv)
    with pytest.raises(BadInput) as e:
        args.fn(args)
    assert "\n" not in str(e.value)


def test_a_variant_the_pod_list_cannot_make_is_bad_input(tmp_path: Path) -> None:
    nodes, pods = small_alibaba_lists(tmp_path)
    lines = pods.read_text().splitlines(keepends=True)
    pods.write_text("".join(line for line in lines if ",2,1000," not in line))  # no multi-GPU pods
    args = parse("--trace", "alibaba", "--nodes", str(nodes), "--pods", str(pods), "--variant", "multigpu20")
    with pytest.raises(BadInput, match="no multi-GPU pods"):
        args.fn(args)


def test_a_job_that_always_restarts_runs_again_and_every_forecast_goes_on() -> None:
    # The fold restarts a job whose restart policy is "always" even after a clean exit; the
    # simulator took that for a fault and raised, so one tenant's service job made every
    # forecast (and every what-if reaching its end) fail, for everyone.
    from corral.events.jobs import JobsAdmitted

    setup: list[Event] = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(8)}))]
    svc = JobSpec(
        queue="q",
        resources=Resources(gpus=1),
        restart_policy="always",
        runtime_estimate_s=100.0,
        command=TRAIN,
    )
    big = JobSpec(queue="q", resources=Resources(gpus=8), runtime_estimate_s=600.0, command=TRAIN)
    jobs = [SimJob("svc", "eve", svc, 0.0, 100.0), SimJob("big", "bob", big, 10.0, 600.0)]
    sim = Simulation(inventory.cluster(1, "h100-8x"), setup, jobs, record=True)
    sim.run(until=250.0)  # past its first run's end
    admitted = [a.job_id for r in sim.records if isinstance(r.body, JobsAdmitted) for a in r.body.admissions]
    assert admitted.count("svc") >= 2  # admitted again after its run
    assert sim.state.jobs["big"].phase == "queued"
    assert "big" in eta.forecast(sim.state, sim.now).starts  # the forecast runs past svc's ends too


def test_an_elastic_job_shrunk_and_stopped_again_and_again_keeps_its_books() -> None:
    # The preemptor shrinks elastic jobs in the simulator as it does live: a shrunk job's held
    # GPUs were taken off its stats for good, and after a stop and a restart the tenant was
    # seen holding -4 GPUs.
    from corral.events.decisions import ShrinkRequested
    from corral.events.queues import ApplyPriorityClass, PriorityClassSpec

    setup = [ApplyPriorityClass(priority_class=PriorityClassSpec("high", 100)), *two_teams(4)]
    jobs = [
        SimJob(
            "e",
            "team-a",
            gpus(1, "team-a", 5000.0, replicas=8, min_replicas=4, checkpointable=True),
            0.0,
            5000.0,
        )
    ]
    t = 100.0
    for i in range(3):
        jobs.append(SimJob(f"b{i}", "team-b", gpus(4, "team-b", 100.0), t, 100.0))
        jobs.append(
            SimJob(f"h{i}", "team-a", gpus(8, "team-a", 100.0, priority_class="high"), t + 300, 100.0)
        )
        t += 600
    seen: list[float] = []
    sim = Simulation(
        nodes(1),
        setup,
        jobs,
        SimConfig(agents=AgentModel(checkpoint_interval_s=60, checkpoint_save_s=10)),
        record=True,
        observers=[lambda a, b, held, demand: seen.append(min(held.values(), default=0.0))],
    ).run()
    assert sim.records is not None and any(isinstance(r.body, ShrinkRequested) for r in sim.records)
    assert not sim.unfinished() and min(seen) >= 0 and all(v == 0 for v in sim.held.values())
    assert 0 < sim.stats["e"].held_gpu_s <= 8 * (sim.stats["e"].finished or 0)


def test_a_forecast_from_a_state_with_a_shrink_under_way_lets_its_leaving_ranks_go() -> None:
    # Resumed from the live state, the leaving ranks of a shrink under way ran until the job
    # ended, a day on: its beneficiary's start was forecast a day late.
    from corral.services.admission.decide import decide as admission
    from corral.services.preemptor.decide import decide as preemptor
    from tests.unit.test_preemptor import elastic_borrower

    w = elastic_borrower()
    w.submit("b1", JobSpec(queue="team-b", resources=Resources(gpus=8), command=TRAIN))
    w.cycle(admission)
    w.cycle(preemptor)
    deadline = w.state.jobs["elastic"].preempt_deadline
    assert w.state.jobs["elastic"].leaving and deadline > w.time
    sim = Simulation.resume(w.state, w.time, SimConfig(), lambda j: 86400.0 if j.id == "elastic" else 100.0)
    sim.run()
    first = sim.stats["b1"].first_start
    assert first is not None and first <= deadline, (first, deadline)


def test_a_reclaim_waiting_for_a_guard_happens_when_the_guard_lifts() -> None:
    """Nothing happens between team-b's arrival and the end of the guard that keeps team-a's
    borrower running for its first 1,500 s: a live preemptor decides again when the guard lifts
    (its ``wake``), and so does the simulation, not only when the borrower ends."""
    guarded = ApplyPriorityClass(priority_class=PriorityClassSpec("guarded", 0, min_runtime_s=1500.0))
    borrower = gpus(8, work=2000.0, checkpointable=True, grace_seconds=60.0, priority_class="guarded")
    jobs = [
        SimJob("a", "team-a", borrower, 0.0, 2000.0),
        SimJob("b", "team-b", gpus(4, "team-b", 500.0), 1000.0, 500.0),
    ]
    quiet = AgentModel(checkpoint_interval_s=10_000.0, checkpoint_save_s=30.0)  # no record until then
    sim = run(jobs, [guarded, *two_teams(4)], SimConfig(agents=quiet))
    assert sim.stats["a"].preemptions == 1
    assert sim.stats["b"].first_start == 1530.0  # the guard lifted at 1,500 s, then a 30 s save
