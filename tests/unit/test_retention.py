"""Bounded state: a finished job stays in the state for the retention period of log time the admin
set, then the fold lets it go (``projections/retention.py``); a job that runs or still holds GPUs
never goes; its id is free again; nothing left in the state names it as a live job's."""

from __future__ import annotations

import math

import msgspec
import pytest

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.decisions import PreemptionRequested, Victim
from corral.events.jobs import CancelJob, JobRejected, ResizeJob
from corral.events.nodes import CheckpointCompleted, WorkerExited, WorkerStarted
from corral.events.queues import ApplyRetention, RetentionSpec
from corral.projections import indexes, retention
from corral.projections.fold import apply, apply_event, fold
from corral.projections.state import MAX_REJECTIONS, State
from tests.builders import Cluster, LogBuilder, job, on, placement, running, whole, worker

N0 = "node-00"
N1 = "node-01"


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


def test_the_victims_of_a_beneficiary_stop_naming_it_when_it_ends() -> None:
    """v is checkpointing for b when b's owner cancels b: v stops for nobody from then on, so a
    new job given the id b is no beneficiary of v's preemption once b is let go."""
    spec = job().gpus(8).checkpointable()
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    log.submit("bob", "v", spec).accept("v").admit("v").place(on(N0, *range(8), job_id="v")).started(N0, "v")
    log.submit("alice", "b", job().gpus(8)).accept("b", priority=5).preempt("b", "v")
    state = log.fold()
    assert state.jobs["v"].preempted_for == "b" and state.jobs["b"].victims == ("v",)
    state = log.request("alice", "cancel", CancelJob(job_id="b")).fold()
    assert state.jobs["v"].phase == "checkpointing" and state.jobs["v"].preempted_for == ""
    assert state.jobs["b"].victims == () and "b" not in state.naming_by_beneficiary
    state = log.submit("alice", "b", job().gpus(8)).fold()
    assert state.jobs["b"].phase == "submitted" and state.jobs["v"].preempted_for == ""
    assert state.jobs["v"].phase == "checkpointing"  # it still stops, for nobody


def test_letting_an_ended_beneficiary_go_changes_no_verdict() -> None:
    # v was stopped for b, b was cancelled, v was admitted again. Kept (an hour's retention), b
    # still counted: the fold voided c's move of w as waiting on v ("not placed again yet");
    # let go at once, it took the same move. The same log, two states of the live jobs.
    log = LogBuilder().nodes(Cluster(3)).queue("team-a")
    log.submit("bob", "v", job().gpus(8).checkpointable()).accept("v").admit("v")
    log.place(on("node-00", *range(8), job_id="v")).started("node-00", "v")
    for name, node in (("w", "node-01"), ("x", "node-02")):
        log.submit("bob", name, job().gpus(4)).accept(name).admit(name)
        log.place(on(node, 0, 1, 2, 3, job_id=name)).started(node, name)
    log.submit("alice", "b", job().gpus(8)).accept("b", priority=5).preempt("b", "v")
    log.request("alice", "cancel", CancelJob(job_id="b"))
    log.exited("node-00", "v", code=143, stopped=True).requeue("v", 0, "preempted").admit("v", attempt=1)
    log.submit("alice", "c", job().gpus(8)).accept("c", priority=1).admit("c")
    moves = (
        placement("c", worker(0, "node-01", *map(whole, range(8)))),
        placement("w", worker(0, "node-02", *map(whole, range(4, 8)))),
    )
    log.event(
        subj.decision("preemptor"),
        PreemptionRequested(
            based_on=log.last_seq, now=log.time, beneficiary="c", victims=(Victim("w", 0),),
            deadline=log.time + 30.0, moves=moves,
        ),
    )  # fmt: skip
    phases = []
    for keep in (3600.0, 0.0):
        state = State(retention=RetentionSpec(keep))
        for r in log.records:
            apply(state, r)
        indexes.check(state)
        phases.append((state.jobs["w"].phase, state.jobs["v"].preempted_for, "b" in state.jobs))
    assert phases == [("checkpointing", "", True), ("checkpointing", "", False)], phases


# -- a tenant's jobs -------------------------------------------------------------------------------


def _held(state: State) -> dict[str, int]:
    """How many jobs each tenant has in the state."""
    return {tenant: len(ids) for tenant, ids in state.jobs_by_tenant.items()}


