"""The placement timeout: an admitted job the placer finds no room for gives its quota back after
``AdmissionConfig.placement_timeout_s`` of log time, and sits out ``placement_backoff_s``
before it is admitted again (Kueue's ``waitForPodsReady`` timeout and requeue back-off). Driven
through ``decide`` and the fold, cycle by cycle, every decision appended to the log it was made
from."""

from __future__ import annotations

import math

import pytest

from corral.events import routing
from corral.events.base import Event, Reason
from corral.events.decisions import GpuClaim, Placement, PreemptionRequested, WorkerSlot
from corral.events.jobs import AdmissionWithdrawn, PendingReasonChanged, Resources
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec
from corral.projections.queueing import MAX_BACKOFF_S
from corral.projections.state import State
from corral.services.admission.decide import AdmissionConfig, decide, wake
from corral.services.agent.inventory import h100_8x_nvswitch
from corral.services.placer.backfill import Reservation
from corral.services.preemptor.decide import decide as preemptor_decide
from corral.services.sim.driver import SimConfig, SimJob, Simulation
from tests.builders import LogBuilder, job, on, queue_spec
from tests.unit.test_admission_hosts import admitted, of

TIMEOUT, BACKOFF = 600.0, 900.0
CONFIG = AdmissionConfig(placement_timeout_s=TIMEOUT, placement_backoff_s=BACKOFF)
NO_ROOM = Reason("gpus", "no free GPU suits 8 GPUs", True)


def cycle(lb: LogBuilder, now: float, config: AdmissionConfig = CONFIG) -> tuple[list[Event], State]:
    """One admission cycle at log time ``now``; its events are appended to the log, stamped
    ``now``, and the state after them is returned."""
    lb.at(now)
    state = lb.fold()
    events = decide(state, now, config)
    for e in events:
        lb.event(routing.subject_of(e), e)
    after = lb.fold()
    assert after.faults == 0 and after.void_total == 0, after.rejections[-1:]
    return events, after


def fragmented(reason: Reason = NO_ROOM) -> tuple[LogBuilder, float]:
    """One node of 8 GPUs, queue team-a of 9: ``small`` runs on GPU 0, ``wide`` (8 GPUs) is
    admitted beside it and fits nowhere (the placer says ``reason``), and ``next`` (1 GPU) waits
    for quota that ``wide`` holds idle. Returns the log and when ``wide`` was admitted."""
    lb = LogBuilder().node("n0", h100_8x_nvswitch("n0")).queue(queue_spec("team-a", nominal=9))
    lb.submit("alice", "small", job().gpus(1)).accept("small").admit("small")
    lb.place(on("n0", 0, job_id="small")).started("n0", "small")
    lb.submit("alice", "wide", job().gpus(8)).accept("wide")
    admitted_at = lb.time
    lb.admit("wide")
    said = PendingReasonChanged(job_id="wide", reasons=(reason,))
    lb.event(routing.subject_of(said), said)
    lb.submit("alice", "next", job().gpus(1)).accept("next")
    return lb, admitted_at


def test_an_admission_placed_nowhere_is_withdrawn_at_the_timeout_and_backs_off() -> None:
    lb, t0 = fragmented()
    events, state = cycle(lb, t0 + TIMEOUT - 1)
    assert of(events, AdmissionWithdrawn) == [] and admitted(events) == []
    assert state.jobs["wide"].phase == "admitted"

    now = t0 + TIMEOUT
    events, state = cycle(lb, now)
    (withdrawn,) = of(events, AdmissionWithdrawn)
    assert withdrawn.job_id == "wide" and withdrawn.admit_after == now + BACKOFF
    assert withdrawn.reason.code == "placement-timeout"
    assert "no free GPU suits 8 GPUs" in withdrawn.reason.message
    wide = state.jobs["wide"]
    assert (wide.phase, wide.attempt, wide.admission) == ("queued", 0, None)
    assert wide.reasons == (withdrawn.reason,)

    # The quota it gave back goes to the job behind it, not back to it.
    events, state = cycle(lb, now + 60)
    assert admitted(events) == ["next"]
    assert state.jobs["wide"].reasons == (withdrawn.reason,)  # it keeps why it waits

    # Its back-off over, it is admitted again once its queue's quota allows.
    lb.place(on("n0", 1, job_id="next")).started("n0", "next")
    lb.exited("n0", "small", code=0)
    events, _ = cycle(lb, now + BACKOFF - 1)
    assert admitted(events) == []
    events, state = cycle(lb, now + BACKOFF)
    assert admitted(events) == ["wide"]
    assert state.jobs["wide"].phase == "admitted"


