"""Fair-sharing preemption, as the fold enforces it and the preemptor proposes it: Kueue's
strategies (KEP-1714 "Choosing workloads from ClusterQueues for preemption", rules S2-a and S2-b;
``pkg/scheduler/preemption/fairsharing/strategy.go``; the docs' preemption page, "Fair
Sharing"), on shares from the GPU time each queue held lately (``projections.preemption.Shares``).

The world: three queues of weight 1 in one cohort on two 8-GPU nodes, the half-life 1,000 s.
team-a (nominal 4) runs ``own`` on 4 GPUs; team-b (nominal 2) runs ``v1`` and ``v2`` on 4 each,
borrowing 6 of team-c's nominal 10; team-c runs ``w`` on 4, within its nominal: every GPU and
all the cohort's quota are in use. Long after, team-a
has held about 4 GPUs (share 0) and team-b about 8 (share 6). A queued job ``b`` of team-a, of
the same priority as everyone, needs ``g`` more: team-a would borrow, so neither reclaim nor
borrowing over a lower priority lets it stop anyone; only fair sharing can. Taking ``v1`` (4
GPUs) leaves team-b a share of 2; team-a's share with ``b`` admitted is ``g``.
"""

from __future__ import annotations

import pytest

from corral.events.queues import ApplyCohort, CohortSpec, FairSharingStrategy, PreemptionPolicy
from corral.projections.state import State
from corral.services.preemptor.decide import plan
from tests.builders import Cluster, LogBuilder, job, on, queue_spec

FINAL: FairSharingStrategy = "less-than-or-equal-to-final-share"
INITIAL: FairSharingStrategy = "less-than-initial-share"
N0, N1 = "node-00", "node-01"
LATE = 30_000.0  # 29 half-lives after the jobs started: the shares are what they hold


def _world(strategies: tuple[FairSharingStrategy, ...], *, at: float = LATE) -> LogBuilder:
    return _cohort(PreemptionPolicy(fair_sharing=strategies), (4, 2, 10), at)


def _cohort(policy: PreemptionPolicy, nominals: tuple[int, int, int], at: float) -> LogBuilder:
    """Three queues of weight 1 in one cohort under ``policy``, of ``nominals``, on two 8-GPU
    nodes, the half-life 1,000 s: team-a runs ``own`` on 4 GPUs, team-b ``v1`` and ``v2`` on 4
    each, team-c ``w`` on 4; every GPU in use. At ``at``."""
    lb = LogBuilder().nodes(Cluster(2)).fair_share(1000.0)
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    for name, nominal in zip(("team-a", "team-b", "team-c"), nominals, strict=True):
        lb.queue(queue_spec(name, nominal, cohort="org", preemption=policy))
    for job_id, q, node, gpus in (
        ("own", "team-a", N0, (0, 1, 2, 3)),
        ("v1", "team-b", N0, (4, 5, 6, 7)),
        ("v2", "team-b", N1, (0, 1, 2, 3)),
        ("w", "team-c", N1, (4, 5, 6, 7)),
    ):
        lb.submit("t", job_id, job(q).gpus(len(gpus)).checkpointable()).accept(job_id)
        lb.admit(job_id).place(on(node, *gpus, job_id=job_id)).started(node, job_id)
    return lb.at(at)


def _preempt(lb: LogBuilder, g: int, *victims: str) -> State:
    lb.submit("alice", "b", job("team-a").gpus(g)).accept("b")
    return lb.preempt("b", *victims).fold()


