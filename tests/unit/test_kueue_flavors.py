"""Preemption for a job that names several GPU models, as Kueue's flavor assigner and preemptor
treat a workload that may use several flavors.

Kueue (``pkg/scheduler/flavorassigner``, default fungibility ``whenCanBorrow: Borrow``,
``whenCanPreempt: TryNextFlavor``) tries each flavor in the workload's order: a flavor it fits
as things are is taken at once; one it could fit only by preempting is passed over for a later
flavor it fits; and only where no flavor fits is preemption tried, on the flavor it ranks first
(``isPreferred``): one where only other queues' borrowers are stopped before one where the
queue's own jobs are, then one where the job borrows nothing once admitted, then the order. Its
preemptor then looks for victims on that flavor only (``preemption_test.go``: "only preempt
workloads using the chosen flavor").

corral's models are Kueue's flavors: a queue's quota per GPU model, a job's ``gpu_models`` in
order. The cluster: one HGX H100 node and one A100 node; cohort ``c``: queue ``a`` with 4 of
each model as nominal, queue ``b`` with none of its own (whatever it holds is borrowed).
"""

from __future__ import annotations

from corral.events import routing
from corral.events import subjects as subj
from corral.events.decisions import JobsPlaced, Placement, PreemptionRequested, Victim, WorkerSlot
from corral.events.jobs import JobsAdmitted, JobSpec, PendingReasonChanged, Resources
from corral.events.nodes import NodeConditionChanged, NodeRegistered
from corral.events.queues import ApplyQueue, PreemptionPolicy, QueueSpec, Quota
from corral.projections.fold import apply_event
from corral.services.admission.decide import decide as admission
from corral.services.admission.order import pending_order
from corral.services.admission.validate import validate
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import decide as preemptor
from tests.builders import TRAIN
from tests.unit.test_preemptor import World, whole

H100, A100 = "H100-80GB", "A100-80GB"
N_H100, N_A100 = "node-00", "node-01"  # the "mixed" profile's first two nodes


def _world(a_a100: int = 4) -> World:
    """Cohort ``c``: queue ``a`` with 4 H100 and ``a_a100`` A100 of nominal, ``b`` with none."""
    w = World(nodes=2, profile="mixed").cohort("c")
    policy = PreemptionPolicy(within_queue="lower-priority", reclaim_within_cohort="any")
    for q in (
        QueueSpec("a", cohort="c", quotas={H100: Quota(4), A100: Quota(a_a100)}, preemption=policy),
        QueueSpec("b", cohort="c", quotas={A100: Quota(0)}, preemption=policy),
    ):
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    return w


def spec(queue: str, n: int, *models: str, **kw: object) -> JobSpec:
    return JobSpec(queue=queue, resources=Resources(gpus=n, gpu_models=models), command=TRAIN, **kw)  # type: ignore[arg-type]


def preemptions(w: World) -> list[PreemptionRequested]:
    return [e for e in w.decide() if isinstance(e, PreemptionRequested)]


