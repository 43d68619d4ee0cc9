"""A job that may not be preempted stays within its queue's nominal quota.

What a queue borrows is other queues' nominal, theirs again as soon as they need it, and only
stopping the borrower gives it back. So only jobs that may be preempted borrow: what a queue's
jobs that may not be preempted (their spec, their priority class, or preempted as often as its
lifetime cap allows) hold stays within its
nominal (KAI-Scheduler keeps non-preemptible jobs within their queue's deserved quota), and the
queue's preemptible jobs borrow on top. The fold arbitrates it (``Ledger.may_borrow``, kept as
``State.quota_held_fixed``), admission follows it, and a job that could never fit so is refused
at submission.
"""

from __future__ import annotations

import msgspec

from corral.events import routing
from corral.events.base import Reason
from corral.events.decisions import PreemptionRequested
from corral.events.jobs import Admission, PendingReasonChanged
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    Quota,
)
from corral.projections.quota import ANY, Ledger
from corral.projections.state import JobState, State
from corral.services.admission.decide import decide
from corral.services.admission.validate import validate
from corral.services.preemptor.decide import decide as preempt
from tests.builders import Cluster, LogBuilder, job, on, queue_spec

PINNED = PriorityClassSpec("pinned", 10, preemptible=False)


def lender_world() -> LogBuilder:
    """team-a (nominal 4) and team-b (nominal 4) in one cohort, one 8-GPU node, nothing running."""
    lb = LogBuilder().nodes(Cluster(1))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PINNED))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    return lb.queue(queue_spec("team-a", 4, cohort="org")).queue(queue_spec("team-b", 4, cohort="org"))


def test_the_fold_refuses_a_job_that_may_not_be_preempted_above_its_queues_nominal() -> None:
    lb = lender_world()
    lb.submit("alice", "fixed", job().gpus(4).preemptible(False)).accept("fixed").admit("fixed")
    # 4 + 2 would borrow 2 of team-b's: refused for the job that may not be preempted ...
    lb.submit("alice", "more-fixed", job().gpus(2).priority_class("pinned")).accept("more-fixed")
    lb.admit("more-fixed")
    state = lb.fold()
    assert state.jobs["more-fixed"].phase == "queued"
    assert "may not be preempted, so may not borrow" in state.rejections[-1].message
    # ... and allowed for one that may: the queue borrows what it can be made to give back.
    lb.submit("alice", "elastic", job().gpus(2)).accept("elastic").admit("elastic")
    state = lb.fold()
    assert state.jobs["elastic"].phase == "admitted"
    assert state.quota_held == {"team-a": {ANY: 6000}}
    assert state.quota_held_fixed == {"team-a": {ANY: 4000}}


def test_what_jobs_that_may_not_be_preempted_hold_is_given_back_when_they_end() -> None:
    lb = lender_world()
    lb.submit("alice", "fixed", job().gpus(4).preemptible(False)).accept("fixed").admit("fixed")
    lb.place(on("node-00", 0, 1, 2, 3, job_id="fixed")).started("node-00", "fixed")
    lb.exited("node-00", "fixed")
    state = lb.fold()
    assert state.jobs["fixed"].phase == "succeeded"
    assert state.quota_held_fixed == {}
    lb.submit("alice", "again", job().gpus(4).preemptible(False)).accept("again").admit("again")
    assert lb.fold().jobs["again"].phase == "admitted"


def test_a_class_made_unpreemptible_counts_its_running_jobs_again() -> None:
    lb = lender_world()
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("batch", 0)))
    lb.submit("alice", "b", job().gpus(4).priority_class("batch")).accept("b").admit("b")
    assert lb.fold().quota_held_fixed == {}
    lb.admin(
        "priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("batch", 0, preemptible=False))
    )
    state = lb.fold()
    assert state.quota_held_fixed == {"team-a": {ANY: 4000}}
    ledger, counted = Ledger.from_state(state), Ledger.from_jobs(state)
    assert ledger.fixed("team-a", ANY) == counted.fixed("team-a", ANY) == 4000


def _admitted(state: State) -> list[str]:
    return sorted(j.id for j in state.jobs.values() if j.phase == "admitted")