@pytest.mark.parametrize(
    ("strategies", "g", "stopped"),
    [
        # S2-a: team-a's share with b (1) is at most team-b's once v1 is gone (2).
        pytest.param((FINAL,), 1, True, id="final-share-allows"),
        # S2-a refuses (4 > 2); S2-b allows: 4 is below team-b's share before (6).
        pytest.param((FINAL,), 4, False, id="final-share-refuses-a-large-ask"),
        pytest.param((INITIAL,), 4, True, id="initial-share-allows-a-large-ask"),
        pytest.param((FINAL, INITIAL), 4, True, id="kueue-default-strategies"),
        # Neither: team-a's share with b (7) is above team-b's, before and after.
        pytest.param((FINAL, INITIAL), 7, False, id="no-strategy-lets-a-greedy-queue-take"),
        # Fair sharing off (corral's and Kueue's default): equal priorities, team-a borrowing.
        pytest.param((), 1, False, id="off"),
    ],
)
def test_the_fold_lets_a_queue_take_from_a_higher_share(
    strategies: tuple[FairSharingStrategy, ...], g: int, stopped: bool
) -> None:
    state = _preempt(_world(strategies), g, "v1")
    assert (state.jobs["v1"].phase == "checkpointing") is stopped
    if not stopped:
        assert state.rejections[-1].code == "void" and "share" in state.rejections[-1].message


def test_a_queue_within_its_nominal_keeps_its_jobs() -> None:
    # Kueue takes fair-sharing victims only from ClusterQueues that borrow: team-c's share (far
    # below its nominal) is lower than team-a's, and it lends; w is never a candidate.
    state = _preempt(_world((FINAL, INITIAL)), 1, "w")
    assert state.jobs["w"].phase == "running"


def test_a_queue_taken_from_is_judged_by_what_it_held_lately_not_this_moment() -> None:
    # Right after the jobs started, team-b's GPU time is near nothing, though it borrows now:
    # its share once v1 is gone is 0 - 4 - 2 = -6, below team-a's with b (which counts what it
    # holds now: 4 + 1 - 4 = 1), and the record is refused. Late, the same record passes
    # (``final-share-allows``): a queue that has just burst is not the first to lose it.
    state = _preempt(_world((FINAL,), at=1100.0), 1, "v1")
    assert state.jobs["v1"].phase == "running"


def test_a_queue_taken_from_is_judged_by_what_it_holds_when_that_is_less_than_its_history() -> None:
    # Long after, v2 ends: team-b holds 4 (borrowing 2) but held 8 lately. By what it holds now
    # its share once v1 is gone is 4 - 4 - 2 = -2, below team-a's with b (1): the record is
    # refused. By its history (8 - 4 - 2 = 2) it passed, and a queue that had held much for days
    # was taken from again and again, below the even split, until its history caught up.
    lb = _world((FINAL,)).exited(N1, "v2", 0)
    state = _preempt(lb, 1, "v1")
    assert state.jobs["v2"].phase == "succeeded"
    assert state.jobs["v1"].phase == "running"
    assert state.rejections[-1].code == "void" and "share" in state.rejections[-1].message


def test_a_queue_that_took_by_fair_share_does_not_take_again_in_the_same_cycle() -> None:
    # b takes v1 by fair share (team-a 1 <= team-b 2); b2, of the same queue, asks for 4 more in
    # the next record while v1 still checkpoints. The stop under way counts in full on both
    # sides: team-a's share would be 4 + 1 + 4 - 4 = 5, above team-b's once v2 is gone too
    # (8 - 4 - 4 - 2 = -2, and 2 before it), so it is refused. Read from the histories alone,
    # team-a's 4 + 4 - 4 = 4 would be below team-b's 8 - 2 = 6 before v2 (S2-b), and b2 would
    # take v2 as well.
    lb = _world((FINAL, INITIAL))
    lb.submit("alice", "b", job("team-a").gpus(1)).accept("b").preempt("b", "v1")
    lb.submit("alice", "b2", job("team-a").gpus(4)).accept("b2").preempt("b2", "v2")
    state = lb.fold()
    assert state.jobs["v1"].phase == "checkpointing"
    assert state.jobs["v2"].phase == "running"
    assert state.rejections[-1].code == "void" and "share" in state.rejections[-1].message


def test_the_record_is_judged_whole() -> None:
    # v1 and v2 both gone leave team-b a share of -2: team-a's 1 is above it (S2-a), and S2-b
    # alone is off, so the fold refuses the pair though it would take either one.
    state = _preempt(_world((FINAL,)), 1, "v1", "v2")
    assert state.jobs["v1"].phase == "running" and state.jobs["v2"].phase == "running"


