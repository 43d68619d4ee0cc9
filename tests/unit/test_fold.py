"""The fold, case by case: requests, the job lifecycle, and the arbitration of proposals.

Each test writes a small log with ``LogBuilder`` and folds it from scratch. A fold that hits an
internal error counts a fault instead of raising, so every test checks ``faults == 0``: a fault
is a corral bug even when the visible outcome looks right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from corral.events import codec
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import JobsPlaced, Placement, PreemptionRequested, Victim
from corral.events.heartbeats import XidReport
from corral.events.jobs import (
    Admission,
    JobAccepted,
    JobPriorityChanged,
    JobRequeued,
    JobsAdmitted,
    RestartPolicy,
    SubmitJob,
)
from corral.events.log import Record
from corral.events.nodes import (
    MAX_LOCATION,
    CheckpointCompleted,
    GpuInfo,
    NodeInventory,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeleteQueue,
    FairShareSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import fold_nodes, indexes
from corral.projections.fold import apply, apply_event, requester
from corral.projections.fold_nodes import NODE_FAULTS_FREE
from corral.projections.state import MAX_REJECTIONS, MAX_REJECTIONS_PER_TENANT, GpuState, Rejection, State
from corral.services.admission import decide as admission
from corral.services.agent.inventory import h100_8x_mig
from tests.builders import (
    Cluster,
    JobBuilder,
    LogBuilder,
    SpecLike,
    job,
    mig_slot,
    on,
    placement,
    queue_spec,
    running,
    share,
    whole,
    worker,
)

N0, N1 = "node-00", "node-01"


def fold(log: LogBuilder) -> State:
    state = log.fold()
    assert state.faults == 0, [r for r in state.rejections if r.code == "fault"]
    return state


def last(state: State) -> Rejection:
    assert state.rejections, "expected a rejection"
    return state.rejections[-1]


def holders(state: State, node: str = N0) -> list[dict[str, int]]:
    return [g.holders for g in state.nodes[node].gpus]


def gpu(state: State, index: int, node: str = N0) -> GpuState:
    return state.nodes[node].gpus[index]


def two_nodes() -> LogBuilder:
    """Two 8×H100 nodes and the queues team-a and team-b, with ample quota."""
    return LogBuilder().nodes(Cluster(2)).queues("team-a", "team-b")


def queued(job_id: str = "j1", spec: SpecLike | None = None, tenant: str = "alice") -> LogBuilder:
    return two_nodes().submit(tenant, job_id, spec).accept(job_id)


# -- submit ---------------------------------------------------------------------------------------


def test_submit_takes_the_tenant_from_the_subject_not_the_payload() -> None:
    body = {"request_id": "j1", "job": {"queue": "team-a"}}
    state = fold(LogBuilder().request("alice", "submit", body))
    j = state.jobs["j1"]
    assert (j.tenant, j.phase, j.submitted_seq, j.attempt) == ("alice", "submitted", 1, 0)
    assert state.rejected_total == 0


def test_a_payload_that_names_a_tenant_is_refused() -> None:
    body = {"request_id": "j1", "job": {"queue": "team-a"}, "tenant": "bob"}
    state = fold(LogBuilder().request("alice", "submit", body))
    assert state.jobs == {}
    assert [(r.code, "tenant" in r.message) for r in state.rejections] == [("malformed", True)]


def test_duplicate_submit_by_the_same_tenant_is_one_job() -> None:
    log = LogBuilder().submit("alice", "j1", job().gpus(1)).submit("alice", "j1", job().gpus(1))
    state = fold(log)
    assert list(state.jobs) == ["j1"]
    assert state.jobs["j1"].spec.resources.gpus == 1 and state.jobs["j1"].submitted_seq == 1
    assert (last(state).code, last(state).job_id, state.rejected_total) == ("duplicate", "j1", 1)


def test_a_submit_of_a_held_id_with_another_spec_is_a_conflict_not_the_same_job() -> None:
    """Sent again with another spec (a job file edited, an id reused by hand), a submit is not
    the job it names: taken for a duplicate, its sender was told its job was accepted, and
    the job of the id ran what it had sent first."""
    log = LogBuilder().submit("alice", "j1", job().gpus(1)).submit("alice", "j1", job().gpus(8))
    state = fold(log)
    assert state.jobs["j1"].spec.resources.gpus == 1 and state.jobs["j1"].submitted_seq == 1
    assert (last(state).code, last(state).job_id) == ("conflict", "j1")
    assert "job j1 was submitted with another spec" in last(state).message


def test_a_resized_job_sent_again_as_submitted_is_a_duplicate() -> None:
    from corral.events.jobs import ResizeJob

    sent = job().replicas(4, minimum=1)
    log = LogBuilder().submit("alice", "j1", sent)
    log.request("alice", "resize", ResizeJob(job_id="j1", replicas=2)).submit("alice", "j1", sent)
    state = fold(log)
    assert state.jobs["j1"].spec.replicas == 2
    assert (last(state).code, last(state).job_id) == ("duplicate", "j1")


@pytest.mark.parametrize("resized", [False, True], ids=["as-sent", "resized"])
@pytest.mark.parametrize("most", [2, 8], ids=["fewer", "more"])
def test_an_elastic_job_sent_again_with_other_most_workers_is_a_conflict(resized: bool, most: int) -> None:
    """Its most workers are part of what was sent: another count is another job, whether or not
    a resize changed the job's since (to the count sent now, or not)."""
    from corral.events.jobs import ResizeJob

    log = LogBuilder().submit("alice", "j1", job().replicas(4, minimum=1))
    if resized:
        log.request("alice", "resize", ResizeJob(job_id="j1", replicas=most))
    state = fold(log.submit("alice", "j1", job().replicas(most, minimum=1)))
    assert (last(state).code, last(state).job_id) == ("conflict", "j1")
    assert state.jobs["j1"].spec.replicas == (most if resized else 4)


def test_submit_of_a_job_id_another_tenant_owns_is_forbidden() -> None:
    state = fold(LogBuilder().submit("alice", "j1").submit("bob", "j1"))
    assert state.jobs["j1"].tenant == "alice"
    assert last(state).code == "forbidden"


@pytest.mark.parametrize("request_id", ["a.b", "", "x" * 65, "j*", "has space"])
def test_submit_with_a_bad_request_id_is_malformed(request_id: str) -> None:
    state = fold(LogBuilder().submit("alice", request_id))
    assert state.jobs == {} and last(state).code == "malformed"


@pytest.mark.parametrize(
    "spec",
    [
        job().queue("q" * 200_000),
        job().queue("team a"),
        job().priority_class("p" * 65),
        job().mig("1g.10gb" + "x" * 100),
        job().models("H100" * 40),
        job().mig("1g.10gb").models(*(f"{i:05d}" + "M" * 123 for i in range(1900))),
    ],
    ids=["queue-too-long", "queue-not-a-name", "class-too-long", "mig-too-long", "model-too-long", "models"],
)
def test_a_submit_naming_what_could_never_be_a_name_is_malformed(spec: JobBuilder) -> None:
    # Any string up to a request's size was kept in the job and repeated in every listing of it
    # and in admission's reason: one job filled a page of ``jobs``, sixteen emptied the board.
    state = fold(LogBuilder().submit("alice", "j1", spec))
    assert state.jobs == {} and last(state).code == "malformed"
    assert len(last(state).message) < 200 and last(state).job_id == "j1"


def test_admin_may_submit_too() -> None:
    state = fold(LogBuilder().submit("admin", "j1"))
    assert state.jobs["j1"].tenant == "admin"


# -- cancel and resize ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "cancelled"),
    [("alice", True), ("admin", True), ("bob", False)],
    ids=["owner", "admin", "other-tenant"],
)
def test_cancel_by_owner_or_admin_only(who: str, cancelled: bool) -> None:
    log = queued()
    before = fold(log)
    state = fold(log.request(who, "cancel", {"job_id": "j1"}))
    if cancelled:
        assert state.jobs["j1"].phase == "cancelled"
        assert state.jobs["j1"].reasons[0].code == "cancelled"
        assert state.rejected_total == 0
    else:
        # The same answer as for a job that does not exist: bob learns nothing of alice's jobs.
        assert (last(state).code, last(state).message) == ("unknown", "no job j1")
        assert state.jobs == before.jobs


def test_cancel_of_an_unknown_job() -> None:
    state = fold(LogBuilder().request("alice", "cancel", {"job_id": "nope"}))
    assert last(state).code == "unknown"


def test_cancel_of_a_finished_job_is_illegal() -> None:
    log = queued().request("alice", "cancel", {"job_id": "j1"}).request("alice", "cancel", {"job_id": "j1"})
    state = fold(log)
    assert state.jobs["j1"].phase == "cancelled" and last(state).code == "illegal"


def test_cancel_of_a_running_job_keeps_its_gpus_until_its_worker_is_gone() -> None:
    log = running(nodes=Cluster(2)).request("alice", "cancel", {"job_id": "j1"})
    state = fold(log)
    assert state.jobs["j1"].phase == "cancelled" and holders(state)[0] == {"j1": 1000}
    state = fold(log.exited(N0, "j1", code=137, stopped=True))
    assert holders(state)[0] == {} and state.nodes[N0].cpu_used == 0


@pytest.mark.parametrize(
    ("who", "replicas", "code"),
    [
        ("alice", 2, None),
        ("alice", 1, "illegal"),
        ("bob", 3, "unknown"),
        ("admin", 3, None),
        ("alice", 1024, None),
        ("alice", 1025, "illegal"),
        ("alice", 2**63 - 1, "illegal"),
    ],
    ids=["owner-shrinks", "below-minimum", "other-tenant", "admin", "most", "too-many", "largest-int"],
)
def test_resize_within_the_elastic_range(who: str, replicas: int, code: str | None) -> None:
    log = queued(spec=job().replicas(4, minimum=2)).request(
        who, "resize", {"job_id": "j1", "replicas": replicas}
    )
    state = fold(log)
    if code is None:
        assert state.jobs["j1"].spec.replicas == replicas and state.rejected_total == 0
    else:
        assert state.jobs["j1"].spec.replicas == 4 and last(state).code == code


def test_resize_of_a_job_that_is_not_elastic_is_illegal() -> None:
    state = fold(queued().request("alice", "resize", {"job_id": "j1", "replicas": 1}))
    assert last(state).code == "illegal"


# -- admin verbs, queues, cohorts -----------------------------------------------------------------

ADMIN_ONLY: list[tuple[str, Event]] = [
    ("queue", ApplyQueue(queue=QueueSpec("team-a"))),
    ("cohort", ApplyCohort(cohort=CohortSpec("org"))),
    ("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("high", 100))),
    ("delete-queue", DeleteQueue(name="team-a")),
    ("cordon", CordonNode(node=N0)),
    ("delete-node", DeleteNode(node=N0)),
    ("fair-share", ApplyFairShare(fair_share=FairShareSpec(half_life_s=60.0))),
]


@pytest.mark.parametrize(("verb", "body"), ADMIN_ONLY, ids=[v for v, _ in ADMIN_ONLY])
def test_admin_verb_from_a_tenant_subject_is_refused(verb: str, body: Event) -> None:
    log = two_nodes().admin("queue", ApplyQueue(queue=QueueSpec("team-a")))
    before = fold(log)
    state = fold(log.request("alice", verb, body))
    assert last(state).code == "unknown" and "alice" in last(state).message
    assert (state.queues, state.cohorts, state.priority_classes, state.fair_share) == (
        before.queues,
        before.cohorts,
        before.priority_classes,
        before.fair_share,
    )
    assert state.nodes == before.nodes


@pytest.mark.parametrize(("verb", "body"), ADMIN_ONLY, ids=[v for v, _ in ADMIN_ONLY])
def test_admin_request_decoded_for_a_tenant_is_forbidden(verb: str, body: Event) -> None:
    """The simulator's path skips the subject, so the handlers check the identity themselves."""
    before = fold(two_nodes())
    state = fold(two_nodes())
    apply_event(state, state.seq + 1, subj.request("alice", verb), body, 2000.0, tenant="alice")
    assert last(state).code == "forbidden" and state.faults == 0
    assert (state.queues, state.cohorts, state.priority_classes, state.fair_share) == (
        before.queues,
        before.cohorts,
        before.priority_classes,
        before.fair_share,
    )
    assert not state.nodes[N0].cordoned


def test_admin_changes_queues_cohorts_priority_classes_and_cordons() -> None:
    log = (
        two_nodes()
        .admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
        .admin("cohort", ApplyCohort(cohort=CohortSpec("research", parent="org")))
        .admin("queue", ApplyQueue(queue=QueueSpec("team-a", cohort="research", quotas={"*": Quota(8)})))
        .admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("high", 100)))
        .admin("cordon", CordonNode(node=N0, drain=True))
    )
    state = fold(log)
    assert state.rejected_total == 0
    assert set(state.cohorts) == {"org", "research"} and state.queues["team-a"].quotas["*"].nominal == 8
    assert state.priority_classes["high"].value == 100
    assert state.nodes[N0].cordoned and state.nodes[N0].draining
    state = fold(log.admin("cordon", CordonNode(node=N0, cordoned=False)))
    assert not state.nodes[N0].cordoned and not state.nodes[N0].draining


