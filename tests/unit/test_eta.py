"""Runtime estimates learned from history and start-time forecasts on small hand-made states:
the estimator picks the most specific class with enough history, and a forecast is what the
simulator then does, given the estimates, and changes nothing in the state it forecasts from."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.events.base import Event
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, QueueSpec, Quota
from corral.projections import runtimes
from corral.projections.state import JobState, State
from corral.services.agent import inventory
from corral.services.sim import eta
from corral.services.sim.driver import SimJob, Simulation
from tests.builders import TRAIN


def spec(gpus: int = 1, name: str = "", queue: str = "q", estimate: float | None = None) -> JobSpec:
    return JobSpec(
        queue=queue,
        name=name,
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
        runtime_estimate_s=estimate,
        command=TRAIN,
    )


def finished(tenant: str, s: JobSpec, ran: float, submitted: float = 0.0) -> JobState:
    return JobState(f"done-{ran}", tenant, s, 0, submitted, phase="succeeded", ran_s=ran)


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
        pytest.param("carol", spec(1), 9.0, id="unknown-tenant-falls-back-to-queue-latest-five"),
        pytest.param("carol", spec(1, queue="empty"), None, id="nothing-known"),
        # Learned as well when its owner gave an estimate (which ``runtimes.of`` still prefers):
        # the short-job lane checks the owner's against it.
        pytest.param("alice", spec(1, "bert", estimate=5.0), 200.0, id="learned-beside-the-owner-s-estimate"),
    ],
)
def test_the_learned_estimate(tenant: str, job: JobSpec, expected: float | None) -> None:
    state = State()
    for at, (who, s, ran) in enumerate(HISTORY):  # submitted in this order, and ended in it
        runtimes.learn(state, finished(who, s, ran, float(at)))
    assert runtimes.learned(state, tenant, job) == expected


# (runs of alice's 1-GPU "bert": submitted at, ran; in the order they ended) -> her next one's
# estimate: the median of the latest five submitted, whenever they ended
LATEST_CASES = [
    pytest.param(
        [(0.0, 60.0), (1.0, 60.0), (2.0, 60.0), (10.0, 3600.0), (11.0, 3600.0), (12.0, 3600.0)]
        + [(3.0, 60.0), (4.0, 60.0)],
        3600.0,
        id="a-long-batch-submitted-last-not-the-short-runs-that-ended-last",
    ),
    pytest.param(
        [(1.0, 10.0), (2.0, 20.0), (3.0, 30.0), (4.0, 40.0), (5.0, 50.0), (0.0, 1000.0)],
        30.0,
        id="a-run-submitted-before-the-latest-five-is-not-kept",
    ),
    pytest.param(
        [(float(i), 10.0 * i) for i in range(1, 8)],
        50.0,
        id="only-the-latest-five",
    ),
    pytest.param(
        [(5.0, 500.0), (1.0, 100.0), (3.0, 300.0)],
        300.0,
        id="in-submission-order-whatever-the-end-order",
    ),
    pytest.param([(0.0, 10.0), (1.0, 20.0)], None, id="fewer-than-three-nothing-learned"),
]


@pytest.mark.parametrize(("runs", "expected"), LATEST_CASES)
def test_the_estimate_is_of_the_runs_submitted_last(
    runs: list[tuple[float, float]], expected: float | None
) -> None:
    state = State()
    for at, ran in runs:
        runtimes.learn(state, finished("alice", spec(1, "bert"), ran, at))
    assert runtimes.learned(state, "alice", spec(1, "bert")) == expected
    assert all(len(v) <= runtimes.LATEST for v in state.latest_runs.values())
    assert all(v == sorted(v) for v in state.latest_runs.values())


def test_history_is_bounded_per_class_and_in_classes() -> None:
    state = State()
    for i in range(runtimes.HISTORY + 5):
        runtimes.learn(state, finished("a", spec(1, "n"), float(i)))
    assert all(len(v) == runtimes.HISTORY for v in state.runtimes.values())
    for i in range(runtimes.MAX_CLASSES_PER_TENANT + 3):
        runtimes.learn(state, finished("a", spec(1, f"unique-{i}"), 1.0))
    assert len(state.runtime_classes["a"]) == runtimes.MAX_CLASSES_PER_TENANT
    assert len(state.runtimes) == len(state.latest_runs) == runtimes.MAX_CLASSES_PER_TENANT + 1  # + q=
    assert "t=a" in state.runtimes and "t=a" in state.latest_runs  # updated by every job: never the oldest


def test_one_tenants_unique_jobs_let_go_only_of_its_own_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    # One LRU for all had a tenant running uniquely named jobs push every other tenant's learned
    # estimates out, and a class keyed by a 64 KiB command kept 64 KiB for good.
    monkeypatch.setattr(runtimes, "MAX_CLASSES", 60)
    monkeypatch.setattr(runtimes, "MAX_CLASSES_PER_TENANT", 40)
    state = State()
    for i in range(3):
        runtimes.learn(state, finished("a", spec(1, "train"), 3600.0, float(i)))
    for i in range(10):
        runtimes.learn(state, finished("c", spec(1, f"c-{i}"), 60.0, float(i)))
    long = spec(1, "x" * 60_000)
    for i in range(1000):
        runtimes.learn(state, finished("b", msgspec.structs.replace(long, name="y" * 60_000 + str(i)), 1.0))
    assert runtimes.learned(state, "a", spec(1, "train")) == 3600.0
    assert len(state.runtime_classes["c"]) == 12  # its 10 names, its size and itself: all kept
    assert len(state.runtime_classes["b"]) <= 40 and len(state.runtimes) <= 60
    assert max(map(len, state.runtimes)) < 200  # long names kept as their digest
    # Past the bound in all, the classes updated longest ago go first, whoever's: b's flood,
    # behind what d and e ran since; a's class, used again, stays.
    runtimes.learn(state, finished("a", spec(1, "train"), 3600.0, 9.0))
    for t in ("d", "e"):
        for i in range(20):
            runtimes.learn(state, finished(t, spec(1, f"{t}-{i}"), 1.0))
    assert runtimes.learned(state, "a", spec(1, "train")) == 3600.0
    assert len(state.runtimes) <= 60
    assert len(state.runtime_classes["d"]) == len(state.runtime_classes["e"]) == 22
    assert set(state.runtime_classes) <= {"a", "b", "d", "e"}  # c's gone, and its list with them
    assert all(k in state.runtimes for keys in state.runtime_classes.values() for k in keys)


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


@pytest.mark.parametrize(("resolution", "decided"), [(0.0, 1110.0), (eta.RESOLUTION, 1110.0), (0.5, 1150.0)])
def test_a_forecast_decides_more_coarsely_the_further_ahead(resolution: float, decided: float) -> None:
    """A forecast's resolution counts from its own now, not from the start of the log: at
    1,000 s, with a resolution of 0.5, the decision after the one at 1,100 comes at 1,150. The
    job placed there runs from when its GPUs were freed, 1,110, as it would deciding at every
    event."""
    work = [
        SimJob("a", "t", spec(8, estimate=1100.0), 0.0, 1100.0),
        SimJob("b", "t", spec(8, estimate=10.0), 0.0, 10.0),
        SimJob("c", "t", spec(8, estimate=10.0), 0.0, 10.0),
    ]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=1000.0)
    assert eta.forecast(sim.state, 1000.0, resolution=resolution).starts == pytest.approx(
        {"b": 1100.0, "c": 1110.0}
    )
    ahead = eta.resumed(sim.state, 1000.0, resolution=resolution).run()
    assert ahead.state.jobs["c"].phase_since == decided  # placed by the decision at that time


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


RAN = [100.0, 200.0, 300.0, 400.0, 1000.0]  # how long alice's 1-GPU "bert" runs went


@pytest.mark.parametrize(
    ("ran", "expected"),
    [
        pytest.param(0.0, 300.0, id="not-started-the-class-median"),
        pytest.param(50.0, 250.0, id="short-of-every-run-the-median-less-what-it-ran"),
        pytest.param(150.0, 200.0, id="past-the-shortest-only-the-longer-count"),
        pytest.param(250.0, 150.0, id="three-longer-still-enough"),
        pytest.param(350.0, 100.0, id="too-few-longer-in-its-class-the-tenant-s-say"),
        pytest.param(999.0, None, id="past-all-but-one-nothing-known"),
    ],
)
def test_the_remaining_time_given_how_long_a_job_ran(ran: float, expected: float | None) -> None:
    """The most specific class with at least three runs longer than what the job has run says:
    the median of how much longer those went on."""
    state = State()
    for r in RAN:
        runtimes.learn(state, finished("alice", spec(1, "bert"), r))
    for r in (360.0, 500.0):  # only in the tenant's class and the queue's
        runtimes.learn(state, finished("alice", spec(2, "gpt"), r))
    job = JobState("j", "alice", spec(1, "bert"), 0, 0.0, phase="running")
    got = eta.remaining(job, ran, state.runtimes)
    assert got == (None if expected is None else pytest.approx(expected))


@given(
    runs=st.lists(st.floats(1.0, 1e6), min_size=eta.MIN_LONGER, max_size=runtimes.HISTORY),
    a=st.floats(0.0, 1e6),
    b=st.floats(0.0, 1e6),
)
def test_the_longer_a_job_ran_the_later_it_is_expected_to_end(runs: list[float], a: float, b: float) -> None:
    """Within one class, the expected end (what it ran plus what is expected to remain) never
    comes earlier for a job that has run longer, and what remains is never negative."""
    a, b = min(a, b), max(a, b)
    history = {key: runs for key in runtimes.classes("t", spec(1, "n"))}
    job = JobState("j", "t", spec(1, "n"), 0, 0.0, phase="running")
    left_a, left_b = eta.remaining(job, a, history), eta.remaining(job, b, history)
    if left_b is not None:
        assert left_a is not None  # what ran longer than b ran longer than a
        assert left_b > 0.0 and a + left_a <= b + left_b + 1e-6 * (1.0 + b)


def test_a_running_job_goes_on_as_its_class_did_once_it_outlived_its_estimate() -> None:
    """Learned estimates: a job past the median of its class is forecast to end as the runs of its
    class that outlived it did, not at once and not as long again as it ran."""
    state = State()
    for r in (100.0, 110.0, 120.0, 1000.0, 1100.0, 1200.0):
        runtimes.learn(state, finished("t", spec(8, "n"), r))
    job = JobState("j", "t", spec(8, "n"), 0, 0.0, phase="running", phase_since=0.0, learned_s=115.0)
    assert eta.runtime(job, 500.0, history=state.runtimes) == pytest.approx(600.0)
    assert eta.runtime(job, 500.0, 2.0, state.runtimes) == pytest.approx(1200.0)  # calibrated alike
    assert eta.runtime(job, 500.0) == pytest.approx(500.0)  # without history: as long again


def test_a_running_job_short_of_its_estimate_ends_at_it() -> None:
    """Learned estimates are of the class's latest batch: a job short of its estimate is forecast
    to end at it, however long the class's other runs that ran as long went on."""
    state = State()
    for r in (100.0, 1000.0, 1100.0, 1200.0):
        runtimes.learn(state, finished("t", spec(8, "n"), r))
    job = JobState("j", "t", spec(8, "n"), 0, 0.0, phase="running", phase_since=0.0, learned_s=300.0)
    assert eta.runtime(job, 200.0, history=state.runtimes) == pytest.approx(100.0)
    assert eta.runtime(job, 200.0, 2.0, state.runtimes) == pytest.approx(400.0)  # calibrated
    # past it, one of the long runs: as those that ran as long went on (1,100 - 400)
    assert eta.runtime(job, 400.0, history=state.runtimes) == pytest.approx(700.0)


