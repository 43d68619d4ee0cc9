"""Elastic jobs resized while they run, in the fold: growth (admission admits more replicas, the
placer places the added ranks, their workers join) and shrink (the preemptor or the owner asks
for fewer; the ranks above leave and give their GPUs back one by one as they exit).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from corral.events import subjects as subj
from corral.events.heartbeats import XidReport
from corral.events.nodes import NodeRegistered, WorkerExited
from corral.projections import quota
from corral.projections.state import State
from tests.builders import LogBuilder, job, placement, queue_spec, whole, worker

N0 = "node-00"


def fold(log: LogBuilder) -> State:
    state = log.fold()
    assert state.faults == 0, [r for r in state.rejections if r.code == "fault"]
    return state


def ranks(n: int, first: int = 0) -> tuple:  # type: ignore[type-arg]
    """Ranks ``first..n-1`` on node-00, rank r on GPU r."""
    return tuple(worker(r, N0, whole(r)) for r in range(first, n))


def elastic_running(
    replicas: int = 2, most: int = 4, least: int = 2, nominal: int = 8, queue: str = "team-a"
) -> LogBuilder:
    """Elastic job ``e`` (``least..most`` one-GPU workers) running ``replicas`` ranks on node-00."""
    from tests.builders import Cluster

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec(queue, nominal)).queue(queue_spec("team-b", 8))
    log.submit("alice", "e", job(queue).replicas(most, minimum=least).checkpointable()).accept("e")
    log.admit("e", replicas=replicas).place(placement("e", *ranks(replicas)))
    for r in range(replicas):
        log.started(N0, "e", rank=r)
    return log


def held_quota(state: State, queue: str = "team-a") -> int:
    return state.quota_held.get(queue, {}).get(quota.ANY, 0)


def gpu_holders(state: State) -> list[dict[str, int]]:
    return [g.holders for g in state.nodes[N0].gpus]


def check_quota_books(state: State) -> None:
    """What the fold keeps incrementally equals what the jobs hold, recomputed."""
    again: dict[str, dict[str, int]] = {}
    for j in state.jobs.values():
        if j.phase in ("admitted", "placed", "starting", "running", "checkpointing"):
            for key, milli in quota.holding(j):
                again.setdefault(j.spec.queue, {})[key] = again.get(j.spec.queue, {}).get(key, 0) + milli
    assert {q: {k: v for k, v in d.items() if v} for q, d in again.items()} == state.quota_held


# -- growth --------------------------------------------------------------------------------------


def test_a_running_elastic_job_grows_and_its_added_ranks_join_it() -> None:
    log = elastic_running().grow("e", 4)
    state = fold(log)
    e = state.jobs["e"]
    assert (e.phase, e.admission.replicas if e.admission else 0, held_quota(state)) == ("running", 4, 4000)
    log.place(placement("e", *ranks(4)))
    state = fold(log)
    assert [h for h in gpu_holders(state)[:5]] == [{"e": 1000}] * 4 + [{}]
    log.started(N0, "e", rank=2).started(N0, "e", rank=3)
    state = fold(log)
    e = state.jobs["e"]
    assert (e.phase, e.live, state.rejected_total) == ("running", {0, 1, 2, 3}, 0)
    check_quota_books(state)


def test_a_grown_job_whose_kept_ranks_end_keeps_the_gpus_of_the_ranks_still_to_start() -> None:
    # Ranks 0 and 1 exited 0 before the added ranks 2 and 3 started: all four GPUs were given
    # back while the agent was still to start ranks 2 and 3 on theirs.
    log = elastic_running().grow("e", 4).place(placement("e", *ranks(4)))
    state = fold(log.exited(N0, "e", rank=0, code=0).exited(N0, "e", rank=1, code=0))
    assert state.jobs["e"].phase == "running" and gpu_holders(state)[:4] == [{"e": 1000}] * 4
    check_quota_books(state)
    log.started(N0, "e", rank=2).started(N0, "e", rank=3)
    state = fold(log.exited(N0, "e", rank=2, code=0).exited(N0, "e", rank=3, code=0))
    assert state.jobs["e"].phase == "succeeded" and gpu_holders(state)[:4] == [{}] * 4
    assert state.rejected_total == 0


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: elastic_running().grow("e", 5), "no growth"),
        (lambda: elastic_running().grow("e", 2), "no growth"),
        (lambda: elastic_running(nominal=3).grow("e", 4), "needs 4"),
        (lambda: elastic_running().grow("e", 3, attempt=1), "not running"),
        (lambda: elastic_running(replicas=1, least=1).exited(N0, "e", code=1).grow("e", 2), "not running"),
    ],
    ids=["beyond-most", "not-more", "quota-short", "stale-attempt", "not-running"],
)
def test_a_growth_that_does_not_hold_is_void_and_changes_nothing(
    make: Callable[[], LogBuilder], why: str
) -> None:
    log = make()
    before = LogBuilder()
    before.records = log.records[:-1]
    state = fold(log)
    assert state.rejections[-1].code == "void" and why in state.rejections[-1].message
    assert state.jobs == fold(before).jobs and state.quota_held == fold(before).quota_held


def test_a_job_that_is_not_elastic_does_not_grow() -> None:
    from tests.builders import Cluster

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job().replicas(2)).accept("j").admit("j", replicas=2)
    log.place(placement("j", *ranks(2))).started(N0, "j", rank=0).started(N0, "j", rank=1)
    state = fold(log.grow("j", 3))
    assert state.rejections[-1].code == "void" and state.jobs["j"].admission.replicas == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "workers",
    [
        (worker(0, N0, whole(5)), worker(1, N0, whole(1)), worker(2, N0, whole(2)), worker(3, N0, whole(3))),
        ranks(3),
        (*ranks(2), worker(2, N0, whole(1)), worker(3, N0, whole(3))),
    ],
    ids=["moves-a-kept-rank", "fewer-than-admitted", "claims-a-held-gpu"],
)
def test_a_growth_placement_must_keep_the_ranks_and_add_free_gpus(workers: tuple) -> None:  # type: ignore[type-arg]
    log = elastic_running().grow("e", 4)
    before = fold(log)
    state = fold(log.place(placement("e", *workers)))
    assert state.rejections[-1].code == "void"
    assert state.nodes == before.nodes and state.jobs["e"].placement == before.jobs["e"].placement


# -- shrink --------------------------------------------------------------------------------------


def _with_beneficiary(log: LogBuilder, priority: int = 10, queue: str = "team-a") -> LogBuilder:
    return log.submit("bob", "b", job(queue).replicas(2)).accept("b", priority=priority)


def test_a_shrink_frees_quota_at_once_and_each_leaving_rank_its_gpus_as_it_exits() -> None:
    log = _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "b")
    state = fold(log)
    e = state.jobs["e"]
    assert (e.phase, e.admission.replicas if e.admission else 0, e.leaving) == ("running", 2, [2, 3])
    assert held_quota(state) == 2000 and e.preempted_for == "b"
    assert gpu_holders(state)[:4] == [{"e": 1000}] * 4  # still held until the workers exit
    check_quota_books(state)
    state = fold(log.exited(N0, "e", rank=3, code=143, stopped=True))
    e = state.jobs["e"]
    assert gpu_holders(state)[:4] == [{"e": 1000}] * 3 + [{}] and e.leaving == [2]
    state = fold(log.exited(N0, "e", rank=2, code=0, stopped=True))
    e = state.jobs["e"]
    assert gpu_holders(state)[:4] == [{"e": 1000}] * 2 + [{}, {}]
    assert (e.phase, e.leaving, e.preempted_for, e.restarts) == ("running", [], "", 0)
    assert e.placement is not None and [w.rank for w in e.placement.workers] == [0, 1]
    state = fold(log.exited(N0, "e", rank=0, code=0).exited(N0, "e", rank=1, code=0))
    assert state.jobs["e"].phase == "succeeded" and gpu_holders(state)[:2] == [{}, {}]
    assert state.rejected_total == 0
    check_quota_books(state)


def test_a_job_whose_kept_ranks_ended_succeeds_when_the_last_leaving_rank_is_gone() -> None:
    log = _with_beneficiary(elastic_running(replicas=3)).shrink("e", 2, "b")
    log.exited(N0, "e", rank=0, code=0).exited(N0, "e", rank=1, code=0)
    assert fold(log).jobs["e"].phase == "running"
    state = fold(log.exited(N0, "e", rank=2, code=143, stopped=True))
    assert state.jobs["e"].phase == "succeeded" and state.jobs["e"].held is None


def test_the_owner_resizing_a_running_job_below_its_size_shrinks_it() -> None:
    log = elastic_running(replicas=4).request("alice", "resize", {"job_id": "e", "replicas": 3})
    state = fold(log)
    e = state.jobs["e"]
    assert (e.spec.replicas, e.admission.replicas if e.admission else 0, e.leaving) == (3, 3, [3])
    assert held_quota(state) == 3000 and e.preempted_for == ""


@pytest.mark.parametrize(
    "make",
    [
        lambda: _with_beneficiary(elastic_running(replicas=4)).shrink("e", 1, "b"),
        lambda: _with_beneficiary(elastic_running(replicas=2)).shrink("e", 2, "b"),
        lambda: _with_beneficiary(elastic_running(replicas=4), priority=0, queue="team-a").shrink(
            "e", 2, "b"
        ),
        lambda: _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "nobody"),
        lambda: _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "b", attempt=1),
    ],
    ids=["below-least", "no-fewer", "same-queue-same-priority", "no-beneficiary", "stale-attempt"],
)
def test_a_shrink_that_does_not_hold_is_void_and_changes_nothing(make: Callable[[], LogBuilder]) -> None:
    log = make()
    before = LogBuilder()
    before.records = log.records[:-1]
    state = fold(log)
    assert state.rejections[-1].code == "void"
    assert state.jobs == fold(before).jobs and state.quota_held == fold(before).quota_held


def test_a_job_that_may_not_be_preempted_is_not_shrunk_for_another() -> None:
    from tests.builders import Cluster

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8)).queue(queue_spec("team-b", 8))
    log.submit("alice", "e", job().replicas(4, minimum=2).preemptible(False)).accept("e")
    log.admit("e", replicas=4).place(placement("e", *ranks(4)))
    for r in range(4):
        log.started(N0, "e", rank=r)
    state = fold(_with_beneficiary(log).shrink("e", 2, "b"))
    assert state.rejections[-1].code == "void" and state.jobs["e"].admission.replicas == 4  # type: ignore[union-attr]


def test_a_shrinking_job_does_not_grow_until_its_leaving_ranks_are_gone() -> None:
    log = _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "b").grow("e", 3)
    state = fold(log)
    assert state.rejections[-1].code == "void" and state.jobs["e"].admission.replicas == 2  # type: ignore[union-attr]


def test_a_shrinking_job_preempted_whole_gives_everything_back_when_its_workers_are_gone() -> None:
    log = _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "b").preempt("b", "e")
    state = fold(log)
    assert state.jobs["e"].phase == "checkpointing" and held_quota(state) == 2000
    for r in range(4):
        log.exited(N0, "e", rank=r, code=143, stopped=True)
    state = fold(log)
    assert state.jobs["e"].phase == "preempted" and gpu_holders(state)[:4] == [{}] * 4
    check_quota_books(state)


# -- the services: admission grows, the placer places the added ranks, agents stop leaving ranks --


def _decided(log: LogBuilder, events: list, role: str) -> LogBuilder:  # type: ignore[type-arg]
    from corral.events import subjects as subj
    from corral.events.routing import subject_of

    for ev in events:
        log.event(subject_of(ev) if role != "admission" else subj.decision("admission"), ev)
    return log


def test_admission_grows_a_running_elastic_job_into_quota_nobody_waits_for() -> None:
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide as admit
    from corral.services.placer.decide import decide as place

    log = elastic_running(replicas=2, most=6, nominal=5)  # quota for 5 of its 6 workers
    state = fold(log)
    (ev,) = [e for e in admit(state, 2000.0) if isinstance(e, JobsAdmitted)]
    assert ev.admissions == () and [(g.job_id, g.replicas) for g in ev.growths] == [("e", 5)]
    state = fold(_decided(log, [ev], "admission"))
    assert state.jobs["e"].admission.replicas == 5 and held_quota(state) == 5000  # type: ignore[union-attr]
    placed = place(state, 2001.0)
    state = fold(_decided(log, placed, "placer"))
    e = state.jobs["e"]
    assert e.placement is not None and [w.rank for w in e.placement.workers] == [0, 1, 2, 3, 4]
    assert e.placement.workers[:2] == ranks(2) and state.rejected_total == 0
    assert sum(1 for g in state.nodes[N0].gpus if g.holders) == 5


def _shrunk_across_two_nodes() -> LogBuilder:
    """Elastic ``e`` ran ranks 0-1 on node-00 and 2-3 on node-01, then was resized to 2: ranks 2
    and 3 are leaving."""
    from corral.events.jobs import ResizeJob
    from tests.builders import Cluster

    n1 = "node-01"
    log = LogBuilder().nodes(Cluster(2)).queue(queue_spec("team-a", 8))
    log.submit("alice", "e", job("team-a").replicas(4, minimum=2).checkpointable()).accept("e").admit(
        "e", replicas=4
    )
    log.place(
        placement(
            "e",
            worker(0, N0, whole(0)),
            worker(1, N0, whole(1)),
            worker(2, n1, whole(0)),
            worker(3, n1, whole(1)),
        )
    )
    log.started(N0, "e", rank=0).started(N0, "e", rank=1).started(n1, "e", rank=2).started(n1, "e", rank=3)
    return log.request("alice", "resize", ResizeJob(job_id="e", replicas=2))


def test_a_failure_that_hits_only_ranks_a_shrink_took_away_leaves_the_job_running() -> None:
    # The whole job was interrupted, its healthy kept ranks restarted from their checkpoint,
    # for a GPU of a rank that was on its way out.
    from corral.events.jobs import ResizeJob

    log = elastic_running(replicas=4).request("alice", "resize", ResizeJob(job_id="e", replicas=2))
    state = fold(log.gpu_health(N0, 3, False))
    assert (state.jobs["e"].phase, state.jobs["e"].leaving) == ("running", [2, 3])
    state = fold(
        log.exited(N0, "e", rank=2, code=143, stopped=True).exited(N0, "e", rank=3, code=143, stopped=True)
    )
    assert state.jobs["e"].phase == "running" and gpu_holders(state)[:4] == [{"e": 1000}] * 2 + [{}] * 2
    check_quota_books(state)
    # Its leaving ranks lost with their node have left: nothing waits for their exits.
    state = fold(_shrunk_across_two_nodes().condition("node-01", "lost"))
    e = state.jobs["e"]
    assert (e.phase, e.leaving, e.live) == ("running", [], {0, 1}), (e.phase, e.leaving, e.live)
    assert [g.holders for g in state.nodes["node-01"].gpus[:2]] == [{}, {}]
    check_quota_books(state)
    # Had its kept ranks ended before, the job has succeeded, and holds nothing: it kept GPUs 0
    # and 1 of node-00 for ever.
    ended = _shrunk_across_two_nodes().exited(N0, "e", rank=0, code=0).exited(N0, "e", rank=1, code=0)
    state = fold(ended.condition("node-01", "lost"))
    e = state.jobs["e"]
    assert (e.phase, e.held) == ("succeeded", None) and gpu_holders(state)[:2] == [{}, {}]
    check_quota_books(state)


def test_a_drain_of_a_node_holding_only_ranks_a_shrink_took_away_leaves_the_job_running() -> None:
    # The drain moved the whole job to checkpointing, its kept ranks on node-00 stopped too, for
    # a node it was leaving anyway (losing that node let it run on).
    state = fold(_shrunk_across_two_nodes().cordon("node-01", True, drain=True))
    e = state.jobs["e"]
    assert (e.phase, e.leaving) == ("running", [2, 3]), (e.phase, e.reasons)
    state = fold(
        _shrunk_across_two_nodes()
        .cordon("node-01", True, drain=True)
        .exited("node-01", "e", rank=2, code=143, stopped=True)
        .exited("node-01", "e", rank=3, code=143, stopped=True)
    )
    assert (state.jobs["e"].phase, state.jobs["e"].live) == ("running", {0, 1})
    assert [g.holders for g in state.nodes["node-01"].gpus[:2]] == [{}, {}]
    check_quota_books(state)
    # Nor does its node registering again with those GPUs renumbered (one fell off the bus).
    log = _shrunk_across_two_nodes()
    inv = log.fold().nodes["node-01"].inventory
    left = [msgspec.structs.replace(g, index=i) for i, g in enumerate(inv.gpus[1:])]
    log.event(
        subj.node("node-01"),
        NodeRegistered(node="node-01", inventory=msgspec.structs.replace(inv, gpus=left)),
    )
    assert fold(log).jobs["e"].phase == "running"
    # A leaving rank dying of its GPU's fault fails the GPU; the job runs on.
    xid = XidReport(0, 48, uuid="GPU-node-01-00")
    died = WorkerExited(node="node-01", job_id="e", attempt=0, rank=2, code=1, xids=(xid,))
    state = fold(_shrunk_across_two_nodes().event(subj.node("node-01"), died))
    assert state.jobs["e"].phase == "running" and not state.nodes["node-01"].gpus[0].healthy
    # A drain of the node of its kept ranks moves it, as before.
    assert fold(_shrunk_across_two_nodes().cordon(N0, True, drain=True)).jobs["e"].phase == "checkpointing"


def test_a_grown_job_resized_back_after_its_kept_ranks_ended_succeeds_and_holds_nothing() -> None:
    from corral.events.jobs import ResizeJob

    log = elastic_running().grow("e", 4).place(placement("e", *ranks(4)))
    log.exited(N0, "e", rank=0, code=0).exited(N0, "e", rank=1, code=0)
    state = fold(log.request("alice", "resize", ResizeJob(job_id="e", replicas=2)))
    e = state.jobs["e"]
    assert (e.phase, e.held) == ("succeeded", None) and gpu_holders(state)[:4] == [{}] * 4
    check_quota_books(state)


def test_a_growth_placed_nowhere_is_withdrawn_after_the_placement_timeout() -> None:
    # Admission grows on a cluster-wide count of free GPUs; the added ranks may fit on none of
    # them (a required topology, a selector, a GPU failed since). The grown quota was held for
    # ever while the job's own queue waited beside idle GPUs.
    from corral.events.jobs import AdmissionWithdrawn, JobsAdmitted
    from corral.services.admission.decide import DEFAULT, wake
    from corral.services.admission.decide import decide as admit

    timeout, backoff = DEFAULT.placement_timeout_s, DEFAULT.placement_backoff_s
    assert timeout is not None
    log = elastic_running(replicas=2, most=4, nominal=8).at(2000.0)
    (ev,) = [e for e in admit(fold(log), 2000.0) if isinstance(e, JobsAdmitted)]
    state = fold(_decided(log, [ev], "admission"))
    assert state.jobs["e"].admission.replicas == 4 and held_quota(state) == 4000  # type: ignore[union-attr]
    assert wake(state, 2001.0) == 2000.0 + timeout
    assert not [e for e in admit(state, 2000.0 + timeout - 1) if isinstance(e, AdmissionWithdrawn)]
    (withdrawn,) = [e for e in admit(state, 2000.0 + timeout) if isinstance(e, AdmissionWithdrawn)]
    assert withdrawn.job_id == "e" and "runs on at 2" in withdrawn.reason.message
    from corral.projections.index import summarize

    assert summarize(withdrawn, "e").startswith("growth withdrawn, running on: growth-timeout: grown to 4")
    state = fold(_decided(log.at(2000.0 + timeout), [withdrawn], "job"))
    e = state.jobs["e"]
    assert (e.phase, e.admission.replicas if e.admission else 0, held_quota(state)) == ("running", 2, 2000)
    assert state.rejected_total == 0
    check_quota_books(state)
    later = 2000.0 + timeout + 1
    assert not [e for e in admit(state, later) if isinstance(e, JobsAdmitted) and e.growths]
    assert wake(state, later) == withdrawn.admit_after == 2000.0 + timeout + backoff
    regrown = [e for e in admit(state, withdrawn.admit_after) if isinstance(e, JobsAdmitted)]
    assert [(g.job_id, g.replicas) for ev in regrown for g in ev.growths] == [("e", 4)]
    # A growth proposed during the back-off is void in the fold too.
    early = JobsAdmitted(based_on=state.seq, now=later, admissions=(), growths=ev.growths)
    state = fold(_decided(log.at(later), [early], "admission"))
    assert state.jobs["e"].admission.replicas == 2 and "grows again" in state.rejections[-1].message  # type: ignore[union-attr]


def test_admission_does_not_grow_a_job_while_another_waits_in_its_cohort_tree() -> None:
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide as admit

    log = elastic_running(replicas=2, most=6, nominal=2)
    log.submit("alice", "w", job().replicas(1)).accept("w")  # team-a is full: w waits
    events = admit(fold(log), 2000.0)
    assert not [e for e in events if isinstance(e, JobsAdmitted) and e.growths]


def test_admission_grows_only_onto_gpus_that_are_free() -> None:
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide as admit

    log = elastic_running(replicas=2, most=8, nominal=16)
    log.submit("bob", "x", job("team-b").replicas(5)).accept("x").admit("x", replicas=5)
    log.place(placement("x", *(worker(r, N0, whole(2 + r)) for r in range(5))))  # 7 of 8 GPUs held
    (ev,) = [e for e in admit(fold(log), 2000.0) if isinstance(e, JobsAdmitted)]
    assert [(g.job_id, g.replicas) for g in ev.growths] == [("e", 3)]


def test_an_agent_stops_the_leaving_ranks_of_a_shrunk_job_and_keeps_the_rest() -> None:
    from corral.projections.assignments import node_view
    from corral.services.agent.decide import StopWorker, WorkerKey
    from corral.services.agent.decide import decide as act

    log = _with_beneficiary(elastic_running(replicas=4)).shrink("e", 2, "b")
    state = fold(log)
    workers = {WorkerKey("e", 0, r): "running" for r in range(4)}
    actions = act(node_view(state, N0), workers, now=1010.0, checkpoint_root="/tmp/ck")  # type: ignore[arg-type]
    stops = sorted((a.key.rank, a.reason) for a in actions if isinstance(a, StopWorker))
    assert stops == [(2, "shrunk"), (3, "shrunk")]
    assert all(not isinstance(a, StopWorker) or a.grace > 0 for a in actions)


def test_resizing_an_admitted_job_below_its_admission_admits_it_smaller() -> None:
    from tests.builders import Cluster

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "e", job().replicas(6, minimum=2)).accept("e").admit("e", replicas=6)
    state = fold(log.request("alice", "resize", {"job_id": "e", "replicas": 3}))
    e = state.jobs["e"]
    assert (e.phase, e.admission.replicas if e.admission else 0, held_quota(state)) == ("admitted", 3, 3000)
    check_quota_books(state)


def test_resizing_a_starting_job_below_its_size_waits_until_it_runs() -> None:
    from tests.builders import Cluster

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "e", job().replicas(4, minimum=2)).accept("e").admit("e", replicas=4)
    log.place(placement("e", *ranks(4))).started(N0, "e", rank=0)
    state = fold(log.request("alice", "resize", {"job_id": "e", "replicas": 2}))
    assert state.rejections[-1].code == "illegal" and "once it runs" in state.rejections[-1].message


def test_an_exit_for_a_rank_of_the_current_attempt_that_never_started_changes_nothing() -> None:
    # Rank 0 of attempt 0 still runs (its gang was interrupted by rank 1's death); an exit that
    # names rank 0 of attempt 1, which never started, must not be taken for it.
    log = elastic_running(replicas=2).exited(N0, "e", rank=1, code=1).requeue("e", 0)
    before = fold(log)
    state = fold(log.exited(N0, "e", rank=0, code=1, attempt=1))
    assert state.rejections[-1].code == "illegal"
    assert state.jobs == before.jobs and state.nodes == before.nodes


def _runs_with_a_days_grace(log: LogBuilder, least: int = 1) -> LogBuilder:
    """Elastic job ``e`` of team-a (``least``..4 one-GPU workers, a day of grace) running 4 ranks
    on node-00."""
    log.submit("alice", "e", job().replicas(4, minimum=least)._with(grace_seconds=86_400.0)).accept("e")
    log.admit("e", replicas=4).place(placement("e", *ranks(4)))
    for r in range(4):
        log.started(N0, "e", rank=r)
    return log


def test_the_owners_resize_gives_leaving_ranks_their_grace_at_most_their_queues_max_grace() -> None:
    # Its quota is free at once and its leaving ranks hold their GPUs until they exit: with its
    # own grace of a day, an owner who shrank a job that borrowed kept the GPUs that long.
    from tests.builders import Cluster

    log = _runs_with_a_days_grace(LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8)), least=2)
    at = log.time
    log.request("alice", "resize", {"job_id": "e", "replicas": 2})
    e = fold(log).jobs["e"]
    assert e.leaving == [2, 3] and e.preempt_deadline == at + 600.0  # the queue's max grace


def test_the_owners_resize_during_a_shrink_for_another_keeps_its_beneficiary_and_deadline() -> None:
    log = _with_beneficiary(elastic_running(replicas=4, least=1)).shrink("e", 2, "b")
    shrunk = fold(log).jobs["e"]
    log.request("alice", "resize", {"job_id": "e", "replicas": 1})
    e = fold(log).jobs["e"]
    assert e.admission is not None and e.admission.replicas == 1 and e.leaving == [1, 2, 3]
    assert (e.preempted_for, e.preempt_deadline) == ("b", shrunk.preempt_deadline)


def test_a_shrink_counts_for_the_cooldown_of_its_jobs_class() -> None:
    # Uncounted, a lender submitting and cancelling once a minute had a borrower's elastic job
    # shrunk once a minute past a class allowing once an hour.
    from corral.events.queues import ApplyPriorityClass, PriorityClassSpec
    from tests.builders import Cluster

    steady = PriorityClassSpec("steady", 0, cooldown_s=600.0)
    log = LogBuilder(start_time=0.0).nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.admin("priority-class", ApplyPriorityClass(priority_class=steady))
    log.submit("alice", "e", job().replicas(4, minimum=1).priority_class("steady")).accept("e")
    log.admit("e", replicas=4).place(placement("e", *ranks(4)))
    for r in range(4):
        log.started(N0, "e", rank=r)
    log.at(100.0)
    _with_beneficiary(log).shrink("e", 2, "b")
    log.exited(N0, "e", rank=2, code=143, stopped=True).exited(N0, "e", rank=3, code=143, stopped=True)
    state = fold(log)
    assert state.jobs["e"].preempted_at[-1] >= 100.0 and state.jobs["e"].preemptions == 0
    log.at(160.0).submit("bob", "c", job().replicas(1)).accept("c", priority=10).shrink("e", 1, "c")
    state = fold(log)
    assert state.rejections[-1].code == "void" and "shrunk 60s ago" in state.rejections[-1].message
    assert state.jobs["e"].admission is not None and state.jobs["e"].admission.replicas == 2


def test_the_owners_second_resize_gives_the_ranks_leaving_now_their_grace() -> None:
    # Rank 3 of the first resize is slow to exit, past its deadline: with that deadline, rank 2
    # of the second was stopped at once. No job waits on the owner's shrink: rank 2 gets its
    # grace, and rank 3's deadline does not move earlier.
    log = elastic_running(replicas=4, least=1)
    log.at(2_000.0).request("alice", "resize", {"job_id": "e", "replicas": 3})
    assert fold(log).jobs["e"].preempt_deadline == 2_000.0 + 30.0
    log.at(3_000.0).request("alice", "resize", {"job_id": "e", "replicas": 2})
    e = fold(log).jobs["e"]
    assert (e.leaving, e.preempted_for, e.preempt_deadline) == ([2, 3], "", 3_000.0 + 30.0)


def test_the_owners_shrink_is_capped_by_the_least_max_grace_of_its_cohort_tree() -> None:
    # e of team-a borrows team-b's idle GPUs, then its owner shrinks it: the GPUs its leaving
    # ranks hold may be team-b's, so team-b's cap (600 s) bounds them, not team-a's (none).
    from corral.events.queues import PreemptionPolicy
    from tests.builders import Cluster

    a = queue_spec("team-a", 1, cohort="c", preemption=PreemptionPolicy(max_grace_seconds=None))
    log = _runs_with_a_days_grace(
        LogBuilder().nodes(Cluster(1)).queue(a).queue(queue_spec("team-b", 7, cohort="c"))
    )
    log.at(2_000.0).request("alice", "resize", {"job_id": "e", "replicas": 1})
    e = fold(log).jobs["e"]
    assert e.leaving == [1, 2, 3] and e.preempt_deadline == 2_000.0 + 600.0


def test_a_resize_refused_says_why_in_the_owners_words() -> None:
    # Growing a job that is not elastic read "job g is not elastic down to 3".
    from corral.events.jobs import ResizeJob

    log = LogBuilder().queue(queue_spec("team-a", 8))
    log.submit("alice", "g", job("team-a").replicas(2)).accept("g")
    log.request("alice", "resize", ResizeJob(job_id="g", replicas=3))
    why = fold(log).rejections[-1]
    assert why.code == "illegal" and why.message.startswith(
        "job g is not elastic: it runs 2 workers, no more and no fewer"
    ), why
    state = fold(elastic_running(least=1).request("alice", "resize", ResizeJob(job_id="e", replicas=0)))
    assert state.rejections[-1].message == "job e is elastic down to 1 worker, not 0"
    # A shrink to one worker is said so, not "1 workers".
    state = fold(elastic_running().request("alice", "resize", ResizeJob(job_id="e", replicas=1)))
    assert state.rejections[-1].message == "job e is elastic down to 2 workers, not 1"
