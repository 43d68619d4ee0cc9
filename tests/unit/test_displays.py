"""What the CLI shows tells the truth: an elastic job's running and most workers, numbers as
numbers for ``-o json``, a node's health and MIG instances, quota in words (never ``4 *``)."""

from __future__ import annotations

import json

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.decisions import JobsPlaced
from corral.events.jobs import Admission, CancelJob, JobRequeued, JobsAdmitted, SubmitJob
from corral.events.queues import CordonNode
from corral.projections.fold import fold_refusals
from corral.projections.index import batch_lines, job_events, summarize
from corral.projections.state import State
from corral.services.cli import display
from corral.services.cli.display import job_table, node_table
from corral.services.dashboard import board
from corral.services.query import present
from corral.services.query.decide import Ask, answer
from corral.services.query.explain import explain
from corral.services.query.figures import cluster_figures
from corral.services.query.queues import queue_rows
from tests.builders import (
    Cluster,
    LogBuilder,
    job,
    mig_slot,
    on,
    placement,
    queue_spec,
    share,
    whole,
    worker,
)

N0, N1 = "node-00", "node-01"


def elastic(running: int) -> LogBuilder:
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "e", job().replicas(4, minimum=2)).accept("e").admit("e", replicas=3)
    log.place(placement("e", *(worker(r, N0, whole(r)) for r in range(3))))
    for r in range(running):
        log.started(N0, "e", rank=r)
    return log


def test_an_elastic_job_shows_how_many_run_of_its_range() -> None:
    state = elastic(running=2).fold()
    row = present.job_row(state.jobs["e"])
    assert (row["workers"], row["min_workers"], row["running_workers"]) == (4, 2, 2)
    assert present.workers_text(row) == "2 of 2..4"
    assert "2 of 2..4" in job_table([row])
    text = explain(state.jobs["e"], ())["text"]
    assert "wants 2..4×1 GPU (2 to 4 workers, elastic, admitted at 3)" in text and "2 running" in text


def test_a_gang_shows_what_it_asks_in_all_alike_in_every_view() -> None:
    # ``corral jobs`` showed "8 GPU" for a gang of four workers of 8 GPUs each: read as the job's
    # all, a quarter of what it holds.
    from corral.services.dashboard import board

    log = LogBuilder().nodes(Cluster(4)).queue(queue_spec("team-a", 32))
    log.submit("alice", "g", job().gpus(8).replicas(4)).submit("alice", "one", job().gpus(8))
    log.submit("alice", "cpu", job().gpus(0).replicas(2))
    log.submit("alice", "m", job().mig("3g.40gb").replicas(2))
    state = log.fold()
    rows = {j: present.job_row(state.jobs[j]) for j in ("g", "one", "cpu", "m")}
    said = {j: present.wants_text(r) for j, r in rows.items()}
    assert said == {"g": "4×8 GPU", "one": "8 GPU", "cpu": "no GPU", "m": "2×MIG 3g.40gb"}
    assert "4×8 GPU" in job_table([rows["g"]]).splitlines()[1]
    # The demo's tables write jobs as corral jobs does (they listed "1 GPU" per worker).
    assert display.job_cells([rows["g"]], ["id", "workers", "gpus"]) == [["g", "0 of 4", "4×8 GPU"]]
    assert "wants 4×8 GPU (4 workers)" in explain(state.jobs["g"], ())["text"]
    assert board._job(rows["g"], {})["wants"] == "4×8 GPU"
    assert board.timeline("g", {**explain(state.jobs["g"], ()), "seq": 1})["job"]["wants"] == "4×8 GPU"


def test_json_rows_hold_numbers_not_their_text() -> None:
    state = elastic(running=3).fold()
    row = json.loads(json.dumps(present.job_row(state.jobs["e"])))
    assert row["gpus_per_worker"] == 1 and isinstance(row["gpus_per_worker"], int)
    (q,) = queue_rows(state)
    assert (q["nominal"], q["used"], q["borrowed"]) == (8, 3, 0)
    assert all(not isinstance(q[k], str) for k in ("nominal", "used", "recent", "borrowed", "lent"))


N0, N1 = "node-00", "node-01"


def test_a_job_on_a_silent_node_is_said_to_be_there() -> None:
    # Its explain read "running, placed on node-00" and nothing else for the minute its node's
    # agent was silent: the job looked as healthy as any.
    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    log.place(on(N0, 0, job_id="j")).started(N0, "j")
    said = answer(log.fold(), {}, "alice", "explain", Ask(job="j"))["text"]
    assert "node-00 is suspect" not in said
    said = answer(log.condition(N0, "suspect").fold(), {}, "alice", "explain", Ask(job="j"))["text"]
    assert "\n  node node-00 is suspect: its agent missed heartbeats" in said, said