@pytest.mark.parametrize(
    ("until", "arrivals"),
    [
        pytest.param(None, [160.0], id="once-a-window-later"),
        pytest.param(300.0, [160.0, 220.0, 280.0], id="every-window-to-the-horizon"),
        pytest.param(150.0, [160.0], id="a-horizon-within-the-first-window"),
    ],
)
def test_recent_submissions_come_again(until: float | None, arrivals: list[float]) -> None:
    """Submissions of the last window, from the log (a job the state let go counts too), come
    again a window later, and with a horizon every window up to it, with their estimates."""
    log = [("t", spec(1), 100.0, 50.0), ("t", spec(1), 10.0, 5.0)]  # the second is older than the window
    got = eta.recent(State(), 120.0, 60.0, 2.0, until, log)
    assert [j.arrival for j in got] == arrivals
    assert all(j.work_s == 100.0 and j.tenant == "t" for j in got)
    assert len({j.id for j in got}) == len(got)


@pytest.mark.parametrize(
    ("statistic", "tenant", "job", "expected"),
    [
        pytest.param("learned", "alice", spec(1, "bert"), 200.0, id="the-fold-s-estimate"),
        pytest.param("median", "alice", spec(1, "bert"), 200.0, id="median"),
        pytest.param("mean", "alice", spec(1, "bert"), 400.0, id="mean-of-a-heavy-tail-above-its-median"),
        pytest.param("p75", "alice", spec(1, "bert"), 900.0, id="upper-quartile"),
        pytest.param("mean", "alice", spec(4, "gpt"), 1310.0 / 5, id="too-few-of-name-falls-back-to-tenant"),
        pytest.param("mean", "alice", spec(1, "bert", estimate=5.0), 5.0, id="owner-estimate-stands"),
        pytest.param(
            "mean", "carol", spec(1, queue="empty"), None, id="nothing-known-the-one-learned-at-submission"
        ),
    ],
)
def test_a_forecast_s_runtime_from_its_class(
    statistic: str, tenant: str, job: JobSpec, expected: float | None
) -> None:
    """A forecast runs a job without its owner's estimate for the chosen statistic of the runs of
    its most specific class with enough history; the median is what the fold learned."""
    state = State()
    for who, s, ran in HISTORY[:5]:
        runtimes.learn(state, finished(who, s, ran))
    learned = runtimes.learned(state, tenant, job)
    waiting = JobState("j", tenant, job, 0, 0.0, learned_s=learned)
    assert eta.expected(waiting, state.runtimes, statistic) == expected
    if expected is not None:
        assert eta.runtime(waiting, 0.0, 2.0, state.runtimes, statistic) == pytest.approx(2 * expected)