def test_a_job_reclaims_its_second_models_nominal_from_a_borrower() -> None:
    # a's H100 are held by its own job of a higher priority, which it may not stop; its A100 are
    # lent to b. Kueue's assigner finds H100 impossible and A100 possible by preemption
    # (reclaim); corral reclaimed only on the first model, so a-next waited for b-run to end.
    w = _world()
    w.run("a-h100", spec("a", 4, H100, preemptible=False), whole(N_H100, 0, 1, 2, 3), priority=10)
    w.run("b-run", spec("b", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.submit("a-next", spec("a", 4, H100, A100), priority=0)
    assert not [a for e in admission(w.state, w.time) for a in getattr(e, "admissions", ())]
    found = preemptions(w)
    assert [(e.beneficiary, len(e.victims)) for e in found] == [("a-next", 1)]
    (e,) = found
    assert e.victims[0].job_id == "b-run" and e.key == A100
    w.emit(subj.decision("preemptor"), e)  # the fold takes it
    victim = e.victims[0].job_id
    assert w.state.jobs[victim].phase == "checkpointing"
    assert w.state.jobs["a-next"].reclaim_key == A100
    w.stop(victim).requeue(victim)
    admitted = [a for ev in w.cycle(admission) for a in getattr(ev, "admissions", ())]
    assert [(a.job_id, dict(a.gpus)) for a in admitted] == [("a-next", {A100: 4})]


def test_no_job_is_stopped_for_one_its_second_model_fits_now() -> None:
    # a-next does not fit H100 (a's own lower-priority job holds them, which it could stop) but
    # fits A100 as things are: admission admits it there, and nobody is stopped (Kueue's
    # TryNextFlavor passes over a flavor it would have to preempt on for one that fits).
    w = _world()
    w.run("a-low", spec("a", 4, H100), whole(N_H100, 0, 1, 2, 3), priority=0)
    w.submit("a-next", spec("a", 4, H100, A100), priority=10)
    assert preemptions(w) == []
    admitted = [a for ev in w.cycle(admission) for a in getattr(ev, "admissions", ())]
    assert [(a.job_id, dict(a.gpus)) for a in admitted] == [("a-next", {A100: 4})]


def test_taking_back_what_was_lent_goes_before_stopping_the_queues_own() -> None:
    # scheduler_test.go "prefer reclamation over cq priority based preemption": both models
    # full, H100 with a's own lower-priority job, A100 with b's borrower. Kueue's flavor
    # assigner ranks a flavor where only other queues' borrowers are stopped (reclaim) above one
    # where the queue's own jobs are (``isPreferred``), whatever their order.
    w = _world()
    w.run("a-low", spec("a", 4, H100), whole(N_H100, 0, 1, 2, 3), priority=0)
    w.run("b-run", spec("b", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.submit("a-next", spec("a", 4, H100, A100), priority=10)
    (e,) = preemptions(w)
    assert ([v.job_id for v in e.victims], e.key) == (["b-run"], A100)


def test_where_both_take_back_the_model_it_borrows_no_more_on_goes_first() -> None:
    # isPreferred, of two flavors alike (other queues' borrowers stopped on each), the one where
    # the job borrows less once admitted: on H100, nominal 0, a would borrow what x gives back;
    # on A100 it is within its own nominal. The models' order only breaks a tie.
    w = World(nodes=2, profile="mixed").cohort("c")
    policy = PreemptionPolicy(
        within_queue="lower-priority", reclaim_within_cohort="any", borrow_within_cohort="lower-priority"
    )
    never = PreemptionPolicy(within_queue="never", reclaim_within_cohort="never")
    for q in (
        QueueSpec("a", cohort="c", quotas={H100: Quota(0), A100: Quota(4)}, preemption=policy),
        QueueSpec("b", cohort="c", quotas={H100: Quota(4), A100: Quota(0)}, preemption=never),
        QueueSpec("x", cohort="c", quotas={H100: Quota(0), A100: Quota(0)}, preemption=never),
    ):
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.run("x-h", spec("x", 4, H100), whole(N_H100, 0, 1, 2, 3))
    w.run("x-a", spec("x", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.submit("a-next", spec("a", 4, H100, A100), priority=10)
    (e,) = preemptions(w)
    assert ([v.job_id for v in e.victims], e.key) == (["x-a"], A100)
    w.emit(subj.decision("preemptor"), e)  # the fold takes it


def test_the_fold_refuses_a_preemption_on_a_model_the_job_does_not_name() -> None:
    w = _world()
    w.run("b-run", spec("b", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.run("a-h100", spec("a", 4, H100, preemptible=False), whole(N_H100, 0, 1, 2, 3), priority=10)
    w.submit("a-next", spec("a", 4, H100), priority=0)
    body = PreemptionRequested(
        based_on=w.seq,
        now=w.time,
        beneficiary="a-next",
        victims=(Victim("b-run", w.state.jobs["b-run"].attempt),),
        deadline=w.time + 30,
        key=A100,
    )
    before = w.state.rejected_total
    w.seq += 1
    apply_event(w.state, w.seq, subj.decision("preemptor"), body, w.time)
    assert w.state.rejected_total == before + 1
    assert "A100" in w.state.rejections[-1].message and w.state.jobs["b-run"].phase == "running"


def test_stops_under_way_keep_their_model() -> None:
    # While a-next's stops on A100 are under way, every reader charges it there; a proposal that
    # would stop more for it on another model is refused (readers would disagree on its key).
    w = _world(a_a100=8)
    w.run("a-h100", spec("a", 4, H100, preemptible=False), whole(N_H100, 0, 1, 2, 3), priority=10)
    w.run("b-1", spec("b", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.run("b-2", spec("b", 4, A100), whole(N_A100, 4, 5, 6, 7))
    w.submit("a-next", spec("a", 4, H100, A100))
    (e,) = preemptions(w)
    assert e.key == A100 and len(e.victims) == 1
    w.emit(subj.decision("preemptor"), e)
    other = "b-2" if e.victims[0].job_id == "b-1" else "b-1"
    again = PreemptionRequested(
        based_on=w.seq,
        now=w.time,
        beneficiary="a-next",
        victims=(Victim(other, w.state.jobs[other].attempt),),
        deadline=w.time + 30,
        key=H100,
    )
    w.seq += 1
    before = w.state.rejected_total
    apply_event(w.state, w.seq, subj.decision("preemptor"), again, w.time)
    assert w.state.rejected_total == before + 1 and "under way" in w.state.rejections[-1].message
    assert w.state.jobs[other].phase == "running" and w.state.jobs["a-next"].reclaim_key == A100
    assert preemptions(w) == []  # its stops are under way: the preemptor leaves it be


def test_a_job_of_several_models_hears_why_each_of_them_does_not_fit() -> None:
    # Both of a's models are held by its own jobs; the reason a-next waits names what stands in
    # its way on each model it may run on, not on its first alone, and says preemption would
    # help (a-low, of a lower priority, holds the A100) though it would not on the first.
    w = _world()
    w.run("a-h100", spec("a", 4, H100, preemptible=False), whole(N_H100, 0, 1, 2, 3), priority=10)
    w.run("a-low", spec("a", 4, A100), whole(N_A100, 0, 1, 2, 3), priority=0)
    w.submit("a-next", spec("a", 4, H100, A100), priority=5)
    (why,) = [
        r
        for e in admission(w.state, w.time)
        if isinstance(e, PendingReasonChanged) and e.job_id == "a-next"
        for r in e.reasons
    ]
    assert why.code == "quota" and why.preemption_helps, why
    assert H100 in why.message and A100 in why.message, why.message
    assert "lower-priority jobs of a gave back 4 A100" in why.message, why.message


def test_the_pending_order_charges_a_job_the_model_admission_would_admit_it_on() -> None:
    # a1 may run on H100 or A100; one H100 is free in the cohort, so admission admits it on a's
    # A100. The order `corral queues` and `explain` show charged it to H100 instead, which put
    # queue a above b's share and a2 behind b's jobs, though admission admits a2 before them.
    w = World(nodes=2, profile="mixed").cohort("c")
    for q in ("a", "b"):
        queue = QueueSpec(q, cohort="c", quotas={H100: Quota(4), A100: Quota(4)})
        w.emit(subj.admin("queue"), ApplyQueue(queue=queue), subj.ADMIN)
    w.run("b-h", spec("b", 5, H100), whole(N_H100, 0, 1, 2, 3, 4))
    w.run("a-h", spec("a", 2, H100, preemptible=False), whole(N_H100, 5, 6))
    w.submit("a1", spec("a", 4, H100, A100))
    w.submit("a2", spec("a", 1, H100))
    w.submit("b1", spec("b", 2, A100))
    w.submit("b2", spec("b", 2, A100))
    admitted = [a.job_id for e in admission(w.state, w.time) for a in getattr(e, "admissions", ())]
    assert admitted == ["a1", "a2", "b1", "b2"]
    assert [j.id for j in pending_order(w.state, w.time)] == admitted


def test_a_job_of_several_models_runs_on_the_one_its_admission_counts_against() -> None:
    # a has no H100 quota of its own; its job names H100 and A100 and is admitted on A100. The
    # placer put it on the H100 node (free, and first in its models), where b's H100 quota was:
    # b's job within its nominal then waited as long as a's ran, with nobody borrowing to
    # reclaim from. Kueue places a workload on its assigned flavor's nodes only.
    w = World(nodes=2, profile="mixed").cohort("c")
    for q in (
        QueueSpec("a", cohort="c", quotas={H100: Quota(0), A100: Quota(8)}),
        QueueSpec("b", cohort="c", quotas={H100: Quota(8), A100: Quota(0)}),
    ):
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.submit("a-job", spec("a", 8, H100, A100, preemptible=False))
    admitted = [a for e in w.cycle(admission) if isinstance(e, JobsAdmitted) for a in e.admissions]
    assert [(a.job_id, dict(a.gpus)) for a in admitted] == [("a-job", {A100: 8})]
    placed = [p for e in w.cycle(placer) if isinstance(e, JobsPlaced) for p in e.placements]
    assert [(p.job_id, {wk.node for wk in p.workers}) for p in placed] == [("a-job", {N_A100})]


def test_the_fold_refuses_a_placement_on_a_model_other_than_the_admitted_one() -> None:
    w = World(nodes=2, profile="mixed").cohort("c")
    q = QueueSpec("a", cohort="c", quotas={H100: Quota(0), A100: Quota(8)})
    w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.submit("a-job", spec("a", 8, H100, A100)).cycle(admission)
    assert dict(w.state.jobs["a-job"].admission.gpus) == {A100: 8}  # type: ignore[union-attr]
    node, gpus = whole(N_H100, *range(8))
    on_h100 = Placement("a-job", 0, (WorkerSlot(0, node, gpus),))
    before = w.state.rejected_total
    apply_event(
        w.state,
        w.seq + 1,
        subj.decision("placer"),
        JobsPlaced(based_on=w.seq, now=w.time, placements=(on_h100,)),
        w.time,
    )
    assert w.state.rejected_total == before + 1
    assert "is a H100-80GB" in w.state.rejections[-1].message
    assert w.state.jobs["a-job"].phase == "admitted"


def test_a_job_of_several_models_is_admitted_on_one_some_node_can_host_it_on() -> None:
    # 4 GPUs a worker, T4 or H100: the T4 node has 2 GPUs. Admitted on its T4 quota (first in
    # its order) it could be placed nowhere, and was admitted there again after each timeout.
    w = World(nodes=0)
    for name, inv in (*cluster(1, "t4-2x", prefix="t"), *cluster(1, "h100-8x", prefix="h")):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    q = QueueSpec("a", quotas={"T4": Quota(8), H100: Quota(8)})
    w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.submit("a-job", spec("a", 4, "T4", H100))
    admitted = [a for e in w.cycle(admission) if isinstance(e, JobsAdmitted) for a in e.admissions]
    assert [(a.job_id, dict(a.gpus)) for a in admitted] == [("a-job", {H100: 4})]


def _t4_and_h100(*quotas: str) -> World:
    """A T4 node of 2 GPUs, an H100 node of 8, and queue ``a`` with 16 of each model named."""
    w = World(nodes=0)
    for name, inv in (*cluster(1, "t4-2x", prefix="t"), *cluster(1, "h100-8x", prefix="h")):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    q = QueueSpec("a", quotas={m: Quota(16) for m in quotas})
    w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    return w


def test_a_job_is_refused_when_only_a_model_its_queue_has_no_quota_for_could_host_it() -> None:
    # 4 GPUs a worker, T4 or H100, in a queue with quota for T4 only: it would be charged to T4
    # and placed on T4 GPUs only (the H100 node could host it, but nothing charges H100), so it
    # would be admitted, time out unplaced and be admitted again. Refused at submission.
    w = _t4_and_h100("T4")
    w.submit("a-job", spec("a", 4, "T4", H100))
    why = validate(w.state, w.state.jobs["a-job"])
    assert why is not None and why.code == "no-node"
    assert "charged to its queue's quota of T4" in why.message
    both = _t4_and_h100("T4", H100).submit("a-job", spec("a", 4, "T4", H100))
    assert validate(both.state, both.state.jobs["a-job"]) is None


def test_a_gang_that_fits_only_across_two_models_is_refused() -> None:
    # 5 workers of 2 GPUs: 4 on the H100 node and 1 on the T4 node would hold it, but it runs on
    # the one model its admission counts against, and neither alone has room for 5.
    w = _t4_and_h100("T4", H100)
    w.submit("a-job", spec("a", 2, "T4", H100, replicas=5))
    why = validate(w.state, w.state.jobs["a-job"])
    assert why is not None and "on no one GPU model it names" in why.message
    w.submit("b-job", spec("a", 2, "T4", H100, replicas=4))
    assert validate(w.state, w.state.jobs["b-job"]) is None


def test_a_queued_job_whose_queue_loses_the_only_model_that_hosts_it_waits_and_says_why() -> None:
    w = _t4_and_h100("T4", H100)
    w.submit("a-job", spec("a", 4, "T4", H100))
    w.emit(subj.admin("queue"), ApplyQueue(queue=QueueSpec("a", quotas={"T4": Quota(8)})), subj.ADMIN)
    out = w.cycle(admission)
    assert not [e for e in out if isinstance(e, JobsAdmitted)]
    (changed,) = [e for e in out if isinstance(e, PendingReasonChanged)]
    assert changed.reasons[0].code == "no-node"
    assert "charged to its queue's quota of T4" in changed.reasons[0].message


def test_a_job_interrupted_on_its_admitted_model_is_judged_on_every_model_its_queue_has() -> None:
    # Admitted and placed on T4, its only T4 node lost: requeued, it is admitted again on H100,
    # not held back as if it could run on T4 only.
    w = _t4_and_h100("T4", H100)
    w.run("j", spec("a", 2, "T4", H100), whole("t-00", 0, 1))
    lost = NodeConditionChanged(node="t-00", condition="lost", reason="gone")
    w.emit(routing.subject_of(lost), lost)
    admitted = []
    for _ in range(2):
        out = w.cycle(admission)
        assert not [e for e in out if isinstance(e, PendingReasonChanged)]
        admitted += [
            (a.job_id, dict(a.gpus)) for e in out if isinstance(e, JobsAdmitted) for a in e.admissions
        ]
    assert admitted == [("j", {H100: 2})]


def test_an_elastic_job_of_several_models_is_admitted_at_the_most_its_charged_model_holds() -> None:
    # 1..5 workers of 2 GPUs, H100 or T4: the H100 node holds 4 of them and the T4 node 1, 5 in
    # all; admitted at 5 on H100 it was never placed, withdrawn and admitted at 5 again.
    w = _t4_and_h100(H100, "T4")
    w.submit("e", spec("a", 2, H100, "T4", replicas=5, min_replicas=1))
    out = w.cycle(admission)
    assert [
        (a.job_id, a.replicas, dict(a.gpus)) for e in out if isinstance(e, JobsAdmitted) for a in e.admissions
    ] == [("e", 4, {H100: 8})]
    placed = [p for e in w.cycle(placer) if isinstance(e, JobsPlaced) for p in e.placements]
    assert [len(p.workers) for p in placed] == [4]


def test_a_model_no_node_can_host_the_job_on_neither_orders_it_nor_spares_preemption() -> None:
    # 4 GPUs a worker, T4 or H100, the T4 node having 2: its T4 quota is free, but it can run
    # on H100 only, where its queue's lower-priority job holds the quota. Counted as fitting on
    # T4, nobody was stopped for it and it waited for the other job to end by itself.
    w = _t4_and_h100("T4", H100)
    w.emit(
        subj.admin("queue"),
        ApplyQueue(queue=QueueSpec("a", quotas={"T4": Quota(16), H100: Quota(8)})),
        subj.ADMIN,
    )
    w.run("low", spec("a", 8, H100), whole("h-00", *range(8)))
    w.submit("hi", spec("a", 4, "T4", H100), priority=10)
    assert not [e for e in w.cycle(admission) if isinstance(e, JobsAdmitted)]
    [p] = [e for e in w.cycle(preemptor) if isinstance(e, PreemptionRequested)]  # the fold takes it
    assert (p.beneficiary, [v.job_id for v in p.victims], p.key) == ("hi", ["low"], H100)


def test_the_pending_order_charges_no_model_that_no_node_could_host_the_job_on() -> None:
    # a1 asks 4 GPUs a worker, T4 or H100; the T4 node has 2. Admission charges it to H100 (the
    # one model a node can host it on), which puts a's share above b's and b1 before a2. The
    # order `corral queues` shows charged it to a's free T4 quota, and a2 before b1.
    w = World(nodes=0).cohort("c")
    for name, inv in (*cluster(1, "t4-2x", prefix="t"), *cluster(1, "h100-8x", prefix="h")):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    for q in (
        QueueSpec("a", cohort="c", quotas={"T4": Quota(32), H100: Quota(4)}),
        QueueSpec("b", cohort="c", quotas={H100: Quota(4)}),
    ):
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    (h100,) = [n for n in w.state.nodes if n.startswith("h")]
    w.run("b-h", spec("b", 2, H100), whole(h100, 0, 1))
    w.submit("a1", spec("a", 4, "T4", H100))
    w.submit("a2", spec("a", 1, H100))
    w.submit("b1", spec("b", 1, H100))
    admitted = [a.job_id for e in admission(w.state, w.time) for a in getattr(e, "admissions", ())]
    assert admitted == ["a1", "b1", "a2"]
    assert [j.id for j in pending_order(w.state, w.time)] == admitted


def test_a_job_that_may_not_borrow_is_not_kept_out_for_one_that_may_of_its_ask() -> None:
    # ``h`` waits for a's H100 and holds them. p and q ask alike, H100 or A100; p may borrow and
    # counts against the H100 (c2's are free to borrow), where the hold keeps it out. q may not
    # be preempted, so may not borrow: it counts against the A100, which b borrows from a, and
    # stopping b-run would admit it. The verdict on p was taken for q's: q waited for b-run.
    w = World(nodes=2, profile="mixed").cohort("c")
    policy = PreemptionPolicy(within_queue="lower-priority", reclaim_within_cohort="any")
    for q in (
        QueueSpec("a", cohort="c", quotas={H100: Quota(4), A100: Quota(4)}, preemption=policy),
        QueueSpec("c2", cohort="c", quotas={H100: Quota(4)}, preemption=policy),
        QueueSpec("b", cohort="c", quotas={A100: Quota(0)}, preemption=policy),
    ):
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.run("a-fixed", spec("a", 4, H100, preemptible=False), whole(N_H100, 0, 1, 2, 3), priority=20)
    w.run("c2-run", spec("c2", 2, H100, preemptible=False), whole(N_H100, 4, 5), priority=30)
    w.run("b-run", spec("b", 4, A100), whole(N_A100, 0, 1, 2, 3))
    w.wait(3600)
    w.submit("h", spec("a", 4, H100), priority=10)
    w.submit("p", spec("a", 1, H100, A100), priority=10)
    w.submit("q", spec("a", 1, H100, A100, preemptible=False), priority=10)
    found = preemptions(w)
    assert [(e.beneficiary, [v.job_id for v in e.victims], e.key) for e in found] == [("q", ["b-run"], A100)]