def test_admission_lets_a_job_that_may_not_be_preempted_wait_while_preemptible_ones_borrow() -> None:
    lb = lender_world()
    lb.submit("alice", "fixed", job().gpus(4).preemptible(False)).accept("fixed").admit("fixed")
    lb.submit("alice", "pinned", job().gpus(2).priority_class("pinned")).accept("pinned", priority=10)
    lb.submit("alice", "spare", job().gpus(2)).accept("spare", priority=20)
    state = lb.fold()
    events = decide(state, lb.time)
    for e in events:
        lb.event(routing.subject_of(e), e)
    state = lb.fold()
    assert state.rejected_total == 0, state.rejections
    # The preemptible job borrows team-b's idle quota; the one that may not be preempted would
    # borrow too: it waits, saying why.
    assert _admitted(state) == ["fixed", "spare"]
    said = {e.job_id: e.reasons for e in events if isinstance(e, PendingReasonChanged)}
    (why,) = said["pinned"]
    assert isinstance(why, Reason) and why.code == "quota"
    assert "may not be preempted, so may not borrow" in why.message, why.message


def test_a_job_that_may_not_be_preempted_and_is_larger_than_its_nominal_is_refused_at_submission() -> None:
    state = lender_world().fold()

    def submitted(spec: object) -> JobState:
        return JobState("j", "alice", job().gpus(6).build() if spec is None else spec, 0, 0.0)  # type: ignore[arg-type]

    why = validate(state, submitted(job().gpus(6).preemptible(False).build()))
    assert why is not None and why.code == "never-fits", why
    assert "may not be preempted does not borrow" in why.message
    assert validate(state, submitted(None)) is None  # one that may be preempted may borrow 2


def pool_world(share: bool) -> LogBuilder:
    """team-a (nominal 2, weight 3) and team-b (nominal 2, weight 1) in a cohort holding a pool
    of 4 of its own; two 8-GPU nodes."""
    lb = LogBuilder().nodes(Cluster(2))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PINNED))
    pool = CohortSpec("org", quotas={ANY: Quota(4)}, share_own_quota=share)
    lb.admin("cohort", ApplyCohort(cohort=pool))
    a = msgspec.structs.replace(queue_spec("team-a", 2, cohort="org"), weight=3.0)
    return lb.queue(a).queue(queue_spec("team-b", 2, cohort="org"))


def test_a_cohort_that_shares_its_pool_gives_each_queue_its_part_for_jobs_that_may_not_be_stopped() -> None:
    # team-a's part of the pool is 3 of 4 (its weight 3 of 4): its jobs that may not be preempted
    # may hold 2 + 3; team-b's, 2 + 1. Without the share, each queue's nominal alone.
    for share, limits in ((False, (2000, 2000)), (True, (5000, 3000))):
        state = pool_world(share).fold()
        ledger = Ledger.from_state(state)
        assert (ledger.fixed_limit("team-a", ANY), ledger.fixed_limit("team-b", ANY)) == limits
    lb = pool_world(True)
    lb.submit("bob", "fixed-b", job("team-b").gpus(3).preemptible(False)).accept("fixed-b").admit("fixed-b")
    lb.submit("bob", "one-more", job("team-b").gpus(1).preemptible(False)).accept("one-more")
    state = lb.admit("one-more").fold()  # past team-b's part, with the pool idle: refused
    assert state.jobs["one-more"].phase == "queued"
    assert "its part of its cohort's own quota, 1" in state.rejections[-1].message
    lb.submit("alice", "fixed", job().gpus(5).preemptible(False)).accept("fixed").admit("fixed")
    state = lb.fold()
    assert _admitted(state) == ["fixed", "fixed-b"]


def test_without_the_share_a_job_that_may_not_be_stopped_stays_within_its_nominal() -> None:
    lb = pool_world(False)
    lb.submit("alice", "fixed", job().gpus(3).preemptible(False)).accept("fixed").admit("fixed")
    state = lb.fold()
    assert state.jobs["fixed"].phase == "queued" and "may not borrow" in state.rejections[-1].message


def _refused_keeps(lb: LogBuilder, kind: str, change: object, before: State) -> State:
    """Fold ``change`` after ``lb``'s log: it must be refused, the queues and cohorts kept."""
    state = lb.admin(kind, change).fold()
    why = state.rejections[-1]
    assert why.code == "forbidden" and "hold 3 GPUs, past the" in why.message, why
    assert (state.queues, state.cohorts) == (before.queues, before.cohorts)
    return state