@pytest.mark.parametrize(
    ("ran", "total"),
    [
        pytest.param(50.0, 200.0, id="short-of-the-class-what-it-ran-and-the-median-beyond"),
        pytest.param(250.0, 500.0, id="outlived-its-class-as-long-again"),
    ],
)
def test_a_class_s_running_jobs_count_in_its_runs(ran: float, total: float) -> None:
    """A class's history holds only runs that ended, the short ones first: a job of the class that
    is running counts too, at what it ran plus what is expected to remain, in every class of its
    own, and the state's history is left as it was."""
    state = State()
    for r in (100.0, 200.0, 300.0):
        runtimes.learn(state, finished("t", spec(1, "n"), r))
    before = {k: list(v) for k, v in state.runtimes.items()}
    job = JobState("j", "t", spec(1, "n"), 0, 0.0, phase="running", phase_since=0.0)
    state.jobs["j"] = job
    state.jobs_by_phase.setdefault("running", {})["j"] = None
    runs = eta.with_running(state, ran, state.runtimes, "mean")
    assert all(
        runs[key] == [100.0, 200.0, 300.0, pytest.approx(total)] for key in runtimes.classes("t", job.spec)
    )
    assert state.runtimes == before
    waiting = JobState("w", "t", spec(1, "n"), 0, 0.0)
    assert eta.expected(waiting, runs, "mean") == pytest.approx((600.0 + total) / 4)