def test_a_finished_job_is_not_said_to_be_on_its_nodes() -> None:
    # A job that ended keeps its placement: once its node fell silent, or was lost, its explain
    # read as if it still ran there and would move if the node were called lost.
    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    log.place(on(N0, 0, job_id="j")).started(N0, "j").exited(N0, "j")
    for condition in ("suspect", "lost"):
        state = log.condition(N0, condition).fold()
        assert state.jobs["j"].phase == "succeeded"
        said = answer(state, {}, "alice", "explain", Ask(job="j"))["text"]
        assert f"node {N0} is" not in said, said


def test_a_finished_job_shows_where_it_was_not_where_it_is() -> None:
    # ``corral jobs`` and explain showed a job that had ended on its node, as a running one.
    from corral.services.dashboard import board

    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    log.place(on(N0, 0, job_id="j")).started(N0, "j")
    running = present.job_row(log.fold().jobs["j"])
    assert (running["nodes"], running["was_on"], present.nodes_text(running)) == (N0, "", N0)
    state = log.exited(N0, "j").fold()
    row = present.job_row(state.jobs["j"])
    assert (row["nodes"], row["was_on"]) == ("", N0)
    assert f"was on {N0}" in job_table([row]).splitlines()[1]
    said = explain(state.jobs["j"], ())
    assert f"\n  was on {N0}\n" in said["text"] and "placed on" not in said["text"], said["text"]
    assert board._job(row, {})["where"] == f"was on {N0}"
    assert board.timeline("j", {**said, "seq": 1})["job"]["where"] == f"was on {N0}"


def test_a_cancelled_job_is_on_its_node_until_its_workers_are_gone() -> None:
    # Cancelled, a job holds its GPUs until its workers exit: explain read "1 running" and "was
    # on node-00" while node-00's GPU was still its.
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    log.place(on(N0, 0, job_id="j")).started(N0, "j").request("alice", "cancel", CancelJob(job_id="j"))
    state = log.fold()
    assert state.jobs["j"].phase == "cancelled" and state.nodes[N0].gpus[0].holders == {"j": 1000}
    row = present.job_row(state.jobs["j"])
    assert (row["nodes"], row["was_on"]) == (N0, "")
    assert f"\n  placed on {N0}\n" in explain(state.jobs["j"], ())["text"]
    row = present.job_row(log.exited(N0, "j", code=143, stopped=True).fold().jobs["j"])
    assert (row["nodes"], row["was_on"]) == ("", N0)


def test_a_queues_row_shows_its_borrowing_and_lending_limits() -> None:
    # They were nowhere in ``corral queues``: an admin could not see what bounds a queue's
    # borrowing and lending.
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("capped", 4, borrowing_limit=2, lending_limit=3))
    state = log.queue(queue_spec("open", 4)).fold()
    rows = {r["queue"]: r for r in queue_rows(state)}
    assert (rows["capped"]["borrowing_limit"], rows["capped"]["lending_limit"]) == (2, 3)
    assert (rows["open"]["borrowing_limit"], rows["open"]["lending_limit"]) == (None, None)


def test_a_fraction_and_a_mig_slice_per_worker() -> None:
    log = LogBuilder().nodes(Cluster(1, profile="h100-8x-mig")).queue(queue_spec("team-a", 8))
    log.submit("alice", "f", job().milli(250)).submit("alice", "m", job().mig("3g.40gb"))
    state = log.fold()
    frac, mig = present.job_row(state.jobs["f"]), present.job_row(state.jobs["m"])
    assert (frac["per_worker"], frac["gpus_per_worker"]) == ("0.25 GPU", 0.25)
    assert (mig["per_worker"], mig["gpus_per_worker"], mig["mig"]) == ("MIG 3g.40gb", 0, "3g.40gb")


def test_a_node_shows_its_cordon_health_and_mig_instances() -> None:
    log = LogBuilder().nodes(Cluster(1, profile="h100-8x-mig")).queue(queue_spec("team-a", 8))
    log.submit("alice", "m", job().mig("3g.40gb")).accept("m").admit("m")
    log.place(placement("m", worker(0, N0, mig_slot(2, "3g.40gb", 0)))).started(N0, "m")
    log.gpu_health(N0, 5, healthy=False, signal="xid:79").cordon(N0, drain=True)
    row = present.node_row(log.fold().nodes[N0])
    assert (row["condition"], row["cordoned"], row["draining"]) == ("draining", True, True)
    assert row["unhealthy"] == [{"gpu": 5, "signal": "xid:79"}]
    assert row["mig_instances"] == [{"gpu": 2, "profile": "3g.40gb", "job": "m"}]
    assert present.health_text(row) == "gpu 5 xid:79"
    assert present.mig_text(row) == "8 GPUs: 3g.40gb"
    shown = node_table([row])
    assert "draining" in shown and "gpu 5 xid:79" in shown and "8 GPUs: 3g.40gb" in shown


