"""A start a node fails for its own fault (``WorkerExited.node_fault``): the job goes back to its
queue uncharged, and the placer does not place it on that node again while the node's run of
failed starts counts it (``NodeState.start_faults``): a node with a full disk that is the
tightest fit took the same job's every requeue, each one free, for ever."""

from __future__ import annotations

from corral.events import subjects as subj
from corral.events.decisions import JobsPlaced, JobsUnschedulable
from corral.events.nodes import WorkerExited
from corral.events.queues import CordonNode
from corral.projections.placement.framework import avoided
from corral.projections.state import State
from corral.services.placer.decide import decide
from corral.services.preemptor.decide import plan
from tests.builders import Cluster, LogBuilder, job, on, queue_spec

N0, N1 = "node-00", "node-01"
WHY = "cannot prepare directories: [Errno 28] No space left on device"


def _faulted(nodes: int) -> LogBuilder:
    """``j1`` (8 GPUs) placed on node-00, which failed its start; requeued and admitted again."""
    log = LogBuilder().nodes(Cluster(nodes)).queue("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1").admit("j1").place(on(N0, *range(8), job_id="j1"))
    log.started(N0, "j1").event(
        subj.node(N0), WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=127, node_fault=WHY)
    )
    return log.requeue("j1", 0).admit("j1", attempt=1)


def _placed(state: State) -> tuple[dict[str, str], dict[str, list[str]]]:
    where: dict[str, str] = {}
    why: dict[str, list[str]] = {}
    for ev in decide(state, state.time + 1):
        if isinstance(ev, JobsPlaced):
            where.update({p.job_id: p.workers[0].node for p in ev.placements})
        elif isinstance(ev, JobsUnschedulable):
            why.update({u.job_id: [f"{r.code}: {r.message}" for r in u.reasons] for u in ev.jobs})
    return where, why


def test_a_job_is_not_placed_again_on_the_node_that_failed_its_start() -> None:
    state = _faulted(2).fold()
    assert avoided(state, state.jobs["j1"]) == {N0}
    assert _placed(state)[0] == {"j1": N1}  # node-00, first in order and as free, is passed over


def test_a_job_with_no_other_node_waits_and_says_why_until_the_node_runs_a_worker() -> None:
    log = _faulted(1)
    where, why = _placed(log.fold())
    assert where == {}
    assert why["j1"][0] == (
        f"avoids: not placed again on {N0}, which failed its start for the node's own fault, "
        "until a worker runs there or its cordon is lifted"
    )
    # A person looks at the node and lifts its cordon: its run of failed starts is over.
    log.admin("cordon", CordonNode(node=N0, reason="disk")).admin(
        "cordon", CordonNode(node=N0, cordoned=False)
    )
    state = log.fold()
    assert avoided(state, state.jobs["j1"]) == frozenset()
    assert _placed(state)[0] == {"j1": N0}


def test_another_jobs_worker_that_runs_there_ends_the_avoidance() -> None:
    log = _faulted(1)
    log.submit("bob", "j2", job().gpus(1)).accept("j2").admit("j2").place(on(N0, 0, job_id="j2"))
    log.started(N0, "j2").exited(N0, "j2", code=0)
    state = log.fold()
    assert state.nodes[N0].start_faults == () and avoided(state, state.jobs["j1"]) == frozenset()
    assert _placed(state)[0] == {"j1": N0}