def held(*jobs: tuple[str, str, str, float]) -> State:
    """A state of (id, tenant, phase, submitted at) jobs, with the fold's phase index."""
    state = State()
    for seq, (job_id, tenant, phase, at) in enumerate(jobs, 1):
        state.jobs[job_id] = JobState(job_id, tenant, spec(1, job_id), seq, at, phase=phase)  # type: ignore[arg-type]
        state.jobs_by_phase.setdefault(phase, {})[job_id] = None
    return state


# (jobs: id, tenant, phase, submitted at) -> like jobs that arrive (id, arrival), with now 1000,
# a window of 600 s, a horizon at 1500, each job ending 100 s from now and a like one running 200 s
HOLDING_CASES = [
    pytest.param(
        [("a", "t", "running", 900.0)],
        [("a-again-0", 1100.0), ("a-again-1", 1300.0)],
        id="a-running-job-is-followed-by-like-ones-to-the-horizon",
    ),
    pytest.param(
        [("a", "t", "running", 100.0)],
        [],
        id="a-team-that-submitted-nothing-lately-lets-go",
    ),
    pytest.param(
        [("a", "t", "running", 100.0), ("b", "t", "queued", 800.0)],
        [("a-again-0", 1100.0), ("a-again-1", 1300.0)],
        id="a-waiting-job-submitted-lately-keeps-the-team-holding",
    ),
    pytest.param(
        [("a", "t", "running", 100.0), ("b", "t", "succeeded", 900.0)],
        [("a-again-0", 1100.0), ("a-again-1", 1300.0)],
        id="a-finished-job-the-state-still-holds-counts-too",
    ),
    pytest.param(
        [("a", "t", "running", 900.0), ("b", "u", "running", 100.0), ("c", "u", "queued", 100.0)],
        [("a-again-0", 1100.0), ("a-again-1", 1300.0)],
        id="only-the-teams-that-submitted-lately",
    ),
    pytest.param(
        [("a", "t", "checkpointing", 900.0), ("b", "t", "queued", 900.0)],
        [],
        id="a-job-being-stopped-or-waiting-is-not-followed",
    ),
    pytest.param(
        [("a", "t", "running", 900.0), ("a-again-0", "t", "succeeded", 900.0)],
        [("a-again-0-", 1100.0), ("a-again-1", 1300.0)],
        id="a-like-job-never-takes-a-name-the-state-holds",
    ),
]


