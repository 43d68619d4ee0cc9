"""Bounded state: a finished job stays in the state for the retention period of log time the admin
set, then the fold lets it go (``projections/retention.py``); a job that runs or still holds GPUs
never goes; its id is free again; nothing left in the state names it as a live job's."""

from __future__ import annotations

import math

import pytest

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.jobs import CancelJob, JobRejected, ResizeJob
from corral.events.queues import ApplyRetention, RetentionSpec
from corral.projections import retention
from corral.projections.fold import apply_event
from corral.projections.state import State
from tests.builders import Cluster, LogBuilder, job, on, placement, running, whole, worker

N0 = "node-00"


def done(log: LogBuilder, job_id: str, node: str = N0) -> LogBuilder:
    return log.exited(node, job_id, code=0)


def one_job_done(finished_s: float) -> LogBuilder:
    """``j1`` ran on one GPU and succeeded at log time 1000 + 7 (step 1 s per record)."""
    log = LogBuilder().nodes(Cluster(1)).retention(finished_s)
    return done(running("j1", log=log.queue("team-a")), "j1")


def test_a_finished_job_stays_until_its_retention_has_passed_then_goes() -> None:
    log = one_job_done(60.0)
    state = log.fold()
    ended = state.jobs["j1"].phase_since
    assert state.jobs["j1"].phase == "succeeded" and state.let_go == 0
    state = log.at(ended + 59.0).cordon(N0, False).fold()  # a record 59 s later: still there
    assert "j1" in state.jobs
    state = log.at(ended + 60.0).cordon(N0, False).fold()  # at 60 s: let go
    assert "j1" not in state.jobs and state.let_go == 1
    assert state.finished[state.finished_from :] == []


def test_with_no_retention_a_finished_job_goes_at_the_next_record() -> None:
    log = one_job_done(0.0)
    assert log.fold().jobs["j1"].phase == "succeeded"  # whoever folds its end still sees it
    assert "j1" not in log.cordon(N0, False).fold().jobs


def test_the_gpu_time_it_held_stays_in_its_queue() -> None:
    log = one_job_done(0.0)
    kept = log.fold()
    let_go = log.cordon(N0, False).fold()
    assert let_go.gpu_time == kept.gpu_time and let_go.gpu_time["team-a"]
    assert let_go.quota_held == kept.quota_held


