"""``corral explain`` from the log alone: a job's history in operator words, why it waits, what of
it was refused, and nothing of it for another tenant."""

from __future__ import annotations

import json

import msgspec
import pytest

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.decisions import GpuClaim, JobsUnschedulable, PreemptionRequested, Unschedulable
from corral.events.jobs import REASON_CHARS, CancelJob, PendingReasonChanged
from corral.events.nodes import WorkerExited, WorkerStarted
from corral.events.queues import ApplyCohort, CohortSpec, CordonNode, QueueSpec, Quota
from corral.projections import queueing
from corral.projections.fold_moves import MAX_PREEMPTION_TIMES
from corral.projections.index import summarize
from corral.projections.quota import ANY
from corral.projections.state import JobState, State
from corral.services.agent.decide import StartFailed, WorkerKey, report_events
from corral.services.cli import screen, table
from corral.services.dashboard.board import timeline
from corral.services.query.explain import anyone_stoppable, other_sides
from corral.services.query.view import explain_log
from tests.builders import Cluster, LogBuilder, job, on, placement, worker
from tests.unit import test_restart_keeps_place as keeps
from tests.unit.test_consolidation import N1, _at, _gpus, _move
from tests.unit.test_consolidation import world as scattered
from tests.unit.test_preemptor import N0, World, gpus, whole


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
    # Nothing runs that could be stopped for it: preemption could not help.
    assert (
        "why: [quota] needs 2 GPUs; queue team-a at its nominal 16/16 (no running job may be stopped" in text
    )
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


def test_a_job_moved_to_make_room_reads_as_moved_not_preempted() -> None:
    # The admin's explain of a job a consolidation moved read "preempted for: b1", and its history
    # "asked to checkpoint and yield to b1": as if b1 had taken its place, not made it run elsewhere.
    w = scattered()
    [move] = w.decide()
    assert isinstance(move, PreemptionRequested) and move.moves
    w.emit(subj.decision("preemptor"), move)
    a2 = w.state.jobs["a2"]
    (line,) = other_sides(w.state, a2)
    assert line.startswith("moved to make room for: b1 ("), line
    asked = "asked to checkpoint and move elsewhere, to make room for b1, by "
    assert summarize(move, "a2").startswith(asked)
    assert summarize(move, "b1") == "room made on its behalf by moving a2"
    (beneficiary,) = other_sides(w.state, w.state.jobs["b1"])
    assert beneficiary.startswith("stopped, shrunk or moved for it: a2 ("), beneficiary
    # The dashboard's timeline marks it moved, and counts no preemption.
    entry = {"seq": 9, "time": 1.0, "type": "PreemptionRequested", "summary": summarize(move, "a2")}
    told = {"job": {"per_worker": "2 GPU", "workers": 1}, "reasons": [], "history": [entry], "seq": 9}
    t = timeline("a2", told)
    assert [e["kind"] for a in t["attempts"] for e in a["events"]] == ["moved"]
    assert t["counts"]["preempted"] == 0


def test_a_job_preempted_for_one_it_was_moved_for_long_ago_reads_as_preempted() -> None:
    # a2 was moved for b1, then stopped for as many others as ``stopped_for`` keeps, which
    # dropped the move: b1 could then preempt it (team-a borrows b's quota), and the admin read
    # "moved to make room for: b1" of that preemption, and nothing of it under "preempted for".
    w = scattered(nominal=(4, 28), cohort=True)
    assert _move(w, ("a2",), (_at(w, "b1", N0, 4, 5, 6, 7), _at(w, "a2", N1, 6, 7))) is None
    w.stop("a2").requeue("a2")
    for i in range(MAX_PREEMPTION_TIMES):
        w.admit("a2").place("a2", (N1, _gpus(6, 7))).start("a2")
        w.waiting(f"c{i}", job().queue("a").gpus(1).build(), priority=10)
        w.preempt(f"c{i}", "a2").stop("a2").requeue("a2")
        w.emit(subj.request("alice", "cancel"), CancelJob(job_id=f"c{i}"), "alice")
    w.admit("a2").place("a2", (N1, _gpus(6, 7))).start("a2").preempt("b1", "a2")
    said = other_sides(w.state, w.state.jobs["a2"])
    assert said[0].endswith(", b1 (alice, queue b)") and len(said) == 1, said


