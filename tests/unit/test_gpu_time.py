"""GPU time held per queue, decayed: the arithmetic (``projections.gpu_time``) and what the fold
records from a log (events in, GPU time out).

The expected figures are worked out apart from the fold's incremental bookkeeping: for a fixed
half-life ``h``, holding ``m`` milli-GPU from ``start`` to ``end`` adds, at ``now``,
``m * h / ln 2 * (2 ** (-(now - end) / h) - 2 ** (-(now - start) / h))``, the integral of the
weight ``2 ** (-(now - s) / h)`` over the time held; a queue's GPU time is the sum over what
its jobs held."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from corral.events.decisions import GpuClaim
from corral.events.queues import QueueSpec, Quota
from corral.projections import gpu_time
from corral.projections.quota import ANY
from corral.projections.state import GpuTime, State
from corral.services.query.queues import queue_rows
from tests.builders import AMPLE, Cluster, LogBuilder, job, on, placement, running, whole, worker

HOUR = 3600.0
LN2 = math.log(2)
T0 = 100.0  # when the first job of each story is placed


def integral(held: list[tuple[float, float, int]], now: float, half_life: float) -> float:
    """Decayed milli-GPU-seconds at ``now`` of (start, end, milli-GPU) holdings, by definition."""
    w = half_life / LN2
    return math.fsum(
        m * w * (2 ** (-(now - end) / half_life) - 2 ** (-(now - start) / half_life))
        for start, end, m in held
    )


# -- the arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "holding", "elapsed", "half_life", "expected"),
    [
        pytest.param(0.0, 1000.0, HOUR, HOUR, 1000.0 * HOUR / LN2 / 2, id="one GPU held for one half-life"),
        pytest.param(8.0e6, 0.0, HOUR, HOUR, 4.0e6, id="nothing held: halves every half-life"),
        pytest.param(8.0e6, 0.0, 3 * HOUR, HOUR, 1.0e6, id="three half-lives: an eighth"),
        pytest.param(5.0, 1000.0, 0.0, HOUR, 5.0, id="no time: unchanged"),
        pytest.param(5.0, 1000.0, -60.0, HOUR, 5.0, id="a record stamped earlier counts no time"),
        pytest.param(0.0, 1000.0, 1e-6, 86400.0, 1e-3, id="a microsecond: no cancellation"),
        pytest.param(7.0, 250.0, 10.0, math.inf, 2507.0, id="infinite half-life: GPU-seconds summed"),
    ],
)
def test_decay(value: float, holding: float, elapsed: float, half_life: float, expected: float) -> None:
    assert gpu_time.decayed(value, holding, elapsed, half_life) == pytest.approx(expected, rel=1e-12)


def test_holding_for_ever_counts_as_what_is_held() -> None:
    g = GpuTime(decayed=0.0, at=0.0, holding=8000)
    assert gpu_time.recent(g, 100 * HOUR, HOUR) == pytest.approx(8000.0)
    assert gpu_time.recent(g, HOUR, HOUR) == pytest.approx(4000.0)  # half of it in the last hour


# -- the fold: events in, GPU time out -------------------------------------------------------------


def base(half_life: float = HOUR, queue: QueueSpec | str = "team-a") -> LogBuilder:
    """One 8-GPU node, one queue, the half-life set; records at the same time until ``at``."""
    return LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1)).queue(queue).fair_share(half_life)


def held_once(log: LogBuilder) -> list[tuple[float, float, int]]:
    running("j1", job(), log=log.at(T0)).at(T0 + HOUR).exited("node-00", "j1")
    return [(T0, T0 + HOUR, 1000)]


def two_attempts(log: LogBuilder) -> list[tuple[float, float, int]]:
    running("j1", job().restarts(1), log=log.at(T0))
    log.at(T0 + HOUR).exited("node-00", "j1", code=1).requeue("j1", 0).admit("j1", attempt=1)
    log.at(T0 + 2 * HOUR).place(on("node-00", 3, job_id="j1", attempt=1)).started("node-00", "j1", attempt=1)
    log.at(T0 + 2.5 * HOUR).exited("node-00", "j1", attempt=1)
    return [(T0, T0 + HOUR, 1000), (T0 + 2 * HOUR, T0 + 2.5 * HOUR, 1000)]


def preempted_and_requeued(log: LogBuilder) -> list[tuple[float, float, int]]:
    running("low", job().gpus(2).checkpointable(), log=log.at(T0), gpus=(0, 1))
    log.at(T0 + HOUR).submit("bob", "urgent", job()).accept("urgent", priority=100).preempt("urgent", "low")
    log.at(T0 + HOUR + 30).exited("node-00", "low", code=0, stopped=True).requeue("low", 0, "preempted")
    log.admit("low", attempt=1).at(T0 + 3 * HOUR).place(on("node-00", 4, 5, job_id="low", attempt=1))
    log.started("node-00", "low", attempt=1).at(T0 + 4 * HOUR).exited("node-00", "low", attempt=1)
    return [(T0, T0 + HOUR + 30, 2000), (T0 + 3 * HOUR, T0 + 4 * HOUR, 2000)]


def requeued_while_a_worker_holds(log: LogBuilder) -> list[tuple[float, float, int]]:
    """Rank 1 of a gang dies and the job is requeued, which clears its admission, while rank 0
    still runs on the gang's GPUs: they are held, on the key they were placed under, until it
    exits."""
    log.at(T0).submit("alice", "g", job().replicas(2).restarts(1)).accept("g").admit("g", replicas=2)
    log.place(placement("g", worker(0, "node-00", whole(0)), worker(1, "node-00", whole(1))))
    log.started("node-00", "g", rank=0).started("node-00", "g", rank=1)
    log.at(T0 + HOUR).exited("node-00", "g", rank=1, code=1).requeue("g", 0)
    log.at(T0 + 1.5 * HOUR).exited("node-00", "g", rank=0, code=143)
    return [(T0, T0 + 1.5 * HOUR, 2000)]


def shrunk(log: LogBuilder) -> list[tuple[float, float, int]]:
    """An elastic job of three shrinks to one: each rank leaving holds its GPU until it exits."""
    log.at(T0).submit("alice", "el", job().replicas(3, minimum=1)).accept("el").admit("el", replicas=3)
    log.place(placement("el", *(worker(r, "node-00", whole(r)) for r in range(3))))
    for r in range(3):
        log.started("node-00", "el", rank=r)
    log.at(T0 + HOUR).submit("bob", "b", job()).accept("b", priority=50).shrink("el", 1, "b")
    log.at(T0 + HOUR + 10).exited("node-00", "el", rank=2, code=143, stopped=True)
    log.at(T0 + HOUR + 20).exited("node-00", "el", rank=1, code=143, stopped=True)
    log.at(T0 + 2 * HOUR).exited("node-00", "el", rank=0)
    return [(T0, T0 + 2 * HOUR, 1000), (T0, T0 + HOUR + 20, 1000), (T0, T0 + HOUR + 10, 1000)]


def grown(log: LogBuilder) -> list[tuple[float, float, int]]:
    log.at(T0).submit("alice", "el", job().replicas(3, minimum=1)).accept("el").admit("el", replicas=1)
    log.place(placement("el", worker(0, "node-00", whole(0)))).started("node-00", "el")
    log.at(T0 + 0.5 * HOUR).grow("el", 3)
    log.place(placement("el", *(worker(r, "node-00", whole(r)) for r in range(3))))
    log.started("node-00", "el", rank=1).started("node-00", "el", rank=2)
    log.at(T0 + HOUR).request("alice", "cancel", {"job_id": "el"})
    for r in range(3):
        log.exited("node-00", "el", rank=r, code=143, stopped=True)
    return [(T0, T0 + HOUR, 1000), (T0 + 0.5 * HOUR, T0 + HOUR, 2000)]


def shared(log: LogBuilder) -> list[tuple[float, float, int]]:
    """A quarter of a GPU counts as a quarter, as quota charges it."""
    log.at(T0).submit("alice", "f", job().milli(250)).accept("f").admit("f")
    log.place(placement("f", worker(0, "node-00", GpuClaim(0, milli=250)))).started("node-00", "f")
    log.at(T0 + HOUR).exited("node-00", "f")
    return [(T0, T0 + HOUR, 250)]


Story = Callable[[LogBuilder], list[tuple[float, float, int]]]


@dataclass(frozen=True)
class Case:
    story: Story
    half_life: float = HOUR


CASES = {
    "one job held 1 h, half-life 1 h": Case(held_once),
    "the same, half-life 1 day": Case(held_once, 86400.0),
    "two attempts": Case(two_attempts),
    "preempted and requeued": Case(preempted_and_requeued),
    "requeued while a worker holds its GPUs": Case(requeued_while_a_worker_holds),
    "an elastic job shrinks": Case(shrunk),
    "an elastic job grows": Case(grown),
    "a shared GPU": Case(shared),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_fold_records_the_gpu_time_each_attempt_held(case: Case) -> None:
    log = base(case.half_life)
    held = case.story(log)
    state = log.fold()
    assert state.rejected_total == 0, state.rejections
    (g,) = state.gpu_time["team-a"].values()
    assert g.holding == 0  # all given back
    end = max(e for _, e, _ in held)
    for now in (end, end + HOUR, end + 10 * HOUR):  # read at any later time, stored nowhere
        assert gpu_time.at(g, now, case.half_life) == pytest.approx(
            integral(held, now, case.half_life), rel=1e-9
        )
    assert all(j.held is None and j.held_milli == 0 and j.held_key == "" for j in state.jobs.values())


def test_one_gpu_held_one_half_life_counts_half_a_gpu() -> None:
    log = base(HOUR)
    held_once(log)
    g = log.fold().gpu_time["team-a"][ANY]
    assert gpu_time.recent(g, T0 + HOUR, HOUR) == pytest.approx(500.0)
    assert gpu_time.recent(g, T0 + 2 * HOUR, HOUR) == pytest.approx(250.0)


def test_what_is_held_now_counts_up_to_the_reading() -> None:
    state = running("j1", job().gpus(2), log=base(HOUR).at(T0), gpus=(0, 1)).fold()
    g = state.gpu_time["team-a"][ANY]
    assert g.holding == 2000 and state.jobs["j1"].held_milli == 2000
    assert gpu_time.at(g, T0 + HOUR, HOUR) == pytest.approx(
        integral([(T0, T0 + HOUR, 2000)], T0 + HOUR, HOUR)
    )


def test_a_change_of_half_life_keeps_what_was_held_lately_and_decays_at_the_new_rate() -> None:
    log = base(HOUR)
    running("j1", job(), log=log.at(T0))
    log.at(T0 + HOUR).fair_share(2 * HOUR)
    state = log.fold()
    g = state.gpu_time["team-a"][ANY]
    # At the change: half a GPU held lately under a 1 h half-life, read so under the 2 h one too
    # (it read a quarter, and 2 GPUs after a change from 2 h to 1 h: history jumped by old / new).
    assert gpu_time.recent(g, T0 + HOUR, 2 * HOUR) == pytest.approx(500.0)
    log.at(T0 + 3 * HOUR).exited("node-00", "j1")
    state = log.fold()
    assert state.fair_share.half_life_s == 2 * HOUR
    g = state.gpu_time["team-a"][ANY]
    # Two hours on at a 2 h half-life, the GPU held all along: half the way from 0.5 to 1.
    assert gpu_time.recent(g, T0 + 3 * HOUR, 2 * HOUR) == pytest.approx(750.0)
    # Back to 1 h, and a queue that held nothing still holds nothing.
    log.at(T0 + 3 * HOUR).fair_share(HOUR)
    g = log.fold().gpu_time["team-a"][ANY]
    assert gpu_time.recent(g, T0 + 3 * HOUR, HOUR) == pytest.approx(750.0)


def test_gpu_time_counts_on_the_quota_key_the_job_was_placed_under() -> None:
    q = QueueSpec("team-a", quotas={"H100-80GB": Quota(AMPLE), ANY: Quota(AMPLE)})
    log = base(HOUR, q)
    running("j1", job().models("H100-80GB"), log=log.at(T0))
    state = log.fold()
    assert set(state.gpu_time["team-a"]) == {"H100-80GB"}
    assert state.jobs["j1"].held_key == "H100-80GB"


def test_a_half_life_must_be_a_positive_number_of_seconds() -> None:
    for bad in (0.0, -5.0):
        state = base(HOUR).fair_share(bad).fold()
        assert state.fair_share.half_life_s == HOUR
        assert state.rejections[-1].code == "malformed"


def test_never_set_the_half_life_is_a_day() -> None:
    assert State().fair_share.half_life_s == 86400.0


def test_corral_queues_shows_the_gpus_a_queue_held_recently() -> None:
    log = base(HOUR)
    held_once(log)
    (row,) = queue_rows(log.fold())  # as of the last record: the job's exit, one half-life on
    assert (row["queue"], row["used"], row["recent"]) == ("team-a", 0, 0.5)


def test_a_deleted_queue_takes_its_gpu_time_with_it() -> None:
    # Kept for every queue that ever ran a job: a cluster whose queues come and go grew every
    # folding process's state by one entry a queue, and a queue made again under the name
    # inherited a history that was not its own.
    from corral.events.queues import DeleteQueue

    log = base()
    held_once(log)
    assert set(log.fold().gpu_time) == {"team-a"}
    log.admin("delete-queue", DeleteQueue(name="team-a"))
    state = log.fold()
    assert "team-a" not in state.queues and state.gpu_time == {}, state.rejections
    assert log.queue("team-a").fold().gpu_time == {}