@pytest.mark.parametrize(
    ("strategies", "g", "victims"),
    [
        pytest.param((FINAL,), 1, ("v1",), id="final-share"),
        pytest.param((FINAL, INITIAL), 4, ("v1",), id="second-strategy-after-the-first-fails"),
        pytest.param((), 1, (), id="off"),
    ],
)
def test_the_preemptor_proposes_what_the_fold_accepts(
    strategies: tuple[FairSharingStrategy, ...], g: int, victims: tuple[str, ...]
) -> None:
    lb = _world(strategies)
    # team-a's b needs g GPUs: one of team-b's jobs (the pool's order picks which) frees them.
    lb.submit("alice", "b", job("team-a").gpus(g)).accept("b")
    state = lb.fold()
    plans = plan(state, lb.time)
    found = [v.job_id for p in plans for v in p.victims]
    assert len(found) == len(victims) and {state.jobs[v].spec.queue for v in found} <= {"team-b"}
    if found:
        folded = lb.preempt("b", *found).fold()
        assert all(folded.jobs[v].phase == "checkpointing" for v in found)


def _reclaiming_world(reclaim: str) -> LogBuilder:
    """team-a (nominal 12) runs ``own`` on 4 GPUs and lends the rest: team-b (nominal 2) runs
    ``v1`` and ``v2`` on 4 each, team-c (nominal 2) ``w`` on 4. A queued job ``b`` of team-a
    needs two workers of 4 GPUs, which leaves team-a within its nominal: it would take back
    what it lent, if ``reclaim`` let it. Late, team-a's share with ``b`` is 0; team-b's is 6,
    2 once one of its jobs is gone and -2 once both are; team-c's 2, -2 once ``w`` is gone. So
    S2-a lets team-a take either of team-b's jobs alone, never the pair, never ``w``."""
    policy = PreemptionPolicy(reclaim_within_cohort=reclaim, fair_sharing=(FINAL,))  # type: ignore[arg-type]
    lb = _cohort(policy, (12, 2, 2), LATE)
    lb.submit("alice", "b", job("team-a").gpus(4).replicas(2)).accept("b")
    return lb


@pytest.mark.parametrize(
    ("reclaim", "stops"),
    [
        # Taking back lent quota is allowed: any two of the borrowers' jobs free the 8 GPUs.
        pytest.param("any", 2, id="reclaim-any"),
        # Reclaim is off, and no record of two victims is fair as a whole: nobody is stopped,
        # though the beneficiary's side would be within its own quota with the pair gone.
        pytest.param("never", 0, id="reclaim-never-and-no-fair-pair"),
    ],
)
def test_a_queue_within_its_nominal_takes_back_lent_quota_only_as_its_reclaim_policy_says(
    reclaim: str, stops: int
) -> None:
    lb = _reclaiming_world(reclaim)
    state = lb.fold()
    found = [v.job_id for p in plan(state, lb.time) for v in p.victims]
    assert len(found) == stops and {state.jobs[v].spec.queue for v in found} <= {"team-b", "team-c"}
    # The fold judges the pair as the preemptor does.
    folded = lb.preempt("b", "v1", "v2").fold()
    assert all(folded.jobs[v].phase == ("checkpointing" if stops else "running") for v in ("v1", "v2"))