@pytest.mark.parametrize(
    "spec",
    [
        QueueSpec("bad.name"),
        QueueSpec(""),
        QueueSpec("team-a", weight=0.0),
        QueueSpec("team-a", weight=-1.0),
        QueueSpec("team-a", quotas={"H100-80GB": Quota(-1)}),
        QueueSpec("team-a", weight=float("nan")),
        QueueSpec("team-a", weight=float("inf")),
        QueueSpec("team-a", quotas={"*": Quota(4, borrowing_limit=-1)}),
        QueueSpec("team-a", quotas={"*": Quota(4, lending_limit=-3)}),
        QueueSpec("team-a", quotas={"*": Quota(2**62)}),
        QueueSpec("team-a", preemption=PreemptionPolicy(max_grace_seconds=-1.0)),
        QueueSpec("team-a", weight=1e-320),
    ],
    ids=[
        "dotted-name",
        "empty-name",
        "zero-weight",
        "negative-weight",
        "negative-quota",
        "nan-weight",
        "infinite-weight",
        "negative-borrowing-limit",
        "negative-lending-limit",
        "quota-beyond-any-cluster",
        "negative-max-grace",
        "denormal-weight",  # shares are divided by it: they were infinite
    ],
)
def test_invalid_queue_is_malformed(spec: QueueSpec) -> None:
    state = fold(LogBuilder().admin("queue", ApplyQueue(queue=spec)))
    assert state.queues == {} and last(state).code == "malformed"


@pytest.mark.parametrize(
    "changes",
    [
        {"min_runtime_s": -100.0},
        {"min_runtime_s": float("nan")},
        {"cooldown_s": -1e308},
        {"cooldown_s": float("inf")},
        {"max_preemptions": -1},
        {"max_preemptions_per_hour": -5},
        {"max_preemptions_per_hour": 33},  # past the times a job keeps: it would never bind
    ],
    ids=[
        "negative-min-runtime",
        "nan-min-runtime",
        "negative-cooldown",
        "infinite-cooldown",
        "cap",
        "hourly-cap",
        "hourly-cap-past-the-times-kept",
    ],
)
def test_a_priority_class_of_negative_times_is_malformed(changes: dict[str, object]) -> None:
    # Taken as they came: a negative number of preemptions allowed, a cooldown of -1e308 s.
    spec = PriorityClassSpec("odd", 10, **changes)  # type: ignore[arg-type]
    state = fold(LogBuilder().admin("priority-class", ApplyPriorityClass(priority_class=spec)))
    assert "odd" not in state.priority_classes and last(state).code == "malformed", last(state)


def test_a_queue_may_not_close_to_a_tenant_with_jobs_in_it() -> None:
    # Accepted, the tenant's queued jobs were admitted later, and its running ones requeued when
    # stopped, and ran on a queue it could no longer use or even see.
    log = two_nodes().queue(QueueSpec("q", quotas={"*": Quota(nominal=8)}))
    log.submit("alice", "a1", job("q")).accept("a1").admit("a1").place(on(N0, 0, job_id="a1"))
    log.submit("alice", "a2", job("q")).accept("a2")  # waits

    def tenants(*names: str) -> State:
        return fold(
            log.admin(
                "queue", ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=8)}, tenants=names))
            )
        )

    state = tenants("bob")
    assert last(state).code == "forbidden" and "alice (2)" in last(state).message, last(state)
    assert state.queues["q"].tenants == ()
    assert tenants("alice", "bob").queues["q"].tenants == ("alice", "bob")  # closes to nobody with jobs
    assert tenants("bob").queues["q"].tenants == ("alice", "bob")  # refused: alice's jobs
    log.request("admin", "cancel", {"job_id": "a1"}).request("admin", "cancel", {"job_id": "a2"})
    assert tenants("bob").queues["q"].tenants == ("bob",)
    assert tenants("bob", "carol").queues["q"].tenants == ("bob", "carol")  # opened further: nothing to ask


def test_a_queue_may_not_leave_its_cohort_while_it_borrows_there() -> None:
    log = LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("other")))
    for name in ("team-a", "team-b"):
        log.queue(QueueSpec(name, cohort="org", quotas={"*": Quota(nominal=4)}))
    for j in ("a1", "a2"):
        log.submit("alice", j, job("team-a").gpus(4)).accept(j).admit(j)  # a2 borrows team-b's 4
    moved = QueueSpec("team-a", cohort="other", quotas={"*": Quota(nominal=4)})
    state = fold(log.admin("queue", ApplyQueue(queue=moved)))
    assert last(state).code == "forbidden" and "borrows" in last(state).message, last(state)
    assert state.queues["team-a"].cohort == "org"
    lender = QueueSpec("team-b", cohort="other", quotas={"*": Quota(nominal=4)})
    state = fold(log.admin("queue", ApplyQueue(queue=lender)))  # nor may its lender leave
    assert last(state).code == "forbidden" and state.queues["team-b"].cohort == "org", last(state)
    log.request("alice", "cancel", {"job_id": "a2"})
    state = fold(log.admin("queue", ApplyQueue(queue=moved)))
    assert state.queues["team-a"].cohort == "other"


def test_a_cohort_may_not_leave_its_parent_while_its_tree_borrows() -> None:
    # team-a (under "left") borrows the 4 GPUs team-b (under "right") lent it within "org":
    # moved out of "org", no side of any tree would hold team-b's lent quota to take it back.
    log = LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    for side in ("left", "right"):
        log.admin("cohort", ApplyCohort(cohort=CohortSpec(side, parent="org")))
    log.queue(QueueSpec("team-a", cohort="left", quotas={"*": Quota(nominal=4)}))
    log.queue(QueueSpec("team-b", cohort="right", quotas={"*": Quota(nominal=4)}))
    for j in ("a1", "a2"):
        log.submit("alice", j, job("team-a").gpus(4)).accept(j).admit(j)
    state = fold(log.admin("cohort", ApplyCohort(cohort=CohortSpec("left"))))
    assert last(state).code == "forbidden" and "team-a borrows" in last(state).message, last(state)
    assert state.cohorts["left"].parent == "org"
    moved = fold(log.admin("cohort", ApplyCohort(cohort=CohortSpec("right", parent="left"))))
    assert last(moved).code == "forbidden" and moved.cohorts["right"].parent == "org"
    same = fold(log.admin("cohort", ApplyCohort(cohort=CohortSpec("left", parent="org", quotas={}))))
    assert same.cohorts["left"].parent == "org" and not same.rejections[len(moved.rejections) :]
    log.request("alice", "cancel", {"job_id": "a2"})
    state = fold(log.admin("cohort", ApplyCohort(cohort=CohortSpec("left"))))
    assert state.cohorts["left"].parent is None


def test_a_cohort_is_deleted_only_once_nothing_is_in_it_and_its_quota_is_not_lent() -> None:
    log = LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    pool = CohortSpec("pool", parent="org", quotas={"*": Quota(nominal=4)})
    log.admin("cohort", ApplyCohort(cohort=pool))
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("empty")))
    log.queue(QueueSpec("team-a", cohort="org", quotas={"*": Quota(nominal=4)}))
    state = fold(log.admin("delete-cohort", DeleteCohort(name="org")))
    assert last(state).code == "illegal" and "cohort pool, queue team-a" in last(state).message, last(state)
    state = fold(log.admin("delete-cohort", DeleteCohort(name="nowhere")))
    assert last(state).code == "unknown"
    log.submit("alice", "a1", job("team-a").gpus(8)).accept("a1").admit("a1")  # borrows the pool's 4
    state = fold(log.admin("delete-cohort", DeleteCohort(name="pool")))
    assert last(state).code == "forbidden" and "pool" in state.cohorts, last(state)
    state = fold(log.admin("delete-cohort", DeleteCohort(name="empty")))
    assert "empty" not in state.cohorts
    log.request("alice", "cancel", {"job_id": "a1"})
    state = fold(log.admin("delete-cohort", DeleteCohort(name="pool")))
    assert "pool" not in state.cohorts and "org" in state.cohorts
    # A tenant may not: refused, recorded, and the cohort stays.
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("spare")))
    state = fold(log.request("alice", "delete-cohort", DeleteCohort(name="spare")))
    assert "spare" in state.cohorts and "delete-cohort" in last(state).message, last(state)


def test_a_priority_class_is_deleted_only_once_no_unfinished_job_names_it() -> None:
    # Classes were only ever added: every one a cluster ever had stayed in every service.
    from corral.events.queues import DeletePriorityClass

    urgent = PriorityClassSpec("urgent", 100)
    log = LogBuilder().queue("team-a").admin("priority-class", ApplyPriorityClass(priority_class=urgent))
    log.submit("alice", "u1", job("team-a").priority_class("urgent")).accept("u1", priority=100)
    state = fold(log.admin("delete-priority-class", DeletePriorityClass(name="urgent")))
    assert last(state).code == "illegal" and "u1" in last(state).message
    assert "urgent" in state.priority_classes
    state = fold(log.admin("delete-priority-class", DeletePriorityClass(name="nowhere")))
    assert last(state).code == "unknown"
    log.request("alice", "cancel", {"job_id": "u1"})
    # A tenant may not: refused, recorded, and the class stays.
    state = fold(log.request("alice", "delete-priority-class", DeletePriorityClass(name="urgent")))
    assert "urgent" in state.priority_classes and "delete-priority-class" in last(state).message
    rejected = state.rejected_total
    state = fold(log.admin("delete-priority-class", DeletePriorityClass(name="urgent")))
    assert "urgent" not in state.priority_classes and state.rejected_total == rejected
    # A job naming it now is rejected by admission as of a class that does not exist.
    from corral.services.admission.validate import validate

    log.submit("alice", "u2", job("team-a").priority_class("urgent"))
    state = fold(log)
    why = validate(state, state.jobs["u2"])
    assert why is not None and why.code == "unknown-priority-class"


def test_a_class_may_not_turn_non_preemptible_while_its_jobs_borrow() -> None:
    # Accepted, the loan was for ever: team-b's jobs within its nominal waited for GPUs nobody
    # could take back, as jobs that may not be preempted never borrow.
    normal = PriorityClassSpec("normal", 0)
    log = LogBuilder().admin("priority-class", ApplyPriorityClass(priority_class=normal))
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    for name, nominal in (("team-a", 4), ("team-b", 12)):
        log.queue(QueueSpec(name, cohort="org", quotas={"*": Quota(nominal=nominal)}))
    for j in ("a1", "a2"):
        log.submit("alice", j, job("team-a").gpus(4)).accept(j).admit(j)  # a2 borrows 4
    fixed = msgspec.structs.replace(normal, preemptible=False)
    state = fold(log.admin("priority-class", ApplyPriorityClass(priority_class=fixed)))
    assert last(state).code == "forbidden" and "borrow" in last(state).message, last(state)
    assert state.priority_classes["normal"].preemptible and state.quota_held_fixed.get("team-a", {}) == {}
    log.request("alice", "cancel", {"job_id": "a2"})  # admitted, not placed: its quota is back at once
    state = fold(log.admin("priority-class", ApplyPriorityClass(priority_class=fixed)))
    assert not state.priority_classes["normal"].preemptible  # within its nominal: no loan to keep


def test_a_queues_quota_may_not_be_cut_below_what_its_unstoppable_jobs_hold() -> None:
    # Accepted, the excess was a loan nobody could take back: team-b's job within its nominal
    # waited for team-a's jobs that may not be preempted to end on their own.
    log = LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    log.queue(QueueSpec("team-a", cohort="org", quotas={"*": Quota(nominal=4)}))
    log.queue(QueueSpec("team-b", cohort="org", quotas={"*": Quota(nominal=4)}))
    log.submit("alice", "fixed", job("team-a").gpus(4).preemptible(False)).accept("fixed").admit("fixed")
    cut = QueueSpec("team-a", cohort="org", quotas={"*": Quota(nominal=2)})
    state = fold(log.queue(cut))
    why = last(state)
    assert why.code == "forbidden" and "may not be stopped hold 4 GPUs, past the 2" in why.message
    assert state.queues["team-a"].quotas["*"].nominal == 4
    raised = fold(log.queue(QueueSpec("team-a", cohort="org", quotas={"*": Quota(nominal=6)})))
    assert raised.queues["team-a"].quotas["*"].nominal == 6
    log.request("alice", "cancel", {"job_id": "fixed"})
    assert fold(log.queue(cut)).queues["team-a"].quotas["*"].nominal == 2


@pytest.mark.parametrize("half_life", [0.0, -60.0, 1e-300, 0.5, float("inf"), float("nan")])
def test_a_fair_share_half_life_under_a_second_is_malformed(half_life: float) -> None:
    # 1e-300 s forgot every history between two records and showed usage of 2e+301 GPUs.
    state = fold(LogBuilder().fair_share(half_life))
    assert last(state).code == "malformed" and state.fair_share == State().fair_share


@pytest.mark.parametrize(
    "quotas",
    [{"*": Quota(-100)}, {"*": Quota(4, borrowing_limit=-1)}, {"*": Quota(4, lending_limit=-1)}],
    ids=["negative-nominal", "negative-borrowing-limit", "negative-lending-limit"],
)
def test_a_cohort_of_negative_quota_is_malformed(quotas: dict[str, Quota]) -> None:
    # Taken, a cohort's -100 GPUs made its queues refuse every job: "can hold at most -99 GPUs".
    state = fold(LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("org", quotas=quotas))))
    assert state.cohorts == {} and last(state).code == "malformed"


