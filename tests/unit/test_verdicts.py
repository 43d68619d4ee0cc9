"""Verdicts are data: what the fold refused, record by record and item by item, as it folds.

A job's history says which records about it the fold refused. Batch decisions are arbitrated
item by item, so a placement batch may be void for one job and stand for the others: the fold
records which items, as (job, why) pairs, not as a sentence to be split. And a reader learns
every verdict of a batch of records as the fold makes it, however many there are; the state's
list of recent rejections is capped and cannot tell.
"""

from __future__ import annotations

from corral.events import subjects
from corral.events.jobs import CancelJob
from corral.projections.fold import fold_refusals
from corral.projections.index import job_events
from corral.projections.state import MAX_REJECTIONS, MAX_REJECTIONS_PER_TENANT, State
from tests.builders import Cluster, LogBuilder, job, on


def test_a_placement_batch_void_for_one_job_is_refused_for_that_job_only() -> None:
    lb = LogBuilder().nodes(Cluster(1)).queues("team-a")
    lb.submit("alice", "a", job().gpus(1)).accept("a").admit("a")
    lb.submit("alice", "b", job().gpus(1)).accept("b").admit("b")
    lb.submit("alice", "c", job().gpus(1)).accept("c")  # not admitted: its placement is void
    # one reason with the separators a sentence would be split on
    lb.place(on("node-00", 0, job_id="a"), on("node-00", 1, job_id="c"), on("node-00", 0, job_id="b"))
    state = State()
    refusals = fold_refusals(state, lb.records)
    (rej,) = refusals.values()
    assert [j for j, _ in rej.voided] == ["c", "b"]
    events = {e.job_id: e.refused for e in job_events(state, lb.records, refusals) if e.type == "JobsPlaced"}
    assert events["a"] == ""
    assert events["b"].startswith("void: ") and "GPU 0" in events["b"]
    assert events["c"] == "void: not admitted at attempt 0"


def test_every_verdict_of_a_batch_is_known_however_many() -> None:
    lb = LogBuilder().nodes(Cluster(1)).queues("team-a").submit("alice", "j", job())
    n = MAX_REJECTIONS + 500
    for i in range(n):
        lb.request("alice", "cancel", CancelJob(job_id=f"nobody-{i}"))
    state = State()
    refusals = fold_refusals(state, lb.records)
    assert len(refusals) == n and len(state.rejections) == MAX_REJECTIONS_PER_TENANT  # alice's
    assert refusals[lb.records[-n].seq].subject == subjects.request("alice", "cancel")