def _two_reservations(reserved_for: str | None) -> LogBuilder:
    """big-c (carol) holds the reservation a placer cycle made for it, big-a (alice) still says
    it holds one from an earlier cycle, and bob's w waits behind ``reserved_for`` (None: its
    reason does not say which, as one recorded before reasons said it)."""
    log = LogBuilder().nodes(Cluster(1)).queues("team-a", "team-b", "team-c")
    for tenant, job_id, queue in (
        ("alice", "big-a", "team-a"),
        ("carol", "big-c", "team-c"),
        ("bob", "w", "team-b"),
    ):
        log.submit(tenant, job_id, job(queue)).accept(job_id)
    log.admit("big-a", "big-c", "w")
    held = Reason(queueing.RESERVED, "holds a reservation on 8 GPUs of n0, free at t=5000s", True)
    earlier = JobsUnschedulable(
        based_on=log.last_seq, now=log.time, jobs=(Unschedulable("big-a", 0, (held,)),)
    )
    log.event(subj.decision("placer"), earlier)
    why = "the free GPUs that fit are reserved for another tenant's job (free at t=6000s); ..."
    waits = Reason(queueing.RESERVATION, why, True, reserved_for=reserved_for)
    now = (Unschedulable("big-c", 0, (held,)), Unschedulable("w", 0, (waits,)))
    return log.event(
        subj.decision("placer"), JobsUnschedulable(based_on=log.last_seq, now=log.time, jobs=now)
    )


def test_the_admin_is_told_the_one_reservation_a_job_waits_behind() -> None:
    # Two admitted jobs said they held a reservation (one from an earlier cycle), and the admin
    # read both as the jobs the free GPUs w waits for are reserved for.
    told = explain_log(_two_reservations("big-c").records, "w", None)
    assert told is not None
    said = [line.strip() for line in told["text"].splitlines() if "reserved for:" in line]
    assert said == ["the free GPUs that fit are reserved for: big-c (carol, queue team-c)"]
    assert told["reasons"][0]["reserved_for"] == "big-c"
    # Its owner is told neither, in the text or the data.
    mine = explain_log(_two_reservations("big-c").records, "w", "bob")
    assert mine is not None and "big-c" not in json.dumps(mine) and "reserved_for" not in json.dumps(mine)


def test_a_log_that_does_not_say_which_reservation_reads_as_before() -> None:
    # A placer that did not record which job a reason waits behind wrote reasons without the
    # field: they decode, encode again to the same bytes, and the admin is told every job that
    # says it holds a reservation, as then.
    records = _two_reservations(None).records
    waits = codec.decode_envelope(records[-1].data)
    assert isinstance(waits.body, JobsUnschedulable)
    (reason,) = waits.body.jobs[1].reasons
    assert reason.reserved_for is None
    assert b"reserved_for" not in records[-1].data and codec.encode(waits) == records[-1].data
    told = explain_log(records, "w", None)
    assert told is not None and "reserved_for" not in told["reasons"][0]
    assert (
        "the free GPUs that fit are reserved for: big-a (alice, queue team-a), big-c (carol" in told["text"]
    )


def _holding(
    priority: int, queue: str = "team-a", preemptible: bool = True, cohort: bool = False, nominal_b: int = 8
) -> LogBuilder:
    """j1 (priority 5, queue team-a) waits for GPUs that ``holder`` of ``priority`` holds; with
    ``cohort``, team-a and team-b share one; team-b's nominal is ``nominal_b``."""
    log = LogBuilder().nodes(Cluster(1))
    if cohort:
        log.admin("cohort", ApplyCohort(cohort=CohortSpec("ml")))
    for name in ("team-a", "team-b"):
        nominal = nominal_b if name == "team-b" else 8
        log.queue(QueueSpec(name=name, cohort="ml" if cohort else None, quotas={ANY: Quota(nominal)}))
    log.submit("bob", "holder", job().queue(queue).gpus(8).preemptible(preemptible)).accept(
        "holder", priority
    )
    log.admit("holder").place(placement("holder", worker(0, "node-00", *(GpuClaim(g) for g in range(8)))))
    log.started("node-00", "holder")
    log.submit("alice", "j1", job().gpus(8)).accept("j1", 5).admit("j1")
    why = Reason("gpus", "node node-00: needs 8 free GPUs it can use, has 0", preemption_helps=True)
    return log.event(subj.job("j1"), PendingReasonChanged(job_id="j1", reasons=(why,)))