def test_a_queues_lending_limit_above_its_nominal_is_malformed() -> None:
    # Kueue refuses it as well: a queue lends its nominal at most, and a limit of 8 on a nominal
    # of 4 read, in ``corral queues``, as a bound on lending it is not.
    state = fold(LogBuilder().queue(QueueSpec("team-a", quotas={"*": Quota(4, lending_limit=5)})))
    assert state.queues == {} and last(state).code == "malformed"
    assert "lending_limit of * is 5 GPUs, more than its nominal 4" in last(state).message
    assert (
        "team-a"
        in fold(LogBuilder().queue(QueueSpec("team-a", quotas={"*": Quota(4, lending_limit=4)}))).queues
    )
    # A cohort's bounds what its whole subtree lends: above its own quota it means something.
    cohort = CohortSpec("org", quotas={"*": Quota(0, lending_limit=3)})
    assert "org" in fold(LogBuilder().admin("cohort", ApplyCohort(cohort=cohort))).cohorts


@pytest.mark.parametrize(
    ("cohorts", "accepted", "refused"),
    [
        ([("a", None), ("b", "a"), ("c", "b")], {"a", "b", "c"}, 0),
        ([("a", "a")], set(), 1),
        ([("a", "b"), ("b", "a")], {"a"}, 1),
        ([("a", None), ("b", "a"), ("c", "b"), ("a", "c")], {"a", "b", "c"}, 1),
        ([("a", "missing")], {"a"}, 0),
        ([("bad.name", None)], set(), 1),
    ],
    ids=["chain", "own-parent", "two-loop", "three-loop", "parent-not-yet-known", "bad-name"],
)
def test_cohort_parent_chain_may_not_loop(
    cohorts: list[tuple[str, str | None]], accepted: set[str], refused: int
) -> None:
    log = LogBuilder()
    for name, parent in cohorts:
        log.admin("cohort", ApplyCohort(cohort=CohortSpec(name, parent=parent)))
    state = fold(log)
    assert set(state.cohorts) == accepted
    assert state.rejected_total == refused and all(r.code == "malformed" for r in state.rejections)
    for c in state.cohorts.values():  # whatever was accepted, no chain loops
        seen, parent = {c.name}, c.parent
        while parent in state.cohorts:
            assert parent not in seen
            seen.add(parent)
            parent = state.cohorts[parent].parent


def test_a_looping_cohort_keeps_its_previous_parent() -> None:
    log = LogBuilder().admin("cohort", ApplyCohort(cohort=CohortSpec("a")))
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("b", parent="a")))
    state = fold(log.admin("cohort", ApplyCohort(cohort=CohortSpec("a", parent="b"))))
    assert state.cohorts["a"].parent is None and last(state).code == "malformed"


def test_priority_class_name_must_be_a_name() -> None:
    state = fold(
        LogBuilder().admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("a b", 1)))
    )
    assert state.priority_classes == {} and last(state).code == "malformed"


@pytest.mark.parametrize(
    ("jobs", "name", "code"),
    [(False, "team-a", None), (True, "team-a", "illegal"), (False, "team-z", "unknown")],
    ids=["empty-queue", "queue-with-jobs", "unknown-queue"],
)
def test_delete_queue(jobs: bool, name: str, code: str | None) -> None:
    log = LogBuilder().admin("queue", ApplyQueue(queue=QueueSpec("team-a")))
    if jobs:
        log.submit("alice", "j1", job("team-a"))
    state = fold(log.admin("delete-queue", DeleteQueue(name=name)))
    if code is None:
        assert state.queues == {}
    else:
        assert "team-a" in state.queues and last(state).code == code


def test_cordon_request_for_an_unknown_node() -> None:
    state = fold(LogBuilder().admin("cordon", CordonNode(node="node-99")))
    assert last(state).code == "unknown"


# -- the whole lifecycle --------------------------------------------------------------------------

LIFECYCLE: list[tuple[str, Callable[[LogBuilder], LogBuilder], str]] = [
    ("submit", lambda log: log.submit("alice", "j1", job().gpus(2).cpu(8000).memory(65536)), "submitted"),
    ("accept", lambda log: log.accept("j1", priority=5), "queued"),
    ("admit", lambda log: log.admit("j1"), "admitted"),
    ("place", lambda log: log.place(on(N0, 2, 3, job_id="j1")), "placed"),
    ("start", lambda log: log.started(N0, "j1"), "running"),
    ("checkpoint", lambda log: log.checkpoint(N0, "j1", step=100), "running"),
    ("succeed", lambda log: log.exited(N0, "j1", code=0), "succeeded"),
]


def test_full_lifecycle_phase_by_phase_and_resources_come_back() -> None:
    log = two_nodes()
    idle = fold(log).nodes
    previous = ""
    for step, append, phase in LIFECYCLE:
        state = fold(append(log))
        j = state.jobs["j1"]
        assert j.phase == phase, step
        assert state.rejected_total == 0, (step, state.rejections)
        if phase != previous:
            assert j.updated_seq == state.seq and j.phase_since == state.time, step
        previous = phase
        node = state.nodes[N0]
        if phase in ("placed", "running"):
            assert [g.index for g in node.inventory.gpus if node.gpus[g.index].holders] == [2, 3]
            assert gpu(state, 2).holders == {"j1": 1000} and gpu(state, 2).used_milli == 1000
            assert (node.cpu_used, node.memory_used) == (8000, 65536)
    assert state.jobs["j1"].priority == 5
    assert state.jobs["j1"].checkpoint is not None and state.jobs["j1"].checkpoint.step == 100
    assert state.jobs["j1"].exit_codes == {0: 0} and state.jobs["j1"].held is None
    assert state.nodes == idle  # every GPU, CPU and byte of memory given back


def test_rejected_job_stays_rejected() -> None:
    from corral.events.jobs import JobRejected

    log = LogBuilder().submit("alice", "j1")
    log.event(subj.job("j1"), JobRejected(job_id="j1", request_seq=1, reason=Reason("quota", "no quota")))
    state = fold(log)
    assert state.jobs["j1"].phase == "rejected" and state.jobs["j1"].reasons[0].code == "quota"
    state = fold(log.accept("j1"))
    assert state.jobs["j1"].phase == "rejected" and last(state).code == "illegal"


def test_gang_runs_when_every_rank_started_and_succeeds_when_every_rank_exited_zero() -> None:
    spec = job().gpus(8).replicas(2).pack("nvlink")
    log = queued(spec=spec).admit("j1", replicas=2)
    log.place(placement("j1", worker(0, N0, *map(whole, range(8))), worker(1, N1, *map(whole, range(8)))))
    log.started(N0, "j1", rank=0)
    assert fold(log).jobs["j1"].phase == "starting"
    log.started(N1, "j1", rank=1)
    assert fold(log).jobs["j1"].phase == "running"
    log.exited(N0, "j1", rank=0, code=0)
    state = fold(log)
    assert state.jobs["j1"].phase == "running" and all(h == {"j1": 1000} for h in holders(state, N0))
    state = fold(log.exited(N1, "j1", rank=1, code=0))
    assert state.jobs["j1"].phase == "succeeded"
    assert all(h == {} for h in holders(state, N0) + holders(state, N1))


def test_a_workers_report_finds_its_rank_wherever_the_placement_lists_it() -> None:
    # The placer lists ranks in order, and the fold looks there first; a placement may list them
    # in any order, and each rank is still its own node's to report.
    spec = job().gpus(8).replicas(2).pack("nvlink")
    log = queued(spec=spec).admit("j1", replicas=2)
    log.place(placement("j1", worker(1, N1, *map(whole, range(8))), worker(0, N0, *map(whole, range(8)))))
    state = fold(log.started(N1, "j1", rank=0))
    assert last(state).code == "illegal" and "no rank 0 on node-01" in last(state).message
    state = fold(log.started(N0, "j1", rank=0).started(N1, "j1", rank=1))
    assert state.jobs["j1"].phase == "running" and state.rejected_total == 1
    state = fold(log.exited(N0, "j1", rank=1, code=0))
    assert last(state).code == "illegal" and "rank 1 of job j1 is not on node-00" in last(state).message
    state = fold(log.exited(N1, "j1", rank=1, code=0).exited(N0, "j1", rank=0, code=0))
    assert state.jobs["j1"].phase == "succeeded" and state.rejected_total == 2


def test_a_checkpoint_is_its_own_nodes_to_report() -> None:
    # node-01's agent may not point node-00's job at a location of its choosing, nor, with the
    # largest step, make the job ignore every checkpoint its own workers report after.
    log = queued().admit("j1")
    log.place(placement("j1", worker(0, N0, whole(0))))
    log.started(N0, "j1").checkpoint(N1, "j1", step=2**62)
    state = fold(log)
    assert state.jobs["j1"].checkpoint is None
    assert last(state).code == "illegal" and "no worker of attempt 0 on node-01" in last(state).message
    log.checkpoint(N0, "j1", step=5)
    assert fold(log).jobs["j1"].checkpoint.step == 5  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "location",
    ["/ckpt/j1/a\x00b", "/ckpt/j1\n/5", "", "/" + "c" * MAX_LOCATION],
    ids=["nul", "newline", "empty", "longer-than-a-path"],
)
def test_a_checkpoint_no_worker_could_resume_from_is_malformed(location: str) -> None:
    # The location is every later attempt's CORRAL_RESUME_FROM, on whatever node it runs: one
    # with a NUL (no environment carries it) made each start of the job fail, on every node.
    log = queued().admit("j1")
    log.place(placement("j1", worker(0, N0, whole(0)))).started(N0, "j1").checkpoint(N0, "j1", step=5)
    bad = CheckpointCompleted(node=N0, job_id="j1", attempt=0, location=location, step=9)
    state = fold(log.event(subj.node(N0), bad))
    assert last(state).code == "malformed" and last(state).job_id == "j1"
    assert state.jobs["j1"].checkpoint.location == "/ckpt/j1/5"  # type: ignore[union-attr]


def test_a_late_checkpoint_of_an_attempt_over_is_a_straggler_and_changes_nothing() -> None:
    # The node was lost and the job moved on; its agent, alive, stopped the old worker, which
    # saved once more first: the fold refused that report as a node's out of turn.
    log = queued().admit("j1")
    log.place(placement("j1", worker(0, N0, whole(0)))).started(N0, "j1").checkpoint(N0, "j1", step=5)
    log.condition(N0, "lost").requeue("j1", 0).admit("j1", attempt=1)
    log.place(placement("j1", worker(0, N1, whole(0)), attempt=1)).started(N1, "j1", attempt=1)
    before = fold(log)
    state = fold(log.checkpoint(N0, "j1", step=9, attempt=0))
    assert state.rejected_total == before.rejected_total, last(state)
    assert state.jobs["j1"].checkpoint == before.jobs["j1"].checkpoint
    # Another node's word about an attempt still holding GPUs is still refused.
    state = fold(log.checkpoint(N0, "j1", step=12, attempt=1))
    assert last(state).code == "illegal"


def test_only_the_admin_lifts_a_cordon() -> None:
    # The health monitor only cordons; a node's agent, which writes on the node's subject too,
    # must not undo the admin's drain by writing a cordon lifted there.
    log = two_nodes().admin("cordon", CordonNode(node=N0, drain=True)).cordon(N0, cordoned=False)
    state = fold(log)
    assert state.nodes[N0].cordoned and last(state).code == "forbidden"
    state = fold(log.cordon(N0, cordoned=True, drain=False))  # nor end the drain
    assert state.nodes[N0].cordoned and state.nodes[N0].draining
    state = fold(log.admin("cordon", CordonNode(node=N0, cordoned=False)))
    assert not state.nodes[N0].cordoned and not state.nodes[N0].draining


def test_redelivered_record_is_folded_once() -> None:
    log = queued()
    state = fold(log)
    copy = fold(log)
    for r in log.records:
        apply(state, r)
    assert state == copy


def test_pending_reasons_and_unschedulable_reasons_are_kept() -> None:
    from corral.events.decisions import JobsUnschedulable, Unschedulable
    from corral.events.jobs import PendingReasonChanged

    why = (Reason("capacity", "no 8-GPU island free", True),)
    log = queued()
    log.event(subj.job("j1"), PendingReasonChanged(job_id="j1", reasons=why))
    assert fold(log).jobs["j1"].reasons == why
    log.admit("j1")
    log.event(
        subj.decision("placer"),
        JobsUnschedulable(based_on=0, now=0.0, jobs=(Unschedulable("j1", 0, why * 2),)),
    )
    assert fold(log).jobs["j1"].reasons == why * 2


# -- placements that no longer hold ---------------------------------------------------------------


@dataclass
class Void:
    id: str
    why: str  # what the recorded rejection says, so the case fails for the reason it names
    proposal: Placement
    spec: SpecLike = field(default_factory=lambda: job().gpus(2))
    before: Callable[[LogBuilder], object] = lambda log: None
    admitted: bool = True
    replicas: int = 1


