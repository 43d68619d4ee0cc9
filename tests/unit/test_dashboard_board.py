"""The live dashboard's board and a job's timeline, built from the read service's answers (pure).

One small log, folded by the read service's own view: tenant a's jobs in queue qa (two whole GPUs,
a quarter of a shared one, one waiting with a reason, one preempted, checkpointed and requeued),
tenant b's half GPU in qb beside a's quarter; node-01 draining with an unhealthy GPU. Each test asks
the read service's pure ``answer`` as one identity and builds what the page would draw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.events import subjects
from corral.events.base import Reason
from corral.events.jobs import PendingReasonChanged
from corral.events.queues import QueueSpec, Quota
from corral.projections.index import JobEvent
from corral.projections.state import State
from corral.services.dashboard import board
from corral.services.query import present
from corral.services.query.decide import Ask, answer
from corral.services.query.view import JobView
from tests.builders import Cluster, LogBuilder, job, on, placement, share, worker

N0, N1 = "node-00", "node-01"
WAITING = Reason("quota", "queue qa has 0 of 8 GPUs free", preemption_helps=True)


def small_log() -> LogBuilder:
    log = LogBuilder().nodes(Cluster(2))
    log.queue(QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a",)))
    log.queue(QueueSpec("qb", quotas={"*": Quota(8)}, tenants=("b",)))
    log.submit("a", "ja", job("qa").gpus(2)).accept("ja").admit("ja").place(on(N0, 0, 1, job_id="ja"))
    log.submit("a", "ja2", job("qa").milli(250)).accept("ja2").admit("ja2")
    log.place(placement("ja2", worker(0, N0, share(2, 250))))
    log.submit("b", "jb", job("qb").milli(500)).accept("jb").admit("jb")
    log.place(placement("jb", worker(0, N0, share(2, 500))))
    log.submit("a", "jw", job("qa").gpus(16)).accept("jw")
    log.event(subjects.job("jw"), PendingReasonChanged(job_id="jw", reasons=(WAITING,)))
    # A job preempted for another: placed, started, checkpointed, asked to yield, stopped, requeued.
    log.submit("a", "v", job("qa").checkpointable()).accept("v").admit("v").place(on(N1, 0, job_id="v"))
    log.started(N1, "v").checkpoint(N1, "v", step=100)
    log.submit("a", "u", job("qa")).accept("u", priority=10).preempt("u", "v")
    log.exited(N1, "v", code=0, stopped=True).requeue("v", 0, code="preempted")
    log.gpu_health(N1, 3, healthy=False, signal="xid:79").cordon(N1, drain=True)
    return log


@pytest.fixture(scope="module")
def world() -> tuple[State, dict[str, list[JobEvent]]]:
    view = JobView(":memory:")
    view.fold(small_log().records)
    return view.state, view.history


def board_of(world: tuple[State, dict[str, list[JobEvent]]], asker: str) -> dict[str, Any]:
    state, history = world
    asked = [answer(state, history, asker, q, Ask()) for q in ("gpus", "queues", "jobs")]
    return board.build(asker, *asked)


def cells(b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {g["id"]: g["segments"] for n in b["nodes"] for g in n["gpus"]}


def jobs_named(b: dict[str, Any]) -> set[str]:
    named = {s["job"] for segs in cells(b).values() for s in segs if s["job"]}
    return named | {j["id"] for j in b["waiting"] + b["running"]}


def test_a_job_s_cells_are_in_its_queue_s_colour(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    b = board_of(world, subjects.ADMIN)
    colour = {q["queue"]: q["colour"] for q in b["queues"]}
    grid = cells(b)
    assert [(s["job"], s["colour"], s["share"]) for s in grid["node-00/0"]] == [("ja", colour["qa"], 1.0)]
    assert [(s["job"], s["colour"]) for s in grid["node-00/2"]] == [
        ("ja2", colour["qa"]),
        ("jb", colour["qb"]),
    ]
    assert colour["qa"] != colour["qb"]
    shared = next(g for n in b["nodes"] for g in n["gpus"] if g["id"] == "node-00/2")
    assert shared["free"] == pytest.approx(0.25)


def test_a_tenant_sees_others_jobs_only_as_gpus_taken(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    b = board_of(world, "a")
    assert jobs_named(b) == {"ja", "ja2", "jw", "v", "u"}
    assert [(s["job"], s["share"]) for s in cells(b)["node-00/2"]] == [("ja2", 0.25), ("", 0.5)]
    assert {q["queue"] for q in b["queues"]} == {"qa"}
    assert '"jb"' not in json.dumps(b) and "qb" not in json.dumps(b)
    assert jobs_named(board_of(world, "b")) == {"jb"}


def test_node_health_in_one_word_and_the_unhealthy_gpu(
    world: tuple[State, dict[str, list[JobEvent]]],
) -> None:
    b = board_of(world, subjects.ADMIN)
    health = {n["name"]: n["health"] for n in b["nodes"]}
    assert health == {N0: "ready", N1: "draining"}
    bad = [g for n in b["nodes"] for g in n["gpus"] if not g["healthy"]]
    assert [(g["id"], g["signal"]) for g in bad] == [("node-01/3", "xid:79")]
    assert "unhealthy (xid:79)" in bad[0]["title"]


HEALTH = {
    "ready": ({"condition": "ready", "cordoned": False, "draining": False}, True, "ready"),
    "a bad gpu": ({"condition": "ready", "cordoned": False, "draining": False}, False, "degraded"),
    "cordoned": ({"condition": "ready", "cordoned": True, "draining": False}, True, "cordoned"),
    "draining": ({"condition": "ready", "cordoned": True, "draining": True}, True, "draining"),
    "suspect first": ({"condition": "suspect", "cordoned": True, "draining": True}, True, "suspect"),
    "lost": ({"condition": "lost", "cordoned": False, "draining": False}, False, "lost"),
}


@pytest.mark.parametrize(("node", "healthy", "word"), HEALTH.values(), ids=HEALTH.keys())
def test_node_health(node: dict[str, Any], healthy: bool, word: str) -> None:
    assert board.node_health({**node, "gpus": [{"healthy": True}, {"healthy": healthy}]}) == word


def test_queue_figures_and_waiting_reasons(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    b = board_of(world, "a")
    [qa] = b["queues"]
    assert {k: qa[k] for k in ("nominal", "used", "borrowed", "lent")} == {
        "nominal": 8,
        "used": 2.25,
        "borrowed": 0,
        "lent": 0,
    }
    waiting = {j["id"]: j for j in b["waiting"]}
    assert waiting["jw"]["reason"] == WAITING.message  # the read service's words, as explain says them
    assert waiting["v"]["phase"] == "queued" and waiting["v"]["attempt"] == 1
    assert {j["id"] for j in b["running"]} == {"ja", "ja2"}


def test_a_preempted_job_s_timeline_has_two_attempts(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    state, history = world
    t = board.timeline("v", answer(state, history, "a", "explain", Ask("v")))
    first, second = t["attempts"]
    kinds = [e["kind"] for e in first["events"]]
    assert kinds == [
        "submitted",
        "accepted",
        "admitted",
        "placed",
        "started",
        "checkpoint",
        "preempted",
        "exited",
        "requeued",
    ]
    assert (second["attempt"], second["events"]) == (1, [])
    assert t["counts"] == {"placed": 1, "preempted": 1, "checkpoint": 1, "requeued": 1}
    assert first["start"] <= first["end"] == second["start"]
    assert [r["kind"] for r in first["rows"]] == kinds  # one checkpoint: a line of its own
    beneficiary = board.timeline("u", answer(state, history, "a", "explain", Ask("u")))
    assert "preempting" in [e["kind"] for a in beneficiary["attempts"] for e in a["events"]]


def test_a_run_of_checkpoints_is_one_line() -> None:
    def record(seq: int, kind: str, summary: str) -> dict[str, Any]:
        return {"seq": seq, "time": float(seq), "type": kind, "summary": summary, "subject": ""}

    steps = [
        record(3 + i, "CheckpointCompleted", f"checkpoint at step {100 * (i + 1)}: /c") for i in range(3)
    ]
    history = [record(1, "JobsPlaced", "placed"), record(2, "WorkerStarted", "started"), *steps]
    explained = {
        "seq": 9,
        "job": {},
        "reasons": [],
        "refused": [],
        "history": [*history, record(6, "WorkerExited", "x")],
    }
    [attempt] = board.timeline("j", explained)["attempts"]
    assert [(r["kind"], r["count"]) for r in attempt["rows"]] == [
        ("placed", 1),
        ("started", 1),
        ("checkpoint", 3),
        ("exited", 1),
    ]
    assert attempt["rows"][2]["summary"] == "3 checkpoints, the last checkpoint at step 300: /c"
    assert len(attempt["events"]) == 6


def test_another_tenant_s_job_has_no_timeline(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    state, history = world
    with pytest.raises(board.Unanswered, match="no job jb"):
        board.timeline("jb", answer(state, history, "a", "explain", Ask("jb")))


def test_an_error_answer_is_no_board() -> None:
    ok = {"seq": 1, "nodes": [], "queues": [], "jobs": []}
    with pytest.raises(board.Unanswered, match="no question"):
        board.build("a", {"seq": 1, "error": "no question 'gpus'"}, ok, ok)


def test_queue_colours_are_distinct_and_stable() -> None:
    names = [f"q{i}" for i in range(8)]
    colours = board.queue_colours(names)
    assert len(set(colours.values())) == 8
    assert board.queue_colours(list(reversed(names))) == colours


def test_a_gpu_no_work_may_go_on_is_not_drawn_free(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    """A cell's free share is the read service's (``present.free_by_gpu``, what ``corral nodes``
    counts): none on a node that takes no work (node-01 drains), whose idle GPUs are drawn not
    available, saying why, as is an unhealthy GPU's idle share."""
    state, _ = world
    b = board_of(world, subjects.ADMIN)
    for n in b["nodes"]:
        drawn = [round(g["free"] * board.MILLI) for g in n["gpus"]]
        assert drawn == present.free_by_gpu(state.nodes[n["name"]]), n["name"]
    gpus = {g["id"]: g for n in b["nodes"] for g in n["gpus"]}
    idle = gpus[f"{N1}/1"]
    assert (idle["segments"], idle["free"], idle["unavailable"]) == ([], 0, 1.0)
    assert (
        idle["unavailable_why"] == "node draining" and "1 idle, not available: node draining" in idle["title"]
    )
    # On a node that takes work, a GPU's unheld share is free, and nothing is unavailable.
    shared = gpus[f"{N0}/2"]
    assert (shared["free"], shared["unavailable"], shared["unavailable_why"]) == (pytest.approx(0.25), 0, "")


def test_an_unhealthy_gpu_on_a_node_that_takes_work_is_not_free() -> None:
    gpu = {
        "index": 3,
        "model": "H100",
        "healthy": False,
        "signal": "xid:79",
        "mig": False,
        "used_milli": 0,
        "holders": [],
        "others_milli": 0,
        "free_milli": 0,
    }
    node = {
        "name": N0,
        "condition": "ready",
        "cordoned": False,
        "draining": False,
        "profile": "",
        "gpus": [gpu],
    }
    [cell] = board.build(
        "admin", {"seq": 1, "nodes": [node]}, {"seq": 1, "queues": []}, {"seq": 1, "jobs": []}
    )["nodes"][0]["gpus"]
    assert (cell["free"], cell["unavailable"], cell["unavailable_why"]) == (0, 1.0, "GPU unhealthy")
