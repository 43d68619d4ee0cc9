"""An idle service does not decide again on a state that has not moved: the same state gets the
same empty answer, until a record is folded or time alone could change it (``wake``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Event
from corral.events.jobs import SubmitJob
from corral.events.log import Append, InMemoryLog
from corral.events.queues import ApplyPriorityClass, PriorityClassSpec
from corral.projections import thrash
from corral.projections.state import JobState, State
from corral.services.preemptor.decide import wake
from corral.services.preemptor.service import CADENCE_S
from corral.services.preemptor.service import service as service_of_preemptor
from corral.services.runtime.shell import Service
from tests.builders import Cluster, LogBuilder, job, on, spec_of


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _counting(calls: list[float]):  # type: ignore[no-untyped-def]
    def decide(state: State, now: float) -> Sequence[Event]:
        calls.append(now)
        return []

    return decide


async def test_a_state_that_has_not_moved_is_not_decided_again_until_quiet_s() -> None:
    calls: list[float] = []
    clock = Clock()
    svc = Service("placer", _counting(calls), InMemoryLog(), clock=clock, quiet_s=30.0)
    await svc.restore()
    await svc.cycle()
    clock.t += 29.0
    await svc.cycle()
    await svc.cycle()
    assert len(calls) == 1 and svc.skipped == 2
    clock.t += 1.0  # quiet_s on: decided again, time alone may have changed something
    await svc.cycle()
    assert len(calls) == 2


async def test_a_folded_record_is_decided_on_at_once() -> None:
    calls: list[float] = []
    log = InMemoryLog()
    svc = Service("placer", _counting(calls), log, clock=Clock(), quiet_s=3600.0)
    await svc.restore()
    await svc.cycle()
    body = SubmitJob(request_id="j1", job=spec_of(job("q")))
    await log.append(Append(subj.request("alice", "submit"), codec.encode(body)))
    svc.fold([r for r in log.records if r.seq > svc.state.seq])
    await svc.cycle()
    assert len(calls) == 2


async def test_wake_brings_the_next_cycle_forward() -> None:
    calls: list[float] = []
    clock = Clock()
    svc = Service(
        "placer",
        _counting(calls),
        InMemoryLog(),
        clock=clock,
        quiet_s=3600.0,
        wake=lambda s, now: 1_010.0 if now < 1_010.0 else 1_010.5,
    )
    await svc.restore()
    await svc.cycle()
    clock.t = 1_009.0
    await svc.cycle()
    assert len(calls) == 1
    clock.t = 1_010.0
    await svc.cycle()
    assert len(calls) == 2
    clock.t = 1_011.0  # a wake half a second on waits for MIN_QUIET_S
    await svc.cycle()
    assert len(calls) == 2
    clock.t = 1_012.0
    await svc.cycle()
    assert len(calls) == 3


async def test_wake_is_asked_only_once_the_state_has_stayed_put() -> None:
    # On a busy log every cycle that finds nothing is followed by a record: when time alone
    # would change the answer is asked only of a state that stayed put, and then once, for the
    # time of the cycle that found nothing.
    calls: list[float] = []
    asked: list[float] = []
    clock = Clock()
    log = InMemoryLog()

    def wake(state: State, now: float) -> float:
        asked.append(now)
        return now + 5.0

    svc = Service("placer", _counting(calls), log, clock=clock, quiet_s=3600.0, wake=wake)
    await svc.restore()
    for i in range(3):
        await svc.cycle()
        body = SubmitJob(request_id=f"j{i}", job=spec_of(job("q")))
        await log.append(Append(subj.request("alice", "submit"), codec.encode(body)))
        svc.fold([r for r in log.records if r.seq > svc.state.seq])
        clock.t += 1.0
    assert len(calls) == 3 and asked == []
    await svc.cycle()  # at 1,003: nothing, and nothing folded after it
    clock.t = 1_007.0
    await svc.cycle()
    await svc.cycle()
    assert len(calls) == 4 and asked == [1_003.0]
    clock.t = 1_008.0  # 1,003 + 5: the wake
    await svc.cycle()
    assert len(calls) == 5


async def test_a_cadence_defers_a_cycle_and_the_wait_ends_when_it_allows() -> None:
    # With a cadence, records folded in between are decided on together once it allows, and
    # the loop waits only until then for the log (not a whole tick); without, at once.
    mono = [100.0]
    calls: list[float] = []
    log = InMemoryLog()
    svc = Service("preemptor", _counting(calls), log, clock=Clock(), tick=1.0, cadence_s=0.5)
    svc.monotonic = lambda: mono[0]
    await svc.restore()

    async def submit(i: int) -> None:
        body = SubmitJob(request_id=f"j{i}", job=spec_of(job("q")))
        await log.append(Append(subj.request("alice", "submit"), codec.encode(body)))
        svc.fold([r for r in log.records if r.seq > svc.state.seq])

    await svc.cycle()
    assert len(calls) == 1 and svc._wait_s() == 1.0
    await submit(0)
    mono[0] = 100.2
    await svc.cycle()  # deferred: 0.3 s to go
    assert len(calls) == 1 and svc._wait_s() == pytest.approx(0.3)
    await submit(1)
    mono[0] = 100.5
    await svc.cycle()
    assert len(calls) == 2 and svc._wait_s() == 1.0
    assert service_of_preemptor(InMemoryLog()).cadence_s == CADENCE_S > 0


GUARDED = PriorityClassSpec("normal", 0, min_runtime_s=300.0, cooldown_s=600.0, max_preemptions_per_hour=2)


def _running(since: float, preempted_at: tuple[float, ...] = ()) -> JobState:
    return JobState(
        id="j",
        tenant="t",
        spec=spec_of(job("q")),
        submitted_seq=1,
        submitted_at=0.0,
        phase="running",
        phase_since=since,
        preempted_at=preempted_at,
        preemptions=len(preempted_at),
    )


@pytest.mark.parametrize(
    ("since", "preempted_at", "now", "lifts"),
    [
        pytest.param(900.0, (), 1_000.0, 1_200.0, id="min-runtime"),
        pytest.param(0.0, (), 1_000.0, 1_000.0, id="not-protected"),
        pytest.param(0.0, (700.0,), 1_000.0, 1_300.0, id="cooldown"),
        pytest.param(0.0, (100.0, 200.0), 1_000.0, 3_700.0, id="two-in-the-hour"),
        pytest.param(950.0, (100.0, 200.0), 1_000.0, 3_700.0, id="the-latest-of-all"),
    ],
)
def test_when_a_guard_lifts(since: float, preempted_at: tuple[float, ...], now: float, lifts: float) -> None:
    j = _running(since, preempted_at)
    at = thrash.lifts_at(j, GUARDED, now)
    assert at == lifts
    assert (thrash.guard(j, GUARDED, at) is None) and (
        at == now or thrash.guard(j, GUARDED, at - 1.0) is not None
    )


def test_a_lifetime_cap_never_lifts() -> None:
    capped = PriorityClassSpec("normal", 0, max_preemptions=1)
    assert thrash.lifts_at(_running(0.0, (10.0,)), capped, 1_000.0) == math.inf


@pytest.mark.parametrize("preempted_at", [(), (10.0,)], ids=["never-preempted", "preempted"])
def test_a_cap_of_none_an_hour_never_lifts(preempted_at: tuple[float, ...]) -> None:
    # The fold takes a cap of 0 ("0 or more"): with no time in the hour to wait out, the
    # preemptor's wake indexed an empty list and raised on every idle cycle.
    never = PriorityClassSpec("normal", 0, max_preemptions_per_hour=0)
    assert thrash.lifts_at(_running(0.0, preempted_at), never, 1_000.0) == math.inf


def test_the_preemptor_wakes_when_a_running_jobs_guard_lifts() -> None:
    lb = (
        LogBuilder()
        .nodes(Cluster(1))
        .admin("priority-class", ApplyPriorityClass(priority_class=GUARDED))
        .queue("q")
    )
    lb.at(1_000.0).submit(
        "alice", "j", job("q").gpus(8).priority_class("normal").checkpointable().preemptible()
    )
    lb.accept("j").admit("j").place(on("node-00", *range(8), job_id="j")).started("node-00", "j")
    state = lb.fold()
    start = state.jobs["j"].phase_since
    assert wake(state, start + 10.0) == start + 300.0
    assert wake(state, start + 400.0) == math.inf  # nothing protected any more