def test_a_set_the_fold_allows_is_found_though_a_longer_one_is_refused() -> None:
    # team-a (nominal 16, reclaims only lower priorities, fair sharing by final share) lends
    # all of it; team-b (nominal 0) borrows: j01 on all of node-01 (priority 0), j02 and j03 on
    # a GPU each of node-00 (priority 0) and j00 beside them (priority 10), for ten minutes.
    # team-a's ``urgent`` (priority 10, 8 GPUs) takes back what j01 holds. The candidates, least
    # work lost first, are j03, j02, j01 and j00, whom only fair sharing offers (same priority):
    # with all four gone the record is refused (team-b's share, about 0 now, would fall to -11,
    # below team-a's -8), with the first three it is allowed (a reclaim from lower priorities).
    # Asked only after 1, 2 and 4 removals, the search found nothing.
    lb = LogBuilder().nodes(Cluster(2))  # the default half-life, a day: team-b has held little yet
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lender = PreemptionPolicy(
        within_queue="never", reclaim_within_cohort="lower-priority", fair_sharing=(FINAL,)
    )
    lb.queue(queue_spec("team-a", 16, cohort="org", preemption=lender))
    lb.queue(queue_spec("team-b", 0, cohort="org"))
    for job_id, node, gpus, priority in (
        ("j00", N0, (0,), 10),
        ("j01", N1, tuple(range(8)), 0),
        ("j02", N0, (1,), 0),
        ("j03", N0, (2,), 0),
    ):
        lb.submit("t", job_id, job("team-b").gpus(len(gpus))).accept(job_id, priority=priority)
        lb.admit(job_id).place(on(node, *gpus, job_id=job_id)).started(node, job_id)
    lb.at(lb.time + 600).submit("alice", "urgent", job("team-a").gpus(8)).accept("urgent", priority=10)
    state = lb.fold()
    assert [(p.beneficiary, [v.job_id for v in p.victims]) for p in plan(state, lb.time)] == [
        ("urgent", ["j01"])
    ]
    assert lb.preempt("urgent", "j01").fold().jobs["j01"].phase in ("checkpointing", "preempted")


def _departments() -> LogBuilder:
    """Two departments of cohort org: dept-x holds team-a (nominal 0, sharing fairly by S2-a,
    never reclaiming) and team-d (nominal 12, idle); dept-y holds team-b (nominal 0), which runs
    ``v1`` on 8 GPUs and ``v2`` on 2, borrowing 10 of team-d's. Late: team-b's share is 10,
    dept-y's too; dept-x's 12 under its nominal."""
    policy = PreemptionPolicy(reclaim_within_cohort="never", fair_sharing=(FINAL,))
    lb = LogBuilder().nodes(Cluster(2)).fair_share(1000.0)
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    for dept in ("dept-x", "dept-y"):
        lb.admin("cohort", ApplyCohort(cohort=CohortSpec(dept, parent="org")))
    lb.queue(queue_spec("team-a", 0, cohort="dept-x", preemption=policy))
    lb.queue(queue_spec("team-d", 12, cohort="dept-x")).queue(queue_spec("team-b", 0, cohort="dept-y"))
    for job_id, node, gpus in (("v1", N0, tuple(range(8))), ("v2", N1, (0, 1))):
        lb.submit("t", job_id, job("team-b").gpus(len(gpus)).checkpointable()).accept(job_id)
        lb.admit(job_id).place(on(node, *gpus, job_id=job_id)).started(node, job_id)
    return lb.at(LATE)


def test_departments_share_fairly_as_wholes() -> None:
    # team-a's b asks 4, and stopping v1 leaves team-b 2. The two queues meet in org, so the
    # shares compared are their departments' (Kueue's almost lowest common ancestors): dept-x's
    # with b admitted is 4 - 12 = -8, at most dept-y's 2 once v1 is gone, and S2-a allows it.
    # By the queues' own shares (team-a's 4 above team-b's 2) it would be refused, though
    # dept-x lent all that team-b borrows.
    state = _preempt(_departments(), 4, "v1")
    assert state.jobs["v1"].phase == "checkpointing"


def test_the_preemptor_proposes_what_the_fold_accepts_across_departments() -> None:
    lb = _departments()
    lb.submit("alice", "b", job("team-a").gpus(4)).accept("b")
    state = lb.fold()
    found = [v.job_id for p in plan(state, lb.time) for v in p.victims]
    assert found == ["v2"]  # 2 GPUs back are enough quota, and b fits on node-01's free GPUs
    folded = lb.preempt("b", *found).fold()
    assert folded.jobs["v2"].phase == "checkpointing"
