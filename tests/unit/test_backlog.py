"""A queue's backlog for one admission cycle (``services/admission/backlog.py``): read lazily from
the fold's order, with the jobs the cycle queued merged in and those it dropped left out, it
gives the jobs a list of them in that order would, by index, by window and whole."""

from __future__ import annotations

import pytest

from corral.projections.indexes import place_of
from corral.projections.state import JobState
from corral.services.admission.backlog import Backlog
from tests.builders import job


def _job(i: int, priority: int = 0) -> JobState:
    spec = job().build()
    assert spec.queue == "team-a"
    return JobState(
        id=f"j{i:03}",
        tenant="alice",
        spec=spec,
        submitted_seq=i,
        submitted_at=0.0,
        phase="queued",
        priority=priority,
    )


@pytest.mark.parametrize("added", [False, True], ids=["as-folded", "with-added"])
@pytest.mark.parametrize("dropped", [False, True], ids=["none-dropped", "some-dropped"])
def test_a_backlog_reads_as_the_list_of_its_jobs_in_order(added: bool, dropped: bool) -> None:
    folded = [_job(i, priority=10 if i % 7 == 0 else 0) for i in range(0, 60, 2)]
    jobs = {j.id: j for j in folded}
    backlog = Backlog(jobs, "team-a", sorted(place_of(j) for j in folded))
    want = list(folded)
    if added:
        for j in (_job(5), _job(33, priority=10), _job(99)):
            backlog.add(j)
            want.append(j)
    if dropped:
        for job_id in ("j000", "j014", "j005" if added else "j016", "nobody"):
            backlog.drop(job_id)
            want = [j for j in want if j.id != job_id]
    want.sort(key=place_of)
    assert len(backlog) == len(want)
    assert [backlog[i].id for i in (0, 3, 1)] == [want[i].id for i in (0, 3, 1)]  # read partly first
    for start, stop in ((0, 5), (2, 9), (4, 4), (9, 2), (10, 1000), (0, len(want))):
        assert [j.id for j in backlog[start:stop]] == [j.id for j in want[start:stop]]
    assert [j.id for j in backlog[-3:]] == [j.id for j in want[-3:]]
    assert [j.id for j in backlog] == [j.id for j in want]
    assert backlog[-1].id == want[-1].id