def test_the_job_the_reservation_is_for_keeps_its_admission() -> None:
    """It starts as soon as the reserved GPUs free: withdrawing it would only let it starve."""
    lb, t0 = fragmented(Reason("reserved", "holds a reservation on 8 GPUs of n0, free at t=9000", True))
    events, state = cycle(lb, t0 + 10 * TIMEOUT)
    assert of(events, AdmissionWithdrawn) == []
    assert state.jobs["wide"].phase == "admitted"


def test_a_reservation_with_no_start_in_sight_times_out() -> None:
    """Its reserved GPUs are held by jobs with no runtime estimate: one that may not be preempted
    may hold them for good, and the job kept its queue's quota idle for ever while jobs that
    fit the free GPUs waited for it."""
    untimed = Reason("reserved-untimed", "holds a reservation on 8 GPUs of n0, free when jobs without", True)
    lb, t0 = fragmented(untimed)
    events, state = cycle(lb, t0 + TIMEOUT)
    (withdrawn,) = of(events, AdmissionWithdrawn)
    assert withdrawn.job_id == "wide" and state.jobs["wide"].phase == "queued"
    events, _ = cycle(lb, t0 + TIMEOUT + 60)
    assert admitted(events) == ["next"]


def test_an_admission_the_placer_has_not_explained_is_kept() -> None:
    """No reason: the placer has not looked at it (it may be down), so nobody knows it is stuck."""
    lb = LogBuilder().node("n0", h100_8x_nvswitch("n0")).queue(queue_spec("team-a", nominal=9))
    lb.submit("alice", "wide", job().gpus(8)).accept("wide")
    t0 = lb.time
    lb.admit("wide")
    events, state = cycle(lb, t0 + 10 * TIMEOUT)
    assert of(events, AdmissionWithdrawn) == []
    assert state.jobs["wide"].phase == "admitted"


def test_no_timeout_no_withdrawal() -> None:
    lb, t0 = fragmented()
    events, state = cycle(lb, t0 + 10 * TIMEOUT, AdmissionConfig(placement_timeout_s=None))
    assert of(events, AdmissionWithdrawn) == [] and admitted(events) == []
    assert state.jobs["wide"].phase == "admitted"


def test_the_fold_voids_an_admission_during_the_back_off() -> None:
    lb, t0 = fragmented()
    cycle(lb, t0 + TIMEOUT)
    after = t0 + TIMEOUT + BACKOFF
    lb.at(after - 1).admit_as(lb.admission("wide"))
    state = lb.fold()
    assert state.jobs["wide"].phase == "queued"
    assert state.rejections[-1].voided == (("wide", f"backs off until t={after:.0f} (placed nowhere)"),)
    lb.at(after).admit_as(lb.admission("wide"))
    assert lb.fold().jobs["wide"].phase == "admitted"


@pytest.mark.parametrize(
    "after, code",
    [(MAX_BACKOFF_S + 1, "void"), (1e308, "void"), (math.inf, "malformed"), (math.nan, "malformed")],
)
def test_the_fold_refuses_a_withdrawal_that_would_keep_a_job_out_for_ever(after: float, code: str) -> None:
    """A back-off longer than the fold's bound is void, and the job keeps its admission (one
    that is not a number does not even decode: JSON has none); the longest allowed is taken."""
    lb, t0 = fragmented()
    now = t0 + TIMEOUT
    lb.at(now)
    bad = AdmissionWithdrawn(job_id="wide", attempt=0, reason=NO_ROOM, admit_after=now + after)
    lb.event(routing.subject_of(bad), bad)
    state = lb.fold()
    assert state.jobs["wide"].phase == "admitted" and state.jobs["wide"].admission is not None
    refused = state.rejections[-1]
    assert refused.code == code and (code != "void" or "back-off" in refused.message)
    ok = AdmissionWithdrawn(job_id="wide", attempt=0, reason=NO_ROOM, admit_after=now + MAX_BACKOFF_S)
    lb.event(routing.subject_of(ok), ok)
    state = lb.fold()
    assert (state.jobs["wide"].phase, state.jobs["wide"].admit_after) == ("queued", now + MAX_BACKOFF_S)