def _busy_gpu1(log: LogBuilder) -> None:
    running("j0", log=log, gpus=(1,))


def _earlier_attempt_still_running(log: LogBuilder) -> None:
    log.place(on(N0, 2, 3, job_id="j1")).started(N0, "j1").gpu_health(N0, 2, False)
    log.requeue("j1", 0).admit("j1", attempt=1)


def _mig_node(log: LogBuilder) -> None:
    log.node("node-02", h100_8x_mig("node-02"))


GANG = job().gpus(2).replicas(2)
VOID = [
    Void("not-admitted", "not admitted", on(N0, 0, 1, job_id="j1"), admitted=False),
    Void("stale-attempt", "not admitted at attempt 1", on(N0, 0, 1, job_id="j1", attempt=1)),
    Void("unknown-job", "j9: not admitted", on(N0, 0, 1, job_id="j9")),
    Void("gpu-taken", "GPU 1 of node-00 is not free", on(N0, 0, 1, job_id="j1"), before=_busy_gpu1),
    Void(
        "gpu-unhealthy",
        "unhealthy (xid:79)",
        on(N0, 0, 1, job_id="j1"),
        before=lambda log: log.gpu_health(N0, 1, False),
    ),
    Void(
        "node-cordoned", "node-00 is cordoned", on(N0, 0, 1, job_id="j1"), before=lambda log: log.cordon(N0)
    ),
    Void(
        "node-cordoned-by-admin",
        "node-00 is cordoned",
        on(N0, 0, 1, job_id="j1"),
        before=lambda log: log.admin("cordon", CordonNode(node=N0)),
    ),
    Void(
        "node-suspect",
        "node-00 is suspect",
        on(N0, 0, 1, job_id="j1"),
        before=lambda log: log.condition(N0, "suspect"),
    ),
    Void(
        "node-lost",
        "node-00 is lost",
        on(N0, 0, 1, job_id="j1"),
        before=lambda log: log.condition(N0, "lost"),
    ),
    Void("node-unknown", "not registered", on("node-99", 0, 1, job_id="j1")),
    Void("gpu-out-of-range", "has no GPU 8", on(N0, 7, 8, job_id="j1")),
    Void("too-few-gpus", "2 whole GPUs", on(N0, 0, job_id="j1")),
    Void("too-many-gpus", "2 whole GPUs", on(N0, 0, 1, 2, job_id="j1")),
    Void("fraction-for-whole", "2 whole GPUs", placement("j1", worker(0, N0, whole(0), share(1, 500)))),
    Void(
        "mig-slot-for-whole",
        "2 whole GPUs",
        placement("j1", worker(0, N0, mig_slot(0, "3g.40gb", 0), whole(1))),
    ),
    Void("wrong-model", "is a H100-80GB", on(N0, 0, 1, job_id="j1"), spec=job().gpus(2).models("A100-80GB")),
    Void(
        "too-little-gpu-memory",
        "has 81559 MiB",
        on(N0, 0, 1, job_id="j1"),
        spec=job().gpus(2).gpu_memory(100_000),
    ),
    Void(
        "labels-not-selected",
        "lacks the labels",
        on(N0, 0, 1, job_id="j1"),
        spec=job().gpus(2).select(rack="rack-9"),
    ),
    Void("rank-missing", "ranks [0]", on(N0, 0, 1, job_id="j1"), spec=GANG, replicas=2),
    Void(
        "rank-wrong",
        "ranks [0, 2]",
        placement("j1", worker(0, N0, whole(0), whole(1)), worker(2, N1, whole(0), whole(1))),
        spec=GANG,
        replicas=2,
    ),
    Void(
        "rank-twice",
        "ranks [0, 0]",
        placement("j1", worker(0, N0, whole(0), whole(1)), worker(0, N1, whole(0), whole(1))),
        spec=GANG,
        replicas=2,
    ),
    Void(
        "rank-extra",
        "ranks [0, 1]",
        placement("j1", worker(0, N0, whole(0), whole(1)), worker(1, N1, whole(0), whole(1))),
    ),
    Void("same-gpu-twice", "same GPU twice", on(N0, 0, 0, job_id="j1")),
    Void(
        "same-gpu-by-two-ranks",
        "GPU 1 of node-00 is not free",
        placement("j1", worker(0, N0, whole(0), whole(1)), worker(1, N0, whole(1), whole(2))),
        spec=GANG,
        replicas=2,
    ),
    Void("cpu-exceeded", "224001 milli-CPU", on(N0, 0, 1, job_id="j1"), spec=job().gpus(2).cpu(224_001)),
    Void(
        "cpu-exceeded-by-gang",
        "240000 milli-CPU",
        placement("j1", worker(0, N0, whole(0)), worker(1, N0, whole(1))),
        spec=job().cpu(120_000).replicas(2),
        replicas=2,
    ),
    Void(
        "memory-exceeded", "MiB free", on(N0, 0, 1, job_id="j1"), spec=job().gpus(2).memory(2048 * 1024 + 1)
    ),
    Void("whole-gpu-of-a-mig-gpu", "in MIG mode", on("node-02", 0, 1, job_id="j1"), before=_mig_node),
    Void(
        "earlier-attempt-holds-gpus",
        "earlier attempt still hold",
        on(N0, 4, 5, job_id="j1", attempt=1),
        before=_earlier_attempt_still_running,
    ),
]


@pytest.mark.parametrize("case", VOID, ids=[c.id for c in VOID])
def test_placement_that_no_longer_holds_is_void_and_changes_nothing(case: Void) -> None:
    log = two_nodes().submit("alice", "j1", case.spec).accept("j1")
    if case.admitted:
        log.admit("j1", replicas=case.replicas)
    case.before(log)
    before = fold(log)
    state = fold(log.place(case.proposal))
    assert last(state).code == "void", state.rejections
    assert case.why in last(state).message
    assert state.void_total == before.void_total + 1
    assert state.nodes == before.nodes and state.jobs == before.jobs


def test_one_void_placement_does_not_void_the_others_in_its_event() -> None:
    log = two_nodes().submit("alice", "j1").accept("j1").submit("bob", "j2").accept("j2").admit("j1", "j2")
    state = fold(log.place(on(N0, 0, job_id="j1"), on(N0, 0, job_id="j2"), on(N0, 1, job_id="j2")))
    assert (state.jobs["j1"].phase, state.jobs["j2"].phase) == ("placed", "placed")
    assert holders(state)[:2] == [{"j1": 1000}, {"j2": 1000}]
    assert last(state).code == "void" and "j2" in last(state).message and state.void_total == 1


def test_void_admissions_do_not_void_the_others() -> None:
    log = queued().submit("bob", "j2").admit("j1", "j2", "j9")
    state = fold(log)
    assert state.jobs["j1"].phase == "admitted" and state.jobs["j2"].phase == "submitted"
    assert last(state).code == "void" and "j2" in last(state).message and "j9" in last(state).message


@pytest.mark.parametrize(("replicas", "admitted"), [(1, False), (2, True), (4, True), (5, False)])
def test_admission_must_stay_within_the_elastic_range(replicas: int, admitted: bool) -> None:
    state = fold(queued(spec=job().replicas(4, minimum=2)).admit("j1", replicas=replicas))
    assert (state.jobs["j1"].phase == "admitted") is admitted


# -- admissions claim quota -----------------------------------------------------------------------


def test_of_two_gangs_admitted_in_one_cycle_only_the_first_fits_the_quota() -> None:
    log = LogBuilder().queue(queue_spec("team-a", 8))
    log.submit("alice", "a", job().gpus(8)).accept("a").submit("bob", "b", job().gpus(8)).accept("b")
    before = fold(log)
    state = fold(log.admit("a", "b"))
    assert state.jobs["a"].phase == "admitted" and state.jobs["a"].admission == log.admission("a")
    assert state.jobs["b"] == before.jobs["b"]  # still queued, holding nothing
    assert (last(state).code, state.void_total, state.rejected_total) == ("void", 1, 1)
    assert "b: needs 8 GPUs" in last(state).message and "a: " not in last(state).message


def test_a_void_admission_takes_no_quota_from_the_ones_after_it() -> None:
    log = LogBuilder().queue(queue_spec("team-a", 8))
    log.submit("alice", "big", job().gpus(8).replicas(2)).accept("big")
    log.submit("alice", "fits", job().gpus(8)).accept("fits")
    state = fold(log.admit("big", "fits", replicas=1).admit("big", replicas=2))
    assert (state.jobs["big"].phase, state.jobs["fits"].phase) == ("queued", "admitted")
    assert "big: 1 replicas outside 2..2" in state.rejections[0].message
    assert "big: needs 16 GPUs" in last(state).message and state.void_total == 2


def test_quota_is_held_until_the_job_ends_then_comes_back() -> None:
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    running("a", job().gpus(8), gpus=tuple(range(8)), log=log)
    log.submit("bob", "b", job().gpus(8)).accept("b").admit("b")
    state = fold(log)
    assert state.jobs["b"].phase == "queued" and "b: needs 8 GPUs" in last(state).message
    log.exited(N0, "a", code=0).admit("b")
    state = fold(log)
    assert (state.jobs["a"].phase, state.jobs["b"].phase) == ("succeeded", "admitted")
    log.submit("carol", "c", job().gpus(8)).accept("c").admit("c")
    assert fold(log).jobs["c"].phase == "queued"  # b holds the quota, placed or not
    log.request("bob", "cancel", {"job_id": "b"}).admit("c")
    assert fold(log).jobs["c"].phase == "admitted"


def _understated(adm: Admission) -> Admission:
    return Admission(adm.job_id, adm.attempt, adm.replicas, {"*": adm.gpus["*"] - 1})


@dataclass
class QuotaCase:
    id: str
    queues: tuple[QueueSpec, ...]
    ask: JobBuilder  # job j1, proposed at ``replicas``
    why: str = ""  # what the void message says; empty: the admission wins
    replicas: int = 1
    held: tuple[JobBuilder, ...] = ()  # jobs admitted in earlier cycles, holding quota
    proposal: Callable[[Admission], Admission] = lambda adm: adm  # default: the faithful one


A4, B8 = queue_spec("team-a", 4, cohort="org"), queue_spec("team-b", 8, cohort="org")
A8 = queue_spec("team-a", 8)
QUOTA = [
    QuotaCase("within-nominal", (A8,), job().gpus(8)),
    QuotaCase(
        "over-nominal", (A8,), job().gpus(8), "needs 8 GPUs; queue team-a using 4", held=(job().gpus(4),)
    ),
    QuotaCase("gang-counts-every-worker", (A8,), job().gpus(4).replicas(3), "needs 12 GPUs", replicas=3),
    QuotaCase("elastic-gang-at-fewer-workers", (A8,), job().gpus(4).replicas(3, minimum=1), replicas=2),
    QuotaCase(
        "four-quarters-are-one-gpu", (queue_spec("team-a", 1),), job().milli(250).replicas(4), replicas=4
    ),
    QuotaCase(
        "five-quarters", (queue_spec("team-a", 1),), job().milli(250).replicas(5), "1.25 GPUs", replicas=5
    ),
    QuotaCase("borrows-idle-quota-of-its-cohort", (A4, B8), job().gpus(8)),
    QuotaCase(
        "over-its-borrowing-limit",
        (queue_spec("team-a", 4, cohort="org", borrowing_limit=2), B8),
        job().gpus(8),
        "borrowing limit 2",
    ),
    QuotaCase(
        "within-its-borrowing-limit",
        (queue_spec("team-a", 4, cohort="org", borrowing_limit=2), B8),
        job().gpus(6),
    ),
    QuotaCase(
        "over-what-the-cohort-may-lend",
        (A4, queue_spec("team-b", 8, cohort="org", lending_limit=2)),
        job().gpus(8),
        # team-a's own 4 and the 2 team-b may lend: "the cohort has 6 to lend" read as 6 more
        "6 free to it now in cohort org, 2 of them borrowed",
    ),
    QuotaCase(
        "within-what-the-cohort-may-lend",
        (A4, queue_spec("team-b", 8, cohort="org", lending_limit=2)),
        job().gpus(6),
    ),
    QuotaCase(
        "cohort-quota-in-use",
        (A4, B8),
        job().gpus(8),
        "using 0 of its nominal 4 GPUs; 4 free to it now in cohort org",
        held=(job("team-b").gpus(8),),
    ),
    QuotaCase(
        "no-cohort-to-borrow-from", (queue_spec("team-a", 4), B8), job().gpus(8), "no cohort to borrow from"
    ),
    QuotaCase("model-quota", (queue_spec("team-a", 8, key="H100-80GB"),), job().gpus(8).models("H100-80GB")),
    QuotaCase(
        "no-quota-for-any-model",
        (queue_spec("team-a", 8, key="H100-80GB"),),
        job().gpus(1),
        "no quota for GPUs",
    ),
    QuotaCase("unknown-queue", (A8,), job("team-z").gpus(1), "no queue team-z"),
    QuotaCase("gpus-understated", (A8,), job().gpus(8), "1 workers of j1 hold 8 *", proposal=_understated),
    QuotaCase(
        "no-gpus-named",
        (A8,),
        job().gpus(1),
        "must name exactly one quota key",
        proposal=lambda adm: Admission(adm.job_id, adm.attempt, adm.replicas),
    ),
    QuotaCase(
        "two-keys-named",
        (A8,),
        job().gpus(1),
        "must name exactly one quota key",
        proposal=lambda adm: Admission(adm.job_id, adm.attempt, adm.replicas, {"*": 1, "H100-80GB": 0}),
    ),
    QuotaCase(
        "key-it-may-not-count-against",
        (A8,),
        job().gpus(8),
        "may count against *, not H100-80GB",
        proposal=lambda adm: Admission(adm.job_id, adm.attempt, adm.replicas, {"H100-80GB": 8}),
    ),
    QuotaCase("gpu-less-job-needs-no-quota", (queue_spec("team-a", 0),), job().gpus(0)),
    QuotaCase(
        "gpu-less-job-may-not-claim-gpus",
        (A8,),
        job().gpus(0),
        "uses no GPU",
        proposal=lambda adm: Admission(adm.job_id, adm.attempt, adm.replicas, {"*": 1}),
    ),
]


