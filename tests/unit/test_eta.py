"""Runtime estimates learned from history and start-time forecasts on small hand-made states:
the estimator picks the most specific class with enough history, and a forecast is what the
simulator then does, given the estimates, and changes nothing in the state it forecasts from."""

from __future__ import annotations

import math

import msgspec
import pytest

from corral.events.base import Event
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections import runtimes
from corral.projections.state import JobState, State
from corral.services.agent import inventory
from corral.services.sim import eta
from corral.services.sim.driver import SimJob, Simulation


def spec(gpus: int = 1, name: str = "", queue: str = "q", estimate: float | None = None) -> JobSpec:
    return JobSpec(
        queue=queue,
        name=name,
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
        runtime_estimate_s=estimate,
    )


def finished(tenant: str, s: JobSpec, ran: float) -> JobState:
    return JobState(f"done-{ran}", tenant, s, 0, 0.0, phase="succeeded", ran_s=ran)


HISTORY = [
    ("alice", spec(1, "bert"), 100.0),
    ("alice", spec(1, "bert"), 200.0),
    ("alice", spec(1, "bert"), 900.0),
    ("alice", spec(4, "gpt"), 50.0),
    ("alice", spec(4, "gpt"), 60.0),
    ("bob", spec(2), 7.0),
    ("bob", spec(2), 8.0),
    ("bob", spec(2), 9.0),
]


@pytest.mark.parametrize(
    ("tenant", "job", "expected"),
    [
        pytest.param("alice", spec(1, "bert"), 200.0, id="same-name-and-size-median"),
        pytest.param("alice", spec(4, "gpt"), 100.0, id="too-few-of-name-falls-back-to-tenant"),
        pytest.param("alice", spec(1, "other"), 200.0, id="tenant-and-size"),
        pytest.param("bob", spec(2, "x"), 8.0, id="tenant-and-size-other-tenant"),
        pytest.param("carol", spec(1), 55.0, id="unknown-tenant-falls-back-to-queue"),
        pytest.param("carol", spec(1, queue="empty"), None, id="nothing-known"),
        pytest.param("alice", spec(1, "bert", estimate=5.0), None, id="owner-estimate-stands"),
    ],
)
def test_the_learned_estimate(tenant: str, job: JobSpec, expected: float | None) -> None:
    state = State()
    for who, s, ran in HISTORY:
        runtimes.learn(state, finished(who, s, ran))
    assert runtimes.learned(state, tenant, job) == expected


def test_history_is_bounded_per_class_and_in_classes() -> None:
    state = State()
    for i in range(runtimes.HISTORY + 5):
        runtimes.learn(state, finished("a", spec(1, "n"), float(i)))
    assert all(len(v) == runtimes.HISTORY for v in state.runtimes.values())
    for i in range(runtimes.MAX_CLASSES + 3):
        runtimes.learn(state, finished("a", spec(1, f"unique-{i}"), 1.0))
    assert len(state.runtimes) == runtimes.MAX_CLASSES
    assert "t=a" in state.runtimes  # updated by every job: never the oldest


def test_the_fold_learns_from_jobs_that_succeed() -> None:
    """Three runs of the same job, then a fourth submitted without an estimate: the fold fixes
    its estimate at the median of what the three ran for."""
    jobs = [SimJob(f"j{i}", "t", spec(1, "train"), 1000.0 * i, work) for i, work in enumerate((30, 50, 400))]
    jobs.append(SimJob("j3", "t", spec(1, "train"), 5000.0, 10.0))
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), jobs).run()
    assert sim.state.jobs["j3"].learned_s == 50.0


def queue(nominal: int) -> list[Event]:
    return [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=nominal)}))]


# (what runs or waits, in submission order: (id, GPUs, estimate, work)) -> forecast starts
CASES = [
    pytest.param(
        [("a", 8, 100.0, 100.0), ("b", 8, 50.0, 50.0)],
        {"b": 100.0},
        id="waits-for-the-running-job-to-end",
    ),
    pytest.param(
        [("a", 8, 100.0, 100.0), ("b", 8, 50.0, 50.0), ("c", 8, 10.0, 10.0)],
        {"b": 100.0, "c": 150.0},
        id="in-line-behind-another",
    ),
    pytest.param(
        [("a", 4, 100.0, 100.0), ("b", 8, 50.0, 50.0), ("c", 4, 200.0, 200.0)],
        {"b": 100.0, "c": 150.0},
        id="not-backfilled-as-it-would-delay-the-first",
    ),
    pytest.param(
        [("a", 8, 100.0, 300.0), ("b", 8, 50.0, 50.0)],
        {"b": 100.0},
        id="forecast-from-the-estimate-not-the-truth",
    ),
]


@pytest.mark.parametrize(("jobs", "starts"), CASES)
def test_the_forecast(jobs: list[tuple[str, int, float, float]], starts: dict[str, float]) -> None:
    work = [SimJob(i, "t", spec(g, i, estimate=est), 0.0, w) for i, g, est, w in jobs]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=0.0)
    before = msgspec.msgpack.encode(sim.state)
    got = eta.forecast(sim.state, 0.0)
    assert got.starts == pytest.approx(starts)
    assert msgspec.msgpack.encode(sim.state) == before  # a forecast changes nothing


def test_the_forecast_of_a_running_job_past_its_estimate() -> None:
    """A job that ran past its estimate is expected to run as long again as it has run."""
    work = [
        SimJob("a", "t", spec(8, estimate=100.0), 0.0, 500.0),
        SimJob("b", "t", spec(8, estimate=1.0), 1.0, 1.0),
    ]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=200.0)
    assert eta.forecast(sim.state, 200.0).starts == {"b": 400.0}


def test_the_band_scales_every_runtime() -> None:
    work = [
        SimJob("a", "t", spec(8, estimate=100.0), 0.0, 100.0),
        SimJob("b", "t", spec(8, estimate=1.0), 0.0, 1.0),
    ]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=0.0)
    assert eta.band(sim.state, 0.0) == {"b": (50.0, 100.0, 200.0)}


def test_a_start_past_the_horizon_is_unknown() -> None:
    work = [
        SimJob("a", "t", spec(8, estimate=1e5), 0.0, 1e5),
        SimJob("b", "t", spec(8, estimate=1.0), 0.0, 1.0),
    ]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=0.0)
    assert eta.forecast(sim.state, 0.0, horizon_s=3600.0).starts == {"b": math.inf}