@pytest.mark.parametrize(
    ("priority", "queue", "preemptible", "cohort", "nominal_b", "could"),
    [
        (0, "team-a", True, False, 8, True),  # a lower-priority job of its queue
        (5, "team-a", True, False, 8, False),  # only a job of its priority holds the GPUs
        (9, "team-a", True, False, 8, False),  # ... or of a higher one
        (0, "team-a", False, False, 8, False),  # ... or one that may not be preempted
        (9, "team-b", True, False, 8, False),  # another queue, in no cohort with it: nothing to reclaim
        (0, "team-b", True, False, 8, False),  # ... of a lower priority too
        (9, "team-b", True, True, 8, False),  # one of its cohort within its nominal: it lent nothing
        (0, "team-b", True, True, 8, False),  # ... of a lower priority too
        (9, "team-b", True, True, 4, True),  # one of its cohort that borrows what team-a lent
    ],
)
def test_preemption_could_help_only_where_a_running_job_may_be_stopped(
    priority: int, queue: str, preemptible: bool, cohort: bool, nominal_b: int, could: bool
) -> None:
    # It said "preemption could help" beside every node short of room, also where only jobs of a
    # higher priority held the GPUs and no rule would stop one of them, or where a queue of its
    # cohort held them within its nominal, which no other queue's job may take from it.
    report = explain_log(_holding(priority, queue, preemptible, cohort, nominal_b).records, "j1", None)
    assert report is not None
    hint = "(preemption could help)" if could else "(no running job may be stopped for it)"
    assert f"has 0 {hint}" in report["text"]


def test_a_drain_joins_the_history_of_the_jobs_it_sends_away() -> None:
    # A drain is a record of the node's: the jobs it asked to checkpoint and leave had nothing of
    # it in their histories until they were requeued, while they checkpointed.
    log = LogBuilder().nodes(Cluster(3)).queues("team-a")
    for jid, node in (("j1", "node-00"), ("j2", "node-01")):
        log.submit("alice", jid, job().gpus(8).checkpointable()).accept(jid).admit(jid)
        log.place(placement(jid, worker(0, node, *(GpuClaim(g) for g in range(8))))).started(node, jid)
    log.admin("cordon", CordonNode(node="node-00", drain=True, reason="fan failure"))
    for asker in (None, "alice"):
        report = explain_log(log.records, "j1", asker)
        assert report is not None
        (line,) = [h for h in report["history"] if h["type"] == "CordonNode"]
        assert line["summary"].startswith("asked to checkpoint and leave by ")
        assert line["summary"].endswith(": node node-00 is draining: fan failure")
    report = explain_log(log.records, "j2", None)
    assert report is not None and not [h for h in report["history"] if h["type"] == "CordonNode"]
    # A job that does not checkpoint is stopped at once: it was told it had until a deadline.
    log.submit("alice", "j3", job().gpus(8)).accept("j3").admit("j3")
    log.place(placement("j3", worker(0, "node-02", *(GpuClaim(g) for g in range(8))))).started(
        "node-02", "j3"
    )
    log.admin("cordon", CordonNode(node="node-02", drain=True, reason="cables"))
    report = explain_log(log.records, "j3", None)
    assert report is not None
    assert [h["summary"] for h in report["history"] if h["type"] == "CordonNode"] == [
        "stopped: node node-02 is draining: cables"
    ]
    # A cordon alone sends nothing away.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1")
    log.place(placement("j1", worker(0, "node-00", *(GpuClaim(g) for g in range(8))))).started(
        "node-00", "j1"
    )
    log.admin("cordon", CordonNode(node="node-00", reason="maintenance"))
    report = explain_log(log.records, "j1", None)
    assert report is not None and not [h for h in report["history"] if h["type"] == "CordonNode"]


def test_preemption_could_help_where_a_job_placed_and_not_started_may_be_stopped() -> None:
    # A preemption stops a job placed and not started as it stops a running one: only running
    # jobs were looked at, and the hint said none could be stopped.
    w = World().queue("team-a", 16)
    w.submit("holder", gpus(8)).admit("holder").place("holder", whole(N0, *range(8)))
    w.waiting("j1", gpus(8), priority=10)
    assert w.state.jobs["holder"].phase == "placed"
    assert w.victims() == {"j1": ["holder"]}
    assert anyone_stoppable(w.state, w.state.jobs["j1"])


def test_preemption_could_help_where_a_job_of_its_priority_may_be_moved() -> None:
    # b1 waits for GPUs scattered over two nodes, all held by jobs of its priority: the
    # preemptor moves a2 to make room (a consolidation), and the hint said no job could be.
    w = scattered()
    [p] = w.plan()
    assert [v.job_id for v in p.victims] == ["a2"] and p.moves
    assert anyone_stoppable(w.state, w.state.jobs["b1"])
    # Where the free GPUs do not add up to its ask, no move makes room for it.
    w = scattered(a3_gpus=8)
    assert w.plan() == []
    assert not anyone_stoppable(w.state, w.state.jobs["b1"])