@pytest.mark.parametrize("case", QUOTA, ids=[c.id for c in QUOTA])
def test_admission_wins_only_if_faithful_and_within_quota(case: QuotaCase) -> None:
    log = LogBuilder()
    for q in case.queues:
        log.queue(q)
    for i, spec in enumerate(case.held):
        log.submit("bob", f"h{i}", spec).accept(f"h{i}").admit(f"h{i}")
    log.submit("alice", "j1", case.ask).accept("j1")
    before = fold(log)
    assert before.rejected_total == 0 and all(
        j.phase == "admitted" for j in before.jobs.values() if j.id != "j1"
    )
    proposal = case.proposal(log.admission("j1", replicas=case.replicas))
    state = fold(log.admit_as(proposal))
    if not case.why:
        assert state.jobs["j1"].phase == "admitted" and state.jobs["j1"].admission == proposal
        assert state.rejected_total == 0
    else:
        assert last(state).code == "void" and "j1: " in last(state).message, last(state)
        assert case.why in last(state).message, last(state).message
        assert state.void_total == 1 and state.jobs == before.jobs


# -- fractional GPUs ------------------------------------------------------------------------------


def _shares(*millis: int) -> LogBuilder:
    log = two_nodes()
    for i, m in enumerate(millis):
        log.submit("alice", f"s{i}", job().milli(m)).accept(f"s{i}").admit(f"s{i}")
        log.place(placement(f"s{i}", worker(0, N0, share(0, m))))
    return log


@pytest.mark.parametrize(
    ("millis", "placed"),
    [
        ((250, 250, 250, 250), 4),
        ((250, 250, 250, 250, 250), 4),
        ((500, 500), 2),
        ((600, 500), 1),
        ((100, 900, 1), 2),
        ((999, 1), 2),
    ],
    ids=["four-quarters", "fifth-quarter", "two-halves", "over-by-100", "exactly-full", "999-and-1"],
)
def test_fractions_share_one_gpu_up_to_1000_milli(millis: tuple[int, ...], placed: int) -> None:
    state = fold(_shares(*millis))
    won = [f"s{i}" for i in range(len(millis)) if state.jobs[f"s{i}"].phase == "placed"]
    assert len(won) == placed and state.void_total == len(millis) - placed
    g = gpu(state, 0)
    assert g.used_milli == sum(g.holders.values()) <= 1000 and set(g.holders) == set(won)


def test_whole_gpu_may_not_join_a_shared_one_nor_a_share_a_whole_one() -> None:
    log = _shares(250).submit("alice", "w", job().gpus(1)).accept("w").admit("w").place(on(N0, 0, job_id="w"))
    state = fold(log)
    assert state.jobs["w"].phase == "admitted" and last(state).code == "void"
    log = running("w", nodes=Cluster(2))
    log.submit("alice", "s", job().milli(10)).accept("s").admit("s").place(
        placement("s", worker(0, N0, share(0, 10)))
    )
    state = fold(log)
    assert state.jobs["s"].phase == "admitted" and gpu(state, 0).holders == {"w": 1000}


def test_fraction_of_the_wrong_size_is_void() -> None:
    log = queued(spec=job().milli(250)).admit("j1").place(placement("j1", worker(0, N0, share(0, 500))))
    assert last(fold(log)).code == "void"


def test_a_finished_share_makes_room() -> None:
    log = _shares(500, 500)
    log.started(N0, "s0").exited(N0, "s0")
    log.submit("alice", "s9", job().milli(400)).accept("s9").admit("s9")
    state = fold(log.place(placement("s9", worker(0, N0, share(0, 400)))))
    assert gpu(state, 0).holders == {"s1": 500, "s9": 400} and gpu(state, 0).used_milli == 900


# -- MIG ------------------------------------------------------------------------------------------

MIG_NODE = "node-00"


def _mig_log(*slots: tuple[str, int]) -> LogBuilder:
    """One job per slot, each proposing its MIG instance on GPU 0 of a MIG-mode H100 node."""
    log = LogBuilder().nodes(Cluster(1, "h100-8x-mig")).queue("team-a")
    for i, (profile, start) in enumerate(slots):
        log.submit("alice", f"m{i}", job().mig(profile)).accept(f"m{i}").admit(f"m{i}")
        log.place(placement(f"m{i}", worker(0, MIG_NODE, mig_slot(0, profile, start))))
    return log


@pytest.mark.parametrize(
    ("slots", "won"),
    [
        ([("3g.40gb", 0), ("3g.40gb", 4)], [0, 1]),
        ([("3g.40gb", 2)], []),
        ([("4g.40gb", 4)], []),
        ([("7g.80gb", 0), ("1g.10gb", 0)], [0]),
        ([("2g.20gb", 0), ("1g.10gb", 1)], [0]),
        ([("2g.20gb", 0), ("1g.10gb", 2), ("1g.20gb", 2)], [0, 1]),
        ([("4g.40gb", 0), ("3g.40gb", 4)], [0, 1]),
        ([("1g.10gb+me", 0), ("1g.10gb+me", 1)], [0]),
        ([("1g.10gb+me", 0), ("1g.10gb", 1)], [0, 1]),
        ([("1g.10gb", s) for s in range(7)] + [("1g.10gb", 7)], list(range(7))),
        ([("1g.20gb", 6), ("1g.10gb", 6)], [0]),
        ([("1g.5gb", 0)], []),
        ([("9g.90gb", 0)], []),
        ([("3g.40gb", -4)], []),
    ],
    ids=[
        "two-3g",
        "3g-at-2",
        "4g-at-4",
        "7g-then-1g",
        "overlap-2g-1g",
        "2g-1g-then-overlap",
        "4g-and-3g",
        "me-only-once",
        "me-then-plain",
        "seven-1g-no-eighth",
        "1g2s-takes-slice-7",
        "a100-40-profile-on-h100",
        "unknown-profile",
        "negative-start",
    ],
)
def test_mig_slots(slots: list[tuple[str, int]], won: list[int]) -> None:
    state = fold(_mig_log(*slots))
    assert [i for i in range(len(slots)) if state.jobs[f"m{i}"].phase == "placed"] == won
    assert state.void_total == len(slots) - len(won)
    g = gpu(state, 0, MIG_NODE)
    assert sorted(g.mig) == sorted(slots[i][1] for i in won)
    assert g.used_milli == sum(g.holders.values()) <= 1000


def test_mig_instance_counts_its_memory_share_and_comes_back() -> None:
    log = _mig_log(("3g.40gb", 0), ("1g.10gb", 4)).started(MIG_NODE, "m0")
    state = fold(log)
    g = gpu(state, 0, MIG_NODE)
    assert g.holders == {"m0": 500, "m1": 125} and g.mig_used == 0b0001_1111
    state = fold(log.exited(MIG_NODE, "m0"))
    g = gpu(state, 0, MIG_NODE)
    assert g.holders == {"m1": 125} and g.mig_used == 0b0001_0000 and list(g.mig) == [4]


def test_mig_job_may_not_use_a_whole_gpu() -> None:
    log = two_nodes().submit("alice", "m", job().mig("3g.40gb")).accept("m").admit("m")
    state = fold(log.place(on(N0, 0, job_id="m")))
    assert state.jobs["m"].phase == "admitted" and last(state).code == "void"


def test_release_leaves_other_jobs_mig_instances_alone() -> None:
    inv = h100_8x_mig(MIG_NODE)
    two, one = (NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus[:n]) for n in (2, 1))
    spec = job().mig("3g.40gb")
    slot = mig_slot(1, "3g.40gb", 0)
    log = LogBuilder().node(MIG_NODE, two).queue("team-a")
    log.submit("alice", "a", spec).accept("a").admit("a").place(placement("a", worker(0, MIG_NODE, slot)))
    log.started(MIG_NODE, "a")
    log.node(MIG_NODE, one).node(MIG_NODE, two)  # GPU 1 fell off the bus and came back
    log.request("alice", "cancel", {"job_id": "a"})
    log.submit("bob", "b", spec).accept("b").admit("b").place(placement("b", worker(0, MIG_NODE, slot)))
    log.exited(MIG_NODE, "a", code=137, stopped=True)  # a's straggler gives back what a held
    log.submit("carol", "c", spec).accept("c").admit("c").place(placement("c", worker(0, MIG_NODE, slot)))
    state = fold(log)
    assert state.jobs["b"].phase == "placed"
    assert gpu(state, 1, MIG_NODE).mig[0].job_id == "b"
    assert state.jobs["c"].phase == "admitted"


# -- failures and restarts ------------------------------------------------------------------------


def test_worker_failure_with_restarts_left_is_interrupted_then_requeued_at_the_next_attempt() -> None:
    log = running(spec=job().restarts(1), nodes=Cluster(2)).exited(N0, "j1", code=1)
    state = fold(log)
    j = state.jobs["j1"]
    assert (j.phase, j.restarts, j.attempt) == ("interrupted", 1, 0)
    assert j.reasons[0].code == "restarting" and holders(state)[0] == {} and j.held is None
    state = fold(log.requeue("j1", 0))
    j = state.jobs["j1"]
    assert (j.phase, j.attempt, j.placement, j.admission, j.started, j.exit_codes) == (
        "queued",
        1,
        None,
        None,
        set(),
        {},
    )
    log.admit("j1", attempt=1).place(on(N0, 5, job_id="j1", attempt=1)).started(N0, "j1", attempt=1)
    assert fold(log).jobs["j1"].phase == "running"
    state = fold(log.exited(N0, "j1", code=1, attempt=1))
    j = state.jobs["j1"]
    assert (j.phase, j.restarts) == ("failed", 1) and j.reasons[0].code == "failed"
    assert holders(state)[5] == {} and state.nodes[N0].cpu_used == 0


@pytest.mark.parametrize(
    ("policy", "code", "phase"),
    [
        ("never", 1, "failed"),
        ("on-failure", 1, "interrupted"),
        ("on-failure", 0, "succeeded"),
        ("always", 0, "interrupted"),
    ],
)
def test_restart_policy(policy: RestartPolicy, code: int, phase: str) -> None:
    log = running(spec=job().restarts(3, policy), nodes=Cluster(2)).exited(N0, "j1", code=code)
    state = fold(log)
    assert state.jobs["j1"].phase == phase and holders(state)[0] == {}


def _start_fault(
    job_id: str = "j1", attempt: int = 0, why: str = "cannot prepare directories: disk full"
) -> WorkerExited:
    return WorkerExited(node=N0, job_id=job_id, attempt=attempt, rank=0, code=127, node_fault=why)


def test_a_start_the_node_failed_sends_the_job_back_without_counting_a_restart() -> None:
    # It was charged to the job: one with no restarts failed, on a node that could start nothing.
    log = running(spec=job(), nodes=Cluster(2)).event(subj.node(N0), _start_fault())
    state = fold(log)
    j = state.jobs["j1"]
    assert (j.phase, j.restarts, j.attempt) == ("interrupted", 0, 0)
    assert j.reasons == (
        Reason("interrupted", f"node {N0} could not start rank 0: cannot prepare directories: disk full"),
    )
    assert holders(state)[0] == {} and j.held is None
    assert state.nodes[N0].start_faults == ("j1",) and j.fault_nodes == (N0,)


def test_a_node_counts_the_jobs_whose_starts_it_failed_in_a_row_until_a_worker_runs_or_it_is_uncordoned() -> (
    None
):
    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    for i in range(3):
        running(f"j{i}", job(), log=log).event(subj.node(N0), _start_fault(f"j{i}"))
        assert fold(log).nodes[N0].start_faults == tuple(f"j{k}" for k in range(i + 1))
    # A worker that ran here and ended, even failing: the node could start it.
    running("ok", job(), log=log).exited(N0, "ok", code=3)
    assert fold(log).nodes[N0].start_faults == ()
    running("j9", job(), log=log).event(subj.node(N0), _start_fault("j9"))
    log.admin("cordon", CordonNode(node=N0, reason="quarantined"))
    assert fold(log).nodes[N0].start_faults == ("j9",)  # a cordon keeps the count
    log.admin("cordon", CordonNode(node=N0, cordoned=False))
    assert fold(log).nodes[N0].start_faults == ()