def test_a_tenant_past_its_jobs_in_the_state_is_refused_until_some_are_let_go() -> None:
    # Alice may have 3 jobs in the state: a finished one not let go counts, and so does one
    # admission rejected; her fourth submission is refused with the reason, and Bob's is not.
    log = LogBuilder().nodes(Cluster(1)).retention(60.0, jobs_per_tenant=3).queue("team-a")
    done(running("a1", log=log), "a1")
    log.submit("alice", "a2", job().gpus(1)).accept("a2")
    log.submit("alice", "bad", job().gpus(1))
    why = Reason("invalid", "too big")
    log.event(subj.job("bad"), JobRejected(job_id="bad", request_seq=log.last_seq, reason=why))
    state = log.submit("alice", "a4", job().gpus(1)).fold()
    r = state.rejections[-1]
    assert (r.code, r.job_id) == ("limit", "a4") and "a4" not in state.jobs
    assert "has 3 jobs in the cluster's state, the most one tenant may have (3)" in r.message
    assert _held(state) == {"alice": 3}
    state = log.submit("bob", "b1", job().gpus(1)).fold()
    assert state.jobs["b1"].phase == "submitted" and _held(state) == {"alice": 3, "bob": 1}
    # A minute after a1 and bad ended, both are let go: Alice may submit again.
    ended = state.jobs["bad"].phase_since
    state = log.at(ended + 60.0).submit("alice", "a4", job().gpus(1)).fold()
    assert state.jobs["a4"].phase == "submitted" and _held(state) == {"alice": 2, "bob": 1}
    indexes.check(state)


def test_a_tenant_past_what_its_jobs_specs_may_hold_is_refused_until_some_are_let_go() -> None:
    # A job of 200 KiB of env, rejected or not, was as cheap as any under the count: 300 of
    # them took 544 MiB of one process. Now what their specs hold is counted too.
    env = {f"V{i}": "x" * 60_000 for i in range(3)}
    big = job().gpus(1).build()
    big = msgspec.structs.replace(big, env=env)
    size = indexes.spec_bytes(big)
    assert size > 180_000
    log = (
        LogBuilder().nodes(Cluster(1)).retention(60.0, spec_bytes_per_tenant=2 * size + 1000).queue("team-a")
    )
    log.submit("alice", "b1", big)
    why = Reason("invalid", "env is too large")
    log.event(subj.job("b1"), JobRejected(job_id="b1", request_seq=log.last_seq, reason=why))
    log.submit("alice", "b2", big).accept("b2")
    state = log.submit("alice", "b3", big).fold()
    r = state.rejections[-1]
    assert (r.code, r.job_id) == ("limit", "b3") and "b3" not in state.jobs
    assert f"hold {2 * size} bytes of specs and this one {size}" in r.message
    state = log.submit("alice", "small", job().gpus(1)).fold()  # a usual spec still fits
    assert state.jobs["small"].phase == "submitted"
    state = log.submit("bob", "b1-of-bob", big).fold()
    assert state.jobs["b1-of-bob"].phase == "submitted"
    # A minute after the rejected one ended, it is let go, and what it held with it.
    ended = state.jobs["b1"].phase_since
    state = log.at(ended + 60.0).submit("alice", "b3", big).fold()
    assert state.jobs["b3"].phase == "submitted"
    assert state.spec_bytes_by_tenant["alice"] == 2 * size + indexes.spec_bytes(state.jobs["small"].spec)
    indexes.check(state)


@pytest.mark.parametrize(
    "field",
    ["queue", "name", "priority_class", "image", "command", "env", "labels", "node_selector", "mounts"]
    + ["gpu_models", "mig"],
)
def test_every_string_a_spec_carries_counts(field: str) -> None:
    # A 250 KiB queue name was measured at the fixed part alone, and kept for the retention
    # period once admission rejected it.
    from corral.events.jobs import Mount

    big = "x" * 100_000
    spec = job().gpus(1).build()
    res = spec.resources
    changed = {
        "command": (big,),
        "env": {"K": big},
        "labels": {"k": big},
        "node_selector": {"k": big},
        "mounts": (Mount(source=big, target="/t"),),
    }.get(field, big)
    if field in ("gpu_models", "mig"):
        value = (big,) if field == "gpu_models" else big
        spec = msgspec.structs.replace(spec, resources=msgspec.structs.replace(res, **{field: value}))
    else:
        spec = msgspec.structs.replace(spec, **{field: changed})
    assert indexes.spec_bytes(spec) >= 100_000