def test_a_drain_that_sends_a_job_nowhere_is_not_in_its_history() -> None:
    # j1 spans both nodes. Drained off node-00, it checkpoints and keeps its deadline: draining
    # node-01 too, or node-00 again, asks nothing more of it, yet each added a line saying it was
    # asked to leave (under node-01's record, "node node-00 is draining").
    log = LogBuilder().nodes(Cluster(2)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8).replicas(2).checkpointable()).accept("j1").admit("j1", replicas=2)
    gpus = tuple(GpuClaim(g) for g in range(8))
    log.place(placement("j1", worker(0, "node-00", *gpus), worker(1, "node-01", *gpus)))
    log.started("node-00", "j1", rank=0).started("node-01", "j1", rank=1)
    log.admin("cordon", CordonNode(node="node-00", drain=True, reason="fan failure"))
    log.admin("cordon", CordonNode(node="node-00", drain=True, reason="fan failure, still"))
    log.admin("cordon", CordonNode(node="node-01", drain=True, reason="maintenance"))
    report = explain_log(log.records, "j1", None)
    assert report is not None
    lines = [h["summary"] for h in report["history"] if h["type"] == "CordonNode"]
    assert len(lines) == 1 and lines[0].endswith(": node node-00 is draining: fan failure"), lines


NODE_FULL = "cannot prepare directories: No space left on device"
NO_COMMAND = "cannot run bwrap: bwrap: execvp no-such-command: No such file or directory"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"node_fault": NODE_FULL}, f"rank 0 could not start on node-00, the node's own fault: {NODE_FULL}"),
        ({"start_error": NO_COMMAND}, f"rank 0 could not start on node-00: {NO_COMMAND}"),
    ],
    ids=["the-node's", "the-job's"],
)
def test_a_start_that_failed_reads_so_in_its_history_and_says_whose_fault(
    fault: dict[str, str], said: str
) -> None:
    # It read "rank 0 exited with code 127 on node-00", as a command that ran and failed so, or
    # was not there: neither whose fault nor why.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1")
    log.place(placement("j1", worker(0, "node-00", *(GpuClaim(g) for g in range(8))))).started(
        "node-00", "j1"
    )
    exited = WorkerExited(node="node-00", job_id="j1", attempt=0, rank=0, code=127)
    log.event(subj.node("node-00"), msgspec.structs.replace(exited, **fault))
    report = explain_log(log.records, "j1", "alice")
    assert report is not None
    assert [h["summary"] for h in report["history"] if h["type"] == "WorkerExited"] == [said]


@pytest.mark.parametrize("node_fault", [True, False], ids=["the-node's", "the-job's"])
def test_a_start_that_failed_is_not_said_to_have_started(node_fault: bool) -> None:
    # Its history read "rank 0 started on node-00", then "rank 0 could not start on node-00":
    # the agent reports a failed start as a start and its exit, which the fold needs in turn.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1")
    log.place(placement("j1", worker(0, "node-00", *(GpuClaim(g) for g in range(8)))))
    for ev in report_events("node-00", StartFailed(WorkerKey("j1", 0, 0), NODE_FULL, node_fault)):
        log.event(subj.node("node-00"), ev)
    report = explain_log(log.records, "j1", "alice")
    assert report is not None
    lines = [h["summary"] for h in report["history"] if h["type"].startswith("Worker")]
    assert len(lines) == 1 and lines[0].startswith("rank 0 could not start on node-00"), lines
    assert "started" not in report["text"]