def test_one_job_whose_starts_nodes_keep_failing_counts_once_and_is_charged_past_its_free_ones() -> None:
    # A job can make its own starts fail on any node (links left in its directories, where a
    # node's agent cannot tell): counted once per node, it cordons none, and past
    # NODE_FAULTS_FREE of them the next is its own failure, not a free requeue for ever.
    log = running(spec=job().restarts(1), nodes=Cluster(1))
    for attempt in range(NODE_FAULTS_FREE):
        log.event(subj.node(N0), _start_fault(attempt=attempt)).requeue("j1", attempt)
        log.admit("j1", attempt=attempt + 1).place(on(N0, 0, job_id="j1", attempt=attempt + 1))
        log.started(N0, "j1", attempt=attempt + 1)
    state = fold(log)
    j = state.jobs["j1"]
    assert (j.fault_nodes, j.restarts, j.attempt) == ((N0,) * NODE_FAULTS_FREE, 0, NODE_FAULTS_FREE)
    assert state.nodes[N0].start_faults == ("j1",)
    # Another job's worker runs on the node: its run of failed starts is over.
    running("ok", job(), log=log, gpus=(1,)).exited(N0, "ok", code=0)
    assert fold(log).nodes[N0].start_faults == ()
    state = fold(log.event(subj.node(N0), _start_fault(attempt=NODE_FAULTS_FREE)))
    j = state.jobs["j1"]
    assert (j.phase, j.restarts, j.reasons[0].code) == ("interrupted", 1, "restarting")
    assert f"after {NODE_FAULTS_FREE} starts nodes failed" in j.reasons[0].message
    # Charged to the job, it is taken for the job's doing: no step towards the node's quarantine.
    assert state.nodes[N0].start_faults == ()


def test_a_start_that_failed_for_the_jobs_own_fault_says_why() -> None:
    # It said "rank 0 exited with code 127": its owner could not tell a missing command from a
    # command that ran and failed, the agent's words in the node's log alone.
    why = "cannot run bwrap: bwrap: execvp no-such-command: No such file or directory"
    body = WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=127, start_error=why)
    state = fold(running(spec=job().restarts(1), nodes=Cluster(2)).event(subj.node(N0), body))
    j = state.jobs["j1"]
    assert (j.phase, j.restarts) == ("interrupted", 1)
    assert j.reasons == (Reason("restarting", f"rank 0 could not start: {why}; restart 1"),)
    assert state.nodes[N0].start_faults == () and j.fault_nodes == ()  # the job's, not the node's


@pytest.mark.parametrize(
    ("code", "stopped"),
    [(0, False), (127, True)],
)
def test_a_node_fault_on_an_exit_that_is_no_failure_changes_nothing(code: int, stopped: bool) -> None:
    # A clean exit, or one corral stopped, is no start the node failed, whatever its agent says.
    body = WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=code, stopped=stopped)
    plain = fold(running(spec=job(), nodes=Cluster(2)).event(subj.node(N0), body))
    faulted = msgspec.structs.replace(body, node_fault="the node's fault, it says")
    state = fold(running(spec=job(), nodes=Cluster(2)).event(subj.node(N0), faulted))
    j, k = state.jobs["j1"], plain.jobs["j1"]
    assert (j.phase, j.reasons, j.restarts) == (k.phase, k.reasons, k.restarts)
    assert state.nodes[N0].start_faults == ()


def _exit_with(xid: int, uuid: str = f"GPU-{N0}-00") -> WorkerExited:
    return WorkerExited(node=N0, job_id="j1", attempt=0, rank=0, code=1, xids=(XidReport(0, xid, uuid=uuid),))


def test_a_worker_that_dies_of_its_gpus_fault_is_not_charged_for_it() -> None:
    # XID 48 (double-bit ECC) killed the worker milliseconds before the health monitor's next
    # heartbeat said the GPU was bad: the exit counted as the job's failure, and a job that may
    # not restart failed; one that may was restarted, maybe on the same GPU.
    def ran() -> LogBuilder:
        return running(spec=job().restarts(0, "never"), nodes=Cluster(2))

    state = fold(ran().event(subj.node(N0), _exit_with(48)))
    j, gpu = state.jobs["j1"], state.nodes[N0].gpus[0]
    assert (j.phase, j.restarts, gpu.healthy, gpu.signal) == ("interrupted", 0, False, "xid:48"), j.reasons
    assert holders(state)[0] == {}
    # An application's XID (13: the job's own fault) is the job's failure, the GPU kept.
    state = fold(
        running(spec=job().restarts(0, "never"), nodes=Cluster(2)).event(subj.node(N0), _exit_with(13))
    )
    assert state.jobs["j1"].phase == "failed" and state.nodes[N0].gpus[0].healthy
    # Stopping for another job when it died of it, the GPU is failed all the same: the job it
    # stops for was about to be placed on it.
    stopping = ran().submit("bob", "b", job().gpus(8)).accept("b", priority=9).preempt("b", "j1")
    state = fold(stopping.event(subj.node(N0), _exit_with(48)))
    assert not state.nodes[N0].gpus[0].healthy and state.jobs["j1"].phase in ("preempted", "interrupted")
    # A gang's second rank dying of its own GPU after the first: its GPU is failed too, though
    # the job was interrupted by the first (its restart was placed on that GPU).
    gang = queued(spec=job().replicas(2)).admit("j1", replicas=2)
    gang.place(placement("j1", worker(0, N0, whole(0)), worker(1, N0, whole(1))))
    gang.started(N0, "j1", rank=0).started(N0, "j1", rank=1).event(subj.node(N0), _exit_with(48))
    second = WorkerExited(
        node=N0, job_id="j1", attempt=0, rank=1, code=1, xids=(XidReport(1, 48, uuid=f"GPU-{N0}-01"),)
    )
    state = fold(gang.event(subj.node(N0), second))
    assert [g.healthy for g in state.nodes[N0].gpus[:2]] == [False, False] and state.jobs["j1"].held is None
    # An XID of a GPU the worker did not run on says nothing of its exit.
    other = _exit_with(48, uuid=f"GPU-{N0}-03")
    state = fold(ran().event(subj.node(N0), other))
    assert state.jobs["j1"].phase == "failed" and all(g.healthy for g in state.nodes[N0].gpus)


def test_a_broken_gang_keeps_its_gpus_until_its_last_worker_is_gone() -> None:
    log = queued(spec=job().replicas(2)).admit("j1", replicas=2)
    log.place(placement("j1", worker(0, N0, whole(0)), worker(1, N1, whole(0))))
    log.started(N0, "j1", rank=0).started(N1, "j1", rank=1).exited(N0, "j1", rank=0, code=1)
    state = fold(log)
    assert state.jobs["j1"].phase == "interrupted" and holders(state, N1)[0] == {"j1": 1000}
    state = fold(log.exited(N1, "j1", rank=1, code=143, stopped=True))
    assert holders(state, N0)[0] == {} and holders(state, N1)[0] == {} and state.jobs["j1"].held is None


def test_a_gang_rank_that_ends_before_another_starts_leaves_the_gpus_held_for_it() -> None:
    # Rank 0 ran and exited 0 before rank 1 started (a short rank, or start skew across nodes):
    # the gang's GPUs were all given back, another job was placed on rank 1's, and rank 1 then
    # started there too.
    log = queued(spec=job().replicas(2)).admit("j1", replicas=2)
    log.place(placement("j1", worker(0, N0, whole(0)), worker(1, N0, whole(1))))
    state = fold(log.started(N0, "j1", rank=0).exited(N0, "j1", rank=0, code=0))
    assert state.jobs["j1"].phase == "starting" and holders(state)[1] == {"j1": 1000}
    log.submit("bob", "x", job()).accept("x").admit("x").place(on(N0, 1, job_id="x"))
    state = fold(log.started(N0, "j1", rank=1))
    assert state.jobs["x"].phase == "admitted" and state.jobs["j1"].live == {1}
    state = fold(log.exited(N0, "j1", rank=1, code=0))
    assert state.jobs["j1"].phase == "succeeded" and holders(state)[:2] == [{}, {}]


def test_straggler_of_an_old_attempt_only_gives_back_gpus() -> None:
    log = running(nodes=Cluster(2)).gpu_health(N0, 0, False).requeue("j1", 0)
    state = fold(log)
    assert state.jobs["j1"].attempt == 1 and holders(state)[0] == {"j1": 1000}
    state = fold(log.exited(N0, "j1", code=137, attempt=0))
    assert state.jobs["j1"].phase == "queued" and holders(state)[0] == {} and state.rejected_total == 0


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (lambda log: log.started(N0, "j1", rank=1), "illegal"),
        (lambda log: log.started(N1, "j1", rank=0), "illegal"),
        (lambda log: log.started(N0, "j1", attempt=1), "illegal"),
        (lambda log: log.started(N0, "j1"), "illegal"),
        (lambda log: log.exited(N0, "j1", rank=3), "illegal"),
        (lambda log: log.exited(N0, "j1", attempt=2), "illegal"),
        (lambda log: log.checkpoint(N0, "j1", step=1, attempt=2), "illegal"),
        (lambda log: log.started(N0, "j9"), "unknown"),
        (lambda log: log.requeue("j1", 0), "illegal"),
        (lambda log: log.requeue("j1", 3), "void"),
        (lambda log: log.gpu_health(N0, 8, False), "unknown"),
        (lambda log: log.condition("node-99", "lost"), "unknown"),
        (lambda log: log.exited(N0, "j1", attempt=-1), "malformed"),
        (lambda log: log.exited(N0, "j1", rank=-1), "malformed"),
        (lambda log: log.started(N0, "j1", attempt=-1), "malformed"),
        (lambda log: log.checkpoint(N0, "j1", step=1, attempt=-1), "malformed"),
    ],
    ids=[
        "start-unplaced-rank",
        "start-on-other-node",
        "start-future-attempt",
        "start-twice",
        "exit-of-rank-not-running",
        "exit-future-attempt",
        "checkpoint-future-attempt",
        "start-unknown-job",
        "requeue-running",
        "requeue-stale-attempt",
        "gpu-out-of-range",
        "unknown-node",
        "exit-negative-attempt",
        "exit-negative-rank",
        "start-negative-attempt",
        "checkpoint-negative-attempt",
    ],
)
def test_worker_and_node_reports_that_do_not_fit_are_refused(
    event: Callable[[LogBuilder], LogBuilder], code: str
) -> None:
    log = running(nodes=Cluster(2))
    before = fold(log)
    state = fold(event(log))
    assert last(state).code == code
    assert state.jobs == before.jobs and state.nodes == before.nodes


# -- preemption -----------------------------------------------------------------------------------


def _victim_and_beneficiary(
    victim: SpecLike | None = None, priority: int = 0, queue: str = "team-a"
) -> LogBuilder:
    """A victim running in team-a, and a beneficiary of priority 10 (in its queue, by default:
    a job of another queue may stop it only while its queue borrows)."""
    log = two_nodes().submit("alice", "v", victim or job().checkpointable())
    log.accept("v", priority).admit("v").place(on(N0, 0, job_id="v")).started(N0, "v")
    return log.submit("bob", "b", job(queue)).accept("b", priority=10)


def test_preemption_checkpoints_stops_and_requeues_keeping_the_checkpoint() -> None:
    log = _victim_and_beneficiary().preempt("b", "v")
    state = fold(log)
    v = state.jobs["v"]
    assert (v.phase, v.preemptions, v.reasons[0].code) == ("checkpointing", 1, "preempted")
    assert holders(state)[0] == {"v": 1000}
    log.checkpoint(N0, "v", step=900)
    state = fold(log.exited(N0, "v", code=0, stopped=True))
    v = state.jobs["v"]
    assert v.phase == "preempted" and holders(state)[0] == {} and v.held is None
    state = fold(log.requeue("v", 0, code="preempted"))
    v = state.jobs["v"]
    assert (v.phase, v.attempt) == ("queued", 1)
    assert v.checkpoint is not None and (v.checkpoint.step, v.checkpoint.attempt) == (900, 0)
    assert v.restarts == 0  # preemption is not the job's failure


def test_older_checkpoint_does_not_replace_a_newer_one() -> None:
    state = fold(_victim_and_beneficiary().checkpoint(N0, "v", step=900).checkpoint(N0, "v", step=800))
    assert state.jobs["v"].checkpoint is not None and state.jobs["v"].checkpoint.step == 900


def test_preempting_a_placed_job_that_never_started_frees_it_at_once() -> None:
    log = two_nodes().submit("alice", "v").accept("v").admit("v").place(on(N0, 0, job_id="v"))
    log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v")
    state = fold(log)
    assert state.jobs["v"].phase == "preempted" and holders(state)[0] == {}


def _no_preempt_class(log: LogBuilder) -> LogBuilder:
    log.admin(
        "priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("normal", 0, preemptible=False))
    )
    return log