def test_no_change_of_a_shared_pool_leaves_unstoppable_jobs_past_their_part() -> None:
    # team-b's job that may not be preempted holds 3: its nominal 2 and its part of the pool, 1
    # (weight 1 of 4). Each change below would make its part less than what it holds: the rest a
    # loan from the pool nobody could take back, team-a's jobs within their part waiting for it.
    lb = pool_world(True)
    lb.submit("bob", "fixed-b", job("team-b").gpus(3).preemptible(False)).accept("fixed-b").admit("fixed-b")
    before = lb.fold()
    assert before.quota_held_fixed == {"team-b": {ANY: 3000}}
    heavier = msgspec.structs.replace(queue_spec("team-a", 2, cohort="org"), weight=4.0)  # b: 2 + 4/5
    _refused_keeps(lb, "queue", ApplyQueue(queue=heavier), before)
    joining = queue_spec("team-c", 0, cohort="org")  # b: 2 + 4/5
    _refused_keeps(lb, "queue", ApplyQueue(queue=joining), before)
    smaller = CohortSpec("org", quotas={ANY: Quota(2)}, share_own_quota=True)  # b: 2 + 2/4
    _refused_keeps(lb, "cohort", ApplyCohort(cohort=smaller), before)
    unshared = CohortSpec("org", quotas={ANY: Quota(4)}, share_own_quota=False)  # b: 2
    _refused_keeps(lb, "cohort", ApplyCohort(cohort=unshared), before)
    # A change that leaves it its part, or more, is taken.
    lighter = msgspec.structs.replace(queue_spec("team-a", 2, cohort="org"), weight=1.0)
    state = lb.admin("queue", ApplyQueue(queue=lighter)).fold()
    assert state.queues["team-a"].weight == 1.0 and state.rejected_total == 4
    # Once the job ends, each may be made.
    lb.request("bob", "cancel", {"job_id": "fixed-b"})
    state = lb.admin("cohort", ApplyCohort(cohort=unshared)).fold()
    assert not state.cohorts["org"].share_own_quota and state.rejected_total == 4


# A class whose jobs may be preempted once in their life.
ONCE = PriorityClassSpec("once", 0, max_preemptions=1)


def capped_world(gpus: int) -> LogBuilder:
    """team-a's ``pinned`` (2 GPUs, may not be preempted) and ``capped`` (``gpus`` GPUs of class
    ``once``, borrowing team-b's nominal), running; then ``capped`` stopped once for team-b's
    ``b1``, which runs and ends, and ``capped`` waits again, at its class's cap."""
    lb = lender_world()
    lb.admin("priority-class", ApplyPriorityClass(priority_class=ONCE))
    lb.submit("alice", "pinned", job().gpus(2).preemptible(False)).accept("pinned").admit("pinned")
    lb.place(on("node-00", 0, 1, job_id="pinned")).started("node-00", "pinned")
    lb.submit("alice", "capped", job().gpus(gpus).priority_class("once").checkpointable()).accept("capped")
    lb.admit("capped").place(on("node-00", *range(2, 2 + gpus), job_id="capped")).started("node-00", "capped")
    lb.submit("bob", "b1", job("team-b").gpus(4)).accept("b1").preempt("b1", "capped")
    lb.exited("node-00", "capped", code=0, stopped=True).requeue("capped", 0, code="preempted")
    lb.admit("b1").place(on("node-00", 2, 3, 4, 5, job_id="b1")).started("node-00", "b1").exited(
        "node-00", "b1"
    )
    return lb


def test_a_job_at_its_classs_cap_on_preemptions_may_not_borrow_again() -> None:
    # Borrowing again, nobody could take back what it borrowed: team-b's jobs within their
    # nominal would wait for it to end on its own.
    lb = capped_world(3)
    state = lb.fold()
    assert state.jobs["capped"].preemptions == 1 and state.quota_held_fixed == {"team-a": {ANY: 2000}}
    lb.admit("capped", attempt=1)  # 2 + 3 of a nominal 4: it would borrow 1
    state = lb.fold()
    assert state.jobs["capped"].phase == "queued"
    assert "may not be preempted, so may not borrow" in state.rejections[-1].message
    events = decide(state, lb.time)
    assert not any(getattr(e, "admissions", None) for e in events), events
    said = {e.job_id: e.reasons for e in events if isinstance(e, PendingReasonChanged)}
    (why,) = said["capped"]
    assert why.code == "quota" and "may not be preempted, so may not borrow" in why.message, why
    # Once the pinned job is gone it fits the nominal: admitted, and held as a fixed part of it.
    lb.exited("node-00", "pinned").admit("capped", attempt=1)
    state = lb.fold()
    assert state.jobs["capped"].phase == "admitted" and state.jobs["capped"].fixed
    assert state.quota_held_fixed == {"team-a": {ANY: 3000}}
    ledger, counted = Ledger.from_state(state), Ledger.from_jobs(state)
    assert ledger.fixed("team-a", ANY) == counted.fixed("team-a", ANY) == 3000