def test_a_failed_start_the_fold_refused_is_kept_in_the_history() -> None:
    # A start marked failed is left out of a job's history, its exit telling of it; one the fold
    # refused (sent by another node's agent) has no exit to tell of it, and went unseen with it.
    log = LogBuilder().nodes(Cluster(2)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1")
    log.place(placement("j1", worker(0, "node-00", *(GpuClaim(g) for g in range(8)))))
    forged = WorkerStarted(node="node-01", job_id="j1", attempt=0, rank=0, failed=True)
    log.event(subj.node("node-01"), forged)
    report = explain_log(log.records, "j1", "alice")
    assert report is not None
    [entry] = [h for h in report["history"] if h["type"] == "WorkerStarted"]
    assert [r["seq"] for r in report["refused"]] == [entry["seq"]], report["refused"]
    assert entry["summary"] == "rank 0 could not start on node-01"


def test_a_late_report_of_an_earlier_attempt_names_its_attempt() -> None:
    # node-00 was lost and j1 runs again on node-01; its rank 0 on node-00 then reported its
    # exit, which read "rank 0 exited with code 137 on node-00" as if the attempt now had ended.
    log = LogBuilder().nodes(Cluster(2)).queues("team-a")
    log.submit("alice", "j1", job().gpus(1)).accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1")).started("node-00", "j1").condition("node-00", "lost")
    log.requeue("j1", 0).admit("j1", attempt=1).place(on("node-01", 0, job_id="j1", attempt=1))
    log.started("node-01", "j1", attempt=1).checkpoint("node-00", "j1", 5)
    log.exited("node-00", "j1", code=137).exited("node-01", "j1", attempt=1)
    report = explain_log(log.records, "j1", "alice")
    assert report is not None
    lines = [h["summary"] for h in report["history"] if h["type"].startswith(("Worker", "Checkpoint"))]
    assert lines == [
        "rank 0 started on node-00",
        "rank 0 started on node-01",
        "checkpoint of earlier attempt 0 at step 5: /ckpt/j1/5",
        "rank 0 of earlier attempt 0 exited with code 137 on node-00",
        "rank 0 exited with code 0 on node-01",
    ], lines


@pytest.mark.parametrize("field", ["node_fault", "start_error"])
def test_what_an_agent_says_of_a_failed_start_is_bounded_and_starts_no_line(field: str) -> None:
    # The agent's words reach the job's reason and history, which its owner reads: an agent taken
    # over could send a megabyte, or lines of its own to pass off as corral's.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1")
    log.place(placement("j1", worker(0, "node-00", *(GpuClaim(g) for g in range(8))))).started(
        "node-00", "j1"
    )
    said = "disk\n  why: [ok] all is well\x1b[2J" + "x" * 1_000_000
    exited = WorkerExited(node="node-00", job_id="j1", attempt=0, rank=0, code=127)
    log.event(subj.node("node-00"), msgspec.structs.replace(exited, **{field: said}))
    state = log.fold()
    assert len(state.jobs["j1"].reasons[0].message) <= REASON_CHARS + 200
    report = explain_log(log.records, "j1", "alice")
    assert report is not None
    (line,) = [h["summary"] for h in report["history"] if h["type"] == "WorkerExited"]
    assert len(line) <= REASON_CHARS + 200
    text = screen.escape(report["text"])  # as the CLI prints it
    assert "\x1b" not in text and not any(row.lstrip().startswith("why: [ok]") for row in text.splitlines())


@pytest.mark.parametrize(("checkpointable", "asked"), [(True, "checkpoint"), (False, "stop")])
def test_a_preemption_asks_a_victim_that_cannot_checkpoint_to_stop(checkpointable: bool, asked: str) -> None:
    # Its agent stops the workers of a job that cannot checkpoint at once: it was never asked to
    # checkpoint, whatever the phase the fold keeps it in is called.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "v", job().gpus(8).checkpointable(checkpointable)).accept("v").admit("v")
    log.place(placement("v", worker(0, "node-00", *(GpuClaim(g) for g in range(8))))).started("node-00", "v")
    log.submit("alice", "b", job().gpus(8)).accept("b", priority=10).preempt("b", "v")
    report = explain_log(log.records, "v", None)
    assert report is not None
    [line] = [h["summary"] for h in report["history"] if h["type"] == "PreemptionRequested"]
    assert line.startswith(f"asked to {asked} and yield to b by "), line


def test_a_job_back_from_a_planned_shutdown_says_it_keeps_its_place() -> None:
    # ``run`` ran on the whole node when ``corral up`` stopped; requeued and admitted again, it
    # waits for the node to come back, ahead of the job its reservation was for.
    records = keeps._admission_cycle(keeps._stopped(keeps._before())).records
    line = (
        "keeps its place on node node-00 (GPUs 0, 1, 2, 3, 4, 5, 6, 7) from before a planned shutdown "
        "(corral stopped): held from every other job, it is placed first"
    )
    for asker in (None, "alice"):
        report = explain_log(records, "run", asker)
        assert report is not None and line in report["text"]
    # A node lost keeps nobody's place, and the job's explain says nothing of one.
    lost = keeps._before().condition(N0, "lost").exited(N0, "run", code=143, stopped=True)
    report = explain_log(keeps._admission_cycle(lost).records, "run", None)
    assert report is not None and "keeps its place" not in report["text"]
