"""One time base: the deadlines the fold records are log time, and services decide at a ``now``
that never falls behind the log time they have folded, whatever their host's clock says."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from corral.events import subjects
from corral.events.base import Event
from corral.events.decisions import PreemptionRequested, Victim
from corral.events.log import Append, InMemoryLog
from corral.projections.fold import apply_event
from corral.services.runtime.clock import LogClock
from corral.services.runtime.shell import Service
from tests.builders import Cluster, LogBuilder, job, on, placement, queue_spec, whole, worker

N0 = "node-00"


def _victim_and_beneficiary() -> LogBuilder:
    lb = LogBuilder().nodes(Cluster(1)).queue("team-a")
    lb.submit("alice", "v", job().checkpointable()).accept("v").admit("v")
    lb.place(on(N0, 0, job_id="v")).started(N0, "v")
    return lb.submit("bob", "b", job("team-a")).accept("b", priority=10)


@pytest.mark.parametrize("skew", [0.0, 100.0, -100.0], ids=["in-step", "ahead", "behind"])
def test_a_preemption_deadline_is_its_grace_from_where_it_sits_in_the_log(skew: float) -> None:
    """A preemptor whose clock runs ahead (or behind) the stream's grants its 30 s of grace all
    the same: no agent reads the preemptor's clock against its own."""
    lb = _victim_and_beneficiary()
    at = lb.time
    state = lb.preempt("b", "v", decided_at=at + skew).fold()
    assert state.jobs["v"].phase == "checkpointing"
    assert state.jobs["v"].preempt_deadline == at + 30.0


@pytest.mark.parametrize("skew", [0.0, 100.0, -100.0], ids=["in-step", "ahead", "behind"])
def test_a_shrink_deadline_is_log_time_too(skew: float) -> None:
    lb = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8)).queue(queue_spec("team-b", 8))
    lb.submit("alice", "e", job("team-a").replicas(4, minimum=2).checkpointable()).accept("e")
    lb.admit("e", replicas=4).place(placement("e", *(worker(r, N0, whole(r)) for r in range(4))))
    for r in range(4):
        lb.started(N0, "e", rank=r)
    lb.submit("bob", "b", job("team-a").replicas(2)).accept("b", priority=10)
    at = lb.time
    state = lb.shrink("e", 2, "b", decided_at=at + skew).fold()
    assert state.jobs["e"].leaving == [2, 3]
    assert state.jobs["e"].preempt_deadline == at + 30.0


def test_log_time_never_goes_back_when_the_stream_s_clock_does() -> None:
    """A stream leader's clock stepped back (an NTP correction, or a failover to a server whose
    clock lags the last leader's) stamps records before the log time already folded. What the
    fold stamps from them is the log's time so far: a preemption's grace counted from an hour
    back was over before any agent read it, and its victim was killed without its checkpoint,
    and a job placed then had run an hour to every guard."""
    lb = _victim_and_beneficiary()
    newest = lb.time - 1.0  # the last record's time, the newest folded
    lb.at(newest - 3600.0)  # the server's clock goes back an hour
    state = lb.preempt("b", "v").fold()
    assert state.time == newest
    assert state.jobs["v"].phase == "checkpointing"
    assert state.jobs["v"].preempt_deadline == newest + 30.0
    assert state.jobs["v"].phase_since == newest


def test_log_time_never_goes_back_in_the_simulator_s_fold_either() -> None:
    lb = _victim_and_beneficiary()
    newest = lb.time - 1.0
    state = lb.fold()
    body = PreemptionRequested(
        based_on=state.seq, now=newest - 3600.0, beneficiary="b",
        victims=(Victim(job_id="v", attempt=0),), deadline=newest - 3600.0 + 30.0,
    )  # fmt: skip
    apply_event(state, state.seq + 1, subjects.decision("preemptor"), body, newest - 3600.0)
    assert state.jobs["v"].preempt_deadline == newest + 30.0


class Clocks:
    """A host clock and a monotonic one, moved by hand."""

    def __init__(self, wall: float) -> None:
        self.wall = wall
        self.elapsed = 0.0

    def tick(self, seconds: float) -> None:
        self.wall += seconds
        self.elapsed += seconds


def _clock(c: Clocks) -> LogClock:
    return LogClock(lambda: c.wall, lambda: c.elapsed)


def test_with_no_log_time_yet_now_is_the_host_clock() -> None:
    c = Clocks(500.0)
    assert _clock(c).now() == 500.0


def test_a_host_behind_the_log_decides_at_log_time_carried_forward() -> None:
    c = Clocks(1000.0)
    lc = _clock(c)
    lc.saw(1100.0)  # the server's clock is 100 s ahead of this host's
    assert lc.now() == 1100.0
    c.tick(5.0)
    assert lc.now() == 1105.0  # not stuck at the last record on a quiet log
    lc.saw(1103.0)  # an older record (out of order): log time does not go back
    assert lc.now() == 1105.0


def test_a_host_ahead_of_the_log_decides_at_its_own_time() -> None:
    c = Clocks(2000.0)
    lc = _clock(c)
    lc.saw(1000.0)  # e.g. a snapshot's last record, long ago
    assert lc.now() == 2000.0
    c.tick(1.0)
    assert lc.now() == 2001.0


def _records_at(time: float) -> LogBuilder:
    return LogBuilder(start_time=time).queue("team-a").submit("alice", "j1")


async def test_the_shell_never_decides_before_the_log_time_it_folded() -> None:
    seen: list[float] = []

    def decide(state: object, now: float) -> Sequence[Event]:
        seen.append(now)
        return []

    log = InMemoryLog()
    log.now = 5000.0  # the stream's clock
    for r in _records_at(5000.0).records:
        await log.append(Append(r.subject, r.data, headers=r.headers))
    svc = Service("admission", decide, log, clock=lambda: 1000.0)  # a host far behind
    await svc.restore()
    await svc.cycle()
    assert svc.state.time == 5000.0
    assert seen and seen[0] >= 5000.0
