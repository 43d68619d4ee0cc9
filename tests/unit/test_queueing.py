"""The order jobs wait in within a queue: FIFO, or shortest first with aging (highest response
ratio next), as admission admits by and the preemptor searches by."""

from __future__ import annotations

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