@pytest.mark.parametrize(("jobs", "arrivals"), HOLDING_CASES)
def test_teams_that_submitted_lately_keep_holding(
    jobs: list[tuple[str, str, str, float]], arrivals: list[tuple[str, float]]
) -> None:
    state = held(*jobs)
    got = eta.holding(state, 1000.0, 600.0, 1500.0, lambda j: 100.0, lambda j: 200.0)
    assert [(j.id, j.arrival) for j in got] == arrivals
    assert all(j.work_s == 200.0 and j.spec == state.jobs[j.id.split("-again")[0]].spec for j in got)


def test_a_team_that_keeps_submitting_takes_back_what_it_frees() -> None:
    """Team u's job ends at 100 and u submitted lately: its like job, within u's nominal quota,
    goes before team t's waiting job, which would borrow those GPUs; t's job starts when t's own
    running one ends, at 200, where with no later submissions it borrows u's at 100."""
    setup: list[Event] = [ApplyCohort(cohort=CohortSpec("c"))]
    setup += [
        ApplyQueue(queue=QueueSpec(q, cohort="c", quotas={"*": Quota(nominal=4)}, tenants=(q,))) for q in "tu"
    ]
    work = [
        SimJob("a", "t", spec(4, "a", queue="t", estimate=200.0), 0.0, 200.0),
        SimJob("b", "u", spec(4, "b", queue="u", estimate=100.0), 0.0, 100.0),
        SimJob("w", "t", spec(4, "w", queue="t", estimate=50.0), 1.0, 50.0),
    ]
    sim = Simulation(inventory.cluster(1, "h100-8x"), setup, work).run(until=10.0)
    assert eta.forecast(sim.state, 10.0).starts == {"w": 100.0}
    assert eta.forecast(sim.state, 10.0, hold_s=600.0).starts == {"w": 200.0}
    # with a window that has none of u's submissions in it, u lets its GPUs go as before
    assert eta.forecast(sim.state, 10.0, hold_s=5.0).starts == {"w": 100.0}