def test_free_gpus_are_one_count_in_corral_nodes_and_in_the_metrics() -> None:
    """FREE is what work could be placed on now: a node that takes no new work shows 0 (its
    condition says why; its idle GPUs are ``idle`` in its JSON row), as the metrics' gauge
    counts it, and a GPU half held is half free in both."""
    log = LogBuilder().nodes(Cluster(7)).queue(queue_spec("team-a", 64))
    log.submit("alice", "h", job().milli(500)).accept("h").admit("h")
    log.place(placement("h", worker(0, N0, share(0, 500)))).started(N0, "h")
    log.gpu_health(N0, 7, healthy=False)
    log.condition("node-01", "lost").condition("node-02", "suspect").shutdown("node-03")
    log.cordon("node-04").cordon("node-05", drain=True)
    state = log.fold()
    rows = {n: present.node_row(state.nodes[n]) for n in sorted(state.nodes)}
    free = {n: r["free"] for n, r in rows.items()}
    assert free == {
        N0: 6.5,
        "node-01": 0,
        "node-02": 0,
        "node-03": 0,
        "node-04": 0,
        "node-05": 0,
        "node-06": 8,
    }
    assert [r["idle"] for r in rows.values()] == [6, 8, 8, 8, 8, 8, 8]
    ((gauge, _),) = cluster_figures(state)["corral.node.gpus.free"]
    assert gauge == sum(free.values()) == 14.5
    header, *shown = node_table(list(rows.values())).splitlines()
    at = header.index("FREE")
    assert [line[at:].split()[0] for line in shown] == ["6.5", "0", "0", "0", "0", "0", "8"]


def test_a_node_whose_agent_went_silent_says_why_it_takes_no_work() -> None:
    log = LogBuilder().nodes(Cluster(2)).condition(N0, "suspect").condition(N1, "lost")
    state = log.fold()
    suspect, lost = (present.node_row(state.nodes[n]) for n in (N0, N1))
    assert suspect["why"].startswith("its agent missed heartbeats: nothing new goes here")
    assert lost["why"].startswith("its agent went silent: its jobs went back to their queues")
    shown = node_table([suspect, lost])
    assert "missed heartbeats" in shown and "went silent" in shown
    # A cordon's reason is kept beside it.
    state = log.cordon(N1).fold()
    why = present.node_row(state.nodes[N1])["why"]
    assert why.startswith("its agent went silent") and why.endswith(state.nodes[N1].cordon_reason)


def test_a_node_its_agent_shut_down_says_so_until_the_agent_is_back() -> None:
    log = LogBuilder().nodes(Cluster(2)).shutdown(N0)
    state = log.fold()
    row = present.node_row(state.nodes[N0])
    assert row["condition"] == "shut down" and row["why"].startswith("its agent shut it down")
    assert "shut down" in node_table([row])
    # ... and the dashboard, which reads the node's GPUs, in its one word.
    gpus = present.node_gpus(state.nodes[N0], state, lambda _: True)
    assert board.node_health(gpus) == "shut down"
    # Silent since, it is lost: that is what it is now, and why.
    row = present.node_row(log.condition(N0, "lost").fold().nodes[N0])
    assert row["condition"] == "lost" and row["why"].startswith("its agent went silent")
    node = log.condition(N0, "ready").node(N0, Cluster(1).nodes[0][1]).fold().nodes[N0]
    assert present.node_row(node)["condition"] == "ready" and present.node_row(node)["why"] == ""


def test_an_admin_uncordons_a_node_the_health_monitor_drained() -> None:
    log = LogBuilder().nodes(Cluster(1)).cordon(N0, drain=True)
    assert present.node_row(log.fold().nodes[N0])["condition"] == "draining"
    log.admin("cordon", CordonNode(node=N0, cordoned=False))
    state = log.fold()
    assert present.node_row(state.nodes[N0])["condition"] == "ready"
    assert state.nodes[N0].schedulable


def test_an_admission_reads_as_gpus_of_quota() -> None:
    admitted = JobsAdmitted(based_on=1, now=0.0, admissions=(Admission("g", 0, 4, {"*": 16}),))
    line = summarize(admitted, "g")
    assert line == "admitted attempt 0: 4 workers, holding 16 GPUs of quota", line
    by_model = JobsAdmitted(based_on=1, now=0.0, admissions=(Admission("g", 0, 1, {"H100-80GB": 8}),))
    assert summarize(by_model, "g") == "admitted attempt 0: 1 worker, holding 8 H100-80GB of quota"
    submitted = SubmitJob(request_id="g", job=job().gpus(4).replicas(4, minimum=2).build())
    assert summarize(submitted, "g") == "submitted to queue team-a: 2..4 × 4 GPU"


