"""Kueue's hierarchical-cohort and fair-sharing preemption tables, case by case, as corral's
preemptor answers them.

Follows ``TestHierarchicalPreemptions`` in Kueue's
``pkg/scheduler/preemption/preemption_hierarchical_test.go`` (kubernetes-sigs/kueue), and the
simpler cases of ``TestFairPreemptions`` in ``preemption_fair_test.go`` (their own section
below says how shares translate). Each case
keeps Kueue's name as its id. Kueue's CPU quantities are whole GPUs on quota key ``"*"``; a
ClusterQueue is a queue, a Cohort (with its parent and its own quota) a cohort; admitted
workloads are jobs that run, the incoming workload a queued job its queue's quota blocks. The
cluster has a spare node or more, so that quota, not room on the nodes, decides every case, as
in Kueue's table. Each queue's three preemption fields are written out, as Kueue's case sets
them (Kueue's default is ``never``; corral's is not).

The outcome checked is Kueue's ``wantPreempted``: the victims the preemptor proposes for the
incoming job, and that the fold takes the proposal (``World.emit`` fails on a rejection).

Left out, because corral has no such thing: "hiearchical preemption with multiple resources"
(CPU and memory quota at once; with GPUs alone the incoming job fits and the case says nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from corral.events import subjects as subj
from corral.events.decisions import PreemptionRequested, ShrinkRequested
from corral.events.queues import ApplyCohort, ApplyFairShare, CohortSpec, FairShareSpec, Quota
from corral.projections.quota import ANY
from corral.services.preemptor.decide import decide
from tests.unit.test_preemptor import World, gpus, whole

GPUS_PER_NODE = 8  # h100-8x

# The policies of Kueue's table, each field written out.
LP_ANY: dict[str, Any] = {
    "within_queue": "lower-priority",
    "reclaim_within_cohort": "any",
    "borrow_within_cohort": "never",
}
LP_ANY_BORROW_0: dict[str, Any] = {
    **LP_ANY,
    "borrow_within_cohort": "lower-priority",
    "borrow_priority_threshold": 0,
}
LP_LP_BORROW_0: dict[str, Any] = {**LP_ANY_BORROW_0, "reclaim_within_cohort": "lower-priority"}


@dataclass(frozen=True)
class Cohort:
    name: str
    parent: str | None = None
    nominal: int | None = None


@dataclass(frozen=True)
class Queue:
    name: str
    cohort: str
    nominal: int = 0
    policy: dict[str, Any] | None = None
    lending_limit: int | None = None


@dataclass(frozen=True)
class Running:
    job_id: str
    queue: str
    priority: int
    gpus: int


@dataclass(frozen=True)
class Case:
    cohorts: tuple[Cohort, ...]
    queues: tuple[Queue, ...]
    running: tuple[Running, ...]
    queue: str  # the incoming job's
    priority: int
    gpus: int
    preempted: tuple[str, ...]
    # Cohort quota applied once the jobs run (a quota cut): how a Kueue snapshot that holds more
    # than its quota is reached, since the fold admits nothing beyond quota.
    then: tuple[Cohort, ...] = ()
    # Jobs already stopping for the incoming job when the cycle runs (Kueue: evicted, not gone).
    stopping: tuple[str, ...] = ()


def _world(case: Case) -> World:
    held = sum(r.gpus for r in case.running)
    nodes = -(-held // GPUS_PER_NODE) + 2  # every job fits where first-fit puts it, and room spare
    w = World(nodes=nodes)
    for c in case.cohorts:
        w.cohort(c.name, c.parent, c.nominal)
    for q in case.queues:
        w.queue(q.name, q.nominal, q.cohort, lending_limit=q.lending_limit, **(q.policy or LP_ANY))
    free = [list(range(GPUS_PER_NODE)) for _ in range(nodes)]
    for r in case.running:
        n = next(i for i, f in enumerate(free) if len(f) >= r.gpus)
        taken, free[n] = free[n][: r.gpus], free[n][r.gpus :]
        w.run(r.job_id, gpus(r.gpus, r.queue), whole(f"node-{n:02d}", *taken), priority=r.priority)
    for c in case.then:
        quotas = {} if c.nominal is None else {ANY: Quota(c.nominal)}
        w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec(c.name, c.parent, quotas)), subj.ADMIN)
    w.submit("in", gpus(case.gpus, case.queue), priority=case.priority)
    if case.stopping:
        w.preempt("in", *case.stopping)
    return w


CASES = [
    #        r
    #      /   \
    #   c(2)  q_borrowing(0)
    #    |
    #   q(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q", "c"), Queue("q_borrowing", "r")),
            running=(Running("admitted2", "q_borrowing", 0, 2),),
            queue="q",
            priority=0,
            gpus=2,
            preempted=("admitted2",),
        ),
        id="preempt with hierarchical advantage",
    ),
    #          r
    #      /   |      \
    #   c(2) q_borrowing(0) q_nominal(2)
    #    |
    #   q(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q_nominal", "r", 2), Queue("q", "c"), Queue("q_borrowing", "r")),
            running=(Running("admitted1", "q_nominal", -10, 2), Running("admitted2", "q_borrowing", 0, 2)),
            queue="q",
            priority=0,
            gpus=2,
            preempted=("admitted2",),
        ),
        id="avoid queues within nominal quota",
    ),
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q", "c"), Queue("q_borrowing", "r")),
            running=(Running("admitted1", "q_borrowing", 1, 1), Running("admitted2", "q_borrowing", 2, 1)),
            queue="q",
            priority=0,
            gpus=2,
            preempted=("admitted1", "admitted2"),
        ),
        id="preempt multiple with hierarchical advantage",
    ),
    #        r(0)
    #         |
    #        c(3)
    #      /     \
    #   q(0)  q_same_cohort(0)
    # Kueue's snapshot holds 4 GPUs against c's 3 (admitted_preemptible is assigned 2): the
    # jobs run under a quota of 4, then c is cut to 3.
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 4)),
            queues=(Queue("q", "c", policy=LP_ANY_BORROW_0), Queue("q_same_cohort", "c")),
            running=(
                Running("admitted_not_preemptible", "q_same_cohort", 1, 1),
                Running("admitted_preemptible", "q_same_cohort", 0, 2),
                Running("admitted_own_queue", "q", -1, 1),
            ),
            then=(Cohort("c", "r", 3),),
            queue="q",
            priority=1,
            gpus=2,
            preempted=("admitted_own_queue", "admitted_preemptible"),
        ),
        id="preempt in cohort and own CQ",
    ),
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q", "c"), Queue("q_borrowing", "r")),
            running=(
                Running("admitted_borrowing", "q_borrowing", 1, 1),
                Running("admitted_same_queue", "q", -2, 1),
            ),
            queue="q",
            priority=0,
            gpus=1,
            preempted=("admitted_borrowing",),
        ),
        id="prefer to preempt hierarchical candidate",
    ),
    #          r(0)
    #        /     \
    #     c(2)   q_nominal(2)
    #    /    \
    #  q(0)  q_same_cohort(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(
                Queue("q", "c", policy=LP_ANY_BORROW_0),
                Queue("q_nominal", "r", 2),
                Queue("q_same_cohort", "c"),
            ),
            running=(
                Running("admitted_nominal", "q_nominal", -10, 2),
                Running("admitted_same_cohort", "q_same_cohort", -1, 2),
            ),
            queue="q",
            priority=0,
            gpus=2,
            preempted=("admitted_same_cohort",),
        ),
        id="forced to preempt priority candidate",
    ),
    #          r(0)
    #        /     \
    #     c(2)   q_borrowing(0)
    #    /    \
    #  q(4)  q_same_cohort(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q", "c", 4), Queue("q_borrowing", "r"), Queue("q_same_cohort", "c")),
            running=(
                Running("admitted_borrowing", "q_borrowing", 10, 3),
                Running("admitted_same_cohort", "q_same_cohort", 10, 3),
            ),
            queue="q",
            priority=0,
            gpus=4,
            preempted=("admitted_borrowing", "admitted_same_cohort"),
        ),
        id="incoming workload fits in CQ nominal quota",
    ),
    #          r(1)
    #        /     \
    #     c(4)   q_borrowing(0)
    #    /    \
    #  q(0)  q_same_cohort(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r", None, 1), Cohort("c", "r", 4)),
            queues=(
                Queue("q", "c", policy=LP_LP_BORROW_0),
                Queue("q_borrowing", "r"),
                Queue("q_same_cohort", "c"),
            ),
            running=(
                Running("admitted_borrowing", "q_borrowing", -1, 2),
                Running("admitted_same_cohort_preemptible", "q_same_cohort", -1, 1),
                Running("admitted_borrowing_not_preemptible", "q_borrowing", 1, 2),
            ),
            queue="q",
            priority=0,
            gpus=3,
            preempted=("admitted_borrowing", "admitted_same_cohort_preemptible"),
        ),
        id="preempt hierarchical and priority candidates",
    ),
    pytest.param(
        Case(
            cohorts=(Cohort("r", None, 1), Cohort("c", "r", 4)),
            queues=(
                Queue("q", "c", policy=LP_LP_BORROW_0),
                Queue("q_borrowing", "r"),
                Queue("q_same_cohort", "c"),
            ),
            running=(
                Running("admitted_borrowing", "q_borrowing", -1, 2),
                Running("admitted_same_queue_preemptible", "q", -1, 1),
                Running("admitted_borrowing_not_preemptible", "q_borrowing", 1, 2),
            ),
            queue="q",
            priority=0,
            gpus=3,
            preempted=("admitted_borrowing", "admitted_same_queue_preemptible"),
        ),
        id="preempt hierarchical candidates and inside CQ",
    ),
    #          r(0)
    #      /    |       \
    #   c(3) q_borrowing(0) q_nominal(2)
    #    |
    #   q(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 3)),
            queues=(Queue("q", "c"), Queue("q_borrowing", "r"), Queue("q_nominal", "r", 2)),
            running=(
                Running("admitted_borrowing_prio_8", "q_borrowing", 8, 1),
                Running("admitted_borrowing_prio_9", "q_borrowing", 9, 1),
                Running("admitted_borrowing_prio_10", "q_borrowing", 9, 1),
                Running("admitted_nominal", "q_nominal", -2, 2),
            ),
            queue="q",
            priority=0,
            gpus=1,
            preempted=("admitted_borrowing_prio_8",),
        ),
        id="reclaim nominal quota from lowest priority workload, excluding non-borrowing",
    ),
    #              r
    #          /        \
    #       c(2)        c_other(2)
    #      /    \            |
    #   q(0) q_same_cohort(0) q_other(0)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2), Cohort("c_other", "r", 2)),
            queues=(Queue("q_other", "c_other"), Queue("q", "c"), Queue("q_same_cohort", "c")),
            running=(
                Running("admitted_other_1", "q_other", -10, 1),
                Running("admitted_other_2", "q_other", -10, 1),
                Running("admitted_same_cohort", "q_same_cohort", 0, 2),
            ),
            queue="q",
            priority=0,
            gpus=2,
            preempted=(),
        ),
        id="infeasible preemption all available workloads in pruned subtrees",
    ),
    #          r(0)
    #        /     \
    #     c(2)   q_borrowing(0)
    #    /    \
    #  q(0)  q_same_cohort(0)
    # Kueue's evicted workload is one still stopping for the incoming job: the preemption is
    # under way, and nothing more is stopped for it (admitted_borrowing keeps running).
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(
                Queue("q", "c", policy=LP_ANY_BORROW_0),
                Queue("q_borrowing", "r"),
                Queue("q_same_cohort", "c"),
            ),
            running=(
                Running("admitted_borrowing", "q_borrowing", -10, 1),
                Running("evicted_same_cohort", "q_same_cohort", -1, 1),
            ),
            stopping=("evicted_same_cohort",),
            queue="q",
            priority=0,
            gpus=1,
            preempted=(),
        ),
        id="prefer to preempt evicted workloads",
    ),
    #          r(0)
    #        /     \
    #     c(2)   q_borrowing(0)
    #      |
    #  q(3, lending limit 2)
    pytest.param(
        Case(
            cohorts=(Cohort("r"), Cohort("c", "r", 2)),
            queues=(Queue("q", "c", 3, lending_limit=2), Queue("q_borrowing", "r")),
            running=(Running("admitted_borrowing", "q_borrowing", 0, 4),),
            queue="q",
            priority=-2,
            gpus=5,
            preempted=("admitted_borrowing",),
        ),
        id="respect lending limits",
    ),
    #                     r
    #                /         \
    #             c11           c12
    #          /   |   \          \
    #       c21   c22   c23        q1
    #      /   \    |     |
    #    c31   c32  q3    q2
    #     |     |
    #    q5    q4
    # 4 GPUs each for c11, c12, c21, c22, c23, c31, c32; the queues hold none. Only one of
    # q2's jobs goes: once the first is stopped, c23 is back within its own quota.
    pytest.param(
        Case(
            cohorts=(
                Cohort("r"),
                Cohort("c11", "r", 4),
                Cohort("c12", "r", 4),
                Cohort("c21", "c11", 4),
                Cohort("c22", "c11", 4),
                Cohort("c23", "c11", 4),
                Cohort("c31", "c21", 4),
                Cohort("c32", "c21", 4),
            ),
            queues=(
                Queue("q1", "c12"),
                Queue("q2", "c23"),
                Queue("q3", "c22"),
                Queue("q4", "c32"),
                Queue("q5", "c31"),
            ),
            running=(
                Running("admitted_borrowing_1", "q1", -6, 4),
                Running("admitted_borrowing_2", "q1", -5, 4),
                Running("admitted_borrowing_3", "q2", -9, 4),
                Running("admitted_borrowing_4", "q2", -10, 4),
                Running("admitted_borrowing_5", "q3", -4, 4),
                Running("admitted_borrowing_6", "q3", -3, 3),
                Running("admitted_borrowing_7", "q4", 4, 2),
                Running("admitted_borrowing_8", "q4", 2, 3),
            ),
            queue="q5",
            priority=-2,
            gpus=7,
            preempted=("admitted_borrowing_1", "admitted_borrowing_4"),
        ),
        id="reclaim in complex hierarchy",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_kueue_hierarchical_preemption(case: Case) -> None:
    w = _world(case)
    assert w.state.jobs["in"].phase == "queued"
    events = w.cycle(decide)  # the fold takes each proposal, or the World fails
    assert not [e for e in events if isinstance(e, ShrinkRequested)]
    proposed = sorted(v.job_id for e in events if isinstance(e, PreemptionRequested) for v in e.victims)
    assert [e.beneficiary for e in events if isinstance(e, PreemptionRequested)] == (
        ["in"] if proposed else []
    )
    assert proposed == sorted(case.preempted)
    for r in case.running:
        stopped = r.job_id in case.preempted or r.job_id in case.stopping
        assert (w.state.jobs[r.job_id].phase == "running") is not stopped, r.job_id


# -- fair sharing ----------------------------------------------------------------------------------
#
# The simpler cases of ``TestFairPreemptions`` in Kueue's
# ``pkg/scheduler/preemption/preemption_fair_test.go``: one cohort ``all`` of queues a, b and c
# (nominal 3 each; within lower-priority, reclaim any) and
# ``preemptible`` (nominal 0, stops nobody). Kueue's strategies default to both, final share
# first. Cases with half CPUs count every quantity twice (a, b and c then have 6 GPUs each).
#
# A corral share is the queue's decayed GPU time less its nominal, not what it holds now: the
# jobs run for 30 half-lives before the incoming job comes, so that what each queue held lately
# is what it holds. Kueue divides by what the cohort could lend and stops at 0 under nominal;
# with one cohort and one resource the order of shares is the same, and where a victim's queue
# falls under its nominal below, Kueue's 0 and corral's negative share give the same answer.
#
# Identical jobs of one queue (same priority, same size) are told apart in Kueue by name; corral
# takes the one that loses least work, the youngest. So victims are compared as (queue, GPUs,
# priority), not by name.

FINAL = "less-than-or-equal-to-final-share"
INITIAL = "less-than-initial-share"
HALF_LIFE_S = 1000.0


@dataclass(frozen=True)
class Fair:
    running: tuple[Running, ...]
    queue: str
    gpus: int
    preempted: tuple[str, ...]
    priority: int = 0
    nominal: int = 3
    strategies: tuple[str, ...] = (FINAL, INITIAL)


def _fair_world(case: Fair) -> World:
    held = sum(r.gpus for r in case.running)
    nodes = -(-held // GPUS_PER_NODE) + 2
    w = World(nodes=nodes)
    w.emit(
        subj.admin("fair-share"),
        ApplyFairShare(fair_share=FairShareSpec(half_life_s=HALF_LIFE_S)),
        subj.ADMIN,
    )
    w.cohort("all")
    # Kueue's queues set borrowWithinCohort (lower priority, up to -3), which Kueue ignores once
    # fair sharing is on ("workloads under priority threshold not capriciously preempted"); a
    # corral queue would still honour it next to its fair sharing, so it is left off here.
    policy = LP_ANY
    for name in ("a", "b", "c"):
        w.queue(name, case.nominal, "all", fair_sharing=case.strategies, **policy)
    never = {"within_queue": "never", "reclaim_within_cohort": "never", "borrow_within_cohort": "never"}
    w.queue("preemptible", 0, "all", fair_sharing=case.strategies, **never)
    free = [list(range(GPUS_PER_NODE)) for _ in range(nodes)]
    for r in case.running:
        n = next(i for i, f in enumerate(free) if len(f) >= r.gpus)
        taken, free[n] = free[n][: r.gpus], free[n][r.gpus :]
        w.run(r.job_id, gpus(r.gpus, r.queue), whole(f"node-{n:02d}", *taken), priority=r.priority)
    w.wait(30 * HALF_LIFE_S)
    w.submit("in", gpus(case.gpus, case.queue), priority=case.priority)
    return w


def _units(queue: str, n: int, prefix: str | None = None, priority: int = 0) -> tuple[Running, ...]:
    """``n`` one-GPU jobs of ``queue``, named as Kueue's unit workloads (a1, a2, ...)."""
    return tuple(Running(f"{prefix or queue}{i}", queue, priority, 1) for i in range(1, n + 1))


