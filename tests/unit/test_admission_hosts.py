"""Admission and the nodes that could host a job: a job no node can host is refused at submission;
an admitted one whose node left gives its quota back and waits, holding nothing, until a node
that can host it is there again. Driven through ``decide`` and the fold, cycle by cycle, every
decision appended to the log it was made from."""

from __future__ import annotations

from typing import Any

import msgspec

from corral.events import routing
from corral.events.base import Event
from corral.events.jobs import (
    AdmissionWithdrawn,
    JobAccepted,
    JobRejected,
    JobsAdmitted,
    PendingReasonChanged,
)
from corral.projections.state import State
from corral.services.admission.decide import decide
from corral.services.agent.inventory import h100_8x_nvswitch, t4_2x
from tests.builders import Cluster, LogBuilder, job, on, queue_spec

NO_BIG_NODE = "needs 8 GPUs per worker; the largest node has 2"
WAITS = "waits, holding no quota, until a node that can host it registers"


def cycle(lb: LogBuilder) -> tuple[list[Event], State]:
    """One admission cycle on the log so far; its events are appended to the log, and the state
    after them is returned."""
    state = lb.fold()
    events = decide(state, state.time)
    for e in events:
        lb.event(routing.subject_of(e), e)
    after = lb.fold()
    assert after.faults == 0 and after.void_total == 0, after.rejections[-1:]
    return events, after