@pytest.mark.parametrize("most", [0, indexes.SPEC_BYTES - 1])
def test_a_limit_of_no_spec_is_refused(most: int) -> None:
    state = LogBuilder().retention(60.0, spec_bytes_per_tenant=most).fold()
    assert state.rejections[-1].code == "malformed" and state.retention == RetentionSpec()


@pytest.mark.parametrize("most", [0, -1])
def test_a_limit_of_no_job_is_refused(most: int) -> None:
    state = LogBuilder().retention(60.0, jobs_per_tenant=most).fold()
    assert state.rejections[-1].code == "malformed" and state.retention == RetentionSpec()


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


# -- bounded: what finished jobs leave behind -------------------------------------------------------

ROUND_S = 10.0  # log time a round of the churn below takes; the retention keeps the last few rounds


def churn(log: LogBuilder, i: int) -> None:
    """One round of the kinds of job a cluster sees end: a one-GPU job that succeeds, a gang of
    two 8-GPU workers over both nodes that succeeds, a job that fails, one preempted for
    another that then runs and is cancelled (and the one it stopped, requeued, then too), one
    cancelled while queued, one rejected at submission, and duplicate submissions refused.
    Every job of the round has given its GPUs back when the round ends. (Ids of one length: a
    snapshot's bytes do not grow with them.)"""
    a, g, f, v, b, q, r = (f"{kind}{i:05d}" for kind in "agfvbqr")
    log.at(1000.0 + i * ROUND_S)
    running(a, job().gpus(1).build(), log=log)
    done(log, a)
    log.submit("alice", g, job().gpus(8).replicas(2)).accept(g).admit(g, replicas=2)
    log.place(placement(g, worker(0, N0, *map(whole, range(8))), worker(1, N1, *map(whole, range(8)))))
    for rank, node in ((0, N0), (1, N1)):
        log.started(node, g, rank=rank)
    for rank, node in ((0, N0), (1, N1)):
        log.exited(node, g, rank=rank, code=0)
    running(f, job().gpus(2).restarts(0, "never").build(), log=log, gpus=(0, 1))
    log.exited(N0, f, code=1)
    running(v, job().gpus(8).build(), log=log, gpus=tuple(range(8)))
    log.submit("bob", b, job().gpus(8)).accept(b, priority=5).preempt(b, v)
    log.exited(N0, v, code=143, stopped=True).requeue(v, 0, "preempted")
    log.admit(b).place(on(N0, *range(8), job_id=b)).started(N0, b)
    log.request("bob", "cancel", CancelJob(job_id=b))
    log.exited(N0, b, code=143, stopped=True)
    log.request("alice", "cancel", CancelJob(job_id=v))  # requeued, it waits: until cancelled
    log.submit("alice", q, job().gpus(1)).accept(q)
    log.request("alice", "cancel", CancelJob(job_id=q))
    log.submit("alice", r, job().gpus(1))
    why = Reason("invalid", "too big")
    log.event(subj.job(r), JobRejected(job_id=r, request_seq=log.last_seq, reason=why))
    for _ in range(2):  # retries of one still kept: duplicates (the recent refusals fill up)
        log.submit("alice", a, job().gpus(1))


def sizes(state: State) -> dict[str, int]:
    """Entries in each collection the State keeps, one level down into dicts of collections."""
    out = {}
    for name in state.__struct_fields__:
        value = getattr(state, name)
        if isinstance(value, dict):
            inner = [v for v in value.values() if isinstance(v, dict | list)]
            out[name] = len(value) + sum(len(v) for v in inner)
        elif isinstance(value, list):
            out[name] = len(value) - (state.finished_from if name == "finished" else 0)
    return out


def snapshot_size(state: State) -> int:
    """The State's bytes as a snapshot holds it, less the let-go head of ``finished`` that the
    fold trims in batches (at most ``retention._TRIM`` entries: bounded, but not the same from
    one record to the next)."""
    waiting = state.finished[state.finished_from :]
    return len(msgspec.msgpack.encode(msgspec.structs.replace(state, finished=waiting, finished_from=0)))