def batch(now: float, *jobs: tuple[str, str, float, float]) -> State:
    """A state of (id, phase, submitted at, ran) jobs of tenant t, 1 GPU each, with no estimate;
    a running one started ``ran`` seconds before ``now``."""
    state = State()
    for seq, (job_id, phase, at, ran) in enumerate(jobs, 1):
        job = JobState(job_id, "t", spec(1, job_id), seq, at, phase=phase, phase_since=now - ran)  # type: ignore[arg-type]
        state.jobs[job_id] = job
        state.jobs_by_phase.setdefault(phase, {})[job_id] = None
    return state


# (jobs: id, phase, submitted at, ran) -> what each waiting job is expected to run, at 10,000 s
# with a window of 1,000 s and no history (a running job: what it has run, at least)
ALIKE_CASES = [
    pytest.param(
        [("a", "running", 0.0, 3000.0), ("b", "running", 0.0, 4000.0), ("c", "running", 0.0, 5000.0)]
        + [("w", "queued", 500.0, 0.0)],
        {"w": 4000.0},
        id="the-median-of-what-the-batch-running-now-runs-at-least",
    ),
    pytest.param(
        [("a", "running", 0.0, 3000.0), ("b", "running", 0.0, 4000.0), ("w", "queued", 500.0, 0.0)],
        {},
        id="too-few-running",
    ),
    pytest.param(
        [("a", "running", 0.0, 3000.0), ("b", "running", 0.0, 4000.0), ("c", "running", 0.0, 5000.0)]
        + [("w", "queued", 2000.0, 0.0)],
        {},
        id="submitted-too-far-apart",
    ),
    pytest.param(
        [("a", "running", 9000.0, 300.0), ("b", "running", 9000.0, 400.0), ("c", "running", 9000.0, 500.0)]
        + [("w", "queued", 8500.0, 0.0), ("x", "preempted", 9500.0, 0.0)],
        {"w": 400.0, "x": 400.0},
        id="before-or-after-and-every-waiting-phase",
    ),
]


def test_a_batch_mate_short_of_its_estimate_counts_at_what_it_ran() -> None:
    """What a batch-mate still short of its estimate will run is the estimate, which the waiting
    job has already: the floor counts what it ran, not what its class's long runs went on."""
    state = batch(
        10_000.0,
        *[(f"r{i}", "running", 0.0, 200.0) for i in range(3)],
        ("w", "queued", 500.0, 0.0),
    )
    for r in (100.0, 1000.0, 1100.0, 1200.0):
        runtimes.learn(state, finished("t", spec(1, "n"), r))
    for i in range(3):
        state.jobs[f"r{i}"] = msgspec.structs.replace(state.jobs[f"r{i}"], learned_s=300.0)
    assert eta.alike(state, 10_000.0, 1000.0, state.runtimes) == {"w": pytest.approx(200.0)}
    for i in range(3):  # past their estimate: one of the long runs each
        state.jobs[f"r{i}"] = msgspec.structs.replace(state.jobs[f"r{i}"], learned_s=150.0)
    assert eta.alike(state, 10_000.0, 1000.0, state.runtimes) == {"w": pytest.approx(1100.0)}


@pytest.mark.parametrize(("jobs", "expected"), ALIKE_CASES)
def test_a_waiting_job_runs_as_its_batch_running_now(
    jobs: list[tuple[str, str, float, float]], expected: dict[str, float]
) -> None:
    assert eta.alike(batch(10_000.0, *jobs), 10_000.0, 1000.0, {}) == pytest.approx(expected)