def test_a_share_or_a_slice_of_a_gpu_is_said_to_hold_what_its_queue_is_charged() -> None:
    # A quarter of a GPU and a 3g.40gb slice read "holding 1 GPU of quota" in their histories,
    # while their queue was charged 0.25 and 0.5 and their waits said "needs 0.25 GPUs".
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "q", job().milli(250)).accept("q")
    log.submit("alice", "s", job().mig("3g.40gb").models("H100-80GB")).accept("s")
    log.submit("alice", "w", job().gpus(2)).accept("w").admit("q", "s", "w")
    state = State()
    held = {
        e.job_id: e.summary
        for e in job_events(state, log.records, fold_refusals(state, log.records))
        if e.type == "JobsAdmitted"
    }
    assert held == {
        "q": "admitted attempt 0: 1 worker, holding 0.25 GPUs of quota",
        "s": "admitted attempt 0: 1 worker, holding 0.5 GPUs of quota",
        "w": "admitted attempt 0: 1 worker, holding 2 GPUs of quota",
    }
    assert state.quota_held["team-a"] == {"*": 250 + 500 + 2000}


def test_a_placement_and_a_requeue_read_as_a_person_writes_them() -> None:
    # It read "placed attempt 0: 1 workers on node-02", and "requeued for attempt 1: requeued:
    # preempted for hi; back in queue team-a for attempt 1, resuming from step 174, resuming
    # from /ckpt/step-174.npz": the attempt and the resumption twice.
    one = JobsPlaced(based_on=1, now=0.0, placements=(placement("p", worker(0, "node-02", whole(0))),))
    assert summarize(one, "p") == "placed attempt 0: 1 worker on node-02"
    two = JobsPlaced(
        based_on=1, now=0.0, placements=(placement("p", worker(0, "node-02"), worker(1, "node-01")),)
    )
    assert summarize(two, "p") == "placed attempt 0: 2 workers on node-01, node-02"
    why = "preempted for hi; back in queue team-a for attempt 1, resuming from step 174"
    resumed = JobRequeued(
        job_id="p", attempt=0, reason=Reason("requeued", why), resume_from="/ckpt/step-174.npz"
    )
    assert summarize(resumed, "p") == f"requeued: {why}; checkpoint /ckpt/step-174.npz"
    anew = JobRequeued(job_id="p", attempt=0, reason=Reason("preempted", "x"))
    assert summarize(anew, "p") == "requeued for attempt 1: preempted: x"


def test_a_batch_reads_each_job_as_its_own_item_once_read_whole() -> None:
    # One line per job from one pass over the batch: each job's own item, the first if listed
    # twice, an admission before a growth, and a job the batch does not list in general words.
    admitted = JobsAdmitted(
        based_on=1,
        now=0.0,
        admissions=(Admission("a", 0, 1, {"*": 1}), Admission("b", 2, 2, {"*": 2}), Admission("a", 1, 3, {})),
        growths=(Admission("b", 2, 4, {"*": 4}), Admission("c", 0, 3, {"*": 3})),
    )
    lines = batch_lines(admitted)
    assert lines == {
        "a": "admitted attempt 0: 1 worker, holding 1 GPU of quota",
        "b": "admitted attempt 2: 2 workers, holding 2 GPUs of quota",
        "c": "grown to 3 workers",
    }
    for job_id in ("a", "b", "c", "z"):
        assert summarize(admitted, job_id, lines) == summarize(admitted, job_id)
    assert summarize(admitted, "z") == "jobs admitted"


def test_nothing_shown_is_a_python_repr() -> None:
    state: State = elastic(running=1).fold()
    rows = [present.job_row(j) for j in state.jobs.values()]
    for text in (job_table(rows), node_table([present.node_row(n) for n in state.nodes.values()])):
        assert "{'" not in text and "['" not in text and "None" not in text
    assert subj.ADMIN == "admin"


def test_a_victims_history_tells_the_deadline_the_fold_gave_it() -> None:
    # The record asks 30 s (its victims' longest grace); the victim asked 10 s, and the fold
    # gives it its own. Its history said "by <the record's deadline> at the latest".
    from corral.services.query.view import JobView
    from tests.unit.test_agent_decide import base, running, spec

    log = running("v", spec(grace_seconds=10.0), log=base())
    log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v")
    view = JobView(":memory:")
    view.fold(log.records)
    v = view.state.jobs["v"]
    assert v.phase == "checkpointing"
    (line,) = [e.summary for e in view.history["v"] if e.type == "PreemptionRequested"]
    assert line.endswith(f" by t={v.phase_since + 10:.0f}s"), line  # not "by t=...s at the latest"
    (beneficiary,) = [e.summary for e in view.history["b"] if e.type == "PreemptionRequested"]
    assert beneficiary == "preemption requested on its behalf: victims another tenant's job"