@pytest.mark.parametrize(
    "make",
    [
        lambda: _victim_and_beneficiary(victim=job().preemptible(False)).preempt("b", "v"),
        lambda: _no_preempt_class(_victim_and_beneficiary()).preempt("b", "v"),
        lambda: _victim_and_beneficiary(priority=10, queue="team-a").preempt("b", "v"),
        lambda: _victim_and_beneficiary(priority=50, queue="team-a").preempt("b", "v"),
        lambda: _victim_and_beneficiary().preempt("nobody", "v"),
        lambda: _victim_and_beneficiary().request("bob", "cancel", {"job_id": "b"}).preempt("b", "v"),
        lambda: _victim_and_beneficiary().preempt("b", "v", attempt=1),
        lambda: _victim_and_beneficiary().preempt("b", "v", "ghost"),
        lambda: _victim_and_beneficiary().submit("carol", "q").accept("q").preempt("b", "v", "q"),
    ],
    ids=[
        "victim-not-preemptible",
        "victim-class-not-preemptible",
        "same-queue-same-priority",
        "same-queue-higher-priority",
        "unknown-beneficiary",
        "beneficiary-cancelled",
        "victim-stale-attempt",
        "unknown-victim",
        "victim-not-running",
    ],
)
def test_preemption_that_no_longer_holds_is_void_and_changes_nothing(make: Callable[[], LogBuilder]) -> None:
    log = make()
    before = LogBuilder()
    before.records = log.records[:-1]
    state = fold(log)
    assert last(state).code == "void"
    assert state.jobs == fold(before).jobs and state.nodes == fold(before).nodes


def test_lower_priority_victim_of_the_same_queue_may_be_preempted() -> None:
    state = fold(_victim_and_beneficiary(priority=1, queue="team-a").preempt("b", "v"))
    assert state.jobs["v"].phase == "checkpointing"


def _priority(log: LogBuilder, job_id: str, priority: int) -> LogBuilder:
    why = Reason("attained-service", "ran its share")
    return log.event(subj.job(job_id), JobPriorityChanged(job_id=job_id, priority=priority, reason=why))


@pytest.mark.parametrize(
    ("victim_priority", "beneficiary_priority", "phase"),
    [(0, 10, "checkpointing"), (10, 10, "running"), (10, 11, "checkpointing"), (-5, -6, "running")],
    ids=["lowered-below", "raised-to-equal", "beneficiary-raised-above", "beneficiary-lowered-below"],
)
def test_the_preemption_rule_reads_the_priority_a_job_has_now(
    victim_priority: int, beneficiary_priority: int, phase: str
) -> None:
    log = _victim_and_beneficiary(priority=0, queue="team-a")
    _priority(_priority(log, "v", victim_priority), "b", beneficiary_priority).preempt("b", "v")
    state = fold(log)
    assert state.jobs["v"].priority == victim_priority
    assert state.jobs["v"].phase == phase


@pytest.mark.parametrize("when", ["submitted", "finished"])
def test_a_priority_change_of_a_job_not_accepted_or_over_is_refused(when: str) -> None:
    log = two_nodes().submit("alice", "j")
    if when == "finished":
        log.accept("j").request("alice", "cancel", {"job_id": "j"})
    state = fold(_priority(log, "j", 7))
    assert last(state).code == "illegal"
    assert state.jobs["j"].priority == 0


def test_preemption_naming_a_victim_twice_changes_nothing_or_everything() -> None:
    log = two_nodes().submit("alice", "v").accept("v").admit("v").place(on(N0, 0, job_id="v"))
    log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v", "v")
    state = fold(log)
    refused = state.rejected_total > 0
    assert refused == (state.jobs["v"].phase == "placed")


# -- node and GPU failures ------------------------------------------------------------------------


def test_node_lost_interrupts_its_jobs_and_gives_their_gpus_back() -> None:
    log = running(spec=job().gpus(2).cpu(4000), gpus=(0, 1), nodes=Cluster(2)).condition(N0, "lost")
    state = fold(log)
    j = state.jobs["j1"]
    assert (j.phase, j.reasons[0].code, j.restarts) == ("interrupted", "interrupted", 0)
    assert holders(state)[:2] == [{}, {}] and state.nodes[N0].cpu_used == 0 and j.live == set()
    assert state.nodes[N0].condition == "lost"


def test_node_lost_leaves_jobs_elsewhere_alone() -> None:
    log = running(nodes=Cluster(2)).condition(N1, "lost")
    assert fold(log).jobs["j1"].phase == "running"


@dataclass
class Shutdown:
    id: str
    story: Callable[[], LogBuilder]
    phases: dict[str, str]  # job -> phase after the story
    restarts: dict[str, int]  # job -> restarts counted
    refused: str | None = None  # the code of the story's last rejection, if any


def _gang_on_both() -> LogBuilder:
    log = queued("g", spec=job().replicas(2).restarts(2)).admit("g", replicas=2)
    log.place(placement("g", worker(0, N0, whole(0)), worker(1, N1, whole(0))))
    return log.started(N0, "g", rank=0).started(N1, "g", rank=1)


def _two_jobs(spec: JobBuilder) -> LogBuilder:
    return running("far", node=N1, spec=spec, log=running("here", spec=spec, nodes=Cluster(2)))


def _shut_down_twice() -> LogBuilder:
    log = (
        running(spec=job().restarts(1), nodes=Cluster(2))
        .shutdown(N0)
        .exited(N0, "j1", code=143, stopped=True)
    )
    log.node(N0, Cluster(2).nodes[0][1])  # its agent back
    log.requeue("j1", 0).admit("j1", attempt=1).place(on(N0, 0, job_id="j1", attempt=1))
    log.started(N0, "j1", attempt=1).shutdown(N0)
    return log.exited(N0, "j1", code=143, attempt=1, stopped=True)


SHUTDOWNS = [
    Shutdown(
        "stopped-workers-are-not-charged",
        lambda: (
            running(spec=job().restarts(1), nodes=Cluster(2))
            .shutdown(N0, "corral up stopped")
            .exited(N0, "j1", code=143, stopped=True)
        ),
        {"j1": "interrupted"},
        {"j1": 0},
    ),
    Shutdown(
        "a-job-with-no-restarts-left-is-requeued-not-failed",
        lambda: (
            running(spec=job().restarts(0), nodes=Cluster(2))
            .shutdown(N0)
            .exited(N0, "j1", code=137, stopped=True)
        ),
        {"j1": "interrupted"},
        {"j1": 0},
    ),
    Shutdown("shut-down-twice-still-nothing-counted", _shut_down_twice, {"j1": "interrupted"}, {"j1": 0}),
    Shutdown(
        "a-crash-before-the-shutdown-still-counts",
        lambda: running(spec=job().restarts(1), nodes=Cluster(2)).exited(N0, "j1", code=1).shutdown(N0),
        {"j1": "interrupted"},
        {"j1": 1},
    ),
    Shutdown(
        "placed-not-started-goes-back",
        lambda: queued().admit("j1").place(on(N0, 0, job_id="j1")).shutdown(N0),
        {"j1": "interrupted"},
        {"j1": 0},
    ),
    Shutdown(
        "a-job-on-another-node-runs-on",
        lambda: running("far", node=N1, nodes=Cluster(2)).shutdown(N0),
        {"far": "running"},
        {"far": 0},
    ),
    Shutdown(
        "a-gang-across-nodes-goes-back-whole-and-its-other-ranks-exits-are-stragglers",
        lambda: _gang_on_both().shutdown(N0).exited(N1, "g", rank=1, code=1),
        {"g": "interrupted"},
        {"g": 0},
    ),
    Shutdown(
        "a-crash-elsewhere-during-the-shutdown-is-charged-to-its-own-job",
        lambda: _two_jobs(job().restarts(2)).shutdown(N0).exited(N1, "far", code=1),
        {"here": "interrupted", "far": "interrupted"},
        {"here": 0, "far": 1},
    ),
    Shutdown(
        "no-agent-may-end-another-nodes-rank",
        lambda: (
            running("far", node=N1, nodes=Cluster(2), spec=job().restarts(2))
            .shutdown(N0)
            .exited(N0, "far", code=143, stopped=True)
        ),
        {"far": "running"},
        {"far": 0},
        "illegal",
    ),
    Shutdown(
        "an-unknown-node-shuts-nothing-down",
        lambda: running(nodes=Cluster(2)).shutdown("node-99"),
        {"j1": "running"},
        {"j1": 0},
        "unknown",
    ),
]


@pytest.mark.parametrize("case", SHUTDOWNS, ids=[c.id for c in SHUTDOWNS])
def test_a_node_shut_down_on_purpose_charges_no_restart(case: Shutdown) -> None:
    state = fold(case.story())
    assert {j: state.jobs[j].phase for j in case.phases} == case.phases
    assert {j: state.jobs[j].restarts for j in case.restarts} == case.restarts
    assert (last(state).code if state.rejections else None) == case.refused


def test_a_shut_down_nodes_gpus_are_held_until_its_workers_exit() -> None:
    log = running(spec=job().gpus(2), gpus=(0, 1), nodes=Cluster(2)).shutdown(N0)
    state = fold(log)
    assert state.jobs["j1"].live == {0} and holders(state)[:2] == [{"j1": 1000}] * 2
    # Its own reason code: a planned stop told from a fault by what a program reads, not words.
    assert state.jobs["j1"].reasons[0] == Reason(fold_nodes.SHUT_DOWN, f"node {N0} shut down")
    state = fold(log.exited(N0, "j1", code=143, stopped=True))
    assert holders(state)[:2] == [{}, {}] and state.jobs["j1"].held is None and state.rejected_total == 0


def test_a_shutdowns_reason_is_kept_to_a_line_in_the_jobs_it_interrupts() -> None:
    # Every job on the node, whichever tenant's, takes it as its reason, shown in each listing:
    # a node's agent sending a report's worth of reason made each of them that large.
    state = fold(running(nodes=Cluster(2)).shutdown(N0, "r" * 200_000))
    message = state.jobs["j1"].reasons[0].message
    assert message.startswith(f"node {N0} shut down: rrr") and len(message) < 600


def test_gpu_unhealthy_interrupts_the_job_holding_it_only() -> None:
    log = running("j1", gpus=(0,), nodes=Cluster(2))
    running("j2", gpus=(1,), log=log).gpu_health(N0, 0, False, signal="xid:79")
    state = fold(log)
    assert state.jobs["j1"].phase == "interrupted" and "xid:79" in state.jobs["j1"].reasons[0].message
    assert state.jobs["j2"].phase == "running"
    assert not gpu(state, 0).healthy and gpu(state, 0).signal == "xid:79"
    assert gpu(state, 0).holders == {"j1": 1000}  # its worker may still be on it
    state = fold(log.exited(N0, "j1", code=137))
    assert gpu(state, 0).holders == {} and state.jobs["j1"].phase == "interrupted"
    state = fold(log.gpu_health(N0, 0, True, signal=""))
    assert gpu(state, 0).healthy


def test_gpu_unhealthy_while_checkpointing_ends_the_preemption() -> None:
    state = fold(_victim_and_beneficiary().preempt("b", "v").gpu_health(N0, 0, False))
    assert state.jobs["v"].phase == "preempted"


def test_gpu_unhealthy_before_any_worker_started_gives_the_gpus_back() -> None:
    log = queued(spec=job().gpus(2)).admit("j1").place(on(N0, 0, 1, job_id="j1")).gpu_health(N0, 0, False)
    state = fold(log)
    assert state.jobs["j1"].phase == "interrupted"
    assert holders(state)[:2] == [{}, {}]
    state = fold(log.requeue("j1", 0).admit("j1", attempt=1).place(on(N0, 2, 3, job_id="j1", attempt=1)))
    assert state.jobs["j1"].phase == "placed"


def test_cordon_keeps_running_work_and_blocks_new_work() -> None:
    log = running(nodes=Cluster(2)).cordon(N0)
    state = fold(log)
    assert state.jobs["j1"].phase == "running" and state.nodes[N0].cordoned
    log.submit("alice", "j2").accept("j2").admit("j2").place(on(N0, 1, job_id="j2"))
    assert last(fold(log)).code == "void"


def test_drain_asks_the_work_on_the_node_to_checkpoint_and_keeps_its_gpus_until_workers_exit() -> None:
    # Interrupted at once, a job that checkpoints when asked resumed from its last periodic
    # checkpoint, or from the start; a preemption asks for one first, and so does a drain.
    log = running(nodes=Cluster(2)).cordon(N0, drain=True)
    state = fold(log)
    j1 = state.jobs["j1"]
    assert state.nodes[N0].draining and j1.phase == "checkpointing"
    assert j1.preempt_deadline == j1.phase_since + j1.spec.grace_seconds and j1.preemptions == 0
    assert j1.reasons[0].code == "drained" and "draining" in j1.reasons[0].message
    assert j1.live and gpu(state, 0).holders == {"j1": 1000}  # its worker is still checkpointing
    state = fold(log.checkpoint(N0, "j1", step=7).exited(N0, "j1", code=143, stopped=True))
    j1 = state.jobs["j1"]
    assert j1.phase == "preempted" and j1.checkpoint is not None and j1.checkpoint.step == 7
    assert gpu(state, 0).holders == {} and state.faults == 0
    requeued = [e for e in admission.decide(state, state.time) if isinstance(e, JobRequeued)]
    assert [(e.job_id, e.resume_from) for e in requeued] == [("j1", "/ckpt/j1/7")]