def test_a_batch_running_longer_than_the_estimate_lengthens_a_waiting_job_only() -> None:
    """The batch's expectation is a floor: a waiting job estimated longer keeps its estimate."""
    job = JobState("w", "t", spec(1, "w"), 1, 0.0, phase="queued", learned_s=100.0)
    assert eta.runtime(job, 0.0, batch={"w": 500.0}) == 500.0
    assert eta.runtime(job, 0.0, batch={"w": 50.0}) == 100.0
    assert eta.runtime(job, 0.0, 2.0, batch={"w": 500.0}) == 500.0  # what the batch ran is not scaled
    assert eta.runtime(job, 0.0, 6.0, batch={"w": 500.0}) == 600.0  # the estimate is


def test_each_job_runs_for_one_of_the_errors_the_same_one_each_time() -> None:
    errors = eta.Errors((0.5, 1.0, 2.0, 3.0, 4.0, 8.0))
    got = {f"j{i}": errors.of(f"j{i}") for i in range(200)}
    assert got == {f"j{i}": errors.of(f"j{i}") for i in range(200)}  # the same in every forecast
    assert set(got.values()) == set(errors.ratios)  # each error taken by some job
    # a running job that has run 1.5 times its estimate runs for one of the errors above that
    assert {errors.of(f"j{i}", 1.5) for i in range(200)} == {2.0, 3.0, 4.0, 8.0}
    assert errors.of("j0", 3.5) is None  # fewer than MIN_LONGER ran that much longer than estimated


def test_a_line_waits_for_each_jobs_own_error_not_every_job_for_the_mean() -> None:
    """One job in 20 ran 20 times its estimate: in a line of 40 jobs through 8 GPUs, the few
    such jobs hold a GPU each while the others drain the rest of the line, which ends at 500
    (400 had every estimate been right). Scaling every job by the mean error (1.95) forecasts
    the end of the line at 780."""
    work = [SimJob(f"w{i:02}", "t", spec(1, estimate=100.0), 0.0, 100.0) for i in range(40)]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=0.0)
    errors = eta.Errors(tuple(sorted([1.0] * 19 + [20.0])))
    own = eta.forecast(sim.state, 0.0, errors=errors).starts
    mean = eta.forecast(sim.state, 0.0, scale=sum(errors.ratios) / len(errors.ratios)).starts
    plain = eta.forecast(sim.state, 0.0).starts
    assert (max(plain.values()), max(own.values()), max(mean.values())) == (400.0, 500.0, 780.0)


def test_each_tenants_jobs_run_by_its_own_errors_once_enough_of_its_jobs_finished() -> None:
    """Tenant ``honest``'s jobs ran as estimated; ``wild`` estimates everything at a second
    and runs for hours. Everyone's errors mix both, but each tenant's jobs run by its own once
    ``MIN_OWN`` of them finished: ``wild``'s estimates move no forecast of ``honest``'s jobs,
    and ``wild``'s jobs run for what its jobs really took. A tenant with too few finished jobs
    runs by everyone's."""
    c = eta.Calibration()
    for _ in range(eta.MIN_OWN):
        c.saw(3600.0, 3600.0, "honest")
        c.saw(1e-300, 7200.0, "wild")
    for _ in range(eta.MIN_OWN - 1):
        c.saw(3600.0, 36000.0, "new")
    errors = c.errors()
    assert errors is not None and set(errors.own) == {"honest", "wild"}
    assert c.errors() is errors  # made once until another job is counted
    ids = [f"j{i}" for i in range(50)]
    assert {errors.of(j, 0.0, 3600.0, "honest") for j in ids} == {1.0}
    assert {errors.of(j, 0.0, 1.0, "wild") for j in ids} == {7200.0}
    assert {errors.of(j, 0.0, 3600.0, "new") for j in ids} != {1.0}  # everyone's, "new" among them
    job = JobState("h", "honest", spec(1, estimate=3600.0), 1, 0.0, phase="queued")
    assert eta.runtime(job, 0.0, errors=errors) == 3600.0
    c.saw(3600.0, 3600.0, "honest")
    assert c.errors() is not errors


