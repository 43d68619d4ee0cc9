"""Tiresias's 2D-LAS as the Philly replay runs it (``services/sim/tiresias.py``): which queue a
job is in by the GPU-time it has had, when it comes back up, and who the walk starts and stops;
then the whole role on the simulator, through the fold."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from corral.events.decisions import PreemptionRequested
from corral.events.jobs import JobPriorityChanged, JobSpec, Resources
from corral.events.queues import ApplyPriorityClass, ApplyQueue, QueueSpec, Quota
from corral.projections.state import JobState
from corral.services.agent import inventory
from corral.services.sim import tiresias
from corral.services.sim.driver import AgentModel, SimConfig, SimJob, Simulation
from corral.services.sim.tiresias import HIGH, LOW, Candidate, Service, TiresiasConfig
from tests.builders import TRAIN

CONFIG = TiresiasConfig(threshold_gpu_s=3600.0, promote_knob=8.0)

# -- which queue -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "gpus", "now", "queue"),
    [
        (Service(gpu_s=3599.0), 1, 0.0, HIGH),
        (Service(gpu_s=3600.0), 1, 0.0, LOW),
        (Service(running_since=0.0), 8, 449.0, HIGH),
        (Service(running_since=0.0), 8, 450.0, LOW),  # 8 GPUs x 450 s: the second dimension
        (Service(running_since=0.0), 1, 3599.0, HIGH),  # 1 GPU for as long stays up
        (Service(gpu_s=1800.0, running_since=100.0), 2, 1000.0, LOW),  # past attempts count
    ],
    ids=["below", "at-threshold", "8-gpus-just-below", "8-gpus-at", "1-gpu-same-time", "over-attempts"],
)
def test_a_job_of_the_high_queue_drops_once_its_gpu_time_reaches_the_threshold(
    service: Service, gpus: int, now: float, queue: int
) -> None:
    assert tiresias.queue_of(HIGH, service, gpus, now, CONFIG) == queue


@pytest.mark.parametrize(
    ("service", "now", "config", "queue"),
    [
        (Service(run_s=100.0, waiting_since=0.0), 799.0, CONFIG, LOW),
        (Service(run_s=100.0, waiting_since=0.0), 800.0, CONFIG, HIGH),  # waited 8 x what it ran
        (Service(run_s=100.0, waited_s=500.0, waiting_since=0.0), 300.0, CONFIG, HIGH),  # waits add up
        (Service(run_s=100.0, running_since=0.0), 10_000.0, CONFIG, LOW),  # running: not starving
        (Service(), 10_000.0, CONFIG, LOW),  # never ran: nothing to compare with
        (Service(run_s=100.0, waiting_since=0.0), 1e9, TiresiasConfig(promote_knob=0), LOW),
    ],
    ids=["waited-less", "waited-knob-times", "earlier-waits-count", "running", "never-ran", "knob-off"],
)
def test_a_job_of_the_low_queue_comes_back_up_after_waiting_knob_times_as_long_as_it_ran(
    service: Service, now: float, config: TiresiasConfig, queue: int
) -> None:
    assert tiresias.queue_of(LOW, service, 4, now, config) == queue


def job_state(phase: str, since: float = 0.0, preempted_at: tuple[float, ...] = ()) -> JobState:
    spec = JobSpec(queue="tiresias", resources=Resources(gpus=2), command=TRAIN)
    return JobState(
        id="j", tenant="t", spec=spec, submitted_seq=1, submitted_at=0.0, phase=phase,  # type: ignore[arg-type]
        phase_since=since, preempted_at=preempted_at,
    )  # fmt: skip


def test_service_counts_the_runs_until_their_stops_and_the_waits_between() -> None:
    s = tiresias.observe(Service(), job_state("running", since=10.0), 2, 50.0)
    assert s.running_since == 10.0 and s.attained(2, 50.0) == 80.0
    s = tiresias.observe(s, job_state("queued", since=130.0, preempted_at=(100.0,)), 2, 200.0)
    assert (s.gpu_s, s.run_s, s.running_since, s.waiting_since) == (180.0, 90.0, None, 100.0)
    s = tiresias.observe(s, job_state("running", since=400.0, preempted_at=(100.0,)), 2, 450.0)
    assert (s.waited_s, s.waiting_since, s.attained(2, 450.0)) == (300.0, None, 280.0)


# -- the walk --------------------------------------------------------------------------------------


def running(job_id: str, queue: int, at: int, on: str, gpus: int = 8) -> Candidate:
    return Candidate(job_id, queue, (at, job_id), 1, gpus, ((on, gpus),))


def waiting(job_id: str, queue: int, at: int, gpus: int = 8, workers: int = 1) -> Candidate:
    return Candidate(job_id, queue, (at, job_id), workers, gpus)


def nodes(*names: str, each: int = 8) -> dict[str, int]:
    return dict.fromkeys(names, each)


CASES = [
    # (candidates, room, idle, started, stopped {victim: for}, held)
    pytest.param(
        [waiting("h", HIGH, 5)], nodes("a"), nodes("a"), {"h": ("a",)}, {}, [], id="idle-gpus-start-a-job"
    ),
    pytest.param(
        [running("l1", LOW, 1, "a"), running("l2", LOW, 2, "b"), waiting("h", HIGH, 5)],
        nodes("a", "b"),
        nodes("a", "b", each=0),
        {},
        {"l2": "h"},
        ["h"],
        id="high-queue-stops-the-last-of-the-low-queue",
    ),
    pytest.param(
        [running("h1", HIGH, 1, "a"), waiting("h2", HIGH, 5)],
        nodes("a"),
        nodes("a", each=0),
        {},
        {},
        [],
        id="no-stop-within-the-high-queue",
    ),
    pytest.param(
        [running("l1", LOW, 1, "a"), waiting("l0", LOW, 0)],
        nodes("a"),
        nodes("a", each=0),
        {},
        {},
        [],
        id="no-stop-within-the-low-queue-even-for-an-earlier-job",
    ),
    pytest.param(
        [waiting("second", HIGH, 2), waiting("first", HIGH, 1)],
        nodes("a"),
        nodes("a"),
        {"first": ("a",)},
        {},
        [],
        id="fifo-within-a-queue",
    ),
    pytest.param(
        [waiting("low", LOW, 1), waiting("high", HIGH, 9)],
        nodes("a"),
        nodes("a"),
        {"high": ("a",)},
        {},
        [],
        id="high-queue-before-low-whatever-the-arrival",
    ),
    pytest.param(
        [waiting("big", HIGH, 1, gpus=8, workers=2), waiting("small", HIGH, 2, gpus=4)],
        nodes("a"),
        nodes("a"),
        {"small": ("a",)},
        {},
        [],
        id="a-job-that-does-not-fit-is-skipped-not-waited-for",
    ),
    pytest.param(
        [running("l", LOW, 1, "b"), waiting("h", HIGH, 5, gpus=4)],
        nodes("a", "b"),
        {"a": 4, "b": 0},
        {"h": ("a",)},
        {},
        [],
        id="idle-gpus-before-stopping-anyone",
    ),
    pytest.param(
        [waiting("gang", HIGH, 1, gpus=4, workers=2)],
        nodes("a", "b"),
        {"a": 8, "b": 8},
        {"gang": ("a", "a")},
        {},
        [],
        id="a-gang-on-as-few-nodes-as-it-can",
    ),
    pytest.param(
        [waiting("one", HIGH, 1, gpus=2)],
        {"a": 8, "b": 3},  # 5 GPUs of b are a job's nobody may stop
        {"a": 8, "b": 3},
        {"one": ("b",)},
        {},
        [],
        id="best-fit",
    ),
    pytest.param(
        [running("l", LOW, 1, "a", gpus=4), waiting("h", HIGH, 5, gpus=8), waiting("l2", LOW, 6, gpus=4)],
        nodes("a"),
        {"a": 4},
        {},
        {"l": "h"},
        ["h"],
        id="room-kept-for-the-stopped-jobs-beneficiary",
    ),
]


@pytest.mark.parametrize(("candidates", "room", "idle", "started", "stopped", "held"), CASES)
def test_the_walk(
    candidates: list[Candidate],
    room: dict[str, int],
    idle: dict[str, int],
    started: dict[str, tuple[str, ...]],
    stopped: dict[str, str],
    held: list[str],
) -> None:
    got = tiresias.plan(candidates, room, idle)
    assert (got.start, got.stop, got.held) == (started, stopped, held)


def test_a_job_the_fold_would_not_stop_again_keeps_its_gpus_and_its_taker_waits() -> None:
    """Job "l" was stopped for "h" before (and neither's priority changed since): the fold refuses
    that stop again, so the walk does not ask it; "h" keeps the room and waits, "l2" gets none."""
    walk = [running("l", LOW, 1, "a"), waiting("h", HIGH, 5), waiting("l2", LOW, 6, gpus=1)]
    got = tiresias.plan(walk, nodes("a"), nodes("a", each=0), may_stop=lambda v, b: (v, b) != ("l", "h"))
    assert (got.start, got.stop, got.held) == ({}, {}, ["h"])
    other = tiresias.plan(walk, nodes("a"), nodes("a", each=0), may_stop=lambda v, b: True)
    assert (other.stop, other.held) == ({"l": "h"}, ["h"])


def test_a_job_waiting_for_stops_under_way_stops_nobody_else() -> None:
    """Its victim on b checkpoints (b's GPUs leaving); the job of the low queue on a keeps running."""
    walk = [running("l", LOW, 1, "a"), waiting("h", HIGH, 5)]
    got = tiresias.plan(walk, nodes("a", "b"), nodes("a", "b", each=0), leaving={"b": 8})
    assert (got.start, got.stop, got.held) == ({}, {}, ["h"])


# -- the role on the simulator ---------------------------------------------------------------------

AGENTS = AgentModel(checkpoint_interval_s=600.0, checkpoint_save_s=30.0)


def setup() -> list[object]:
    queue = QueueSpec("tiresias", quotas={"*": Quota(nominal=8)})
    return [ApplyPriorityClass(priority_class=tiresias_class()), ApplyQueue(queue=queue)]


def tiresias_class():  # type: ignore[no-untyped-def]
    from corral.services.sim.philly import TIRESIAS_CLASS

    return TIRESIAS_CLASS


def job(
    job_id: str, gpus: int, arrival: float, work: float, saves: bool = True, estimate: bool = False
) -> SimJob:
    spec = JobSpec(
        queue="tiresias",
        priority_class="tiresias",
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
        checkpointable=saves,
        preemptible=saves,
        grace_seconds=60.0,
        runtime_estimate_s=work if estimate else None,
        command=TRAIN,
    )
    return SimJob(job_id, "team", spec, arrival, work)


def simulate(jobs: list[SimJob], config: TiresiasConfig = CONFIG) -> Simulation:
    cfg = SimConfig(scheduler=lambda: tiresias.Tiresias(config), agents=AGENTS)
    sim = Simulation(list(inventory.cluster(1, "h100-8x")), setup(), jobs, cfg, record=True).run()  # type: ignore[arg-type]
    assert sim.state.void_total == 0 and sim.state.faults == 0, sim.state.rejections
    assert not sim.unfinished()
    return sim


def bodies(sim: Simulation, kind: type) -> list:  # type: ignore[type-arg]
    return [r.body for r in sim.records or () if isinstance(r.body, kind)]


def test_a_long_job_drops_and_is_stopped_for_a_new_one_which_runs_at_once() -> None:
    # 8 GPUs for 450 s is the threshold; the new job arrives at 1000 s
    sim = simulate([job("long", 8, 0.0, 5000.0), job("new", 8, 1000.0, 100.0)])
    down = bodies(sim, JobPriorityChanged)
    assert [(c.job_id, c.priority) for c in down] == [("long", LOW)]
    stops = bodies(sim, PreemptionRequested)
    assert [(p.beneficiary, [v.job_id for v in p.victims]) for p in stops] == [("new", ["long"])]
    assert sim.stats["new"].first_start == 1030.0  # long saved its work for 30 s
    assert sim.stats["long"].preemptions == 1
    assert sim.stats["long"].finished == 1130.0 + (5000.0 - 1000.0)


def test_a_job_that_cannot_checkpoint_is_never_stopped() -> None:
    sim = simulate([job("long", 8, 0.0, 5000.0, saves=False), job("new", 8, 1000.0, 100.0)])
    assert not bodies(sim, PreemptionRequested)
    assert sim.stats["new"].first_start == 5000.0


def test_a_starving_job_comes_back_up_and_stops_the_one_that_starved_it() -> None:
    # "a" runs 1,000 s (8,000 GPU-s: low queue) and is stopped for "b" at 1,000 s; "b" drops to
    # the low queue 450 s after it starts, and keeps the node: "a" waits, also in the low queue,
    # until it has waited 8 x the 1,000 s it ran (at 9,000 s), comes back up and stops "b".
    sim = simulate([job("a", 8, 0.0, 3000.0), job("b", 8, 1000.0, 20_000.0)])
    changes = [(c.job_id, c.priority) for c in bodies(sim, JobPriorityChanged)]
    assert changes[:3] == [("a", LOW), ("b", LOW), ("a", HIGH)]
    promoted = next(
        r for r in sim.records or () if isinstance(r.body, JobPriorityChanged) and r.body.priority == HIGH
    )
    assert promoted.time == 9000.0  # the role asked to decide again when "a" would be starving
    stops = [(p.beneficiary, [v.job_id for v in p.victims]) for p in bodies(sim, PreemptionRequested)]
    assert stops[:2] == [("b", ["a"]), ("a", ["b"])]
    assert sim.stats["a"].finished == 9030.0 + 2000.0


def test_a_job_starved_back_up_does_not_ask_again_for_a_stop_the_fold_refused() -> None:
    """j08 stops j04 (and others) when it comes back up starving, but j10, older and back up too,
    takes the GPUs first; j04 runs again. j08 may not stop j04 a second time (neither's
    priority changed): the role once asked it again at every pass of the same instant, void each
    time, and the simulation never settled. Now j08 waits for j04, and nothing is void
    (``simulate``)."""
    shape = [
        (8, 9561, 6323, True), (4, 4118, 4556, True), (2, 15411, 951, False), (8, 8863, 4423, True),
        (4, 1666, 11333, True), (2, 8146, 11287, True), (1, 6866, 4939, True), (1, 13359, 7544, True),
        (8, 2683, 16318, True), (1, 15189, 5457, False), (4, 2422, 19406, True), (2, 15007, 4571, True),
    ]  # fmt: skip
    sim = simulate([job(f"j{i:02d}", g, at, work, saves) for i, (g, at, work, saves) in enumerate(shape)])
    stops = [(p.beneficiary, [v.job_id for v in p.victims]) for p in bodies(sim, PreemptionRequested)]
    # Once as j08 first came, once after its promotion changed its priority, never a third time.
    assert sum(1 for b, victims in stops if b == "j08" and "j04" in victims) == 2
    assert sim.stats["j08"].first_start is not None


def test_runtime_estimates_change_no_decision() -> None:
    def run(estimate: bool) -> list[bytes]:
        jobs = [
            job(f"j{i}", (1, 2, 4, 8)[i % 4], 50.0 * i, 300.0 + 97 * i, estimate=estimate) for i in range(12)
        ]
        sim = simulate(jobs)
        return [msgspec.json.encode(r.body) for r in sim.records or () if r.source == "scheduler"]

    assert run(True) == run(False)


def test_a_fresh_role_reads_a_jobs_service_from_the_state() -> None:
    """What the role remembers between cycles it can read again from the state: a fresh one,
    on a run in progress, finds the running job's service and demotes it."""
    sim = Simulation(
        list(inventory.cluster(1, "h100-8x")),  # type: ignore[arg-type]
        setup(),
        [job("long", 8, 0.0, 5000.0), job("new", 8, 1000.0, 100.0)],
        SimConfig(scheduler=lambda: tiresias.Tiresias(CONFIG), agents=AGENTS),
    )
    sim.run(until=999.0)
    cycle = tiresias.decide(sim.state, 999.0, {}, CONFIG)
    assert cycle.services["long"] == replace(Service(), running_since=0.0)
    assert [type(e).__name__ for e in cycle.events] == ["JobPriorityChanged"]  # 8 x 999 s: low queue
    assert cycle.wake_at is None  # a running job of the low queue changes queue by no clock