FAIR_CASES = [
    pytest.param(
        Fair(
            running=(*_units("a", 3), *_units("b", 5), *_units("c", 1)), queue="c", gpus=1, preempted=("b1",)
        ),
        id="reclaim nominal from user using the most",
    ),
    pytest.param(
        Fair(
            running=(
                Running("a1", "a", 0, 3),
                Running("a2", "a", 0, 1),
                Running("b1", "b", 0, 2),
                Running("b2", "b", 0, 3),
            ),
            queue="c",
            gpus=3,
            # Kueue stops a1 alone, telling a's equal jobs apart by name. corral, of equal
            # priorities, stops first the job that loses the least work (README: victim order
            # within a priority): b1, from b, whose share is the highest, then a2 once a's is.
            preempted=("a2", "b1"),
        ),
        id=(
            "can reclaim from queue using less, if taking the latest workload from user"
            " using the most isn't enough"
        ),
    ),
    pytest.param(
        Fair(
            running=(*_units("a", 3), *_units("b", 5), *_units("c", 1)), queue="a", gpus=1, preempted=("b1",)
        ),
        id="reclaim borrowable quota from user using the most",
    ),
    pytest.param(
        Fair(
            running=(
                Running("a1", "a", 0, 1),
                Running("a2", "a", 0, 1),
                Running("a3", "a", 0, 6),
                Running("b1", "b", 0, 1),
                Running("b2", "b", 0, 1),
                Running("b3", "b", 0, 6),
            ),
            nominal=6,
            queue="c",
            gpus=4,
            preempted=("a1", "b1"),
        ),
        id="preempt one from each CQ borrowing",
    ),
    pytest.param(
        Fair(running=(*_units("a", 3), *_units("b", 3), *_units("c", 3)), queue="c", gpus=1, preempted=()),
        id="can't preempt when everyone under nominal",
    ),
    pytest.param(
        Fair(running=(*_units("a", 3), *_units("b", 5)), queue="a", gpus=2, preempted=()),
        id="can't preempt when it would switch the imbalance",
    ),
    pytest.param(
        Fair(
            running=(
                *_units("a", 2, "a_low", -1),
                Running("a3", "a", 0, 1),
                Running("a4", "a", 0, 1),
                *_units("b", 5),
            ),
            queue="a",
            gpus=2,
            preempted=("a_low1", "a_low2"),
        ),
        id="can preempt lower priority workloads from same CQ",
    ),
    pytest.param(
        Fair(
            running=(
                Running("a_low", "a", -1, 1),
                Running("a2", "a", 0, 1),
                Running("a3", "a", 0, 1),
                *_units("b", 6),
            ),
            queue="a",
            gpus=2,
            preempted=("a_low", "b1"),
        ),
        id="can preempt a combination of same CQ and highest user",
    ),
    pytest.param(
        Fair(running=(Running("a1", "a", 0, 2), Running("b1", "b", 0, 7)), queue="a", gpus=5, preempted=()),
        id="can't preempt huge workload if the incoming is also huge",
    ),
    pytest.param(
        Fair(
            running=(Running("b1", "b", 0, 2), Running("b2", "b", 0, 2), Running("b3", "b", 0, 3)),
            queue="a",
            gpus=6,
            preempted=(),
        ),
        id="can't preempt 2 smaller workloads if the incoming is huge",
    ),
    pytest.param(
        Fair(
            running=(
                Running("a1_low", "a", -1, 2),
                Running("a2_low", "a", -1, 1),
                Running("b1", "b", 0, 3),
                Running("b2", "b", 0, 3),
            ),
            queue="a",
            gpus=4,
            preempted=("a1_low", "b1"),
        ),
        id="preempt from target and others even if over nominal",
    ),
    pytest.param(
        Fair(
            running=(*_units("a", 3), *_units("b", 3), *_units("preemptible", 3, priority=-3)),
            queue="a",
            gpus=2,
            preempted=(),
        ),
        id="workloads under priority threshold not capriciously preempted",
    ),
    pytest.param(
        Fair(
            running=(Running("a1", "a", 0, 3), Running("b_low", "b", 0, 5), Running("b_high", "b", 1, 1)),
            strategies=(INITIAL,),
            queue="a",
            gpus=1,
            preempted=("b_low",),
        ),
        id="preempt lower priority first, even if big",
    ),
    pytest.param(
        Fair(
            running=(Running("a1", "a", 0, 3), Running("b_low", "b", 0, 5), Running("b_high", "b", 1, 1)),
            strategies=(FINAL,),
            queue="a",
            gpus=1,
            preempted=("b_high",),
        ),
        id="preempt workload that doesn't transfer the imbalance, even if high priority",
    ),
]


def _signature(w: World, job_ids: list[str] | tuple[str, ...]) -> list[tuple[str, int, int]]:
    jobs = [w.state.jobs[j] for j in job_ids]
    return sorted((j.spec.queue, j.spec.resources.gpus, j.priority) for j in jobs)


@pytest.mark.parametrize("case", FAIR_CASES)
def test_kueue_fair_sharing_preemption(case: Fair) -> None:
    w = _fair_world(case)
    assert w.state.jobs["in"].phase == "queued"
    events = w.cycle(decide)  # the fold takes each proposal, or the World fails
    assert not [e for e in events if isinstance(e, ShrinkRequested)]
    proposed = [v.job_id for e in events if isinstance(e, PreemptionRequested) for v in e.victims]
    assert [e.beneficiary for e in events if isinstance(e, PreemptionRequested)] == (
        ["in"] if proposed else []
    )
    assert _signature(w, proposed) == _signature(w, case.preempted), sorted(proposed)
