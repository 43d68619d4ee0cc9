"""Kueue's reading of a cohort tree with lending limits and nested cohorts, and its victim search,
as corral's preemptor answers them (whole GPUs on key ``"*"``, one one-worker job each).

Which queues' jobs are candidates for a queue taking its quota back follows Kueue's
``pkg/scheduler/preemption/classical/hierarchical_preemption.go`` (kubernetes-sigs/kueue):
``collectCandidatesInSubtree`` takes candidates only from subtrees over their quota, skipping
any cohort within it, where a cohort's usage and quota are those of ``pkg/cache``'s resource
nodes (what each child holds beyond what its lending limit keeps for it, against its own quota
plus what its children may lend); ``QuantitiesFitInQuota`` gives the taker its hierarchical
advantage when it fits within its own queue or a cohort on its way up. Each case's world is the
smallest that tells a reading of raw nominal sums from Kueue's.

A job larger than its nominal has work stopped for it only where Kueue's flavor assigner tries
preemption (``fitsResourceQuota`` in ``pkg/scheduler/flavorassigner``: the request fits the
nominal, or a cohort below the root with it, ``mayReclaimInHierarchy``, or the queue may preempt
while borrowing); then its queue's own jobs are candidates when ``within_queue`` lets it stop
them, and the search finds the set Kueue's ``minimalPreemptions`` and
``fillBackWorkloads`` find in the integration case "Should preempt Workloads in the cohort
borrowing quota, when the ClusterQueue is using less than nominal quota"
(``test/integration/singlecluster/scheduler/preemption_test.go``).

The arithmetic itself, what each queue may still take and could ever take, follows
``TestAvailable`` in ``pkg/cache/scheduler/resource_test.go`` (its own section below).
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.events import subjects as subj
from corral.events.decisions import PreemptionRequested, Victim
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, PreemptionPolicy, QueueSpec, Quota
from corral.projections.fold import apply_event
from corral.projections.quota import ANY, Ledger
from corral.projections.state import State
from corral.services.preemptor.decide import decide
from tests.builders import queue_spec
from tests.unit.test_preemptor import World, gpus, whole

LP_ANY = {"within_queue": "lower-priority", "reclaim_within_cohort": "any"}


NEVER = {"within_queue": "never", "reclaim_within_cohort": "never", "borrow_within_cohort": "never"}


def _queue(
    name: str, nominal: int, cohort: str, *, lending_limit: int | None = None, **policy: Any
) -> QueueSpec:
    fields = {**NEVER, **policy}  # Kueue's default is Never for all three fields; corral's is not
    spec = PreemptionPolicy(**fields)
    return queue_spec(name, nominal, cohort=cohort, lending_limit=lending_limit, preemption=spec)


def _world(
    cohorts: list[tuple[str, str | None]], queues: list[QueueSpec], running: list[tuple[str, str, int, int]]
) -> World:
    """``running``: (job, queue, GPUs, priority), admitted and started in that order."""
    w = World(nodes=4)
    for name, parent in cohorts:
        w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec(name, parent)), subj.ADMIN)
    for q in queues:
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    free = [list(range(8)) for _ in range(4)]
    for job_id, queue, n, priority in running:
        i = next(i for i, f in enumerate(free) if len(f) >= n)
        taken, free[i] = free[i][:n], free[i][n:]
        w.run(job_id, gpus(n, queue), whole(f"node-{i:02d}", *taken), priority=priority)
    return w


def _victims(w: World, queue: str, n: int, priority: int = 0) -> list[str]:
    """Who the preemptor stops for a job of ``n`` GPUs of ``queue`` its quota blocks (the fold
    takes each proposal, or the World fails)."""
    w.submit("in", gpus(n, queue), priority=priority)
    assert not Ledger.from_state(w.state).fits(queue, ANY, n * 1000)
    events = w.cycle(decide)
    return sorted(v.job_id for e in events if isinstance(e, PreemptionRequested) for v in e.victims)


def test_a_cohort_over_its_quota_by_a_lending_limit_gives_back_what_it_borrowed() -> None:
    #        r
    #      /   \
    #     C     q3 (4, reclaims any)
    #   /   \
    # q1 (4, lends 1)  q2 (0)
    # q2 holds 2: the 1 q1 may lend, and 1 of q3's nominal through r. C holds 2 of a quota of 1
    # (its raw nominal, 4, would say it borrows nothing), so q3 takes its GPU back from b.
    w = _world(
        [("r", None), ("C", "r")],
        [_queue("q1", 4, "C", lending_limit=1), _queue("q2", 0, "C"), _queue("q3", 4, "r", **LP_ANY)],
        [("b", "q2", 2, 0), ("q3-run", "q3", 3, 0)],
    )
    assert _victims(w, "q3", 1) == ["b"]


def test_a_queue_is_not_back_within_its_side_by_quota_a_lending_limit_keeps_from_it() -> None:
    #          r
    #     /    |    \
    #    C    qr (3)  qb (0)
    #   /  \
    # q1 (4, lends 1)  q (0, reclaims any)
    # q holds 2 and asks 1 more: C's quota is the 1 q1 lends, so q would borrow beyond C, and
    # qb's job, of q's priority, is no reclaim (raw sums would read C within its 4).
    w = _world(
        [("r", None), ("C", "r")],
        [
            _queue("q1", 4, "C", lending_limit=1),
            _queue("q", 0, "C", **LP_ANY),
            _queue("qr", 3, "r"),
            _queue("qb", 0, "r"),
        ],
        [("q-run", "q", 2, 0), ("qr-run", "qr", 1, 0), ("qb-run", "qb", 1, 0)],
    )
    assert _victims(w, "q", 1) == []


def test_a_cohort_within_its_quota_below_the_common_cohort_keeps_its_queues_jobs() -> None:
    #              r
    #           /     \
    #          A       qx (4, reclaims any)
    #        /   \
    #       B     q3 (0)
    #     /   \
    #  q1 (0)  q2 (4)
    # q1 runs on q2's idle 4 inside B, which is within its quota; q3 borrows qx's 4 through A.
    # qx takes back from q3, not from q1, whatever their priorities.
    w = _world(
        [("r", None), ("A", "r"), ("B", "A")],
        [_queue("q1", 0, "B"), _queue("q2", 4, "B"), _queue("q3", 0, "A"), _queue("qx", 4, "r", **LP_ANY)],
        [("b-low", "q1", 4, -5), ("a-borrow", "q3", 4, 0)],
    )
    assert _victims(w, "qx", 4) == ["a-borrow"]


def _larger_than_its_nominal(**policy: Any) -> World:
    # Kueue's "A workload is only eligible to do preemptions if it fits fully within nominal
    # quota" (pkg/scheduler/scheduler_test.go): other-alpha (2) runs a1 and other-beta (2) b1;
    # "in" (3 GPUs, priority 1) would borrow 1 of other-beta's nominal even with a1 gone.
    return _world(
        [("other", None)],
        [_queue("other-alpha", 2, "other", **{**LP_ANY, **policy}), _queue("other-beta", 2, "other")],
        [("a1", "other-alpha", 1, -1), ("b1", "other-beta", 1, -1)],
    )


def test_a_job_larger_than_its_nominal_stops_nothing_where_its_queue_may_not_borrow_over() -> None:
    # Kueue's flavor assigner tries preemption only for a request within the nominal, one that
    # fits a cohort below the root, or a queue that may preempt while borrowing: none here, so
    # a1 keeps running (a1 was stopped for a job that would then run on borrowed quota).
    assert _victims(_larger_than_its_nominal(), "other-alpha", 3, 1) == []


def test_the_fold_refuses_stopping_work_for_a_job_that_would_borrow_where_its_queue_may_not() -> None:
    w = _larger_than_its_nominal()
    w.submit("in", gpus(3, "other-alpha"), priority=1)
    body = PreemptionRequested(
        based_on=w.seq, now=w.time, beneficiary="in", victims=(Victim("a1", 0),), deadline=w.time + 30
    )
    w.seq += 1
    before = w.state.rejected_total
    apply_event(w.state, w.seq, subj.decision("preemptor"), body, w.time)
    assert w.state.rejected_total == before + 1
    assert "borrow_within_cohort: never" in w.state.rejections[-1].message
    assert w.state.jobs["a1"].phase == "running"


@pytest.mark.parametrize(
    "policy",
    [{"borrow_within_cohort": "lower-priority"}, {"fair_sharing": ("less-than-or-equal-to-final-share",)}],
    ids=["borrow within the cohort", "fair sharing, reclaim never"],
)
def test_a_job_larger_than_its_nominal_stops_its_own_queues_work_where_it_may_borrow_over(
    policy: dict[str, Any],
) -> None:
    # With borrow_within_cohort, or sharing fairly (Kueue's "multiple preemptions within cq
    # when fair sharing", pkg/scheduler/scheduler_fs_test.go), it may preempt while borrowing:
    # a1 goes, and b1, within its queue's nominal, stays.
    w = _larger_than_its_nominal(**policy)
    assert _victims(w, "other-alpha", 3, 1) == ["a1"]


def test_a_victim_of_its_own_queue_found_late_spares_a_borrower_taken_early() -> None:
    # alpha, beta and gamma each have nominal 2. beta borrows 3 (beta-mid 1 and beta-high 4).
    # alpha-mid (2) needs alpha's own alpha-low gone to be within its nominal, and 1 GPU of
    # beta's borrowed ones. Taken in order, beta-mid and beta-high go first, which leaves beta
    # below its nominal: no prefix is allowed. Sparing beta-high once alpha-low is taken is.
    w = _world(
        [("all", None)],
        [
            _queue("alpha-cq", 2, "all", **LP_ANY),
            _queue("beta-cq", 2, "all"),
            _queue("gamma-cq", 2, "all", **LP_ANY),
        ],
        [("alpha-low", "alpha-cq", 1, -1), ("beta-mid", "beta-cq", 1, 0), ("beta-high", "beta-cq", 4, 1)],
    )
    assert _victims(w, "alpha-cq", 2, 0) == ["alpha-low", "beta-mid"]


# -- TestAvailable ---------------------------------------------------------------------------------
#
# ``TestAvailable`` in Kueue's ``pkg/cache/scheduler/resource_test.go`` (as of commit ff69552e):
# how much more each ClusterQueue may hold (``Available``) and the most it could hold with the tree
# idle (``PotentialAvailable``), given quotas, limits and usage. corral's ``Ledger.available`` and
# ``Ledger.ceiling`` answer the same, in milli-GPU as Kueue's amounts are milli-CPU; Kueue's
# flavors ``red`` and ``blue`` are two GPU models, each a quota key. Each case is checked idle
# (available equals the ceiling) and with the usage charged.


def _tree(
    queues: list[tuple[str, str | None, dict[str, Quota]]],
    cohorts: list[tuple[str, str | None, dict[str, Quota]]],
) -> State:
    state = State()
    seq = 0
    for name, parent, quotas in cohorts:
        seq += 1
        body = ApplyCohort(cohort=CohortSpec(name, parent, quotas=quotas))
        apply_event(state, seq, subj.admin("cohort"), body, float(seq), subj.ADMIN)
    for name, cohort, quotas in queues:
        seq += 1
        body = ApplyQueue(queue=QueueSpec(name, cohort=cohort, quotas=quotas))
        apply_event(state, seq, subj.admin("queue"), body, float(seq), subj.ADMIN)
    return state


R = "red"
_Q = list[tuple[str, str | None, dict[str, Quota]]]
_Use = dict[tuple[str, str], int]

AVAILABLE_CASES: list[Any] = [
    pytest.param(
        [("cq1", None, {R: Quota(0)}), ("cq2", None, {R: Quota(5), "blue": Quota(10)})],
        [],
        {("cq1", R): 1000, ("cq2", R): 2500, ("cq2", "blue"): 1000},
        # cq1 holds 1 of a nominal of 0 (a quota cut): Kueue reads 0 left, corral how far over
        # (``Ledger.available``: may be < 0 after a quota cut); either admits nothing.
        {("cq1", R): -1000, ("cq2", R): 2500, ("cq2", "blue"): 9000},
        {("cq1", R): 0, ("cq2", R): 5000, ("cq2", "blue"): 10000},
        id="base cqs",
    ),
    pytest.param(
        [("cq1", "cohort", {R: Quota(10)}), ("cq2", "cohort", {R: Quota(10, lending_limit=9)})],
        [("cohort", None, {R: Quota(10)})],
        {("cq1", R): 1000, ("cq2", R): 500},
        {("cq1", R): 28000, ("cq2", R): 28500},
        {("cq1", R): 29000, ("cq2", R): 30000},
        id="cqs with cohort",
    ),
    pytest.param(
        [("cq1", "cohort", {R: Quota(10)})],
        [("cohort", None, {R: Quota(10)})],
        {("cq1", R): 11000},
        {("cq1", R): 9000},
        {("cq1", R): 20000},
        id="cq borrows from cohort",
    ),
    pytest.param(
        [
            ("cq1", "cohort", {R: Quota(10)}),
            ("cq2", "cohort", {R: Quota(10, borrowing_limit=0, lending_limit=0)}),
        ],
        [("cohort", None, {R: Quota(10)})],
        {("cq1", R): 31000},
        # cq1 holds 31 of the 30 it could reach (a quota cut). Kueue lets the excess eat cq2's
        # 10, which cq2 lends to nobody, so that the tree admits nothing; corral keeps cq2's
        # guaranteed quota its own (README, "A quota cut does not spill over").
        {("cq1", R): 0, ("cq2", R): 10000},
        {("cq1", R): 20000, ("cq2", R): 10000},
        id="cq oversubscription spills into cohort",
    ),
    pytest.param(
        [
            ("cq1", "cohort", {R: Quota(10)}),
            ("cq2", "cohort", {R: Quota(10, borrowing_limit=2)}),
            ("cq3", "cohort", {R: Quota(10, lending_limit=5)}),
        ],
        [("cohort", None, {R: Quota(10)})],
        {("cq1", R): 20000, ("cq2", R): 10000, ("cq3", R): 6000},
        {("cq1", R): 4000, ("cq2", R): 2000, ("cq3", R): 4000},
        {("cq1", R): 35000, ("cq2", R): 12000, ("cq3", R): 40000},
        id="lending and borrowing limits respected",
    ),
    pytest.param(
        [("cq1", "left", {R: Quota(10)}), ("cq2", "right", {R: Quota(10, lending_limit=0)})],
        [("root", None, {}), ("left", "root", {R: Quota(10)}), ("right", "root", {R: Quota(10)})],
        {("cq1", R): 10000, ("cq2", R): 5000},
        {("cq1", R): 20000, ("cq2", R): 25000},
        {("cq1", R): 30000, ("cq2", R): 40000},
        id="hierarchical cohort",
    ),
    pytest.param(
        [
            ("left-cq1", "left", {R: Quota(10)}),
            ("left-cq2", "left", {R: Quota(10, borrowing_limit=5)}),
            ("right-cq", "right", {R: Quota(10)}),
        ],
        [
            ("root", None, {}),
            ("left", "root", {R: Quota(10, borrowing_limit=5)}),
            ("right", "root", {R: Quota(10)}),
        ],
        {},
        {("left-cq1", R): 35000, ("left-cq2", R): 15000, ("right-cq", R): 50000},
        {("left-cq1", R): 35000, ("left-cq2", R): 15000, ("right-cq", R): 50000},
        id="hierarchical cohort respects borrowing limit",
    ),
    pytest.param(
        [
            ("left-cq1", "left", {R: Quota(10, lending_limit=5)}),
            ("left-cq2", "left", {R: Quota(10)}),
            ("right-cq", "right", {R: Quota(0)}),
            ("root-cq", "root", {R: Quota(0)}),
        ],
        [
            ("root", None, {}),
            ("left", "root", {R: Quota(0, lending_limit=5)}),
            ("right", "root", {R: Quota(0)}),
        ],
        {},
        {("left-cq1", R): 20000, ("left-cq2", R): 15000, ("right-cq", R): 5000, ("root-cq", R): 5000},
        {("left-cq1", R): 20000, ("left-cq2", R): 15000, ("right-cq", R): 5000, ("root-cq", R): 5000},
        id="hierarchical cohort respects lending limit",
    ),
]


@pytest.mark.parametrize(("queues", "cohorts", "usage", "available", "ceiling"), AVAILABLE_CASES)
def test_available(queues: _Q, cohorts: _Q, usage: _Use, available: _Use, ceiling: _Use) -> None:
    ledger = Ledger(_tree(queues, cohorts))
    # Idle, a queue may hold the most it ever could.
    assert {qk: ledger.available(*qk) for qk in ceiling} == ceiling
    assert {qk: ledger.ceiling(*qk) for qk in ceiling} == ceiling
    for (queue, key), milli in usage.items():
        ledger.charge(queue, key, milli)
    assert {qk: ledger.available(*qk) for qk in available} == available
    assert {qk: ledger.ceiling(*qk) for qk in ceiling} == ceiling
