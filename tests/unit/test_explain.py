"""``corral explain`` from the log alone: a job's history in operator words, why it waits, what of
it was refused, and nothing of it for another tenant."""

from __future__ import annotations

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.jobs import PendingReasonChanged
from corral.projections.state import JobState, State
from corral.services.cli import table
from corral.services.query.explain import other_sides
from corral.services.query.view import explain_log
from tests.builders import Cluster, LogBuilder, job


def _log() -> LogBuilder:
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job().replicas(2)).accept("j1")
    why = Reason("quota", "needs 2 GPUs; queue team-a at its nominal 16/16", preemption_helps=True)
    log.event(subj.job("j1"), PendingReasonChanged(job_id="j1", reasons=(why,)))
    return log.request("alice", "resize", {"job_id": "j1", "replicas": 1})  # not elastic: refused


def test_explain_tells_the_history_the_reason_and_what_was_refused() -> None:
    report = explain_log(_log().records, "j1", None)
    assert report is not None
    text = report["text"]
    assert "j1 of alice in queue team-a: queued" in text
    assert "why: [quota] needs 2 GPUs; queue team-a at its nominal 16/16 (preemption could help)" in text
    assert "submitted to queue team-a: 2 ×" in text and "accepted at priority 0" in text
    assert [r["code"] for r in report["refused"]] == ["illegal"]
    assert [h["type"] for h in report["history"]] == [
        "SubmitJob",
        "JobAccepted",
        "PendingReasonChanged",
        "ResizeJob",
    ]


def test_another_tenants_job_is_no_job_and_the_admin_sees_it() -> None:
    records = _log().records
    assert explain_log(records, "j1", "bob") is None
    assert explain_log(records, "nope", None) is None
    assert explain_log(records, "j1", "admin") is not None


FORGED = "bye\nj9  bob  team-b  running  0  1 of 1"  # a row of another tenant's, made up


def _cancelled_with_a_forged_line() -> LogBuilder:
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job()).accept("j1")
    return log.request("alice", "cancel", {"job_id": "j1", "reason": FORGED})


def test_a_tenants_text_cannot_start_a_line_of_explain() -> None:
    report = explain_log(_cancelled_with_a_forged_line().records, "j1", "admin")
    assert report is not None
    lines = report["text"].splitlines()
    assert not any(line.startswith("j9") for line in lines)
    assert "why: [cancelled] bye\\u000aj9  bob" in report["text"]
    assert "cancel requested: bye\\u000aj9  bob" in report["text"]
    assert report["reasons"][0]["message"] == FORGED  # the data as said; only the text is one line


def test_a_tenants_text_cannot_start_a_row_of_a_table() -> None:
    text = table.render(["id", "reason"], [["j1", FORGED], ["j2", "done\r\u2028"]])
    assert text.splitlines() == [
        "ID  REASON",
        "j1  bye\\u000aj9  bob  team-b  running  0  1 of 1",
        "j2  done\\u000d\\u2028",
    ]


def test_the_admin_is_not_told_a_later_job_of_the_id_a_job_was_preempted_for() -> None:
    # ``stopped_for`` keeps the ids of jobs long let go; bob's "train", submitted once alice's was
    # let go, read as the job v had been stopped for, with bob and his queue.
    state = State()
    v = JobState("v", "carol", job("qc").build(), submitted_seq=1, submitted_at=0.0, phase="running")
    v.stopped_for = (("train", 2, 1), ("urgent", 5, 1))
    state.jobs["v"] = v
    state.jobs["train"] = JobState("train", "bob", job("qb").build(), submitted_seq=90, submitted_at=0.0)
    state.jobs["urgent"] = JobState("urgent", "dave", job("qd").build(), submitted_seq=4, submitted_at=0.0)
    assert other_sides(state, v) == ["preempted for: train, urgent (dave, queue qd)"]