def test_a_tenants_own_errors_are_those_of_its_jobs_estimated_most_alike() -> None:
    """One tenant's jobs estimated at 10 s ran 20 times that, those estimated at an hour ran an
    hour: its job estimated at an hour runs an hour, one at 10 s for 200 s."""
    c = eta.Calibration()
    for _ in range(eta.MIN_OWN):
        c.saw(10.0, 200.0, "x")
        c.saw(3600.0, 3600.0, "x")
    errors = c.errors()
    assert errors is not None
    ids = [f"j{i}" for i in range(50)]
    assert {errors.of(j, 0.0, 3600.0, "x") for j in ids} == {1.0}
    assert {errors.of(j, 0.0, 10.0, "x") for j in ids} == {20.0}


def test_the_own_errors_of_the_tenants_whose_jobs_finished_latest_are_kept() -> None:
    c = eta.Calibration()
    for i in range(eta.MAX_TENANTS + 10):
        c.saw(10.0, 10.0, f"t{i}")
    assert len(c.own) == eta.MAX_TENANTS and "t0" not in c.own and f"t{eta.MAX_TENANTS + 9}" in c.own


def test_a_job_runs_by_the_errors_of_the_jobs_estimated_most_alike() -> None:
    """Jobs estimated at 100 s ran as estimated, jobs estimated at 10 s ran 200 s: a job
    estimated at 100 s runs for its estimate, one at 10 s for 20 times it, one with no estimate
    given by one of everyone's errors. A running job past all the errors of those estimated
    alike runs by one of everyone's above what it ran."""
    c = eta.Calibration()
    for _ in range(eta.NEAREST + 50):
        c.saw(100.0, 100.0)
        c.saw(10.0, 200.0)
    errors = c.errors()
    assert errors is not None
    ids = [f"j{i}" for i in range(100)]
    assert {errors.of(j, 0.0, 100.0) for j in ids} == {errors.of(j, 0.0, 120.0) for j in ids} == {1.0}
    assert {errors.of(j, 0.0, 10.0) for j in ids} == {errors.of(j, 0.0, 5.0) for j in ids} == {20.0}
    assert {errors.of(j) for j in ids} == {1.0, 20.0}
    assert {errors.of(j, 1.5, 100.0) for j in ids} == {20.0}
    assert c.spread() == (1.0, 20.0)  # the band is everyone's
    # a line of jobs estimated at 100 s through 8 GPUs drains as estimated
    work = [SimJob(f"w{i:02}", "t", spec(1, estimate=100.0), 0.0, 100.0) for i in range(40)]
    sim = Simulation(inventory.cluster(1, "h100-8x"), queue(8), work).run(until=0.0)
    assert max(eta.forecast(sim.state, 0.0, errors=errors).starts.values()) == 400.0
    assert max(eta.forecast(sim.state, 0.0, errors=eta.Errors(errors.ratios)).starts.values()) > 400.0


def test_the_calibration_runs_each_job_by_its_error_and_spreads_the_band_by_their_quartiles() -> None:
    c = eta.Calibration()
    for i in range(eta.MIN_CALIBRATION):
        c.saw(100.0, 100.0 * (1 + i % 4))  # errors 1, 2, 3, 4 alike
    errors = c.errors()
    assert errors is not None
    assert errors.ratios == tuple(sorted(float(1 + i % 4) for i in range(eta.MIN_CALIBRATION)))
    assert c.spread() == (1.0 / 2.0, 3.0 / 2.0)
    assert c.total() == pytest.approx(2.5)


@pytest.mark.parametrize("estimate", [5e-324, 1e-300, 0.25, math.inf])
def test_no_tenants_estimates_make_the_calibration_infinite_or_undefined(estimate: float) -> None:
    # The calibration is every tenant's: one tenant's jobs estimated at 5e-324 s made every
    # error infinite and every forecast's band NaN, for everyone.
    c = eta.Calibration()
    for _ in range(eta.MIN_CALIBRATION):
        c.saw(estimate, 60.0)
    for _ in range(eta.MIN_CALIBRATION):
        c.saw(600.0, 600.0)
    errors = c.errors()
    assert errors is not None and all(math.isfinite(r) for r in errors.ratios)
    assert all(math.isfinite(x) for x in (*c.spread(), c.total()))