def test_a_capped_job_larger_than_what_fixed_jobs_may_hold_still_borrows() -> None:
    # Held within its nominal it could never run again: its owner let it be preempted because
    # it could not fit otherwise. Its loan is taken back only when it ends.
    lb = capped_world(5)
    state = lb.admit("capped", attempt=1).fold()
    assert state.jobs["capped"].phase == "admitted" and not state.jobs["capped"].fixed
    assert state.quota_held_fixed == {"team-a": {ANY: 2000}}


def test_a_class_may_not_cap_preemptions_below_what_its_borrowing_jobs_have_had() -> None:
    lb = lender_world()
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("once", 0)))
    lb.submit("alice", "pinned", job().gpus(2).preemptible(False)).accept("pinned").admit("pinned")
    spec = job().gpus(3).priority_class("once").checkpointable()
    lb.submit("alice", "borrower", spec).accept("borrower").admit("borrower")
    lb.place(on("node-00", 2, 3, 4, job_id="borrower")).started("node-00", "borrower")
    lb.submit("bob", "b1", job("team-b").gpus(4)).accept("b1").preempt("b1", "borrower")
    lb.exited("node-00", "borrower", code=0, stopped=True).requeue("borrower", 0, code="preempted")
    lb.admit("b1").place(on("node-00", 4, 5, 6, 7, job_id="b1")).started("node-00", "b1")
    lb.exited("node-00", "b1")
    lb.admit("borrower", attempt=1)  # preempted once, no cap: it borrows again
    state = lb.fold()
    assert state.jobs["borrower"].phase == "admitted" and state.quota_held_fixed == {"team-a": {ANY: 2000}}
    state = lb.admin("priority-class", ApplyPriorityClass(priority_class=ONCE)).fold()
    why = state.rejections[-1]
    assert why.code == "forbidden" and "cap its jobs' preemptions at 1 while its jobs borrow" in why.message
    assert state.priority_classes["once"].max_preemptions is None
    assert state.quota_held_fixed == {"team-a": {ANY: 2000}}
    # A cap its borrowing jobs have not reached is taken.
    twice = msgspec.structs.replace(ONCE, max_preemptions=2)
    state = lb.admin("priority-class", ApplyPriorityClass(priority_class=twice)).fold()
    assert state.priority_classes["once"].max_preemptions == 2


def test_a_new_class_leaves_other_jobs_standing_as_they_were_admitted() -> None:
    # Every holder's standing was decided again on any class's change: a job that reached its
    # cap while checkpointing as a borrower turned fixed, and a class nobody used was refused.
    lb = lender_world()
    lb.admin("priority-class", ApplyPriorityClass(priority_class=ONCE))
    lb.submit("alice", "pinned", job().gpus(2).preemptible(False)).accept("pinned").admit("pinned")
    lb.submit("alice", "capped", job().gpus(3).priority_class("once").checkpointable()).accept("capped")
    lb.admit("capped").place(on("node-00", 2, 3, 4, job_id="capped")).started("node-00", "capped")
    lb.submit("bob", "b1", job("team-b").gpus(4)).accept("b1").preempt("b1", "capped")
    other = PriorityClassSpec("other", 5, max_preemptions=3)
    state = lb.admin("priority-class", ApplyPriorityClass(priority_class=other)).fold()
    assert state.jobs["capped"].phase == "checkpointing" and state.jobs["capped"].fixed is False
    assert "other" in state.priority_classes and state.quota_held_fixed == {"team-a": {ANY: 2000}}


