"""The preemptor's pure core: victim selection tables, the anti-thrash guards, reclaim, elastic
shrinks, queued jobs blocked by quota, and the cycle's bookkeeping (one PreemptionRequested per
beneficiary, no GPUs offered twice, preemptions under way left alone). Then the whole sequence
through admission and the placer: the beneficiary is nominated, and what its victims free goes
to it and to nobody else. States are built by folding events."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from corral.events import routing
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    MigSlot,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
    Unschedulable,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import (
    CancelJob,
    JobAccepted,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    PendingReasonChanged,
    Resources,
    SubmitJob,
    Topology,
)
from corral.events.nodes import CheckpointCompleted, NodeRegistered, WorkerExited, WorkerStarted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import quota, thrash
from corral.projections.fold import apply_event
from corral.projections.quota import ANY
from corral.projections.state import Checkpoint, State
from corral.services.admission.decide import decide as admission
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import Plan, PreemptorConfig, Shrink, decide, plan
from corral.services.preemptor.victims import work_lost

HELPS = Reason("gpus", "no free GPU suits 8 whole GPUs", True)


# -- a world built by folding events -----------------------------------------------------------------


class World:
    """A State folded from events, one second of log time per event, with readable steps."""

    def __init__(self, nodes: int = 1, profile: str = "h100-8x") -> None:
        self.state = State()
        self.seq = 0
        self.time = 1000.0
        for name, inv in cluster(nodes, profile):
            self.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))

    def emit(self, subject: str, body: Event, tenant: str | None = None) -> None:
        before = self.state.rejected_total
        self.seq += 1
        self.time += 1.0
        apply_event(self.state, self.seq, subject, body, self.time, tenant)
        assert self.state.rejected_total == before, self.state.rejections[-1]

    def fork(self) -> World:
        """A World that goes on from a copy of this one's state."""
        other = copy.copy(self)
        other.state = copy.deepcopy(self.state)
        return other

    def wait(self, seconds: float) -> World:
        self.time += seconds
        return self

    # admin

    def queue(
        self,
        name: str,
        nominal: int = 64,
        cohort: str | None = None,
        lending_limit: int | None = None,
        **policy: Any,
    ) -> World:
        quotas = {ANY: Quota(nominal, lending_limit=lending_limit)}
        q = QueueSpec(name=name, cohort=cohort, quotas=quotas, preemption=PreemptionPolicy(**policy))
        self.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
        return self

    def cohort(self, name: str, parent: str | None = None, nominal: int | None = None) -> World:
        quotas = {} if nominal is None else {ANY: Quota(nominal)}
        spec = CohortSpec(name=name, parent=parent, quotas=quotas)
        self.emit(subj.admin("cohort"), ApplyCohort(cohort=spec), subj.ADMIN)
        return self

    def priority_class(self, name: str, value: int, **kw: Any) -> World:
        pc = PriorityClassSpec(name=name, value=value, **kw)
        self.emit(subj.admin("priority-class"), ApplyPriorityClass(priority_class=pc), subj.ADMIN)
        return self

    # jobs

    def submit(self, job_id: str, spec: JobSpec, priority: int = 0) -> World:
        self.emit(subj.request("alice", "submit"), SubmitJob(request_id=job_id, job=spec), "alice")
        self.emit(subj.job(job_id), JobAccepted(job_id=job_id, priority=priority))
        return self

    def admit(self, job_id: str, replicas: int | None = None) -> World:
        job = self.state.jobs[job_id]
        adm = quota.admission(self.state.queues[job.spec.queue], job, replicas)
        self.emit(
            subj.decision("admission"), JobsAdmitted(based_on=self.seq, now=self.time, admissions=(adm,))
        )
        return self

    def place(self, job_id: str, *workers: tuple[str, tuple[GpuClaim, ...]]) -> World:
        job = self.state.jobs[job_id]
        slots = tuple(WorkerSlot(rank, node, gpus) for rank, (node, gpus) in enumerate(workers))
        p = Placement(job_id, job.attempt, slots)
        self.emit(subj.decision("placer"), JobsPlaced(based_on=self.seq, now=self.time, placements=(p,)))
        return self

    def start(self, job_id: str) -> World:
        job = self.state.jobs[job_id]
        assert job.placement is not None
        for w in job.placement.workers:
            self.emit(
                subj.node(w.node), WorkerStarted(node=w.node, job_id=job_id, attempt=job.attempt, rank=w.rank)
            )
        return self

    def run(
        self, job_id: str, spec: JobSpec, *workers: tuple[str, tuple[GpuClaim, ...]], priority: int = 0
    ) -> World:
        return self.submit(job_id, spec, priority).admit(job_id).place(job_id, *workers).start(job_id)

    def waiting(self, job_id: str, spec: JobSpec, priority: int = 0) -> World:
        """Admitted, and the placer says preemption would help."""
        self.submit(job_id, spec, priority).admit(job_id)
        job = self.state.jobs[job_id]
        body = JobsUnschedulable(
            based_on=self.seq, now=self.time, jobs=(Unschedulable(job_id, job.attempt, (HELPS,)),)
        )
        self.emit(subj.decision("placer"), body)
        return self

    def preempt(self, beneficiary: str, *victims: str) -> World:
        vs = tuple(Victim(v, self.state.jobs[v].attempt) for v in victims)
        body = PreemptionRequested(
            based_on=self.seq, now=self.time, beneficiary=beneficiary, victims=vs, deadline=self.time + 30
        )
        self.emit(subj.decision("preemptor"), body)
        return self

    def stop(self, job_id: str) -> World:
        job = self.state.jobs[job_id]
        assert job.placement is not None
        for w in job.placement.workers:
            body = WorkerExited(
                node=w.node, job_id=job_id, attempt=job.attempt, rank=w.rank, code=0, stopped=True
            )
            self.emit(subj.node(w.node), body)
        return self

    def finish(self, job_id: str) -> World:
        """Every worker of ``job_id`` exits 0: the job succeeded."""
        job = self.state.jobs[job_id]
        assert job.placement is not None
        for w in job.placement.workers:
            body = WorkerExited(node=w.node, job_id=job_id, attempt=job.attempt, rank=w.rank, code=0)
            self.emit(subj.node(w.node), body)
        return self

    def requeue(self, job_id: str) -> World:
        job = self.state.jobs[job_id]
        self.emit(
            subj.job(job_id), JobRequeued(job_id=job_id, attempt=job.attempt, reason=Reason("preempted", "x"))
        )
        return self

    def checkpoint(self, job_id: str, step: int) -> World:
        job = self.state.jobs[job_id]
        assert job.placement is not None
        node = job.placement.workers[0].node
        body = CheckpointCompleted(
            node=node, job_id=job_id, attempt=job.attempt, location=f"/c/{step}", step=step
        )
        self.emit(subj.node(node), body)
        return self

    # deciding

    def cycle(self, decide_fn: Callable[[State, float], list[Event]]) -> list[Event]:
        """One cycle of a service: decide, then fold what it proposes (none of it may be void)."""
        events = decide_fn(self.state, self.time)
        for e in events:
            self.emit(routing.subject_of(e), e)
        return events

    def decide(self, config: PreemptorConfig | None = None) -> list[Event]:
        return decide(self.state, self.time, config or PreemptorConfig())

    def plan(self, config: PreemptorConfig | None = None) -> list[Plan]:
        return plan(self.state, self.time, config or PreemptorConfig())

    def victims(self, config: PreemptorConfig | None = None) -> dict[str, list[str]]:
        """beneficiary -> victims, from the cycle's PreemptionRequested events."""
        return {
            e.beneficiary: [v.job_id for v in e.victims]
            for e in self.decide(config)
            if isinstance(e, PreemptionRequested)
        }


def gpus(n: int, queue: str = "team-a", **kw: Any) -> JobSpec:
    return JobSpec(queue=queue, resources=Resources(gpus=n), **kw)


def whole(node: str, *indices: int) -> tuple[str, tuple[GpuClaim, ...]]:
    return node, tuple(GpuClaim(i) for i in indices)


N0, N1, N2 = "node-00", "node-01", "node-02"


def elastic_borrower() -> World:
    """Cohort ``ml`` of team-a and team-b, 8 GPUs each on two 8-GPU nodes; team-a's elastic job
    ``elastic`` (8..16 one-GPU workers, checkpointable) runs at 16: it borrows team-b's 8."""
    w = World(nodes=2).cohort("ml").queue("team-a", 8, cohort="ml").queue("team-b", 8, cohort="ml")
    spec = JobSpec(
        queue="team-a", resources=Resources(gpus=1), replicas=16, min_replicas=8, checkpointable=True
    )
    w.submit("elastic", spec).admit("elastic", 16)
    return w.place("elastic", *[(f"node-0{i // 8}", (GpuClaim(i % 8),)) for i in range(16)]).start("elastic")


