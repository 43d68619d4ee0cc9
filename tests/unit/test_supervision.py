"""A service whose decision core raises: the failure is counted with where it happened, the next
try waits an exponential back-off (capped), and a cycle that goes well resets the run of
failures while the totals stay. The shell's side of it runs on the in-memory log here; the lease
handed to a standby is tested on a real nats-server (tests/integration/test_supervision.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from corral.events.base import Event
from corral.events.jobs import CancelJob, JobAccepted
from corral.events.log import Append, InMemoryLog
from corral.projections.state import JobState, State
from corral.services.runtime.shell import Service
from corral.services.runtime.supervise import CAP, Supervision, backoff, culprit
from tests.builders import LogBuilder
from tests.builders import job as spec


@pytest.mark.parametrize(
    ("in_a_row", "wait"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (1000, 60.0)],
    ids=["none", "first", "second", "third", "sixth", "capped", "long-run-capped"],
)
def test_backoff_doubles_up_to_its_cap(in_a_row: int, wait: float) -> None:
    assert backoff(in_a_row, base=1.0, cap=60.0) == wait


def test_a_failure_waits_its_backoff_and_a_good_cycle_resets_the_run_not_the_total() -> None:
    sup = Supervision(base=1.0, cap=4.0)
    for n, wait in enumerate([1.0, 2.0, 4.0, 4.0], start=1):
        failure = sup.failed(100.0, seq=7, error=RuntimeError("boom"))
        assert (sup.failures, sup.in_a_row, sup.retry_at) == (n, n, 100.0 + wait)
        assert failure.seq == 7 and failure.error == "RuntimeError: boom"
    assert not sup.may_decide(103.9) and sup.may_decide(104.0)
    sup.succeeded()
    assert (sup.failures, sup.in_a_row, sup.cycles) == (4, 0, 1)
    sup.failed(200.0, seq=9, error=RuntimeError("again"))
    assert sup.retry_at == 201.0  # a new run starts from the first wait


def test_a_decision_of_another_replica_past_the_failure_ends_the_run() -> None:
    # A replica that handed its lease over after one failure stood shown as failing for as long
    # as it stood by, and its next failure as leader backed off as a second in a row.
    sup = Supervision(base=1.0, cap=4.0)
    sup.failed(100.0, seq=7, error=RuntimeError("append timed out"))
    sup.decided_elsewhere(7)  # nothing decided past it yet
    assert sup.in_a_row == 1
    sup.decided_elsewhere(12)
    assert (sup.failures, sup.in_a_row, sup.cycles) == (1, 0, 0) and sup.may_decide(100.0)
    sup.failed(200.0, seq=20, error=RuntimeError("again"))
    assert sup.retry_at == 201.0


def _crash_on(state: State, poisoned: str) -> None:
    for job in state.jobs.values():
        if job.id == poisoned:
            raise ValueError(f"cannot order {job.id}")


def test_the_culprit_is_the_job_the_core_was_on() -> None:
    state = LogBuilder().queue("team-a").submit("alice", "fine").submit("alice", "poison").fold()
    with pytest.raises(ValueError) as raised:
        _crash_on(state, "poison")
    assert culprit(raised.value.__traceback__) == "poison"
    with pytest.raises(KeyError) as missing:
        {}["x"]  # noqa: B018 - raises with no job in sight
    assert culprit(missing.value.__traceback__) == ""


def _a_core_with_a_bug(state: State, now: float) -> Sequence[Event]:
    """Accepts each submitted job, but raises while a job named ``poison`` waits to be judged."""
    out: list[Event] = []
    for job in state.jobs.values():
        if job.phase != "submitted":
            continue
        if job.id == "poison":
            raise ValueError("a request nobody foresaw")
        out.append(JobAccepted(job_id=job.id, priority=0))
    return out


async def _append(log: InMemoryLog, lb: LogBuilder) -> None:
    for r in lb.records:
        await log.append(Append(r.subject, r.data, headers=r.headers))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def _service(log: InMemoryLog, job_id: str) -> tuple[Service, Clock]:
    """The admission shell over ``log``, restored, with ``job_id`` submitted, on a clock at 1000."""
    await _append(log, LogBuilder().queue("team-a").submit("alice", job_id, spec("team-a")))
    clock = Clock(1000.0)
    svc = Service("admission", _a_core_with_a_bug, log, clock=clock, supervision=Supervision(1.0, CAP))
    await svc.restore()
    return svc, clock


async def test_a_failing_cycle_is_counted_backed_off_and_the_service_decides_again() -> None:
    log = InMemoryLog()
    svc, clock = await _service(log, "poison")

    assert await svc.cycle() == 0
    sup = svc.supervision
    assert (sup.failures, sup.in_a_row) == (1, 1)
    assert sup.last is not None and (sup.last.job, sup.last.seq) == ("poison", svc.state.seq)
    assert await svc.cycle() == 0 and sup.failures == 1  # backing off: not even tried
    clock.t += 1.0
    assert await svc.cycle() == 0 and (sup.failures, sup.in_a_row) == (2, 2)  # tried, still poisoned
    assert sup.retry_at == clock.t + 2.0

    # The owner cancels the poisoned request; once the back-off is over the next cycle decides.
    later = LogBuilder().request("alice", "cancel", CancelJob(job_id="poison"))
    await _append(log, later.submit("alice", "next", spec("team-a")))
    svc.fold([r for r in log.records if r.seq > svc.state.seq])
    clock.t += 2.0
    assert await svc.cycle() == 1
    assert (sup.failures, sup.in_a_row, sup.cycles) == (2, 0, 1)
    assert log.records[-1].subject == "corral.ev.job.next"


def test_a_job_state_has_the_id_the_culprit_reads() -> None:
    """``culprit`` reads ``job.id``: the name the fold's job records carry."""
    assert "id" in JobState.__struct_fields__


async def test_a_cycle_the_log_refuses_to_append_is_a_failure() -> None:
    # The server refused a cycle's events (one too large for a message): the service logged
    # it and decided again at once, for good, with no failure counted and the lease kept.
    from corral.events.log import LogError

    class Refusing(InMemoryLog):
        async def append_fenced(self, items, fence):  # type: ignore[no-untyped-def]
            raise LogError("MaxPayloadError: nats: maximum payload exceeded")

    svc, _ = await _service(Refusing(), "j")
    assert await svc.cycle() == 0
    sup = svc.supervision
    assert (sup.failures, sup.in_a_row) == (1, 1) and sup.last is not None
    assert "maximum payload exceeded" in sup.last.error
    assert await svc.cycle() == 0 and sup.failures == 1  # backing off