def test_admission_and_the_fold_read_a_capped_jobs_models_alike() -> None:
    # Admission's ledger leaves out models no node can host; the fold's does not: a capped job
    # of two models was borrowing for one and fixed for the other, proposed and voided each
    # cycle.
    from corral.events import routing
    from corral.events.queues import QueueSpec
    from corral.services.agent.inventory import a100_8x_nvlink

    h, a = "H100-80GB", "A100-80GB"
    lb = LogBuilder().node("a", a100_8x_nvlink("a"))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=ONCE))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(QueueSpec("team-a", cohort="org", quotas={h: Quota(8), a: Quota(4)}))
    lb.queue(QueueSpec("team-b", cohort="org", quotas={a: Quota(4)}))
    spec = job().gpus(6).models(h, a).priority_class("once").checkpointable()
    lb.submit("alice", "capped", spec).accept("capped").admit_as(Admission("capped", 0, 1, {a: 6}))
    lb.place(on("a", *range(6), job_id="capped")).started("a", "capped")
    lb.submit("bob", "b1", job("team-b").gpus(4).models(a)).accept("b1").preempt("b1", "capped")
    lb.exited("a", "capped", code=0, stopped=True).requeue("capped", 0, code="preempted")
    lb.admit_as(Admission("b1", 0, 1, {a: 4})).place(on("a", 0, 1, 2, 3, job_id="b1"))
    lb.started("a", "b1").exited("a", "b1")
    for _ in range(3):
        state = lb.fold()
        for e in decide(state, state.time):
            lb.event(routing.subject_of(e), e)
    state = lb.fold()
    assert state.void_total == 0 and state.jobs["capped"].preemptions == 1


def test_a_beneficiary_that_may_not_borrow_is_held_as_a_fixed_part_of_its_nominal() -> None:
    # While its victim checkpoints, what a beneficiary that may not be preempted will hold was
    # charged as a borrower's: another such job of its queue was admitted into the part of the
    # nominal it was to have, and the beneficiary, the preemption done, could not be admitted.
    lb = LogBuilder().nodes(Cluster(3))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PINNED))
    low = PriorityClassSpec("pinned-low", 5, preemptible=False)
    lb.admin("priority-class", ApplyPriorityClass(priority_class=low))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 8, cohort="org")).queue(queue_spec("team-b", 16, cohort="org"))
    lb.submit("alice", "batch", job().gpus(8)).accept("batch").admit("batch")
    lb.place(on("node-00", *range(8), job_id="batch")).started("node-00", "batch")
    lb.submit("alice", "first", job().gpus(4).priority_class("pinned")).accept("first", priority=10)
    lb.preempt("first", "batch")
    lb.submit("alice", "second", job().gpus(6).priority_class("pinned-low")).accept("second", priority=5)
    state = lb.fold()
    assert state.jobs["batch"].phase == "checkpointing" and state.rejected_total == 0
    events = decide(state, lb.time)
    assert not any(getattr(e, "admissions", None) for e in events), events
    # The fold's rule reads the beneficiary's hold alike: ``second`` would leave ``first`` out.
    from corral.projections import preemption

    ledger, charged = preemption.planning(state)
    assert charged == {"first"} and ledger.fixed("team-a", ANY) == 4000


def test_a_lender_keeps_its_free_nominal_for_a_first_job_that_may_not_borrow() -> None:
    # Its first job may not be preempted and waits for the queue's own such job to end; its
    # queue may not take back what it lends. The lending hold read the job as one that could
    # borrow, so fitting, and kept nothing: team-b's job borrowed the free nominal, and the
    # first job, once the one before it ended, waited for team-b's to end as well.
    from corral.events.queues import PreemptionPolicy

    keeps = PreemptionPolicy(reclaim_within_cohort="never")
    lb = LogBuilder().nodes(Cluster(1))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PINNED))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 4, cohort="org", preemption=keeps))
    lb.queue(queue_spec("team-b", 4, cohort="org"))
    lb.submit("alice", "pinned", job().gpus(2).priority_class("pinned")).accept("pinned", priority=10)
    lb.admit("pinned").place(on("node-00", 0, 1, job_id="pinned")).started("node-00", "pinned")
    lb.submit("alice", "next", job().gpus(3).priority_class("pinned")).accept("next", priority=10)
    lb.submit("bob", "wide", job().queue("team-b").gpus(6)).accept("wide")
    state = lb.fold()
    events = decide(state, lb.time)
    assert not any(getattr(e, "admissions", None) for e in events), events


# team-a (nominal 8) and team-b (nominal 16) in one cohort on three nodes: team-a runs 8 GPUs,
# team-b 14, 2 of the quota free. (job, queue, node, GPUs)
_RUNNING = (
    ("batch", "team-a", "node-00", (0, 1, 2, 3)),
    ("b2", "team-b", "node-00", (4, 5, 6, 7)),
    ("low2", "team-a", "node-01", (0, 1, 2, 3)),
    ("b3", "team-b", "node-01", (6, 7)),
    ("b1", "team-b", "node-02", tuple(range(8))),
)