def test_drain_names_no_beneficiary_and_gives_at_most_the_queues_grace() -> None:
    # v, once preempted for b and running again, still named b: drained, it checkpointed as b's
    # victim, and admission held b back for it. A tenant's day of grace held the drain a day.
    log = LogBuilder().nodes(Cluster(2)).queues("team-a")
    log.submit("alice", "v", job().checkpointable().gpus(1))
    log.accept("v").admit("v").place(on(N0, 0, job_id="v")).started(N0, "v")
    log.submit("bob", "b", job("team-a").gpus(8)).accept("b", priority=10).preempt("b", "v")
    log.checkpoint(N0, "v", step=3).exited(N0, "v", code=0, stopped=True)
    log.requeue("v", 0).admit("v", attempt=1).place(on(N1, 0, job_id="v", attempt=1)).started(
        N1, "v", attempt=1
    )
    state = fold(log.cordon(N1, drain=True))
    v = state.jobs["v"]
    assert v.phase == "checkpointing" and v.preempted_for == "" and not state.naming_by_beneficiary
    assert [
        a.job_id
        for e in admission.decide(state, state.time)
        if isinstance(e, JobsAdmitted)
        for a in e.admissions
    ] == ["b"]
    log = LogBuilder().nodes(Cluster(2)).queues("team-a")
    log.submit("alice", "slow", msgspec.structs.replace(job().build(), grace_seconds=86_400.0))
    log.accept("slow").admit("slow").place(on(N0, 0, job_id="slow")).started(N0, "slow")
    slow = fold(log.cordon(N0, drain=True)).jobs["slow"]
    assert slow.preempt_deadline == slow.phase_since + 600.0  # the queue's max_grace_seconds


def test_drain_stops_at_once_a_job_whose_workers_have_not_started() -> None:
    log = (
        two_nodes()
        .queues("team-a")
        .submit("alice", "j1")
        .accept("j1")
        .admit("j1")
        .place(on(N0, 0, job_id="j1"))
    )
    state = fold(log.cordon(N0, drain=True))
    assert state.jobs["j1"].phase == "preempted" and gpu(state, 0).holders == {}


def test_reregistering_keeps_held_gpus_and_failed_ones() -> None:
    log = running(nodes=Cluster(2)).gpu_health(N0, 5, False).node(N0, Cluster(2).nodes[0][1])
    state = fold(log)
    assert gpu(state, 0).holders == {"j1": 1000} and not gpu(state, 5).healthy and gpu(state, 6).healthy
    assert state.nodes[N0].cpu_used == 1000


@pytest.mark.parametrize(
    "inventory",
    [
        NodeInventory(1, 1, (Cluster().nodes[0][1].gpus[1],)),
        NodeInventory(1, 1, Cluster().nodes[0][1].gpus[::-1]),
    ],
    ids=["gap-in-indices", "indices-out-of-order"],
)
def test_node_with_misnumbered_gpus_is_malformed(inventory: NodeInventory) -> None:
    state = fold(LogBuilder().node(N0, inventory))
    assert state.nodes == {} and last(state).code == "malformed"


def _gpu(index: int, **kw: object) -> GpuInfo:
    return msgspec.structs.replace(Cluster().nodes[0][1].gpus[0], index=index, uuid=f"GPU-x-{index}", **kw)


@pytest.mark.parametrize(
    "inventory",
    [
        NodeInventory(1, 1, tuple(_gpu(i) for i in range(9000))),
        NodeInventory(-1, 1, ()),
        NodeInventory(1, -1, ()),
        NodeInventory(1, 1, (_gpu(0, memory_mib=-5),)),
        NodeInventory(1, 1, (_gpu(0, nvlinks=-1),)),
        NodeInventory(1, 1, (_gpu(0, island=2**62),)),
        NodeInventory(1, 1, (), max_workers=0),
        NodeInventory(1, 1, (), max_workers=10**9),
        NodeInventory(1, 1, (), labels={"profile": "x" * 1_000_000}),
        NodeInventory(1, 1, (), labels={f"l{i}": "v" for i in range(65)}),
        NodeInventory(1, 1, (), labels={"rack": "a\nb"}),
        NodeInventory(1, 1, (), labels={"rack": "\U0001f600" * 100}),  # 100 characters, 400 bytes
        NodeInventory(1, 1, (_gpu(0, model="H" * 129),)),
        NodeInventory(1, 1, (_gpu(0, model=""),)),
        NodeInventory(1, 1, (msgspec.structs.replace(_gpu(0), uuid="GPU-" + "0" * 200),)),
    ],
    ids=[
        "9000-gpus",
        "negative-cpu",
        "negative-memory",
        "negative-gpu-memory",
        "negative-nvlinks",
        "no-island",
        "no-workers",
        "a-billion-workers",
        "a-megabyte-label",
        "65-labels",
        "a-label-with-a-newline",
        "a-label-of-400-bytes",
        "a-long-model-name",
        "no-model",
        "a-long-uuid",
    ],
)
def test_a_node_that_claims_the_impossible_is_malformed(inventory: NodeInventory) -> None:
    # One registration of 9,000 GPUs drew every tenant's work to the node and made the GPU grid
    # larger than a message for every reader; a megabyte label on one node made every tenant's
    # GPU grid and node list larger than a message.
    state = fold(LogBuilder().node(N0, inventory))
    assert state.nodes == {} and last(state).code == "malformed", last(state)


# -- bad input ------------------------------------------------------------------------------------

WRONG_SUBJECT: list[tuple[str, str, Event]] = [
    ("accept-on-other-job", subj.job("j2"), JobAccepted(job_id="j1", priority=0)),
    ("accept-on-node", subj.node("j1"), JobAccepted(job_id="j1", priority=0)),
    ("start-on-other-node", subj.node(N1), WorkerStarted(node=N0, job_id="j1", attempt=0, rank=0)),
    ("register-other-node", subj.node(N1), NodeRegistered(node=N0, inventory=NodeInventory(1, 1))),
    ("placement-by-admission", subj.decision("admission"), JobsPlaced(based_on=0, now=0.0, placements=())),
    ("admission-by-placer", subj.decision("placer"), JobsAdmitted(based_on=0, now=0.0, admissions=())),
    (
        "preemption-by-placer",
        subj.decision("placer"),
        PreemptionRequested(based_on=0, now=0.0, beneficiary="j1", victims=(Victim("j1", 0),), deadline=0.0),
    ),
    ("placement-on-job", subj.job("j1"), JobsPlaced(based_on=0, now=0.0, placements=())),
]


@pytest.mark.parametrize(
    ("subject", "body"), [w[1:] for w in WRONG_SUBJECT], ids=[w[0] for w in WRONG_SUBJECT]
)
def test_event_on_a_subject_it_does_not_speak_for_is_forbidden(subject: str, body: Event) -> None:
    log = queued()
    before = fold(log)
    state = fold(log.event(subject, body))
    assert last(state).code == "forbidden"
    assert state.jobs == before.jobs and state.nodes == before.nodes


def test_request_sealed_as_a_service_event_is_refused() -> None:
    state = fold(LogBuilder().event(subj.job("j1"), SubmitJob(request_id="j1", job=job().build())))
    assert state.jobs == {} and last(state).code == "unknown"


GARBAGE = [
    b"",
    b"\x00\xff\xfe",
    b"{",
    b"[]",
    b"null",
    b'{"request_id": 5}',
    b'{"body": {"type": "Nope"}}',
    b'"x"' * 3,
]


@pytest.mark.parametrize("data", GARBAGE, ids=[f"garbage-{i}" for i in range(len(GARBAGE))])
@pytest.mark.parametrize("subject", [subj.request("alice", "submit"), subj.job("j1"), subj.node(N0)])
def test_garbage_is_malformed(subject: str, data: bytes) -> None:
    log = queued()
    before = fold(log)
    state = fold(log.raw(subject, data))
    assert last(state).code == "malformed"
    assert state.jobs == before.jobs and state.nodes == before.nodes and state.seq == before.seq + 1


def test_envelope_with_a_wrong_body_type_is_malformed() -> None:
    env = codec.encode(codec.seal(JobAccepted(job_id="j1", priority=0), event_id="e", time=0.0, producer="p"))
    state = fold(LogBuilder().raw(subj.job("j1"), env.replace(b'"priority":0', b'"priority":"high"')))
    assert last(state).code == "malformed"


@pytest.mark.parametrize(
    "subject",
    [
        "foo.bar",
        "corral.in.alice",
        "corral.in.alice.submit.now",
        "corral.in.alice.launch",
        "corral.hb.node-00",
        "",
    ],
    ids=["not-corral", "no-verb", "extra-token", "unknown-verb", "heartbeat", "empty"],
)
def test_unknown_subject_is_unknown(subject: str) -> None:
    state = fold(LogBuilder().raw(subject, codec.encode({"request_id": "j1", "job": {"queue": "q"}})))
    assert state.jobs == {} and last(state).code == "unknown"


def test_rejections_are_counted_all_but_kept_only_the_most_recent() -> None:
    log = LogBuilder()
    for _ in range(MAX_REJECTIONS + 5):
        log.raw("foo", b"")
    state = fold(log)
    assert state.rejected_total == MAX_REJECTIONS + 5 and len(state.rejections) == MAX_REJECTIONS
    assert state.rejections[0].seq == 6 and state.rejections[-1].seq == MAX_REJECTIONS + 5


def test_tenants_whose_refusals_were_let_go_are_kept_within_a_bound() -> None:
    # One entry a tenant whose refusal was ever let go, kept for good: a cluster of many
    # tenants over months grew it without end. Past the bound, the oldest is kept for all.
    from corral.projections.state import MAX_REJECTIONS_LOST
    from corral.services.query.decide import Ask, verdict

    log = LogBuilder()
    tenants = MAX_REJECTIONS_LOST + 40
    for i in range(tenants):
        for _ in range(2):
            log.request(f"t{i}", "cancel", {"job_id": "nope"})
    for _ in range(MAX_REJECTIONS):  # the services' refusals push every tenant's out
        log.raw("foo", b"")
    state = fold(log)
    assert len(state.rejections_lost) == MAX_REJECTIONS_LOST
    assert "t0" not in state.rejections_lost and f"t{tenants - 1}" in state.rejections_lost
    assert state.rejections_lost_floor == 2 * 40  # t39's second cancel
    # t0's refused cancel is told as unknown, not as taken.
    told = verdict(state, "t0", Ask("nope", 1, verb="cancel"))
    assert told is not None and told["verdict"] == "unknown", told


def test_a_tenants_flood_of_bad_requests_pushes_out_only_its_own_refusals() -> None:
    # Mallory's 1,001 cancels of no job erased alice's refusals from the state: her cancel's
    # verdict read "unknown", and her `rejections` were empty.
    log = LogBuilder().request("alice", "cancel", {"job_id": "nope"})
    for _ in range(MAX_REJECTIONS + 1):
        log.request("mallory", "cancel", {"job_id": "nope"})
    state = fold(log)
    kept = [r.subject.split(".")[2] for r in state.rejections]
    assert kept.count("alice") == 1 and kept.count("mallory") == MAX_REJECTIONS_PER_TENANT
    assert state.rejections_lost == {"mallory": state.seq - MAX_REJECTIONS_PER_TENANT}
    # Nor on subjects of hers the fold cannot read as a request: they are hers all the same.
    log = LogBuilder().request("alice", "cancel", {"job_id": "nope"})
    for i in range(2 * MAX_REJECTIONS):
        log.raw("corral.in.mallory" if i % 2 else f"corral.in.mallory.cancel.{i}", b"{}")
    state = fold(log)
    kept = [r.subject for r in state.rejections]
    assert kept.count("corral.in.alice.cancel") == 1, kept[:3]
    by_tenant: dict[str, list[int]] = {}
    for r in state.rejections:
        by_tenant.setdefault(requester(r.subject), []).append(r.seq)
    assert state.rejections_kept == by_tenant


def test_stream_time_never_goes_backwards() -> None:
    state = fold(LogBuilder(start_time=50.0).submit("alice", "j1"))
    apply(state, Record(state.seq + 1, "foo", b"", None, 10.0))
    assert (state.time, state.seq) == (50.0, 2)


@pytest.mark.parametrize(
    ("node", "code"),
    [(N1, None), (N0, "illegal"), ("node-99", "unknown")],
    ids=["idle-node", "node-holding-work", "unknown-node"],
)
def test_delete_node(node: str, code: str | None) -> None:
    # j1 runs on node-00; node-01 holds nothing.
    log = queued().admit("j1").place(on(N0, 0, job_id="j1")).started(N0, "j1")
    state = fold(log.admin("delete-node", DeleteNode(node=node)))
    indexes.check(state)
    if code is None:
        assert set(state.nodes) == {N0} and node not in state.holding_by_node
    else:
        assert set(state.nodes) == {N0, N1} and last(state).code == code
    if code == "illegal":
        assert last(state).message == "node node-00 holds work of j1: drain it first"


def test_a_deleted_node_that_registers_again_is_new() -> None:
    log = two_nodes().admin("cordon", CordonNode(node=N1)).admin("delete-node", DeleteNode(node=N1))
    assert set(fold(log).nodes) == {N0}
    inventory = fold(two_nodes()).nodes[N1].inventory
    state = fold(log.node(N1, inventory))
    assert set(state.nodes) == {N0, N1} and not state.nodes[N1].cordoned