@pytest.mark.parametrize(
    "timeout, backoff", [(0.0, 60.0), (-1.0, 60.0), (math.inf, 60.0), (60.0, -1.0), (60.0, MAX_BACKOFF_S + 1)]
)
def test_admission_refuses_a_timeout_or_back_off_out_of_bounds(timeout: float, backoff: float) -> None:
    with pytest.raises(ValueError):
        AdmissionConfig(placement_timeout_s=timeout, placement_backoff_s=backoff)


def test_the_preemptor_stops_nobody_for_a_job_that_backs_off() -> None:
    """Admission would not admit it into the quota freed for it: a newcomer would take it. Once
    the back-off is over, the same state has the preemptor stop lower-priority work for it."""
    lb = LogBuilder().node("n0", h100_8x_nvswitch("n0")).queue(queue_spec("team-a", nominal=9))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("urgent", 100)))
    lb.submit("alice", "small", job().gpus(1)).accept("small").admit("small")
    lb.place(on("n0", 0, job_id="small")).started("n0", "small")
    lb.submit("alice", "wide", job().gpus(8).priority_class("urgent")).accept("wide", priority=100)
    lb.admit("wide")
    until = lb.time + BACKOFF
    lb.withdraw("wide", why="no free GPU suits 8 GPUs", admit_after=until)
    lb.submit("alice", "next", job().gpus(1)).accept("next").admit("next")
    lb.place(on("n0", 1, job_id="next")).started("n0", "next")
    state = lb.fold()
    assert state.jobs["wide"].phase == "queued"
    assert preemptor_decide(state, until - 1) == []
    (proposal,) = preemptor_decide(state, until)
    assert isinstance(proposal, PreemptionRequested) and proposal.beneficiary == "wide"


def test_admission_wakes_when_a_timeout_runs_out_and_when_a_back_off_ends() -> None:
    """Nothing is folded at those times: a service that found nothing to do sleeps until then, and
    the simulator decides then, or neither would ever withdraw or admit the job."""
    lb, t0 = fragmented()
    assert wake(lb.fold(), t0 + 1, CONFIG) == t0 + TIMEOUT
    _, state = cycle(lb, t0 + TIMEOUT)
    assert wake(state, t0 + TIMEOUT + 60, CONFIG) == t0 + TIMEOUT + BACKOFF
    assert wake(state, t0 + TIMEOUT + BACKOFF, CONFIG) == math.inf


def test_a_simulation_with_nothing_else_to_do_admits_a_job_whose_back_off_ended() -> None:
    """Ten 8-GPU jobs on one 8-GPU node: all but the running one and the reserved one time out,
    and nothing but their back-offs ending brings them back."""
    nodes = [("n0", h100_8x_nvswitch("n0"))]
    setup = [ApplyQueue(queue=queue_spec("team-a", nominal=80))]
    jobs = [SimJob(f"j{i}", "alice", job().gpus(8).build(), float(i), 100.0) for i in range(10)]
    sim = Simulation(nodes, setup, jobs, SimConfig(admission=CONFIG)).run()
    assert sim.unfinished() == []
    assert sum(1 for s in sim.stats.values() if s.finished is not None) == 10


def test_a_reservations_reason_says_a_time_of_day_to_the_minute_and_counts_its_gpus() -> None:
    # It said "holds a reservation on 1 GPUs of node-01, free at t=1796628026": a raw log time,
    # moving by seconds as the projection did, so the same reason was written again and again.
    def reason(start: float, gpus: int) -> str:
        placement = Placement("j", 0, (WorkerSlot(0, "node-01", tuple(GpuClaim(g) for g in range(gpus))),))
        return Reservation("j", start, placement, Resources(gpus=gpus), ()).reason().message

    live = 1_796_628_026.0  # 2026-12-07 07:20:26Z
    assert reason(live, 1) == "holds a reservation on 1 GPU of node-01, free at 2026-12-07 07:21:00Z"
    assert reason(live + 20, 1) == reason(live, 1)  # the same minute: the same reason
    assert reason(live, 8) == "holds a reservation on 8 GPUs of node-01, free at 2026-12-07 07:21:00Z"
    assert reason(9000.0, 8).endswith("free at t=9000s")  # a simulated log's seconds