def test_a_running_job_never_goes() -> None:
    log = running("j1", log=LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a"))
    state = log.at(1e9).cordon(N0, False).fold()
    assert state.jobs["j1"].phase == "running" and state.let_go == 0


def test_a_failed_job_whose_workers_still_hold_gpus_stays_until_they_are_given_back() -> None:
    """A gang of two fails when one worker exits non-zero; the other still holds its GPU until it
    exits. Only then does the job's retention period begin."""
    log = LogBuilder().nodes(Cluster(1)).retention(10.0).queue("team-a")
    log.submit("alice", "g", job().gpus(1).replicas(2).restarts(0, "never"))
    log.accept("g").admit("g", replicas=2)
    log.place(placement("g", worker(0, N0, whole(0)), worker(1, N0, whole(1))))
    log.started(N0, "g", rank=0).started(N0, "g", rank=1).exited(N0, "g", rank=0, code=1)
    state = log.fold()
    assert state.jobs["g"].phase == "failed" and state.jobs["g"].held is not None
    state = log.at(log.time + 100.0).cordon(N0, False).fold()
    assert "g" in state.jobs  # still holding: not finished for retention
    released_at = log.time
    log.exited(N0, "g", rank=1, code=0)
    state = log.at(released_at + 9.0).cordon(N0, False).fold()
    assert "g" in state.jobs and state.jobs["g"].held is None
    state = log.at(released_at + 10.0).cordon(N0, False).fold()
    assert "g" not in state.jobs


def test_rejected_and_cancelled_jobs_go_too() -> None:
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    log.submit("alice", "q", job().gpus(1)).accept("q")
    log.request("alice", "cancel", CancelJob(job_id="q"))
    log.submit("alice", "bad", job().gpus(1))
    why = Reason("invalid", "too big")
    log.event(subj.job("bad"), JobRejected(job_id="bad", request_seq=log.last_seq, reason=why))
    state = log.cordon(N0, False).fold()
    assert not {"q", "bad"} & state.jobs.keys() and state.let_go == 2


def test_a_longer_retention_set_later_keeps_jobs_that_finished_before() -> None:
    log = one_job_done(10.0)
    ended = log.fold().jobs["j1"].phase_since
    log.retention(3600.0)
    state = log.at(ended + 600.0).cordon(N0, False).fold()
    assert "j1" in state.jobs
    assert "j1" in log.retention(0.0).fold().jobs  # a shorter one lets it go at the next record
    assert "j1" not in log.cordon(N0, False).fold().jobs


# -- job ids ---------------------------------------------------------------------------------------


def test_within_the_retention_period_a_resubmission_is_a_duplicate() -> None:
    log = one_job_done(3600.0)
    state = log.submit("alice", "j1", job().gpus(1)).fold()
    assert state.rejections[-1].code == "duplicate" and state.jobs["j1"].phase == "succeeded"
    state = log.submit("bob", "j1", job().gpus(1)).fold()
    assert state.rejections[-1].code == "forbidden" and state.jobs["j1"].tenant == "alice"


def test_once_let_go_an_id_names_a_new_job() -> None:
    log = one_job_done(0.0)
    state = log.submit("bob", "j1", job().gpus(1)).fold()
    new = state.jobs["j1"]
    assert (new.tenant, new.phase, state.rejected_total) == ("bob", "submitted", 0)
    assert new.priority_seq == new.submitted_seq  # unique to this job, unlike the old one's


@pytest.mark.parametrize(
    ("verb", "body"),
    [("cancel", CancelJob(job_id="j1")), ("resize", ResizeJob(job_id="j1", replicas=1))],
    ids=["cancel", "resize"],
)
def test_a_request_about_a_job_let_go_is_about_no_job(verb: str, body: object) -> None:
    log = one_job_done(0.0).cordon(N0, False)
    state = log.request("alice", verb, body).fold()  # type: ignore[arg-type]
    r = state.rejections[-1]
    assert (r.code, r.message, r.job_id) == ("unknown", "no job j1", "j1")


def test_the_victims_of_a_beneficiary_let_go_stop_naming_it() -> None:
    """v is checkpointing for b when b's owner cancels b; once b is let go, a new job given the
    id b is no beneficiary of v's preemption."""
    spec = job().gpus(8).checkpointable()
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    log.submit("bob", "v", spec).accept("v").admit("v").place(on(N0, *range(8), job_id="v")).started(N0, "v")
    log.submit("alice", "b", job().gpus(8)).accept("b", priority=5).preempt("b", "v")
    log.request("alice", "cancel", CancelJob(job_id="b"))
    state = log.fold()
    assert state.jobs["v"].phase == "checkpointing" and state.jobs["v"].preempted_for == "b"
    assert state.jobs["b"].victims == ("v",)
    state = log.submit("alice", "b", job().gpus(8)).fold()
    assert state.jobs["b"].phase == "submitted" and state.jobs["v"].preempted_for == ""
    assert state.jobs["v"].phase == "checkpointing"  # it still stops, for nobody


# -- the admin's setting ---------------------------------------------------------------------------


@pytest.mark.parametrize("finished_s", [-1.0, math.inf, math.nan], ids=["negative", "infinite", "nan"])
def test_a_retention_that_is_no_number_of_seconds_is_refused(finished_s: float) -> None:
    state = LogBuilder().retention(finished_s).fold()
    assert state.rejections[-1].code == "malformed" and state.retention == RetentionSpec()


def test_only_the_admin_sets_the_retention() -> None:
    log = LogBuilder().request("alice", "retention", ApplyRetention(retention=RetentionSpec(0.0)))
    state = log.fold()
    assert state.rejections[-1].code == "unknown" and state.retention == RetentionSpec()
    body = ApplyRetention(retention=RetentionSpec(0.0))
    apply_event(state, 99, subj.request("alice", "retention"), body, 1.0, "alice")
    assert state.rejections[-1].code == "forbidden" and state.retention == RetentionSpec()


def test_retention_defaults_to_an_hour() -> None:
    assert State().retention.finished_s == 3600.0


# -- cost --------------------------------------------------------------------------------------------


def test_letting_go_looks_only_at_the_head_of_the_finished_jobs() -> None:
    """The finished jobs wait in the order they finished; a record lets go a prefix of them and
    the list is trimmed as it goes, so it stays about as long as the jobs still kept."""
    log = LogBuilder(step=0.0).nodes(Cluster(1)).retention(100.0).queue("team-a")
    for i in range(3000):
        log.at(1000.0 + i)  # one job finishing each second, each on GPU 0 in turn
        running(f"j{i}", log=log)
        done(log, f"j{i}")
    state = log.fold()
    waiting = state.finished[state.finished_from :]
    assert [t for t, _, _ in waiting] == sorted(t for t, _, _ in waiting)
    assert len(waiting) == len(state.jobs) <= 101 and state.let_go == 3000 - len(state.jobs)
    assert len(state.finished) <= 2 * len(waiting) + 1024  # let-go entries do not pile up
    # What the next record lets go is the prefix ``due`` names, and nothing is looked at past it.
    due = retention.due(state, state.seq + 1, state.time + 50.0)
    assert [j.id for j in due] == [job_id for _, job_id, _ in waiting[: len(due)]]
    assert 0 < len(due) < len(waiting)