def test_the_state_after_many_finished_jobs_past_retention_is_as_large_as_after_few() -> None:
    """Past the retention period, what the State holds is what runs and what finished within it:
    every index, the jobs, the finished list still waited on, the runtimes learned, the recent
    rejections and a snapshot's bytes are the same after 600 rounds of churn as after 1,200.
    (A snapshot is the State as msgpack.) A collection that grew with each job that ever
    finished would differ here."""
    log = LogBuilder(step=0.01).nodes(Cluster(3)).queue("team-a").retention(3 * ROUND_S)
    for i in range(600):
        churn(log, i)
    running("live", job().gpus(1).build(), log=log, node="node-02")  # one job runs throughout
    log.submit("alice", "waiting", job().gpus(1)).accept("waiting")  # and one waits
    log.cordon(N0, False)
    state = log.fold()
    early_sizes, early_bytes, early_let_go = sizes(state), snapshot_size(state), state.let_go
    folded = len(log.records)
    for i in range(600, 1200):
        churn(log, i)
    log.cordon(N0, False)
    state = fold(log.records[folded:], state)
    assert state.let_go >= 2 * early_let_go  # as many again were let go...
    # ...and nothing the State keeps grew with them (the rejections are bounded: each tenant's
    # at most ``MAX_REJECTIONS_PER_TENANT``, the services' share the rest, filling up slowly)
    later = sizes(state)
    for kept in ("rejections", "rejections_kept"):  # the second: their positions, by tenant
        assert later.pop(kept) <= 2 * MAX_REJECTIONS and early_sizes.pop(kept) <= 2 * MAX_REJECTIONS
    assert later == early_sizes
    assert snapshot_size(state) <= 1.01 * early_bytes  # longer numbers only: seqs, times
    assert {"live", "waiting"} <= state.jobs.keys() and len(state.jobs) <= 3 * 7 + 2
    assert state.faults == 0
    indexes.check(state)


def test_a_beneficiary_lists_only_the_victims_that_still_stop_for_it() -> None:
    # b waited while job after job was stopped for it and then cancelled: each stayed on b's
    # list, which every admission cycle walks, for as long as b waited.
    spec = job().gpus(8).checkpointable()
    log = LogBuilder().nodes(Cluster(1)).retention(3600.0).queue("team-a")
    log.submit("alice", "b", job().gpus(8)).accept("b", priority=5)
    for i in range(20):
        v = f"v{i}"
        log.submit("bob", v, spec).accept(v).admit(v).place(on(N0, *range(8), job_id=v)).started(N0, v)
        log.preempt("b", v).request("bob", "cancel", CancelJob(job_id=v))
        log.exited(N0, v, code=143, stopped=True)
    state = log.fold()
    assert state.jobs["b"].victims == () and state.jobs["v19"].preempted_for == ""
    assert [state.jobs[f"v{i}"].phase for i in range(20)] == ["cancelled"] * 20


def test_a_report_of_an_earlier_job_of_the_id_is_not_taken_as_the_new_ones() -> None:
    # j's node was lost while j ran, and j was cancelled and let go; j submitted again is placed
    # on the node at the same attempt. The earlier j's process, still running there, wrote a
    # checkpoint: taken as the new j's, the new j resumed from another run's work.
    spec = job().gpus(1).checkpointable()
    log = LogBuilder().nodes(Cluster(1)).queue("team-a").retention(0.0)
    log.submit("alice", "j", spec).accept("j").admit("j").place(on(N0, 0, job_id="j")).started(N0, "j")
    old = log.fold().jobs["j"].submitted_seq
    log.condition(N0, "lost").request("alice", "cancel", CancelJob(job_id="j")).condition(N0, "ready")
    log.submit("alice", "j", spec).accept("j").admit("j").place(on(N0, 1, job_id="j"))
    new = log.fold().jobs["j"].submitted_seq
    late = (
        CheckpointCompleted(node=N0, job_id="j", attempt=0, location="/ckpt/j/old", step=999, run=old),
        WorkerStarted(node=N0, job_id="j", attempt=0, rank=0, run=old),
        WorkerExited(node=N0, job_id="j", attempt=0, rank=0, code=1, run=old),
    )
    for body in late:
        state = log.event(subj.node(N0), body).fold()
        assert state.rejections[-1].code == "unknown" and f"run {old}" in state.rejections[-1].message
    assert state.jobs["j"].phase == "placed" and state.jobs["j"].checkpoint is None
    state = log.event(subj.node(N0), WorkerStarted(node=N0, job_id="j", attempt=0, rank=0, run=new)).fold()
    assert state.jobs["j"].phase == "running"
