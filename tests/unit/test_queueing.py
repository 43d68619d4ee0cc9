"""The order jobs wait in within a queue: FIFO, or shortest first with aging (highest response
ratio next), as admission admits by and the preemptor searches by."""

from __future__ import annotations

import msgspec
import pytest

from corral.events.jobs import JobSpec, Resources
from corral.events.queues import QueueSpec, Quota
from corral.projections import indexes, queueing
from corral.projections.state import JobState, State
from corral.services.admission.decide import decide
from corral.services.admission.order import sort_queue
from corral.services.preemptor.decide import beneficiaries

HOUR = 3600.0


def waiting(
    job_id: str, estimate: float | None, submitted_at: float, seq: int, priority: int = 0
) -> JobState:
    spec = JobSpec(queue="q", resources=Resources(gpus=8), runtime_estimate_s=estimate)
    return JobState(
        id=job_id,
        tenant="t",
        spec=spec,
        submitted_seq=seq,
        submitted_at=submitted_at,
        phase="queued",
        priority=priority,
    )


@pytest.mark.parametrize(
    ("estimate", "waited", "ratio"),
    [
        pytest.param(HOUR, 0.0, 1.0, id="just-submitted"),
        pytest.param(HOUR, HOUR, 2.0, id="waited-its-length"),
        pytest.param(10 * HOUR, HOUR, 1.1, id="a-long-job-ages-slowly"),
        pytest.param(None, 24 * HOUR, 2.0, id="no-estimate-counts-a-day"),
        pytest.param(0.0, 1.0, 2.0, id="a-zero-estimate-counts-a-second"),
    ],
)
def test_the_response_ratio(estimate: float | None, waited: float, ratio: float) -> None:
    assert queueing.response_ratio(waiting("j", estimate, 100.0, 1), 100.0 + waited) == pytest.approx(ratio)


@pytest.mark.parametrize(
    ("estimate", "ran", "since", "ratio"),
    [
        # Submitted 12 h ago, ran 8 of its 10: waited 4 h, 2 h left (all the time since
        # submission over the whole estimate would say 2.2).
        pytest.param(10 * HOUR, 8 * HOUR, 12 * HOUR, 3.0, id="a-requeued-job-counts-what-is-left"),
        pytest.param(10 * HOUR, 0.0, 10 * HOUR, 2.0, id="one-that-never-ran-waited-all-along"),
        # Ran past its estimate: a second left, as a zero estimate.
        pytest.param(HOUR, 2 * HOUR, 3 * HOUR, 3601.0, id="an-overrun-job-has-a-second-left"),
        pytest.param(None, 12 * HOUR, 18 * HOUR, 1.5, id="no-estimate-counts-a-day-less-what-it-ran"),
    ],
)
def test_the_response_ratio_of_a_job_that_ran(
    estimate: float | None, ran: float, since: float, ratio: float
) -> None:
    job = msgspec.structs.replace(waiting("j", estimate, 100.0, 1), ran_s=ran)
    assert queueing.response_ratio(job, 100.0 + since) == pytest.approx(ratio)


def test_a_requeued_job_s_running_time_is_not_waiting() -> None:
    """Submitted 5 hours ago, stopped after running 4 of its 10 and requeued an hour ago: it
    has waited an hour with 6 to go (ratio 1.17), so a short job that waited a quarter of an
    hour (1.25) goes first; a long one that has waited an hour with all 10 to go (1.1) after.
    Counted from submission over its whole estimate, it would go first (1.5)."""
    now = 20 * HOUR
    requeued = msgspec.structs.replace(waiting("requeued", 10 * HOUR, now - 5 * HOUR, 1), ran_s=4 * HOUR)
    fresh = waiting("fresh", 10 * HOUR, now - HOUR, 2)
    short = waiting("short", HOUR, now - HOUR / 4, 3)
    jobs = [fresh, requeued, short]
    sort_queue(jobs, strategy=queueing.SHORTEST_FIRST, now=now)
    assert [j.id for j in jobs] == ["short", "requeued", "fresh"]


def test_shortest_first_then_the_long_job_once_it_waited_long_enough() -> None:
    long = waiting("long", 10 * HOUR, 0.0, 1)
    short = waiting("short", HOUR, 0.0, 2)
    later = waiting("later", HOUR, 5 * HOUR, 3)
    urgent = waiting("urgent", 100 * HOUR, 0.0, 4, priority=5)
    jobs = [long, short, later, urgent]
    sort_queue(jobs, strategy=queueing.SHORTEST_FIRST, now=5 * HOUR)
    assert [j.id for j in jobs] == ["urgent", "short", "long", "later"]  # ratios 6, 1.5, 1
    # 20 hours on: short and later ran; the long job (ratio 3.5) goes before a new short one (1).
    jobs = [long, waiting("new", HOUR, 25 * HOUR, 5)]
    sort_queue(jobs, strategy=queueing.SHORTEST_FIRST, now=25 * HOUR)
    assert [j.id for j in jobs] == ["long", "new"]
    fifo = [short, long]
    sort_queue(fifo, strategy="best-effort-fifo", now=5 * HOUR)
    assert [j.id for j in fifo] == ["long", "short"]


def _state(strategy: str) -> State:
    s = State()
    s.queues["q"] = QueueSpec("q", quotas={"*": Quota(8)}, strategy=strategy)  # type: ignore[arg-type]
    for job in (waiting("long", 10 * HOUR, 0.0, 1), waiting("short", HOUR, 0.0, 2)):
        indexes.add(s, job)
    return s


@pytest.mark.parametrize(("strategy", "first"), [("shortest-first", "short"), ("best-effort-fifo", "long")])
def test_admission_admits_in_the_queues_order(strategy: str, first: str) -> None:
    (adm,) = [a for e in decide(_state(strategy), HOUR) for a in getattr(e, "admissions", ())]
    assert adm.job_id == first


def test_the_preemptor_searches_a_shortest_first_queue_in_its_order() -> None:
    s = _state("shortest-first")
    s.queues["fifo"] = QueueSpec("fifo", quotas={"*": Quota(8)})
    indexes.add(
        s,
        JobState(
            id="f",
            tenant="t",
            spec=JobSpec(queue="fifo", resources=Resources(gpus=8)),
            submitted_seq=3,
            submitted_at=0.0,
            phase="queued",
        ),
    )
    # The queue's places (sequences 1 and 2) go to its jobs in its order; f keeps its own.
    assert [j.id for j in beneficiaries(s, HOUR)] == ["short", "long", "f"]
    assert queueing.slots([s.jobs["long"], s.jobs["short"]], HOUR) == {"short": 1, "long": 2}