def full_node_world() -> World:
    """One 8-GPU node: ``low`` holds 4 GPUs, ``other`` (not preemptible) 4; ``urgent``
    (priority 10) waits for 4 GPUs."""
    w = World().queue("team-a")
    w.run("low", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("other", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    return w.waiting("urgent", gpus(4), priority=10)


# -- victim selection -----------------------------------------------------------------------------


def test_a_lower_priority_job_is_stopped_for_an_urgent_one() -> None:
    w = full_node_world()
    events = w.decide()
    assert len(events) == 1
    ev = events[0]
    assert isinstance(ev, PreemptionRequested)
    assert (ev.beneficiary, ev.victims) == ("urgent", (Victim("low", 0),))
    assert ev.based_on == w.seq and ev.now == w.time
    assert ev.deadline == w.time + 30.0  # the default grace period


def test_deadline_is_the_longest_grace_of_the_victims() -> None:
    w = World().queue("team-a")
    w.run("a", gpus(4, grace_seconds=120.0), whole(N0, 0, 1, 2, 3))
    w.run("b", gpus(4, grace_seconds=45.0), whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(8), priority=10)
    (ev,) = w.decide()
    assert isinstance(ev, PreemptionRequested)
    assert sorted(v.job_id for v in ev.victims) == ["a", "b"]
    assert ev.deadline == w.time + 120.0


def test_the_fold_gives_each_victim_no_more_than_its_own_grace() -> None:
    # One record for both, asking the longer grace: b, which asked 45 s, is due in 45 s.
    w = World().queue("team-a")
    w.run("a", gpus(4, grace_seconds=120.0), whole(N0, 0, 1, 2, 3))
    w.run("b", gpus(4, grace_seconds=45.0), whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(8), priority=10)
    w.cycle(decide)
    t = w.time
    assert (w.state.jobs["a"].preempt_deadline, w.state.jobs["b"].preempt_deadline) == (t + 120.0, t + 45.0)


@pytest.mark.parametrize(
    ("cap", "grace", "given"),
    [
        pytest.param({}, 86_400.0, 600.0, id="a day asked, the default cap of ten minutes"),
        pytest.param({}, 45.0, 45.0, id="less than the cap asked"),
        pytest.param({"max_grace_seconds": 120.0}, 86_400.0, 120.0, id="the lender's own cap"),
        pytest.param({"max_grace_seconds": None}, 86_400.0, 86_400.0, id="no cap"),
    ],
)
def test_a_borrower_reclaimed_gets_at_most_the_lenders_max_grace(
    cap: Any, grace: float, given: float
) -> None:
    # A tenant sets its job's grace: a borrower asking a day would keep the lender waiting a day
    # for the quota it lent. The lender's queue caps what another queue's job is given.
    w = World().cohort("org").queue("team-a", 8, "org", **cap).queue("team-b", 0, "org")
    w.run("b-borrow", gpus(8, queue="team-b", grace_seconds=grace), whole(N0, *range(8)))
    w.submit("a-new", gpus(2))
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested) and ev.deadline == ev.now + given
    assert w.state.jobs["b-borrow"].preempt_deadline == w.time + given


def test_a_queues_own_job_keeps_its_whole_grace() -> None:
    w = World().queue("team-a")
    w.run("low", gpus(8, grace_seconds=7200.0), whole(N0, *range(8)))
    w.waiting("urgent", gpus(8), priority=10)
    (ev,) = w.decide()
    assert isinstance(ev, PreemptionRequested) and ev.deadline == w.time + 7200.0


@pytest.mark.parametrize(
    ("victim", "priority"),
    [
        pytest.param({}, 10, id="equal-priority"),
        pytest.param({}, 20, id="higher-priority"),
        pytest.param({"preemptible": False}, 0, id="not-preemptible"),
        pytest.param({"priority_class": "prod"}, 0, id="class-not-preemptible"),
    ],
)
def test_never_a_victim(victim: dict[str, Any], priority: int) -> None:
    w = World().queue("team-a").priority_class("prod", 0, preemptible=False)
    w.run("low", gpus(8, **victim), whole(N0, *range(8)), priority=priority)
    w.waiting("urgent", gpus(4), priority=10)
    assert w.decide() == []


def test_no_victim_set_suffices_no_preemption() -> None:
    # Stopping ``low`` frees 4 GPUs; the other 4 are not preemptible; 8 are needed.
    w = World().queue("team-a")
    w.run("low", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("other", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(8), priority=10)
    assert w.decide() == []


def test_a_smaller_set_is_chosen() -> None:
    # ``a`` and ``b`` lose the least work but free only 2 GPUs on a node held by a job that may not
    # stop; ``big`` holds a whole node. Removal order is a, b, big; fill-back spares a and b.
    w = World(nodes=2).queue("team-a")
    w.run("big", gpus(8), whole(N1, *range(8)))
    w.wait(600)
    w.run("a", gpus(1), whole(N0, 0))
    w.run("b", gpus(1), whole(N0, 1))
    w.run("pinned", gpus(6, preemptible=False), whole(N0, 2, 3, 4, 5, 6, 7))
    w.waiting("urgent", gpus(8, topology=Topology("node", True)), priority=10)
    assert w.victims() == {"urgent": ["big"]}


def test_two_small_victims_beat_one_big_when_they_lose_less() -> None:
    w = World().queue("team-a")
    w.run("big", gpus(4), whole(N0, 0, 1, 2, 3))
    w.wait(600)
    w.run("s1", gpus(2), whole(N0, 4, 5))
    w.run("s2", gpus(2), whole(N0, 6, 7))
    w.waiting("urgent", gpus(4), priority=10)
    assert w.victims() == {"urgent": ["s1", "s2"]}


def test_least_work_lost_first() -> None:
    # Both free enough; ``old`` has run much longer on as many GPUs.
    w = World().queue("team-a")
    w.run("old", gpus(4), whole(N0, 0, 1, 2, 3))
    w.wait(3600)
    w.run("new", gpus(4), whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(4), priority=10)
    assert w.victims() == {"urgent": ["new"]}


def test_work_lost_is_time_since_checkpoint_times_gpus() -> None:
    w = World().queue("team-a")
    w.run("j", gpus(4), whole(N0, 0, 1, 2, 3))
    job = w.state.jobs["j"]
    assert work_lost(w.state, job, job.phase_since + 100) == 400.0

    class Timed(Checkpoint, frozen=True):
        time: float = 0.0

    job.checkpoint = Timed("/c/1", 1, job.attempt, w.seq, time=job.phase_since + 90)
    assert work_lost(w.state, job, job.phase_since + 100) == 40.0
    job.checkpoint = Timed("/c/0", 0, job.attempt - 1, w.seq, time=job.phase_since + 90)
    assert work_lost(w.state, job, job.phase_since + 100) == 400.0  # an earlier attempt's


def test_equal_work_lost_lowest_priority_then_youngest() -> None:
    # Placed jobs that have not started have lost nothing: priority, then age decide.
    w = World().queue("team-a")
    w.submit("p1", gpus(4), priority=1).admit("p1").place("p1", whole(N0, 0, 1, 2, 3))
    w.submit("p0", gpus(4), priority=0).admit("p0").place("p0", whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(4), priority=10)
    assert w.victims() == {"urgent": ["p0"]}

    w = World().queue("team-a")
    w.submit("older", gpus(4)).admit("older").place("older", whole(N0, 0, 1, 2, 3))
    w.submit("younger", gpus(4)).admit("younger").place("younger", whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(4), priority=10)
    assert w.victims() == {"urgent": ["younger"]}


def test_fractions_and_mig_slices_are_freed_too() -> None:
    w = World(profile="h100-8x-mig").queue("team-a")
    mig = JobSpec(queue="team-a", resources=Resources(gpus=1, mig="3g.40gb"))
    for g in range(8):
        for start in (0, 4):
            w.run(f"m{g}-{start}", mig, (N0, (GpuClaim(g, mig=MigSlot("3g.40gb", start)),)))
    w.waiting("urgent", JobSpec(queue="team-a", resources=Resources(gpus=1, mig="7g.80gb")), priority=10)
    (victims,) = w.victims().values()
    assert len(victims) == 2 and {v.split("-")[0] for v in victims} == {victims[0].split("-")[0]}

    w = World().queue("team-a")
    half = JobSpec(queue="team-a", resources=Resources(gpus=1, gpu_milli=500))
    w.run("h1", half, (N0, (GpuClaim(0, milli=500),)))
    w.run("h2", half, (N0, (GpuClaim(0, milli=500),)))
    w.run("rest", gpus(7, preemptible=False), whole(N0, 1, 2, 3, 4, 5, 6, 7))
    w.waiting("urgent", gpus(1), priority=10)
    assert sorted(w.victims()["urgent"]) == ["h1", "h2"]


# -- reclaim -----------------------------------------------------------------------------------------


def reclaim_world() -> World:
    """One 8-GPU node; team-a's nominal is all 8, team-b's 0: team-b borrows what it runs."""
    w = World().cohort("org").queue("team-a", 8, "org").queue("team-b", 0, "org")
    w.run("a-low", gpus(2), whole(N0, 0, 1))
    w.wait(3600)
    w.run("b-borrow", gpus(6, queue="team-b"), whole(N0, 2, 3, 4, 5, 6, 7), priority=50)
    return w


def test_reclaim_takes_borrowed_gpus_back_first() -> None:
    # a-low has lost far more work than b-borrow, and either would do: the borrower goes first.
    w = reclaim_world()
    w.wait(3600)
    w.submit("a-new", gpus(2), priority=5)  # queued: team-a's quota is lent out
    assert w.victims() == {"a-new": ["b-borrow"]}


def test_reclaim_for_an_admitted_job_the_placer_could_not_place() -> None:
    # The cohort's quota (20) is more than its 16 GPUs: a2 holds quota but finds no GPU.
    w = World(nodes=2).cohort("org").queue("team-a", 12, "org").queue("team-b", 8, "org")
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.run("b2", gpus(4, queue="team-b"), whole(N0, 0, 1, 2, 3))  # 4 borrowed from team-a
    w.run("a1", gpus(4), whole(N0, 4, 5, 6, 7), priority=1)
    w.waiting("a2", gpus(4))  # team-a within its nominal 12 with a2's quota held
    assert w.victims() == {"a2": ["b2"]}


def test_reclaim_for_an_admitted_job_that_brings_its_queue_to_exactly_its_nominal() -> None:
    # Asked whether team-b stays within its own with a milli-GPU more than it holds, a lender at
    # exactly its nominal (b2's quota charged already) took nothing back, though the fold allows it.
    w = World(nodes=2).cohort("org").queue("team-a", 4, "org").queue("team-b", 12, "org")
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.run("a1", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("a2", gpus(4), whole(N0, 4, 5, 6, 7))  # 4 borrowed from team-b
    w.queue("team-b", 12, "org", lending_limit=0)  # lends no more: its 12 are its own again
    w.waiting("b2", gpus(4, queue="team-b"))  # team-b at 12 of its 12 with b2's quota held
    assert w.victims() == {"b2": ["a2"]}


def test_reclaim_only_while_the_other_queue_borrows() -> None:
    # team-b runs within its own nominal: nothing to reclaim, and a1 is not lower priority.
    w = World(nodes=2).cohort("org").queue("team-a", 8, "org").queue("team-b", 8, "org")
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.run("a1", gpus(8), whole(N0, *range(8)))
    w.submit("a2", gpus(4))
    w.submit("b2", gpus(4, queue="team-b"))
    assert w.decide() == []


def test_reclaim_finds_the_borrower_whose_node_frees_a_whole_place_for_the_gang() -> None:
    # team-b borrows 5 of team-a's 12: six jobs on N0 (all 8 GPUs) and one on N1 (1 GPU, the
    # rest of N1 free). a-big (8) is within team-a's nominal and needs one whole node. Taken in
    # quota's order (lowest priority first), N0's 1-GPU jobs give back all team-b borrowed
    # before b-n1 is reached, so b-n1 is no candidate any more and N0 still has no room: the
    # search asks again node by node, N1 first (most of it free already), and stops b-n1 alone.
    w = World(nodes=2).cohort("org").queue("team-a", 12, "org").queue("team-b", 4, "org")
    w.run("b-n1", gpus(1, queue="team-b"), whole(N1, 0), priority=10)
    w.run("b-n0", gpus(3, queue="team-b"), whole(N0, 0, 1, 2), priority=50)
    for g in (3, 4, 5, 6, 7):
        w.run(f"b-{g}", gpus(1, queue="team-b"), whole(N0, g))
    w.submit("a-big", gpus(8), priority=100)
    assert w.victims() == {"a-big": ["b-n1"]}


@pytest.mark.parametrize(("b_nominal", "victims"), [(2, ["b-one", "b-two"]), (3, None)])
def test_reclaim_takes_the_borrower_jobs_of_one_node_as_far_as_their_queue_borrows(
    b_nominal: int, victims: list[str] | None
) -> None:
    # team-b holds 5: it borrows 3 of team-a's 13 with a nominal of 2, 2 with one of 3. N0 has
    # one GPU free; freeing b-two (2) and b-one (1) there makes room for urgent (4 on one node).
    # Borrowing 3, team-b gives both back and is left at its nominal: the node-by-node retry
    # must not pass over the second once the first brought team-b near it. Borrowing 2, the
    # two would take team-b into its nominal, which stays guaranteed (Kueue takes a queue's
    # jobs only while it borrows): urgent waits.
    policy = {
        "within_queue": "never",
        "reclaim_within_cohort": "lower-priority",
        "borrow_within_cohort": "never",
    }
    w = World(nodes=2).cohort("org").queue("team-a", 13, "org", **policy).queue("team-b", b_nominal, "org")
    w.run("b-high-0", gpus(1, queue="team-b"), whole(N0, 0), priority=10)
    w.run("b-high-1", gpus(1, queue="team-b"), whole(N0, 1), priority=10)
    w.run("b-one", gpus(1, queue="team-b"), whole(N0, 2))
    w.wait(600)  # b-two, newer, has less to lose: it comes first
    w.run("b-two", gpus(2, queue="team-b"), whole(N0, 3, 4))
    w.run("a-n0", gpus(2), whole(N0, 5, 6))
    w.run("a-n1", gpus(2), whole(N1, 0, 1))
    w.run("a-four", gpus(4), whole(N1, 2, 3, 4, 5))
    w.submit("urgent", gpus(4), priority=10)
    assert sorted(w.victims().get("urgent", [])) == (victims or [])


def policy_world(**policy: Any) -> World:
    """``reclaim_world`` with team-a's preemption policy set."""
    w = World().cohort("org").queue("team-a", 8, "org", **policy).queue("team-b", 0, "org")
    w.run("a-low", gpus(2), whole(N0, 0, 1))
    w.wait(3600)
    w.run("b-borrow", gpus(6, queue="team-b"), whole(N0, 2, 3, 4, 5, 6, 7), priority=50)
    return w


@pytest.mark.parametrize(
    ("priority", "policy", "victims"),
    [
        pytest.param(100, {}, ["a-low", "b-borrow"], id="defaults"),
        pytest.param(40, {}, ["a-low", "b-borrow"], id="reclaims-from-a-higher-priority-borrower"),
        pytest.param(100, {"borrow_within_cohort": "never"}, ["a-low", "b-borrow"], id="borrow-off"),
        pytest.param(40, {"reclaim_within_cohort": "lower-priority"}, None, id="reclaim-lower-only"),
        # Borrowing over lower priorities is for a job that would borrow; a-big would be within
        # its nominal, so with reclaim ``never`` it waits for b-borrow to end by itself.
        pytest.param(100, {"reclaim_within_cohort": "never"}, None, id="never-reclaims-by-borrowing-over"),
        pytest.param(
            100, {"reclaim_within_cohort": "never", "borrow_within_cohort": "never"}, None, id="cohort-off"
        ),
        pytest.param(100, {"within_queue": "never"}, None, id="own-queue-off"),
    ],
)
def test_reclaim_combined_with_own_queue_victims(priority: int, policy: Any, victims: Any) -> None:
    # team-a (nominal 8) runs a-low (2) and lends 6 to team-b; a-big (8) is within team-a's
    # nominal only once a-low is stopped too. Kueue's preemption.md ("Reclaim within cohort":
    # a ClusterQueue under its nominal quota takes back what others borrow) with its second
    # attempt of getTargets (cohort candidates together with the queue's own, the preemptor
    # then within nominal), and KEP 1337 (borrowWithinCohort: LowerPriority, maxPriorityThreshold)
    # when it would not be.
    w = policy_world(**policy)
    w.submit("a-big", gpus(8), priority=priority)
    assert sorted(w.victims().get("a-big", [])) == (victims or [])


@pytest.mark.parametrize(
    ("threshold", "victims"),
    [
        pytest.param(None, ["a-low", "b-borrow"], id="no-threshold"),
        pytest.param(50, ["a-low", "b-borrow"], id="at-the-threshold"),
        pytest.param(49, None, id="above-the-threshold"),
    ],
)
def test_a_job_that_borrows_stops_lower_priority_borrowers_up_to_the_threshold(
    threshold: int | None, victims: Any
) -> None:
    # team-a (nominal 4) runs a-low (2); team-b borrows 6 of the 4 team-a and team-c lend. a-big
    # (8) borrows 4 of team-c's even with both stopped, so only ``borrow_within_cohort`` (KEP
    # 1337: LowerPriority, maxPriorityThreshold) lets it stop b-borrow, whatever reclaim says.
    w = (
        World()
        .cohort("org")
        .queue("team-a", 4, "org", reclaim_within_cohort="never", borrow_priority_threshold=threshold)
    )
    w.queue("team-b", 0, "org").queue("team-c", 4, "org")
    w.run("a-low", gpus(2), whole(N0, 0, 1))
    w.wait(3600)
    w.run("b-borrow", gpus(6, queue="team-b"), whole(N0, 2, 3, 4, 5, 6, 7), priority=50)
    w.submit("a-big", gpus(8), priority=100)
    assert sorted(w.victims().get("a-big", [])) == (victims or [])


def test_reclaim_never_crosses_into_another_tree() -> None:
    w = World().cohort("org").cohort("other").queue("team-a", 8, "org").queue("team-x", 0, "other")
    w.queue("team-y", 8, "other")
    w.run("x", gpus(8, queue="team-x"), whole(N0, *range(8)))
    w.submit("a", gpus(8), priority=10)
    assert w.decide() == []


# -- anti-thrash guards -------------------------------------------------------------------------------


def test_min_runtime_guard() -> None:
    w = World().queue("team-a").priority_class("batch", 0, min_runtime_s=600.0)
    w.run("low", gpus(8, priority_class="batch"), whole(N0, *range(8)))
    w.waiting("urgent", gpus(8), priority=10)
    assert w.decide() == []
    w.wait(600)
    assert w.victims() == {"urgent": ["low"]}


def preempted_once(**guards: Any) -> World:
    """``low`` was preempted once, requeued and runs again; ``urgent`` waits for its GPUs."""
    w = World().queue("team-a").priority_class("batch", 0, **guards)
    w.run("low", gpus(8, priority_class="batch"), whole(N0, *range(8)))
    w.submit("first", gpus(8), priority=10).admit("first")
    w.preempt("first", "low").stop("low").requeue("low")
    w.emit(subj.request("alice", "cancel"), CancelJob(job_id="first"), "alice")
    w.admit("low").place("low", whole(N0, *range(8))).start("low")
    return w.waiting("urgent", gpus(8), priority=10)


def test_cooldown_guard() -> None:
    w = preempted_once(cooldown_s=900.0)
    assert w.decide() == []
    w.wait(900)
    assert w.victims() == {"urgent": ["low"]}


@pytest.mark.parametrize(("cap", "stopped"), [(1, False), (2, True)])
def test_a_lifetime_cap_on_preemptions(cap: int, stopped: bool) -> None:
    # Preempted once already: with a cap of 1 it runs to its end, however long anyone waits; the
    # fold voids a preemption the preemptor would not propose.
    w = preempted_once(max_preemptions=cap)
    w.wait(30 * 24 * 3600)
    assert (w.victims() == {"urgent": ["low"]}) is stopped
    lb = w.fork()
    before = lb.state.rejected_total
    lb.preempt("urgent", "low") if stopped else None
    if not stopped:
        body = PreemptionRequested(
            based_on=lb.seq, now=lb.time, beneficiary="urgent", victims=(Victim("low", 1),), deadline=lb.time
        )
        lb.seq += 1
        apply_event(lb.state, lb.seq, subj.decision("preemptor"), body, lb.time, None)
        assert lb.state.rejected_total == before + 1
        assert "preempted 1 of the 1 times" in lb.state.rejections[-1].message


def test_preemptions_per_hour_guard() -> None:
    w = preempted_once(max_preemptions_per_hour=1)
    assert w.decide() == []
    w.wait(3600)
    assert w.victims() == {"urgent": ["low"]}


@pytest.mark.parametrize(
    ("times", "cap", "blocked"),
    [
        pytest.param((), 1, False, id="never-preempted"),
        pytest.param((0.0,), 1, True, id="at-cap"),
        pytest.param((0.0, 3000.0), 3, False, id="under-cap"),
        pytest.param((-4000.0, 100.0), 2, False, id="old-ones-expire"),
    ],
)
def test_preemption_cap_counts_the_last_hour(times: tuple[float, ...], cap: int, blocked: bool) -> None:
    w = World().queue("team-a")
    w.run("j", gpus(1), whole(N0, 0))
    job = msgspec.structs.replace(w.state.jobs["j"])

    @dataclass
    class WithTimes:
        base: object
        preempted_at: tuple[float, ...]

        def __getattr__(self, name: str) -> object:
            return getattr(self.base, name)

    pc = PriorityClassSpec("c", 0, max_preemptions_per_hour=cap)
    view = WithTimes(job, times)
    assert (thrash.guard(view, pc, 3500.0) is not None) is blocked  # type: ignore[arg-type]


# -- the cycle -----------------------------------------------------------------------------------------


def test_two_beneficiaries_never_share_freed_gpus() -> None:
    # One stoppable 8-GPU job; two urgent 8-GPU jobs: only the first (by priority) is served.
    w = World(nodes=2).queue("team-a")
    w.run("low", gpus(8), whole(N0, *range(8)))
    w.run("pinned", gpus(8, preemptible=False), whole(N1, *range(8)))
    w.waiting("u1", gpus(8), priority=10)
    w.waiting("u2", gpus(8), priority=20)
    assert w.victims() == {"u2": ["low"]}


def test_a_beneficiary_is_told_that_jobs_stop_for_it_and_by_when() -> None:
    # It kept "would fit now if team-a's 8 borrowed GPUs were reclaimed (preemption could
    # help)" while its victim checkpointed for it; and by when as a time of day, where it
    # said "by t=1796616142".
    w = World(nodes=2)
    w.time = 1_796_616_000.0  # 2026-12-07 04:00:00Z: a cluster's log time, not a simulation's
    w.cohort("ml").queue("team-a", 8, cohort="ml").queue("team-b", 8, cohort="ml")
    w.run("a1", gpus(8, checkpointable=True, grace_seconds=300), whole(N0, *range(8)))
    w.run("a2", gpus(8, checkpointable=True, grace_seconds=300), whole(N1, *range(8)))
    w.submit("b1", gpus(8, "team-b"))
    w.cycle(admission)
    assert w.state.jobs["b1"].reasons[0].preemption_helps
    (stop,) = [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)]
    deadline = w.state.jobs[stop.victims[0].job_id].preempt_deadline
    when = dt.datetime.fromtimestamp(deadline, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    said = [e for e in w.wait(5).cycle(admission) if isinstance(e, PendingReasonChanged) and e.job_id == "b1"]
    assert said and said[0].reasons == (
        Reason("preempting", f"1 job stops or shrinks to make room for it, by {when}"),
    )
    assert not [e for e in w.wait(5).cycle(admission) if isinstance(e, PendingReasonChanged)]  # said once


def test_after_a_quota_cut_the_preemptor_judges_a_reclaim_as_the_fold_does() -> None:
    # qa's nominal is cut under its jobs (the tree over-committed, no spill-over): B1, whose
    # victim still checkpoints, no longer fits, and the preemptor left its quota out where the
    # fold's rule counts it; its stops for B2 were void on every cycle for an hour.
    w = World(nodes=3).cohort("org").queue("qa", 8, cohort="org").queue("qc", 8, cohort="org")
    for i in range(4):
        w.run(f"a{i}", gpus(2, "qa"), whole(N0, 2 * i, 2 * i + 1))
    w.run("V1", gpus(2, "qc", checkpointable=True, grace_seconds=3600), whole(N1, 0, 1))
    w.run("R", gpus(6, "qc"), whole(N1, *range(2, 8)), priority=1000)
    w.submit("B1", gpus(1, "qc"), priority=100)
    w.cycle(admission)
    (stop,) = [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)]
    assert [v.job_id for v in stop.victims] == ["V1"] and w.state.jobs["V1"].phase == "checkpointing"
    w.queue("qa", 4, cohort="org")
    w.submit("B2", gpus(2, "qc"))
    for _ in range(5):  # World.cycle folds what each proposes; none may be void
        w.cycle(admission)
        w.cycle(placer)
        w.wait(1).cycle(decide)


def test_each_beneficiary_gets_its_own_victims() -> None:
    w = World(nodes=2).queue("team-a")
    w.run("l0", gpus(8), whole(N0, *range(8)))
    w.run("l1", gpus(8), whole(N1, *range(8)))
    w.waiting("u1", gpus(8), priority=10)
    w.waiting("u2", gpus(8), priority=10)
    assert w.victims() == {"u1": ["l1"], "u2": ["l0"]}  # l1 is younger: it goes first


def like_jobs_behind_a_full_queue(run: int) -> World:
    """team-a at its nominal 16 on two nodes: four one-GPU jobs (the least work lost) and one
    that may not stop on node-00, an older 8-GPU job on node-01; then ``run`` like one-GPU jobs
    of priority 10, queued: quota blocks them."""
    w = World(nodes=2).queue("team-a", 16)
    w.run("big", gpus(8), whole(N1, *range(8)))
    w.wait(3600)
    for i in range(4):
        w.run(f"small{i}", gpus(1), whole(N0, i))
    w.run("pinned", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    for i in range(run):
        w.submit(f"u{i}", gpus(1), priority=10)
    return w


def test_a_run_of_like_jobs_stops_what_they_need_together_not_one_small_job_each() -> None:
    # Searched one by one, u0..u3 would each stop one of the small jobs (the least work lost for
    # one GPU) and u4 the big one, whose 8 GPUs do for all five: the small ones for nothing.
    w = like_jobs_behind_a_full_queue(5)
    assert w.victims() == {"u0": ["big"]}
    # ... and every one of the run gets going once it is gone, no second round of stops.
    for _ in range(4):
        w.cycle(admission)
        w.cycle(placer)
        w.wait(1).cycle(decide)
    w.stop("big")
    for _ in range(3):
        w.cycle(admission)
        w.cycle(placer)
        w.wait(1).cycle(decide)
    jobs = w.state.jobs
    assert [jobs[f"u{i}"].phase for i in range(5)] == ["placed"] * 5
    assert [jobs[f"small{i}"].phase for i in range(4)] == ["running"] * 4


def test_a_run_the_small_jobs_suffice_for_still_stops_them_first() -> None:
    w = like_jobs_behind_a_full_queue(3)
    assert w.victims() == {"u0": ["small3"], "u1": ["small2"], "u2": ["small1"]}
    # One beneficiary a cycle: no run is looked at beyond what the cycle searches.
    assert w.victims(PreemptorConfig(max_beneficiaries=1)) == {"u0": ["small3"]}


def test_jobs_kept_off_a_node_are_no_run_for_one_that_may_go_there() -> None:
    # u1..u4 failed their starts on node-01 for the node's fault: the placer keeps them off it
    # (``avoided``). Taken for copies of u0, which may go there, they had ``big`` (8 GPUs on
    # node-01, an hour's work) stopped as if all five could use its GPUs: only u0 could.
    w = like_jobs_behind_a_full_queue(5)
    for i in range(1, 5):
        w.state.jobs[f"u{i}"].fault_nodes = (N1,)
    w.state.nodes[N1].start_faults = tuple(f"u{i}" for i in range(1, 5))
    stopped = w.victims()
    assert "big" not in [v for vs in stopped.values() for v in vs], stopped
    assert stopped["u0"] == ["small3"]


def team_a_borrowing() -> World:
    """Cohort ``ml`` on two nodes: team-a (nominal 4) holds it with ``pinned``, which may not be
    preempted, and borrows 12 of team-b's with an older 8-GPU job and four one-GPU ones."""
    w = World(nodes=2).cohort("ml").queue("team-a", 4, cohort="ml").queue("team-b", 12, cohort="ml")
    w.run("big", gpus(8), whole(N1, *range(8)))
    w.wait(3600)
    for i in range(4):
        w.run(f"small{i}", gpus(1), whole(N0, i))
    return w.run("pinned", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))


def test_jobs_that_may_not_borrow_are_no_run_for_one_that_may() -> None:
    # team-a holds its nominal 4 with ``pinned`` and borrows 12 of team-b's. u0 may borrow;
    # u1..u4, of its form and priority, may not be preempted, so may not borrow: admission admits
    # none of them however much is stopped. Taken for a run of five, u0 stopped ``big`` (8 GPUs,
    # an hour's work) where one small job was enough.
    w = team_a_borrowing()
    w.submit("u0", gpus(1), priority=10)
    for i in range(1, 5):
        w.submit(f"u{i}", gpus(1, preemptible=False), priority=10)
    assert w.victims() == {"u0": ["small3"]}


def test_a_job_that_may_not_borrow_hides_none_of_its_form_that_may() -> None:
    # team-a's fixed part is full (``pinned``), so u0, which may not be preempted, may not
    # borrow and no preemption could get it admitted: its form was taken for one quota does not
    # block, and u1 and u2 behind it, which may borrow and stop a small job each, waited with it
    # for as long as u0 waited.
    w = team_a_borrowing()
    w.submit("u0", gpus(1, preemptible=False), priority=10)
    for i in (1, 2):
        w.submit(f"u{i}", gpus(1), priority=10)
    assert w.victims() == {"u1": ["small3"], "u2": ["small2"]}


def test_a_job_preempted_as_often_as_its_class_allows_hides_none_of_its_form() -> None:
    # u0 was preempted once, as often as class ``batch`` allows: it may not borrow, and team-a's
    # fixed part is full. u1 and u2, of its form and class, never preempted, may borrow.
    w = World(nodes=2).cohort("ml").queue("team-a", 4, cohort="ml").queue("team-b", 12, cohort="ml")
    w.priority_class("batch", 10, max_preemptions=1)
    w.run("big", gpus(8), whole(N1, *range(8)))
    w.run("u0", gpus(1, priority_class="batch"), whole(N0, 0), priority=10)
    w.submit("first", gpus(1), priority=20).admit("first")
    w.preempt("first", "u0").stop("u0").requeue("u0")
    w.emit(subj.request("alice", "cancel"), CancelJob(job_id="first"), "alice")
    w.wait(3600)
    for i in range(4):
        w.run(f"small{i}", gpus(1), whole(N0, i))
    w.run("pinned", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    for i in (1, 2):
        w.submit(f"u{i}", gpus(1, priority_class="batch"), priority=10)
    assert w.state.jobs["u0"].phase == "queued" and w.state.jobs["u0"].preemptions == 1
    assert w.victims() == {"u1": ["small3"], "u2": ["small2"]}


def test_a_run_is_searched_together_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Eight small jobs do for a run of five: each of the run found one, and each asked again for
    # the rest of the run together (copies of it placed at every step of a search), a cycle's
    # cost growing with the cube of the run.
    from corral.services.preemptor import victims

    w = World(nodes=2).queue("team-a", 16)
    w.run("big", gpus(8), whole(N1, *range(8)))
    w.wait(3600)
    for i in range(8):
        w.run(f"small{i}", gpus(1), whole(N0, i))
    for i in range(5):
        w.submit(f"u{i}", gpus(1), priority=10)
    runs: list[int] = []
    search = victims.search

    def counted(*args: Any, **kw: Any) -> victims.Found | None:
        copies = args[4] if len(args) > 4 else kw.get("copies", 1)
        if copies > 1:
            runs.append(copies)
        return search(*args, **kw)

    monkeypatch.setattr("corral.services.preemptor.decide.search", counted)
    assert w.victims() == {f"u{i}": [f"small{7 - i}"] for i in range(5)}
    assert runs == [5]


def test_a_run_searches_no_gang_for_copies_its_quota_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    # A run of five waits on team-a's quota of 8, which eight small jobs hold, while node-01 is
    # idle: every step of the search toward enough victims that quota refuses is a "no" without
    # a single gang searched (placed one copy after another, the quota refused the last copies
    # only after the first ones' gangs were searched: at 100,000 queued, most of a cycle's).
    from corral.services.preemptor import victims

    w = World(nodes=2).queue("team-a", 8)
    for i in range(8):
        w.run(f"small{i}", gpus(1), whole(N0, i))
        w.wait(60)
    for i in range(5):
        w.submit(f"u{i}", gpus(1), priority=10)
    gangs = 0
    gang = victims.Simulation._gang

    def counted_gang(sim: victims.Simulation, target: victims.Target) -> Placement | None:
        nonlocal gangs
        gangs += 1
        return gang(sim, target)

    asked: list[tuple[bool, int]] = []  # per room asked for copies: whether found, gangs searched
    fits_copies = victims._fits_copies

    def counted_copies(sim: victims.Simulation, target: victims.Target, copies: int) -> bool:
        before = gangs
        found = fits_copies(sim, target, copies)
        asked.append((found, gangs - before))
        return found

    monkeypatch.setattr(victims.Simulation, "_gang", counted_gang)
    monkeypatch.setattr(victims, "_fits_copies", counted_copies)
    assert w.victims() == {f"u{i}": [f"small{7 - i}"] for i in range(5)}
    assert any(not found for found, _ in asked)  # the quota said no on the way
    assert all(n == 0 for found, n in asked if not found)
    assert all(n == 5 for found, n in asked if found)


def test_a_cycle_that_searches_no_gang_reads_no_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    # A backlog behind team-a's quota, which jobs of its own priority hold: no victims, and no
    # gang searched. The cycle's snapshot of the cluster (a walk of every GPU) went unread; at
    # 100,000 queued behind bench.e2e's backlog quota it was most of every preemptor cycle.
    from corral.services.preemptor import victims

    w = World(nodes=2).queue("team-a", 8)
    for i in range(8):
        w.run(f"small{i}", gpus(1), whole(N0, i))
    for i in range(3):
        w.submit(f"u{i}", gpus(1))
    built: list[victims.Snapshot] = []

    class Counted(victims.Snapshot):
        def __init__(self, state: State) -> None:
            super().__init__(state)
            built.append(self)

    monkeypatch.setattr(victims, "Snapshot", Counted)
    assert w.decide() == []
    assert built == []
    # A search that does need it still builds it, once.
    w.submit("urgent", gpus(1), priority=10)
    assert w.victims() == {"urgent": ["small7"]}
    assert len(built) == 1


def test_a_run_that_reclaims_from_jobs_of_its_priority_is_searched_one_by_one() -> None:
    # team-b borrows 8 of team-a's GPUs with four small jobs and an older 8-GPU one, all of
    # priority 0, as is team-a's run of five. Only a beneficiary is kept room for by admission:
    # taking the big job for the first of the run alone, the other four would wait in the
    # fair-share order with the big job once it is requeued, and it might take the room back.
    w = World(nodes=2).cohort("ml").queue("team-a", 12, cohort="ml").queue("team-b", 4, cohort="ml")
    w.run("big", gpus(8, "team-b"), whole(N1, *range(8)))
    w.wait(3600)
    for i in range(4):
        w.run(f"small{i}", gpus(1, "team-b"), whole(N0, i))
    w.run("pinned", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    for i in range(5):
        w.submit(f"u{i}", gpus(1))
    assert w.victims() == {
        "u0": ["small3"],
        "u1": ["small2"],
        "u2": ["small1"],
        "u3": ["small0"],
        "u4": ["big"],
    }


def test_a_preemption_under_way_is_left_alone() -> None:
    w = World().queue("team-a")
    w.run("l1", gpus(4), whole(N0, 0, 1, 2, 3))
    w.wait(60)
    w.run("l2", gpus(4), whole(N0, 4, 5, 6, 7))
    w.waiting("urgent", gpus(4), priority=10)
    (ev,) = w.decide()
    assert isinstance(ev, PreemptionRequested) and ev.victims == (Victim("l2", 0),)
    w.emit(subj.decision("preemptor"), ev)
    assert w.state.jobs["l2"].phase == "checkpointing"
    assert w.decide() == []  # urgent's victim is checkpointing: nothing more for it
    # The GPUs l2 frees are urgent's: a second urgent job needs a victim of its own.
    w.waiting("urgent2", gpus(4), priority=10)
    assert w.victims() == {"urgent2": ["l1"]}


def test_a_beneficiary_that_fits_already_needs_no_victims() -> None:
    w = World().queue("team-a")
    w.run("low", gpus(4), whole(N0, 0, 1, 2, 3))
    w.waiting("urgent", gpus(4), priority=10)  # the placer's reason is stale: 4 GPUs are free
    assert w.decide() == []


def test_only_jobs_preemption_helps_are_beneficiaries() -> None:
    w = World().queue("team-a")
    w.run("low", gpus(8), whole(N0, *range(8)))
    w.submit("urgent", gpus(8), priority=10).admit("urgent")  # no placer reason yet
    assert w.decide() == []


def test_deterministic() -> None:
    w = World(nodes=2).queue("team-a")
    for i in range(8):
        w.run(f"l{i}", gpus(2), whole(N0 if i < 4 else N1, 2 * (i % 4), 2 * (i % 4) + 1))
    w.waiting("u1", gpus(4), priority=10)
    w.waiting("u2", gpus(6), priority=10)
    first = w.decide()
    copy_ = msgspec.convert(msgspec.to_builtins(w.state), State)
    assert first == w.decide() == decide(copy_, w.time, PreemptorConfig())


# -- elastic jobs ------------------------------------------------------------------------------------


ELASTIC = PreemptorConfig()
WHOLE_ONLY = PreemptorConfig(shrink=False)


def elastic_world() -> World:
    """``el`` runs 6 one-GPU workers (at least 2), ``low`` 2 GPUs; both stoppable."""
    w = World().queue("team-a")
    el = JobSpec(queue="team-a", replicas=6, min_replicas=2, resources=Resources(gpus=1))
    w.run("el", el, *(whole(N0, g) for g in range(6)))
    w.wait(3600)
    w.run("low", gpus(2), whole(N0, 6, 7))
    return w


def test_elastic_jobs_shrink_before_anyone_is_stopped_whole() -> None:
    w = elastic_world().waiting("urgent", gpus(3), priority=10)
    (p,) = w.plan(ELASTIC)
    assert p.victims == () and p.shrinks == (Shrink("el", 0, 3),)
    (ev,) = w.decide(ELASTIC)
    assert isinstance(ev, ShrinkRequested) and (ev.job_id, ev.replicas, ev.beneficiary) == ("el", 3, "urgent")


def test_shrink_to_the_minimum_then_stop_whole() -> None:
    w = elastic_world().waiting("urgent", gpus(6), priority=10)
    (p,) = w.plan(ELASTIC)
    assert p.victims == (Victim("low", 0),) and p.shrinks == (Shrink("el", 0, 2),)


def test_without_shrinks_elastic_jobs_are_stopped_whole() -> None:
    w = elastic_world().waiting("urgent", gpus(3), priority=10)
    assert w.victims(WHOLE_ONLY) == {"urgent": ["el"]}


def test_shrunk_ranks_stay_contiguous() -> None:
    # The gang's ranks sit on GPUs 0..5; what is freed is always its top ranks.
    w = elastic_world().waiting("urgent", gpus(1), priority=10)
    (p,) = w.plan(ELASTIC)
    assert p.shrinks == (Shrink("el", 0, 5),)
    assert {c.gpu for wk in p.placement.workers for c in wk.gpus} == {5}


# -- queued jobs blocked by quota ------------------------------------------------------------------------


def test_a_queued_job_blocked_by_its_own_queues_quota_stops_lower_priority_work() -> None:
    w = World(nodes=2).queue("team-a", 8)  # 16 GPUs, but team-a may hold only 8
    w.run("low", gpus(8), whole(N0, *range(8)))
    w.submit("hi", gpus(8), priority=10)
    assert w.victims() == {"hi": ["low"]}


@pytest.mark.parametrize(
    ("size", "priority"),
    [
        pytest.param(8, 0, id="equal-priority"),
        pytest.param(16, 10, id="more-than-the-queue-could-ever-hold"),
    ],
)
def test_a_queued_job_no_preemption_can_admit_stops_nobody(size: int, priority: int) -> None:
    w = World(nodes=2).queue("team-a", 8)
    w.run("low", gpus(8), whole(N0, *range(8)))
    w.submit("hi", gpus(size), priority=priority)
    assert w.decide() == []


@pytest.mark.parametrize(
    ("small_estimate", "victims"),
    [
        pytest.param(None, {}, id="it-would-delay-the-gang"),
        pytest.param(3600.0, {"a-small": ["b1"]}, id="it-ends-before-the-gang-could-start"),
    ],
)
def test_no_victims_for_a_job_admission_holds_its_queues_quota_against(
    small_estimate: float | None, victims: dict[str, list[str]]
) -> None:
    # team-a's gang (its whole nominal 16) waits for a-run to end: no preemption can admit it
    # sooner. a-small would be within team-a's nominal if team-b's borrowed GPUs were taken back,
    # but admission holds that nominal for the gang, the first of team-a's jobs that does not
    # fit: stopping b1 would not get a-small admitted, unless it ends before a-run does.
    w = World(nodes=2).cohort("org").queue("team-a", 16, "org").queue("team-b", 0, "org")
    w.run("a-run", gpus(8, runtime_estimate_s=7200.0), whole(N0, *range(8)))
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.submit("gang", gpus(8, replicas=2))
    w.submit("a-small", gpus(8, runtime_estimate_s=small_estimate))
    assert w.victims() == victims


def full_cohort(competitor: bool = False, **policy: Any) -> World:
    """Cohort research: team-a and team-b, nominal 12 GPUs each, on 3 nodes of 8 H100, so their
    nominal quotas add up to the capacity. team-a runs ``gang`` (8 GPUs, priority 0); team-b runs
    ``b1`` and ``b2`` (8 each: it borrows 4). Then ``urgent`` (team-a, 8 GPUs, priority 1000, a
    class that may not be preempted) arrives and is queued: quota blocks it. ``competitor``: team-c
    (nominal 0: it only borrows) has an 8-GPU job waiting too, ahead of team-a by fair share."""
    w = World(nodes=3).cohort("research")
    w.queue("team-a", 12, "research", **policy).queue("team-b", 12, "research")
    w.priority_class("urgent", 1000, preemptible=False)
    w.run("gang", gpus(8), whole(N0, *range(8)))
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.wait(60)
    w.run("b2", gpus(8, queue="team-b"), whole(N2, *range(8)))
    w.wait(60)
    if competitor:
        w.queue("team-c", 0, "research")
        w.submit("c1", gpus(8, queue="team-c"))
    w.submit("urgent", gpus(8, priority_class="urgent"), priority=1000)
    return w


def test_an_urgent_job_queued_on_a_full_cohort_stops_a_borrower() -> None:
    w = full_cohort()
    w.cycle(admission)
    urgent = w.state.jobs["urgent"]
    assert urgent.phase == "queued" and urgent.reasons[0].preemption_helps
    (ev,) = w.decide()
    # One 8-GPU victim is enough; team-b's borrowers go before team-a's own gang, and b2 loses
    # the least work.
    assert isinstance(ev, PreemptionRequested)
    assert (ev.beneficiary, ev.victims) == ("urgent", (Victim("b2", 0),))
    w.emit(subj.decision("preemptor"), ev)  # accepted: nothing void
    assert w.state.jobs["b2"].phase == "checkpointing"
    assert w.state.jobs["b2"].preempted_for == "urgent"
    assert w.decide() == []  # under way


def test_without_borrowing_within_the_cohort_it_stops_its_own_queues_job() -> None:
    # urgent would borrow 4 if b2 were stopped; with borrowing over borrowers off it may take
    # team-b's jobs only to take back lent quota, and that leaves team-a within its nominal only
    # once its own gang is stopped, after which b2 can stay (Kueue's fillBackWorkloads).
    w = full_cohort(borrow_within_cohort="never")
    assert w.victims() == {"urgent": ["gang"]}


def test_the_freed_quota_and_gpus_go_to_the_urgent_job() -> None:
    w = full_cohort(competitor=True)
    w.cycle(admission)
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested) and ev.victims == (Victim("b2", 0),)
    w.checkpoint("b2", 40).stop("b2")  # GPUs and quota free; b2 stopped, not yet requeued
    assert w.state.jobs["b2"].phase == "preempted" and w.state.jobs["b2"].held is None
    assert w.cycle(placer) == []  # nothing admitted to place on them
    assert w.decide() == []  # the GPUs are urgent's: its preemption is under way
    events = w.cycle(admission)
    # b2 back in its queue, resuming from its checkpoint; urgent admitted first: neither b2 nor
    # team-c's job (ahead of team-a by fair share) gets the quota b2 gave back.
    requeued = [e for e in events if isinstance(e, JobRequeued)]
    assert [(e.job_id, e.resume_from) for e in requeued] == [("b2", "/c/40")]
    assert [a.job_id for e in events if isinstance(e, JobsAdmitted) for a in e.admissions] == ["urgent"]
    (placed,) = w.cycle(placer)
    assert isinstance(placed, JobsPlaced)
    (p,) = placed.placements
    assert p.job_id == "urgent" and {wk.node for wk in p.workers} == {N2}  # b2's GPUs
    w.start("urgent")
    assert w.state.jobs["urgent"].phase == "running"
    assert w.decide() == []  # b2 would borrow to come back: it stops nobody
    assert not w.state.jobs["b2"].reasons[0].preemption_helps
    assert [e for e in w.cycle(admission) if isinstance(e, JobsAdmitted)] == []


def partial_world() -> World:
    """One queue, 16 GPUs, nominal 20: ``low1`` and ``low2`` (4 GPUs each, priority 0) share
    node-00 with nothing else; ``pinned`` (not preemptible) holds node-01; ``admitted4`` holds
    the last 4 GPUs of quota but found no GPU. ``urgent`` (8 GPUs on one node) and ``small``
    (4 GPUs, priority 5) are queued: the quota is all held."""
    w = World(nodes=2).queue("team-a", 20)
    w.run("low1", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("low2", gpus(4, grace_seconds=300.0), whole(N0, 4, 5, 6, 7))
    w.run("pinned", gpus(8, preemptible=False), whole(N1, *range(8)))
    w.submit("admitted4", gpus(4)).admit("admitted4")
    w.submit("urgent", gpus(8, topology=Topology("node", True)), priority=10)
    w.submit("small", gpus(4), priority=5)
    return w


def test_what_stopped_victims_free_is_kept_until_all_have_stopped() -> None:
    w = partial_world()
    w.cycle(placer)  # admitted4 finds no GPU
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested)
    assert (ev.beneficiary, sorted(v.job_id for v in ev.victims)) == ("urgent", ["low1", "low2"])
    w.stop("low1")  # low2 still checkpointing
    # low1 stays stopped and keeps its quota: small (4 GPUs, priority 5) is not admitted into it
    # and admitted4 is not placed on low1's GPUs.
    events = w.cycle(admission)
    assert not [e for e in events if isinstance(e, JobRequeued | JobsAdmitted)]
    assert w.state.jobs["low1"].phase == "preempted"
    assert not [e for e in w.cycle(placer) if isinstance(e, JobsPlaced)]
    assert w.decide() == []  # urgent's preemption is under way
    w.stop("low2")
    events = w.cycle(admission)
    assert sorted(e.job_id for e in events if isinstance(e, JobRequeued)) == ["low1", "low2"]
    assert [a.job_id for e in events if isinstance(e, JobsAdmitted) for a in e.admissions] == ["urgent"]
    (placed,) = [e for e in w.cycle(placer) if isinstance(e, JobsPlaced)]
    assert [(p.job_id, p.workers[0].node) for p in placed.placements] == [("urgent", N0)]


def test_a_nominated_job_is_placed_before_a_higher_priority_one() -> None:
    # a2 reclaims team-b's borrowed GPUs; x (priority 100, in a queue of its own) waits for GPUs
    # too, with nobody it may stop. The GPUs b2 frees are a2's.
    w = World(nodes=2).cohort("org").queue("team-a", 12, "org").queue("team-b", 8, "org")
    w.queue("team-x", 8)
    w.run("b1", gpus(8, queue="team-b"), whole(N1, *range(8)))
    w.run("b2", gpus(4, queue="team-b"), whole(N0, 0, 1, 2, 3))  # 4 borrowed from team-a
    w.run("a1", gpus(4), whole(N0, 4, 5, 6, 7), priority=1)
    w.waiting("x", gpus(4, queue="team-x"), priority=100)
    w.waiting("a2", gpus(4))
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested) and (ev.beneficiary, ev.victims) == ("a2", (Victim("b2", 0),))
    w.stop("b2")
    # Placed before b2 is requeued: on the GPUs kept for it.
    (placed,) = [e for e in w.fork().cycle(placer) if isinstance(e, JobsPlaced)]
    assert [p.job_id for p in placed.placements] == ["a2"]
    # Placed after b2 is requeued: first, ahead of x.
    w.cycle(admission)
    assert w.state.jobs["b2"].phase in ("queued", "admitted")
    (placed,) = [e for e in w.cycle(placer) if isinstance(e, JobsPlaced)]
    assert [p.job_id for p in placed.placements] == ["a2"]
    assert {c.gpu for c in placed.placements[0].workers[0].gpus} == {0, 1, 2, 3}


def two_teams_world() -> World:
    """Two 8-GPU nodes; team-a (nominal 16) and team-b (nominal 8), in no cohort. ``b1``
    (team-b, 4 GPUs) and ``a2`` (team-a, 1 GPU, no priority class: priority 0) share node-00;
    ``low`` (team-a, 8 GPUs, class batch, checkpointed) fills node-01. ``urgent`` (team-a, 8 GPUs,
    class urgent, not preemptible) is queued: team-a holds 9 of its 16."""
    w = World(nodes=2).priority_class("batch", 10).priority_class("urgent", 1000, preemptible=False)
    w.queue("team-a", 16).queue("team-b", 8)
    w.run("b1", gpus(4, queue="team-b"), whole(N0, 0, 1, 2, 3))
    low = gpus(8, priority_class="batch", checkpointable=True, grace_seconds=20.0)
    w.run("low", low, whole(N1, *range(8)), priority=10)
    w.checkpoint("low", 100)
    w.run("a2", gpus(1), whole(N0, 4))
    return w.submit("urgent", gpus(8, priority_class="urgent"), priority=1000)


@pytest.mark.parametrize(
    "after_admission",
    [
        pytest.param((placer, decide), id="placer-first"),
        pytest.param((decide, placer), id="preemptor-first"),
    ],
)
def test_only_the_job_on_the_node_the_urgent_job_needs_is_stopped(after_admission: Any) -> None:
    # Stopping low alone frees node-01 and leaves team-a at 1 + 8 of 16: a2, on the other node,
    # is not needed, in the first cycle or in any after it. Once low is requeued and urgent
    # admitted in its place, the preemptor may run before the placer has placed urgent: node-01
    # looks free, low (queued, priority 10, blocked by team-a's quota) would fit there once a2
    # gave its 1 GPU of quota back, but node-01 is urgent's.
    w = two_teams_world()
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested)
    assert (ev.beneficiary, ev.victims) == ("urgent", (Victim("low", 0),))
    w.checkpoint("low", 120).stop("low")
    w.cycle(admission)
    assert (w.state.jobs["low"].phase, w.state.jobs["urgent"].phase) == ("queued", "admitted")
    proposed = [e for fn in after_admission for e in w.cycle(fn)]
    proposed += w.cycle(decide)
    assert not [e for e in proposed if isinstance(e, PreemptionRequested | ShrinkRequested)]
    urgent = w.state.jobs["urgent"]
    assert urgent.phase == "placed" and urgent.held is not None
    assert {wk.node for wk in urgent.held.workers} == {N1}
    assert w.state.jobs["a2"].phase == "running"


def test_gpus_an_admitted_job_not_yet_tried_fits_on_are_not_offered_to_a_queued_one() -> None:
    # ``next`` (team-b, priority 20) is admitted and fits on node-01's free GPUs; the placer has
    # not run yet. ``want`` (team-a, priority 10, 8 + 8 of 12 held) would fit there too once
    # ``a-low`` gave its 4 back, but node-01 is next's: stopping a-low would not get want going
    # (or, once the preemption held node-01 for want, next would wait for a lower-priority job).
    w = World(nodes=2).queue("team-a", 12).queue("team-b", 8)
    w.run("a-low", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("a-pinned", gpus(4, preemptible=False), whole(N0, 4, 5, 6, 7))
    w.submit("next", gpus(8, queue="team-b"), priority=20).admit("next")
    w.submit("want", gpus(8), priority=10)
    assert w.decide() == []
    (placed,) = w.cycle(placer)
    assert isinstance(placed, JobsPlaced) and [p.job_id for p in placed.placements] == ["next"]


def test_free_gpus_the_beneficiary_counts_on_are_held_while_its_victims_checkpoint() -> None:
    # urgent needs a whole node: low's 4 GPUs on node-00 (quota too) and the 4 free beside them.
    w = World(nodes=2).queue("team-a", 12).queue("team-b", 4).queue("team-c", 4)
    w.run("low", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("a-run", gpus(4, preemptible=False), whole(N1, 0, 1, 2, 3))
    w.run("b-run", gpus(4, queue="team-b", preemptible=False), whole(N1, 4, 5, 6, 7))
    w.submit("urgent", gpus(8, topology=Topology("node", True)), priority=10)
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested) and ev.victims == (Victim("low", 0),)
    # While low checkpoints, c4 arrives and is admitted: the free half of node-00 is urgent's.
    w.submit("c4", gpus(4, queue="team-c")).admit("c4")
    assert not [e for e in w.cycle(placer) if isinstance(e, JobsPlaced)]
    w.stop("low")
    assert [a.job_id for e in w.cycle(admission) if isinstance(e, JobsAdmitted) for a in e.admissions] == [
        "urgent"
    ]
    (placed,) = [e for e in w.cycle(placer) if isinstance(e, JobsPlaced)]
    assert [(p.job_id, p.workers[0].node) for p in placed.placements] == [("urgent", N0)]


# -- what admission holds for a beneficiary and for a lender ----------------------------------------------


def _admitted(events: list[Event]) -> list[str]:
    return [a.job_id for e in events if isinstance(e, JobsAdmitted) for a in e.admissions]


def test_while_victims_checkpoint_the_beneficiary_keeps_what_was_free_too() -> None:
    # team-b borrows 4 of team-a's nominal 8 and 4 more are free: the preemptor stops b2 (4) for
    # urgent (8), counting on both. A newcomer of team-b that would fit the free 4 waits, so that
    # urgent is admitted as soon as b2 is gone and nobody is stopped a second time (Kueue keeps
    # a preemptor's whole request charged in the cycle that issues the preemption).
    w = World(nodes=2).cohort("org").queue("team-a", 8, "org").queue("team-b", 4, "org")
    w.run("b1", gpus(4, queue="team-b"), whole(N1, 0, 1, 2, 3))
    w.run("b2", gpus(4, queue="team-b"), whole(N0, 0, 1, 2, 3))
    w.queue("team-c", 0, "org")
    w.submit("urgent", gpus(8), priority=10)
    w.cycle(admission)  # the cohort has 4 left: urgent does not fit
    assert w.state.jobs["urgent"].phase == "queued"
    (ev,) = w.cycle(decide)
    assert isinstance(ev, PreemptionRequested) and ev.victims == (Victim("b2", 0),)
    w.submit("c1", gpus(4, queue="team-c"), priority=100)
    assert _admitted(w.cycle(admission)) == []  # b2 still checkpoints: the free 4 are urgent's
    w.stop("b2")
    assert _admitted(w.cycle(admission)) == ["urgent"]
    assert w.decide() == []


@pytest.mark.parametrize("reclaim", ["never", "lower-priority", "any"])
def test_a_lender_that_waits_keeps_its_share_from_being_lent_again(reclaim: str) -> None:
    # team-a lends all of its nominal 8 to team-b's two higher-priority jobs, which its policy
    # may not (or, with "any", need not yet) take back. When one ends, a new borrower of team-b
    # does not take the 4 freed: they are a1's (8, within team-a's nominal), which is admitted
    # once the other ends (Kueue's reservation for a lender that cannot be sure to reclaim:
    # "capacity blocked when lending clusterqueue not guaranteed to reclaim"; here whatever the
    # policy, so that what the preemptor would take back is not lent again meanwhile).
    w = World(nodes=2).cohort("org").queue("team-a", 8, "org", reclaim_within_cohort=reclaim)
    w.queue("team-b", 0, "org")
    w.run("b1", gpus(4, queue="team-b"), whole(N0, 0, 1, 2, 3), priority=10)
    w.run("b2", gpus(4, queue="team-b"), whole(N0, 4, 5, 6, 7), priority=10)
    w.submit("a1", gpus(8), priority=0)
    w.submit("b3", gpus(4, queue="team-b"), priority=10)
    assert _admitted(w.cycle(admission)) == []
    w.finish("b1")
    assert _admitted(w.cycle(admission)) == []  # b3 would borrow what a1 waits for
    w.finish("b2")
    assert _admitted(w.cycle(admission)) == ["a1"]


def test_a_queue_without_quota_reclaims_its_cohorts_from_another_subtree() -> None:
    # Hierarchical cohorts (Kueue KEP 79): ml holds 8 GPUs of its own for team-a (nominal 0);
    # web's team-x (nominal 0) borrows all 8. team-a's job, within ml's own quota, takes them
    # back whatever the priorities; a sibling of team-a on ml's quota would not be taken from.
    w = World(nodes=1).cohort("org").cohort("ml", "org", nominal=8).cohort("web", "org")
    w.queue("team-a", 0, "ml").queue("team-x", 0, "web")
    w.run("x", gpus(8, queue="team-x"), whole(N0, *range(8)), priority=50)
    w.submit("a", gpus(8), priority=0)
    assert w.victims() == {"a": ["x"]}
    w2 = World(nodes=1).cohort("org").cohort("ml", "org", nominal=8)
    w2.queue("team-a", 0, "ml").queue("team-s", 0, "ml")
    w2.run("s", gpus(8, queue="team-s"), whole(N0, *range(8)), priority=50)
    w2.submit("a", gpus(8), priority=0)
    assert w2.decide() == []


def test_a_shrink_is_proposed_before_the_whole_jobs_so_the_fold_judges_it_as_the_search_did() -> None:
    # team-a (nominal 5) holds 8 GPUs: it borrows 3 of team-b's. team-b's urgent job needs 3 and
    # may borrow over lower priorities. The search takes one rank of the elastic job (8 -> 7),
    # then ``low`` whole (7 -> 5): team-a is left at its nominal. The fold judges record by
    # record, the shrink first, as the search took it.
    w = World().cohort("org").queue("team-a", 5, "org").queue("team-b", 3, "org")
    w.run("fixed", gpus(4, preemptible=False), whole(N0, 2, 3, 4, 5), priority=10)
    el = JobSpec(queue="team-a", replicas=2, min_replicas=1, resources=Resources(gpus=1))
    w.run("el", el, whole(N0, 6), whole(N0, 7), priority=10)
    w.wait(3600)
    w.submit("low", gpus(2), priority=10).admit("low").place("low", whole(N0, 0, 1))  # placed: loses nothing
    w.submit("urgent", gpus(3, queue="team-b"), priority=20)
    before = w.state.rejected_total
    events = w.cycle(lambda s, now: decide(s, now, ELASTIC))
    assert [type(e).__name__ for e in events] == ["ShrinkRequested", "PreemptionRequested"]
    assert w.state.rejected_total == before, w.state.rejections[-1:]
    assert w.state.jobs["low"].phase in ("checkpointing", "preempted")
    assert w.state.jobs["el"].leaving == [1]


def test_the_beneficiarys_own_stops_come_before_the_shrink_they_make_a_reclaim() -> None:
    # team-a (nominal 6) runs ``low`` on 2 GPUs; team-b (nominal 2) runs ``el`` on 6, borrowing
    # 4 of team-a's. team-a's ``urgent`` (6 GPUs, ``el``'s priority: nothing to borrow over)
    # takes them back only as a reclaim, with team-a back within its nominal once ``low`` is
    # gone. Proposed shrink first, the fold judged the shrink alone and refused it.
    w = World().cohort("org").queue("team-a", 6, "org").queue("team-b", 2, "org")
    w.run("low", gpus(2), whole(N0, 0, 1), priority=0)
    el = JobSpec(queue="team-b", replicas=6, min_replicas=1, resources=Resources(gpus=1))
    w.run("el", el, *(whole(N0, g) for g in range(2, 8)), priority=10)
    w.wait(3600)
    w.submit("urgent", gpus(6), priority=10)
    (p,) = w.plan(ELASTIC)
    assert p.victims == (Victim("low", 0),) and p.shrinks == (Shrink("el", 0, 2),)
    events = w.cycle(lambda s, now: decide(s, now, ELASTIC))  # the fold refuses none of them
    assert [type(e).__name__ for e in events] == ["PreemptionRequested", "ShrinkRequested"]
    assert w.state.jobs["low"].phase in ("checkpointing", "preempted")
    assert w.state.jobs["el"].leaving == [2, 3, 4, 5]


def test_the_beneficiarys_own_shrink_comes_before_the_shrink_it_makes_a_reclaim() -> None:
    # As above with team-a's own work elastic: ``mine`` gives up a rank, team-b's ``el`` four;
    # ``el``'s shrink is a reclaim only once team-a is back within its nominal.
    w = World().cohort("org").queue("team-a", 6, "org").queue("team-b", 2, "org")
    mine = JobSpec(queue="team-a", replicas=2, min_replicas=1, resources=Resources(gpus=1))
    w.run("mine", mine, whole(N0, 0), whole(N0, 1), priority=0)
    el = JobSpec(queue="team-b", replicas=6, min_replicas=1, resources=Resources(gpus=1))
    w.run("el", el, *(whole(N0, g) for g in range(2, 8)), priority=10)
    w.wait(3600)
    w.submit("urgent", gpus(5), priority=10)
    (p,) = w.plan(ELASTIC)
    assert p.victims == () and set(p.shrinks) == {Shrink("mine", 0, 1), Shrink("el", 0, 2)}
    events = w.cycle(lambda s, now: decide(s, now, ELASTIC))  # the fold refuses none of them
    assert [(type(e).__name__, getattr(e, "job_id", None)) for e in events] == [
        ("ShrinkRequested", "mine"),
        ("ShrinkRequested", "el"),
    ]


def test_a_plan_of_own_and_other_stops_around_a_shrink_is_judged_in_two_preemptions() -> None:
    # As above, with team-b also running ``b1`` (1 GPU, lower priority) that ``urgent`` may
    # borrow over: team-a's own stop first, then team-b's shrink, then team-b's whole job.
    w = World().cohort("org").queue("team-a", 7, "org").queue("team-b", 1, "org")
    w.run("low", gpus(2), whole(N0, 0, 1), priority=0)
    el = JobSpec(queue="team-b", replicas=5, min_replicas=1, resources=Resources(gpus=1))
    w.run("el", el, *(whole(N0, g) for g in range(2, 7)), priority=10)
    w.run("b1", gpus(1, queue="team-b"), whole(N0, 7), priority=0)
    w.wait(3600)
    w.submit("urgent", gpus(7), priority=10)
    (p,) = w.plan(ELASTIC)
    assert set(p.victims) == {Victim("low", 0), Victim("b1", 0)} and p.shrinks == (Shrink("el", 0, 1),)
    events = w.cycle(lambda s, now: decide(s, now, ELASTIC))
    assert [(type(e).__name__, getattr(e, "victims", None)) for e in events] == [
        ("PreemptionRequested", (Victim("low", 0),)),
        ("ShrinkRequested", None),
        ("PreemptionRequested", (Victim("b1", 0),)),
    ]
    assert w.state.jobs["el"].leaving == [1, 2, 3, 4]


# -- the backlog judged form by form --------------------------------------------------------------


class _Counted(dict[str, Any]):
    """``State.jobs`` that counts the jobs asked for by id."""

    asked = 0

    def __getitem__(self, key: str) -> Any:
        self.asked += 1
        return super().__getitem__(key)


def test_a_form_no_victims_could_help_is_read_once_however_deep() -> None:
    """As ``bench.e2e``'s backlog: a queue's quota held by jobs nobody may stop, and a thousand
    one-GPU jobs behind it, each with its own estimate. The first waits and holds the quota;
    the rest of its form is passed over unread."""
    w = World().queue("backlog", nominal=2)
    w.run("r0", gpus(1, "backlog", preemptible=False), whole(N0, 0))
    w.run("r1", gpus(1, "backlog", preemptible=False), whole(N0, 1))
    for i in range(1000):
        w.submit(f"q{i:04d}", gpus(1, "backlog", runtime_estimate_s=10.0 + i))
    jobs = w.state.jobs = _Counted(w.state.jobs)
    assert w.plan() == [] == w.plan(PreemptorConfig(by_form=False))
    by_job = jobs.asked
    jobs.asked = 0
    assert w.plan() == []
    assert jobs.asked < 50 < 1000 <= by_job  # the running jobs, the first queued one, not the rest


def test_a_form_quota_did_not_block_is_judged_again_after_a_commit() -> None:
    """``f-head`` fits the quota (admission's to admit): the rest of its form rests. ``g``'s
    victim is taken in the simulation, and the quota ``g`` then holds blocks ``f-later``, of
    the same form, which gets a victim of its own."""
    w = World().queue("team-a", nominal=8)
    w.run("r1", gpus(4), whole(N0, 0, 1, 2, 3))
    w.run("r3", gpus(1), whole(N0, 4))
    w.submit("f-head", gpus(1), priority=10)
    w.submit("g", gpus(4), priority=5)
    w.submit("f-later", gpus(1), priority=5)
    assert w.victims() == w.victims(PreemptorConfig(by_form=False)) == {"g": ["r3"], "f-later": ["r1"]}


def test_a_hold_keeps_out_each_job_of_a_form_by_its_own_estimate() -> None:
    """``h`` waits (nobody may be stopped that frees 8 GPUs) and holds the queue's quota until
    its holders end. Of the one-GPU form behind it, of ``h``'s priority (so ``h`` could not stop
    them for its room), ``f1`` (no estimate) is kept out; ``f2`` ends before then, so the hold
    does not keep it out, and it gets ``v``."""
    w = World().queue("team-a", nominal=8)
    w.run("r1", gpus(4, preemptible=False, runtime_estimate_s=1000.0), whole(N0, 0, 1, 2, 3))
    w.run("r2", gpus(3, preemptible=False, runtime_estimate_s=1000.0), whole(N0, 4, 5, 6))
    w.run("v", gpus(1, runtime_estimate_s=1000.0), whole(N0, 7))
    w.submit("h", gpus(8), priority=5)
    w.submit("f1", gpus(1), priority=5)
    w.submit("f2", gpus(1, runtime_estimate_s=30.0), priority=5)
    assert w.victims() == w.victims(PreemptorConfig(by_form=False)) == {"f2": ["v"]}


def _admitted(events: list[Event]) -> list[str]:
    return [a.job_id for e in events if isinstance(e, JobsAdmitted) for a in e.admissions]


def test_a_hold_keeps_out_a_job_it_may_not_stop_behind_one_of_the_same_ask_it_may() -> None:
    """``h`` (priority 10) holds the queue's nominal. ``f1`` it may stop (priority 5, preemptible),
    so the hold lets it by (its search then fails: no node matches it); ``f2``, of the same ask,
    may not be preempted, so the hold keeps it out: ``v`` is not stopped for it. A verdict
    cached by ask for ``f1`` must not be read for ``f2``."""
    w = World().queue("team-a", nominal=8)
    w.run("r1", gpus(4, preemptible=False, runtime_estimate_s=1000.0), whole(N0, 0, 1, 2, 3))
    w.run("r2", gpus(3, preemptible=False, runtime_estimate_s=1000.0), whole(N0, 4, 5, 6))
    w.run("v", gpus(1, runtime_estimate_s=1000.0), whole(N0, 7))
    w.submit("h", gpus(8), priority=10)
    w.submit("f1", gpus(1, node_selector={"zone": "nowhere"}), priority=5)
    w.submit("f2", gpus(1, preemptible=False), priority=5)
    assert w.victims() == w.victims(PreemptorConfig(by_form=False)) == {}


def test_a_hold_does_not_let_by_a_job_once_stopped_for_the_held_one() -> None:
    """``J`` was stopped for ``H`` once; never again between the two, so ``H`` could not take its
    room back from it: once ``H`` is held (stopped in turn for ``U``), ``J`` waits behind it."""
    w = World().queue("team-a", nominal=8)
    w.run("A", gpus(2, preemptible=False, runtime_estimate_s=1e6), whole(N0, 0, 1))
    w.run("J", gpus(2, runtime_estimate_s=1e6), whole(N0, 2, 3), priority=0)
    w.submit("H", gpus(6), priority=10)
    w.preempt("H", "J").stop("J").requeue("J")
    w.admit("H").place("H", whole(N0, 2, 3, 4, 5, 6, 7)).start("H")
    w.submit("U", gpus(4, runtime_estimate_s=100.0), priority=20)
    w.preempt("U", "H").stop("H").requeue("H")
    w.admit("U").place("U", whole(N0, 2, 3, 4, 5)).start("U")
    assert _admitted(w.cycle(admission)) == []


def test_a_hold_whose_room_is_free_now_lets_nothing_by_into_it() -> None:
    """``H`` fits its queue's nominal now and waits only for what team-b borrows: the preemptor
    takes that back at once. ``J``, which ``H`` may stop, is not let into the room meanwhile
    (it would be stopped as soon as it ran)."""
    w = World().cohort("org").queue("team-a", nominal=8, cohort="org")
    w.queue("team-b", nominal=0, cohort="org")
    w.run("Y", gpus(2, runtime_estimate_s=1e6), whole(N0, 0, 1), priority=20)
    w.run("R", gpus(4, queue="team-b", runtime_estimate_s=1e6), whole(N0, 2, 3, 4, 5))
    w.submit("H", gpus(6), priority=10)
    w.submit("J", gpus(2, runtime_estimate_s=1e6), priority=0)
    assert _admitted(w.cycle(admission)) == []
    assert w.victims() == {"H": ["R"]}
