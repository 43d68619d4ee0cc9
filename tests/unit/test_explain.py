"""``corral explain`` from the log alone: a job's history in operator words, why it waits, what of
it was refused, and nothing of it for another tenant."""

from __future__ import annotations

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.jobs import PendingReasonChanged
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