def _busy_world() -> LogBuilder:
    lb = LogBuilder().nodes(Cluster(3))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PINNED))
    lb.admin(
        "priority-class",
        ApplyPriorityClass(priority_class=PriorityClassSpec("pinned-low", 5, preemptible=False)),
    )
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 8, cohort="org")).queue(queue_spec("team-b", 16, cohort="org"))
    for job_id, queue, node, gpus in _RUNNING:
        lb.submit("x", job_id, job(queue).gpus(len(gpus))).accept(job_id).admit(job_id)
        lb.place(on(node, *gpus, job_id=job_id)).started(node, job_id)
    return lb


def _stops(state: State, now: float) -> list[PreemptionRequested]:
    return [e for e in preempt(state, now) if isinstance(e, PreemptionRequested)]


def test_no_stop_is_made_for_a_beneficiary_its_queues_fixed_part_keeps_out() -> None:
    # ``batch`` checkpoints for ``first`` (4 GPUs that may not borrow); ``second`` (6 such) could
    # then never be admitted beside it (4 + 6 of a nominal 8). The preemptor's own view charged
    # ``first`` as a borrower and stopped ``low2`` for ``second`` in vain, and the fold's rule,
    # which charged it right, never read the fixed part and let it.
    from corral.projections import preemption

    lb = _busy_world()
    lb.submit("alice", "first", job().gpus(4).priority_class("pinned")).accept("first", priority=10)
    lb.preempt("first", "batch")
    lb.submit("alice", "second", job().gpus(6).priority_class("pinned-low")).accept("second", priority=5)
    state = lb.fold()
    assert state.rejected_total == 0 and state.jobs["batch"].phase == "checkpointing"
    assert not any(e.beneficiary == "second" for e in _stops(state, lb.time))
    why = preemption.may_stop(state, [state.jobs["low2"]], state.jobs["second"], lb.time)
    assert why is not None and "may not be preempted, so may not borrow" in why, why


def test_one_cycle_stops_work_for_no_more_fixed_beneficiaries_than_the_fixed_part_holds() -> None:
    lb = _busy_world()
    lb.submit("alice", "first", job().gpus(4).priority_class("pinned")).accept("first", priority=10)
    lb.submit("alice", "second", job().gpus(2).replicas(3).priority_class("pinned-low")).accept(
        "second", priority=5
    )
    state = lb.fold()
    assert [e.beneficiary for e in _stops(state, lb.time)] == ["first"]


def test_a_checkpointing_victim_that_held_fixed_gives_its_fixed_part_back_to_the_preemptor() -> None:
    # Its class made one that may not be preempted while it checkpointed: it holds a fixed part
    # until it is gone, and the preemptor's view kept that part after the stop, passing over a
    # job the fold and admission would let in once ``w`` stopped.
    from corral.projections import preemption

    lb = LogBuilder().nodes(Cluster(3))
    for pc in (PINNED, PriorityClassSpec("soft", 0), PriorityClassSpec("hi", 20)):
        lb.admin("priority-class", ApplyPriorityClass(priority_class=pc))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.queue(queue_spec("team-a", 8, cohort="org")).queue(queue_spec("team-b", 16, cohort="org"))
    for job_id, spec, node, gpus in (
        ("v", job().gpus(4).priority_class("soft"), "node-00", (0, 1, 2, 3)),
        ("b2", job("team-b").gpus(4), "node-00", (4, 5, 6, 7)),
        ("w", job().gpus(4), "node-01", (0, 1, 2, 3)),
        ("b3", job("team-b").gpus(2), "node-01", (6, 7)),
        ("b1", job("team-b").gpus(8), "node-02", tuple(range(8))),
    ):
        lb.submit("x", job_id, spec).accept(job_id).admit(job_id)
        lb.place(on(node, *gpus, job_id=job_id)).started(node, job_id)
    lb.submit("alice", "b", job().gpus(4).priority_class("hi")).accept("b", priority=20)
    lb.preempt("b", "v")
    pinned_soft = PriorityClassSpec("soft", 0, preemptible=False)
    lb.admin("priority-class", ApplyPriorityClass(priority_class=pinned_soft))
    lb.submit("alice", "c", job().gpus(6).priority_class("pinned")).accept("c", priority=10)
    state = lb.fold()
    assert state.rejected_total == 0 and state.jobs["v"].phase == "checkpointing" and state.jobs["v"].fixed
    assert preemption.planning(state)[0].fixed("team-a", ANY) == 0
    assert preemption.may_stop(state, [state.jobs["w"]], state.jobs["c"], lb.time) is None
    assert [e.beneficiary for e in _stops(state, lb.time)] == ["c"]