def of(events: list[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def admitted(events: list[Event]) -> list[str]:
    return [a.job_id for e in of(events, JobsAdmitted) for a in e.admissions]


def two_nodes() -> LogBuilder:
    """``big``: 8 H100s; ``small``: 2 T4s. Queue team-a may hold 8 GPUs."""
    return (
        LogBuilder()
        .node("big", h100_8x_nvswitch("big"))
        .node("small", t4_2x("small"))
        .queue(queue_spec("team-a", nominal=8))
    )


def test_a_job_no_node_can_host_is_refused_at_submission() -> None:
    lb = LogBuilder().nodes(Cluster(2, "h100-8x")).queue("team-a")
    lb.submit("alice", "huge", job().gpus(16)).submit("alice", "b200", job().models("B200"))
    lb.submit("alice", "fits", job().gpus(8))
    events, state = cycle(lb)
    refused = {e.job_id: e.reason for e in of(events, JobRejected)}
    assert refused["huge"].message == "needs 16 GPUs per worker; the largest node has 8"
    assert refused["b200"].message == "no node has GPU model B200 (models: H100-80GB)"
    assert {r.code for r in refused.values()} == {"no-node"}
    assert [e.job_id for e in of(events, JobAccepted)] == ["fits"]
    assert state.jobs["huge"].phase == "rejected"
    assert state.jobs["huge"].reasons == (refused["huge"],)
    assert admitted(events) == ["fits"]


def test_a_cordoned_node_still_counts_at_submission() -> None:
    """It comes back: a job only it can host is accepted, and waits for it."""
    lb = two_nodes().cordon("big").submit("alice", "wide", job().gpus(8))
    events, state = cycle(lb)
    assert [e.job_id for e in of(events, JobAccepted)] == ["wide"]
    assert state.jobs["wide"].phase == "admitted"


def test_before_any_node_registers_nothing_is_refused_for_size() -> None:
    """A cluster still starting: jobs wait, and are judged once there is an inventory."""
    lb = LogBuilder().queue(queue_spec("team-a", nominal=8)).submit("alice", "wide", job().gpus(8))
    lb.submit("alice", "narrow", job().gpus(2))
    events, state = cycle(lb)
    assert [e.job_id for e in of(events, JobAccepted)] == ["wide", "narrow"]
    assert admitted(events) == ["wide"], "nothing to judge by: wide is admitted as quota allows"


def test_a_queued_job_no_node_can_host_waits_outside_the_order() -> None:
    """It holds nothing, says why once, and the job behind it is admitted instead; once a node
    that can host it registers, it is admitted."""
    lb = LogBuilder().queue(queue_spec("team-a", nominal=12)).submit("alice", "wide", job().gpus(8))
    lb.accept("wide").node("small", t4_2x("small")).submit("alice", "narrow", job().gpus(2))
    lb.submit("alice", "after", job().gpus(2))
    events, state = cycle(lb)
    assert admitted(events) == ["narrow", "after"], "wide, first in the queue, neither takes nor holds quota"
    (said,) = of(events, PendingReasonChanged)
    assert said.job_id == "wide" and said.reasons[0].code == "no-node"
    assert said.reasons[0].message == f"{NO_BIG_NODE}; {WAITS}"
    assert not said.reasons[0].preemption_helps
    assert state.jobs["wide"].phase == "queued"
    assert cycle(lb)[0] == [], "nothing new to say"
    lb.node("big", h100_8x_nvswitch("big"))
    events, state = cycle(lb)
    assert admitted(events) == ["wide"]
    assert state.jobs["wide"].reasons == ()


def test_an_admitted_job_whose_node_left_gives_its_quota_back_and_comes_back_with_it() -> None:
    lb = two_nodes().submit("alice", "wide", job().gpus(8))
    events, state = cycle(lb)
    assert admitted(events) == ["wide"]
    assert state.quota_held == {"team-a": {"*": 8000}}
    # The only node that could host it is lost before the placer placed it.
    lb.condition("big", "lost")
    events, state = cycle(lb)
    (withdrawn,) = of(events, AdmissionWithdrawn)
    assert (withdrawn.job_id, withdrawn.attempt) == ("wide", 0)
    assert withdrawn.reason.message == f"{NO_BIG_NODE}; {WAITS}"
    wide = state.jobs["wide"]
    assert (wide.phase, wide.attempt, wide.admission) == ("queued", 0, None)
    assert wide.reasons == (withdrawn.reason,)
    assert state.quota_held == {}, "its quota is given back"
    assert cycle(lb)[0] == [], "it waits, and nothing more is said"
    # The node comes back: admitted again, at the same attempt.
    lb.condition("big", "ready")
    events, state = cycle(lb)
    assert admitted(events) == ["wide"]
    wide = state.jobs["wide"]
    assert (wide.phase, wide.attempt, wide.reasons) == ("admitted", 0, ())
    assert state.quota_held == {"team-a": {"*": 8000}}


def test_a_node_registering_again_with_fewer_gpus_withdraws_the_admission() -> None:
    lb = two_nodes().submit("alice", "wide", job().gpus(8))
    cycle(lb)
    inv = h100_8x_nvswitch("big")
    lb.node("big", type(inv)(inv.cpu_milli, inv.memory_mib, inv.gpus[:4]))
    events, state = cycle(lb)
    (withdrawn,) = of(events, AdmissionWithdrawn)
    assert withdrawn.reason.message.startswith("needs 8 GPUs per worker; the largest node has 4;")


def test_the_quota_given_back_admits_the_job_behind() -> None:
    lb = two_nodes().submit("alice", "wide", job().gpus(8))
    cycle(lb)
    lb.submit("alice", "narrow", job().gpus(2))
    assert admitted(cycle(lb)[0]) == [], "the queue's 8 GPUs are held by wide"
    lb.condition("big", "lost")
    events, _ = cycle(lb)
    assert of(events, AdmissionWithdrawn) and admitted(events) == [], "given back in the fold, not before"
    assert admitted(cycle(lb)[0]) == ["narrow"]


def test_a_gang_whose_island_split_is_withdrawn() -> None:
    """A topology no part of the cluster meets any more: the node registers again with its
    NVLink island split in two, and the gang needs all its GPUs in one."""
    lb = two_nodes().submit("alice", "pair", job().gpus(4).replicas(2).pack("nvlink", required=True))
    assert admitted(cycle(lb)[0]) == ["pair"]
    inv = h100_8x_nvswitch("big")
    split = tuple(msgspec.structs.replace(g, island=g.index // 4) for g in inv.gpus)
    lb.node("big", msgspec.structs.replace(inv, gpus=split))
    (withdrawn,) = of(cycle(lb)[0], AdmissionWithdrawn)
    assert withdrawn.reason.message.startswith(
        "needs 2 × 4 = 8 GPUs in one NVLink island; the largest has 4;"
    )


def test_a_job_interrupted_by_its_node_leaving_waits_for_one_that_can_host_it() -> None:
    """Requeued for its next attempt, it is not admitted while no node can host it: it says so
    in the same cycle, and is admitted when the node is back."""
    lb = two_nodes().submit("alice", "wide", job().gpus(8))
    cycle(lb)
    lb.place(on("big", *range(8), job_id="wide")).started("big", "wide")
    lb.condition("big", "lost")
    events, state = cycle(lb)
    assert [type(e).__name__ for e in events] == ["JobRequeued", "PendingReasonChanged"]
    wide = state.jobs["wide"]
    assert (wide.phase, wide.attempt) == ("queued", 1)
    assert wide.reasons[0].message == f"{NO_BIG_NODE}; {WAITS}"
    assert state.quota_held == {}
    lb.condition("big", "ready")
    events, state = cycle(lb)
    assert admitted(events) == ["wide"] and state.jobs["wide"].attempt == 1


# -- the fold ---------------------------------------------------------------------------------------


def test_the_fold_withdraws_only_an_admission_still_waiting_for_its_placement() -> None:
    lb = two_nodes().submit("alice", "wide", job().gpus(8)).accept("wide").admit("wide")
    lb.place(on("big", *range(8), job_id="wide"))
    lb.withdraw("wide")  # placed meanwhile: void
    state = lb.fold()
    assert state.jobs["wide"].phase == "placed"
    assert [(r.code, r.job_id) for r in state.rejections] == [("void", "wide")]


def test_the_fold_withdraws_only_the_attempt_named() -> None:
    lb = two_nodes().submit("alice", "wide", job().gpus(8)).accept("wide").admit("wide")
    lb.withdraw("wide", attempt=1)
    state = lb.fold()
    assert state.jobs["wide"].phase == "admitted"
    assert [(r.code, r.job_id) for r in state.rejections] == [("void", "wide")]
    lb.withdraw("wide", attempt=0)
    state = lb.fold()
    assert state.jobs["wide"].phase == "queued"
    assert state.quota_held == {}