def test_the_preemptor_makes_room_elsewhere_for_a_job_the_node_it_fits_failed() -> None:
    # The preemptor's simulation placed the job on the node that failed its start, free and
    # avoided, and so stopped nothing: the job waited behind preemptible work of a lower
    # priority for as long as that ran, and nobody else came to end the node's run.
    log = LogBuilder().nodes(Cluster(2)).queue("team-a")
    log.submit("alice", "j1", job().gpus(8)).accept("j1", priority=10).admit("j1")
    log.place(on(N0, *range(8), job_id="j1")).started(N0, "j1")
    log.event(subj.node(N0), WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=127, node_fault=WHY))
    log.submit("bob", "low", job().gpus(8).preemptible()).accept("low").admit("low")
    log.place(on(N1, *range(8), job_id="low")).started(N1, "low")
    log.requeue("j1", 0).admit("j1", attempt=1)
    state = log.fold()
    for ev in decide(state, state.time + 1):
        log.event(subj.decision("placer"), ev)
    state = log.fold()
    assert state.jobs["j1"].phase == "admitted" and avoided(state, state.jobs["j1"]) == {N0}
    [p] = plan(state, state.time + 1)
    assert p.beneficiary == "j1" and [v.job_id for v in p.victims] == ["low"]
    assert {w.node for w in p.placement.workers} == {N1}


def test_the_preemptor_stops_nothing_for_a_queued_job_that_fits_only_the_node_it_avoids() -> None:
    # team-a's quota (8) blocks j1 (8 GPUs) while ``low`` holds 4 of it. node-00, which failed
    # j1's start, is free; node-01 holds ``low`` and team-b's job. Searched as if j1 could go to
    # node-00, stopping ``low`` was enough: ``low`` was stopped, and j1, admitted, had nowhere
    # to go (team-b's job is within its own quota).
    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 8)).queue(queue_spec("team-b", 8))
    log.submit("alice", "j1", job().gpus(8)).accept("j1", priority=10).admit("j1")
    log.place(on(N0, *range(8), job_id="j1")).started(N0, "j1")
    log.event(subj.node(N0), WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=127, node_fault=WHY))
    log.submit("bob", "low", job().gpus(4).preemptible()).accept("low").admit("low")
    log.place(on(N1, 0, 1, 2, 3, job_id="low")).started(N1, "low")
    log.submit("carol", "other", job().queue("team-b").gpus(4)).accept("other").admit("other")
    log.place(on(N1, 4, 5, 6, 7, job_id="other")).started(N1, "other")
    state = log.requeue("j1", 0).fold()
    assert state.jobs["j1"].phase == "queued" and avoided(state, state.jobs["j1"]) == {N0}
    assert plan(state, state.time + 1) == []
    # Once the node's run of failed starts is over, stopping ``low`` is enough again.
    log.admin("cordon", CordonNode(node=N0, reason="disk")).admin(
        "cordon", CordonNode(node=N0, cordoned=False)
    )
    state = log.fold()
    [p] = plan(state, state.time + 1)
    assert p.beneficiary == "j1" and [v.job_id for v in p.victims] == ["low"]


def test_a_queued_job_that_avoids_a_node_does_not_speak_for_its_form() -> None:
    # j1 and j2 ask alike, but node-00 failed j1's start. Stopping ``low`` there lets j2 in (of
    # a lower priority, it goes past j1's hold: j1 may stop it to take the room back); j1,
    # searched first, found nothing off node-00, and its form was taken for hopeless: j2, behind
    # it, waited every cycle for as long as node-00's run of failed starts counted j1.
    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 16))
    log.submit("alice", "j1", job().gpus(8)).accept("j1", priority=10).admit("j1")
    log.place(on(N0, *range(8), job_id="j1")).started(N0, "j1")
    log.event(subj.node(N0), WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=127, node_fault=WHY))
    log.requeue("j1", 0)
    log.submit("bob", "low", job().gpus(8).preemptible()).accept("low").admit("low")
    log.place(on(N0, *range(8), job_id="low")).started(N0, "low")
    log.submit("carol", "high", job().gpus(8)).accept("high", priority=20).admit("high")
    log.place(on(N1, *range(8), job_id="high")).started(N1, "high")
    log.submit("alice", "j2", job().gpus(8)).accept("j2", priority=5)
    state = log.fold()
    assert [state.jobs[j].phase for j in ("j1", "j2")] == ["queued", "queued"]
    assert avoided(state, state.jobs["j1"]) == {N0}
    [p] = plan(state, state.time + 1)
    assert p.beneficiary == "j2" and [v.job_id for v in p.victims] == ["low"]
