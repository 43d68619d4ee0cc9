"""Kueue's classical preemption tables, as corral answers them.

The cases follow ``TestPreemption`` in Kueue's ``pkg/scheduler/preemption/preemption_test.go``
(kubernetes-sigs/kueue), from "preempt lowest priority" to "long range preemption", in its order,
then ``TestCandidatesOrdering`` of the same file (which running job is taken first). Each case
carries Kueue's name, which its test id spells.

Translation. Kueue's CPUs are GPUs one for one, on corral's quota key ``"*"``; the memory quotas and
the alpha/beta flavors of Kueue's queues are left out, as no case kept here asks for memory or
chooses between flavors. A ClusterQueue is a queue with the same nominal quota, borrowing and
lending limits and the same three preemption fields, each written out: Kueue's default is ``Never``
for all three, corral's is to stop work. Every one of Kueue's default ClusterQueues exists in every
case, as in Kueue's test, so a cohort holds all its members. An admitted workload is a job of
one-GPU workers that runs, admitted in the order the table lists them; the incoming workload is a
queued job that its queue's quota blocks, which is what makes corral's preemptor look for victims
for it. The cluster has room for every GPU the cohorts could hand out, so quota, never a full node,
is what blocks, as in Kueue, where the flavor assigner answered "preempt".

Each case checks that admission cannot admit the incoming job as things are, that the preemptor
proposes Kueue's victims, that the fold accepts the proposal and the victims checkpoint for the
incoming job, and that once they have stopped admission admits it.

Cases left out, because a corral queue holds one quota, of GPUs, with no second resource and no
pod sets (GPU models are its flavors: ``test_kueue_flavors.py``): "only preempt workloads using
the chosen flavor" (two memory flavors), "reclaim quota if workload requests 0 resources for a
resource at nominal quota" (a second resource asked at 0; with one resource it is "reclaim quota
from borrower"), "preempting locally and borrowing other resources in cohort, without cohort
candidates" and "..., with cohort candidates" (the job borrows memory while preempting for CPU),
"each podset preempts a different flavor", "preemptions from cq when target queue is exhausted
for two requested resources" and "... for one requested resource, but not the other" (CPU and
memory both asked). Of ``TestCandidatesOrdering``:
the three priority boost cases (corral has no priority boost), "evicted workload first" (a job
already being stopped is left alone, never a candidate again) and "workloads with higher LQ usage
first" (corral has no LocalQueues).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corral.events import subjects as subj
from corral.events.decisions import GpuClaim, PreemptionRequested
from corral.events.queues import (
    ApplyQueue,
    BorrowWithinCohort,
    CohortSpec,
    PreemptionPolicy,
    QueueSpec,
    Quota,
    ReclaimWithinCohort,
    WithinQueue,
)
from corral.projections.quota import ANY, Ledger
from corral.services.admission.decide import decide as admission
from corral.services.preemptor.decide import PreemptorConfig, decide
from tests.unit.test_preemptor import World, _admitted, gpus

GPUS_PER_NODE = 8
NODES = 4  # 32 GPUs: more than any case's cohort could ever hand out, with the incoming job


def _queue(
    name: str,
    nominal: int,
    cohort: str | None = None,
    *,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    within: WithinQueue = "never",
    reclaim: ReclaimWithinCohort = "never",
    borrow: BorrowWithinCohort = "never",
    threshold: int | None = None,
) -> QueueSpec:
    """A queue as Kueue's ClusterQueue: every policy field is written, Kueue's default ``never``
    unless the ClusterQueue says otherwise."""
    policy = PreemptionPolicy(
        within_queue=within,
        reclaim_within_cohort=reclaim,
        borrow_within_cohort=borrow,
        borrow_priority_threshold=threshold,
    )
    quota = Quota(nominal, borrowing_limit=borrowing_limit, lending_limit=lending_limit)
    return QueueSpec(name=name, cohort=cohort, quotas={ANY: quota}, preemption=policy)


def _shared_cq(
    name: str,
    nominal: int,
    borrowing_limit: int,
    *,
    within: WithinQueue = "never",
    reclaim: ReclaimWithinCohort = "never",
) -> QueueSpec:
    """A queue of Kueue's cohort ``with_shared_cq``, all of whose queues but ``shared`` borrow
    over lower priorities up to priority 0 (BorrowWithinCohort LowerPriority, threshold 0)."""
    return _queue(
        name,
        nominal,
        "with_shared_cq",
        borrowing_limit=borrowing_limit,
        within=within,
        reclaim=reclaim,
        borrow="lower-priority",
        threshold=0,
    )


# Kueue's ``defaultClusterQueues`` (``Resource(cpu, nominal, borrowingLimit)``), CPU read as GPUs.
DEFAULT_QUEUES: tuple[QueueSpec, ...] = (
    _queue("standalone", 6, within="lower-priority"),
    _queue("c1", 6, "cohort", borrowing_limit=6, within="lower-priority", reclaim="lower-priority"),
    _queue("c2", 6, "cohort", borrowing_limit=6, reclaim="any"),
    _queue("d1", 6, "cohort-no-limits", within="lower-priority", reclaim="lower-priority"),
    _queue("d2", 6, "cohort-no-limits", reclaim="any"),
    _queue("l1", 6, "legion", borrowing_limit=12, within="lower-priority", reclaim="lower-priority"),
    _queue("preventStarvation", 6, within="lower-or-newer-equal-priority"),
    _shared_cq("a_standard", 1, 12, reclaim="lower-priority"),
    _shared_cq("b_standard", 1, 12, within="lower-priority", reclaim="any"),
    _shared_cq("a_best_effort", 1, 12, reclaim="lower-priority"),
    _shared_cq("b_best_effort", 0, 13, reclaim="lower-priority"),
    _queue("shared", 10, "with_shared_cq"),
    _queue("lend1", 6, "cohort-lend", lending_limit=4, within="lower-priority", reclaim="lower-priority"),
    _queue("lend2", 6, "cohort-lend", lending_limit=2, within="lower-priority", reclaim="lower-priority"),
    _queue("a", 2, "cohort-three", within="lower-priority", reclaim="any"),
    _queue("b", 2, "cohort-three"),
    _queue("c", 2, "cohort-three"),
)


@dataclass(frozen=True)
class Workload:
    """A Kueue workload: its name, ClusterQueue, CPUs (here GPUs) and priority."""

    name: str
    queue: str
    gpus: int
    priority: int = 0


def wl(name: str, queue: str, n: int, priority: int = 0) -> Workload:
    return Workload(name, queue, n, priority)


@dataclass(frozen=True)
class Case:
    """One Kueue table case. ``admitted``: admitted and running in this order (the last is the
    most recently admitted); ``incoming``: the queued job, always named ``in``; ``want``: the jobs
    stopped for it."""

    admitted: tuple[Workload, ...]
    incoming: Workload
    want: frozenset[str]
    queues: tuple[QueueSpec, ...] = DEFAULT_QUEUES
    cohorts: tuple[CohortSpec, ...] = ()  # cohorts with a parent; the rest are made bare
    submitted_first: bool = False  # the incoming job was submitted before the admitted ones
    checkpointed: tuple[str, ...] = ()  # jobs that save a checkpoint an hour on, just before ``in``


def _world(case: Case) -> World:
    w = World(nodes=NODES)
    named = {c.name for c in case.cohorts}
    for c in case.cohorts:
        if c.parent is not None and c.parent not in named:
            w.cohort(c.parent)
            named.add(c.parent)
        w.cohort(c.name, c.parent)
    for q in case.queues:
        if q.cohort is not None and q.cohort not in named:
            w.cohort(q.cohort)
            named.add(q.cohort)
    for q in case.queues:
        # The spec itself, not World.queue: that knows no borrowing limit.
        w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    job = case.incoming
    if case.submitted_first:
        w.submit(job.name, gpus(1, job.queue, replicas=job.gpus), job.priority)
    free = 0  # the next free GPU, counted across the nodes
    for a in case.admitted:
        workers = []
        for _ in range(a.gpus):
            node, index = divmod(free, GPUS_PER_NODE)
            workers.append((f"node-{node:02d}", (GpuClaim(index),)))
            free += 1
        w.run(a.name, gpus(1, a.queue, replicas=a.gpus), *workers, priority=a.priority)
    if case.checkpointed:
        w.wait(3600)
        for step, name in enumerate(case.checkpointed, 1):
            w.checkpoint(name, step)
    if not case.submitted_first:
        w.submit(job.name, gpus(1, job.queue, replicas=job.gpus), job.priority)
    return w


def _check(case: Case) -> None:
    w = _world(case)
    job = case.incoming
    # Quota, not room, keeps the job out, as in Kueue's table: its queue cannot fit it, and
    # admission does not admit it as things are.
    assert not Ledger.from_state(w.state).fits(job.queue, ANY, job.gpus * 1000)
    assert _admitted(w.fork().cycle(admission)) == []
    # Every proposal is folded: World.emit fails on a record the fold rejects.
    events = w.cycle(lambda state, now: decide(state, now, PreemptorConfig()))
    proposals = [e for e in events if isinstance(e, PreemptionRequested)]
    assert all(p.beneficiary == job.name for p in proposals), proposals
    victims = frozenset(v.job_id for p in proposals for v in p.victims)
    assert victims == case.want
    for v in victims:
        stopping = w.state.jobs[v]
        assert (stopping.phase, stopping.preempted_for) == ("checkpointing", job.name)
    if victims:
        # What the victims give back is enough: once they have stopped, the job is admitted.
        for v in sorted(victims):
            w.stop(v)
        assert _admitted(w.cycle(admission)) == [job.name]


def _id(name: str) -> str:
    return name.replace(" ", "-").replace(",", "").replace(";", "").replace("=", "-")


def _case(name: str, case: Case, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(case, id=_id(name), marks=marks)


# -- TestPreemption -------------------------------------------------------------------------------

PREEMPTION_CASES = [
    _case(
        "preempt lowest priority",
        Case(
            admitted=(
                wl("low", "standalone", 2, -1),
                wl("mid", "standalone", 2),
                wl("high", "standalone", 2, 1),
            ),
            incoming=wl("in", "standalone", 2, 1),
            want=frozenset({"low"}),
        ),
    ),
    _case(
        "preempt multiple",
        Case(
            admitted=(
                wl("low", "standalone", 2, -1),
                wl("mid", "standalone", 2),
                wl("high", "standalone", 2, 1),
            ),
            incoming=wl("in", "standalone", 3, 1),
            want=frozenset({"low", "mid"}),
        ),
    ),
    _case(
        "no preemption for low priority",
        Case(
            admitted=(wl("low", "standalone", 3, -1), wl("mid", "standalone", 3)),
            incoming=wl("in", "standalone", 1, -1),
            want=frozenset(),
        ),
    ),
    _case(
        "not enough low priority workloads",
        Case(
            admitted=(wl("low", "standalone", 3, -1), wl("mid", "standalone", 3)),
            incoming=wl("in", "standalone", 4),
            want=frozenset(),
        ),
    ),
    _case(
        "some free quota, preempt low priority",
        Case(
            admitted=(
                wl("low", "standalone", 1, -1),
                wl("mid", "standalone", 1),
                wl("high", "standalone", 3, 1),
            ),
            incoming=wl("in", "standalone", 2, 1),
            want=frozenset({"low"}),
        ),
    ),
    # Stopping mid alone frees enough, so low is spared.
    _case(
        "minimal set excludes low priority",
        Case(
            admitted=(
                wl("low", "standalone", 1, -1),
                wl("mid", "standalone", 2),
                wl("high", "standalone", 3, 1),
            ),
            incoming=wl("in", "standalone", 2, 1),
            want=frozenset({"mid"}),
        ),
    ),
    # c2 borrows 3 of c1's; c2-high is of in's priority, which c1's reclaim (lower-priority) may
    # not stop.
    _case(
        "reclaim quota from borrower",
        Case(
            admitted=(wl("c1-low", "c1", 3, -1), wl("c2-mid", "c2", 3), wl("c2-high", "c2", 6, 1)),
            incoming=wl("in", "c1", 3, 1),
            want=frozenset({"c2-mid"}),
        ),
    ),
    # c2-low-1 is of a lower priority, but c2 borrows nothing, so nothing of c2's may be taken back.
    # Kueue's table asks 4 CPUs and hands the preemptor a Preempt assignment; 4 fit in the cohort's
    # 4 free GPUs (c1 borrowing 2 of them), so corral would simply admit the job (see the test at
    # the end of the file). 7 cannot be had without taking quota from someone, which is what the
    # case is about.
    _case(
        "no workloads borrowing",
        Case(
            admitted=(wl("c1-high", "c1", 4, 1), wl("c2-low-1", "c2", 4, -1)),
            incoming=wl("in", "c1", 7, 1),
            want=frozenset(),
        ),
    ),
    # c2 borrows only 2; c1 would still borrow 2 once they are back, and c1 may not borrow over
    # others (borrow_within_cohort never).
    _case(
        "not enough workloads borrowing",
        Case(
            admitted=(wl("c1-high", "c1", 4, 1), wl("c2-low-1", "c2", 4, -1), wl("c2-low-2", "c2", 4, -1)),
            incoming=wl("in", "c1", 4, 1),
            want=frozenset(),
        ),
    ),
    # c1 borrows already and c2 does not, so only c1's own jobs are candidates; the job borrows
    # once c1-low is stopped.
    _case(
        "preempting locally and borrowing same resource in cohort",
        Case(
            admitted=(wl("c1-med", "c1", 4, 0), wl("c1-low", "c1", 4, -1), wl("c2-low-1", "c2", 4, -1)),
            incoming=wl("in", "c1", 4, 1),
            want=frozenset({"c1-low"}),
        ),
    ),
    _case(
        "preempting locally and borrowing same resource in cohort; no borrowing limit in the cohort",
        Case(
            admitted=(wl("d1-med", "d1", 4, 0), wl("d1-low", "d1", 4, -1), wl("d2-low-1", "d2", 4, -1)),
            incoming=wl("in", "d1", 4, 1),
            want=frozenset({"d1-low"}),
        ),
    ),
    # Nobody to borrow from, so the 4 must come from l1's own 6; l1-low (2) is not enough, l1-med
    # (4) is.
    _case(
        "preempting locally and not borrowing same resource in 1-queue cohort",
        Case(
            admitted=(wl("l1-med", "l1", 4, 0), wl("l1-low", "l1", 2, -1)),
            incoming=wl("in", "l1", 4, 1),
            want=frozenset({"l1-med"}),
        ),
    ),
    _case(
        "do not reclaim borrowed quota from same priority for withinCohort=ReclaimFromLowerPriority",
        Case(
            admitted=(wl("c1", "c1", 2), wl("c2-1", "c2", 4), wl("c2-2", "c2", 4)),
            incoming=wl("in", "c1", 4),
            want=frozenset(),
        ),
    ),
    # c2 reclaims whatever the priority; of c1's two, the lower-priority one goes.
    _case(
        "reclaim borrowed quota from same priority for withinCohort=ReclaimFromAny",
        Case(
            admitted=(wl("c1-1", "c1", 4), wl("c1-2", "c1", 4, 1), wl("c2", "c2", 2)),
            incoming=wl("in", "c2", 4),
            want=frozenset({"c1-1"}),
        ),
    ),
    # c1 (nominal 6) runs 5, c2 (nominal 6) runs 7 and borrows 1: the cohort's 12 are in use. The
    # incoming 4 of c1 fits only once c2's lower-priority borrower is taken back and c1's own
    # lower-priority job is gone too (c1 then within its nominal, so it reclaims).
    _case(
        "preempt from all ClusterQueues in cohort",
        Case(
            admitted=(
                wl("c1-low", "c1", 3, -1),
                wl("c1-mid", "c1", 2, 0),
                wl("c2-low", "c2", 3, -1),
                wl("c2-mid", "c2", 4, 0),
            ),
            incoming=wl("in", "c1", 4, 0),
            want=frozenset({"c1-low", "c2-low"}),
        ),
    ),
    # c2 may not stop its own jobs (withinClusterQueue Never). Kueue's test forces the flavor
    # assigner's answer to "preempt" although the cohort has room; corral looks for victims only
    # for a job quota blocks, so c1 fills its own nominal here (within it, c1 lends nothing and is
    # no candidate either) and the incoming 4 does not fit the 3 left.
    _case(
        "can't preempt workloads in ClusterQueue for withinClusterQueue=Never",
        Case(
            admitted=(wl("c1-own", "c1", 6, -1), wl("c2-low", "c2", 3, -1)),
            incoming=wl("in", "c2", 4, 1),
            want=frozenset(),
        ),
    ),
    # lower-or-newer-equal-priority: of wl2 and wl3 (equal priority, both submitted after the
    # incoming job), the most recently admitted goes; wl1, of a higher priority, stays.
    _case(
        "preempt newer workloads with the same priority",
        Case(
            admitted=(
                wl("wl1", "preventStarvation", 2, 2),
                wl("wl3", "preventStarvation", 2, 1),
                wl("wl2", "preventStarvation", 2, 1),
            ),
            incoming=wl("in", "preventStarvation", 2, 1),
            want=frozenset({"wl2"}),
            submitted_first=True,
        ),
    ),
    # a_standard would borrow 9; the borrowers below the threshold (priority -1 <= 0) may be taken.
    # One of them, the 10-GPU one, is enough; the other is filled back.
    _case(
        "use BorrowWithinCohort; allow preempting a lower-priority workload from another "
        "ClusterQueue while borrowing",
        Case(
            admitted=(
                wl("a_best_effort_low", "a_best_effort", 10, -1),
                wl("b_best_effort_low", "b_best_effort", 1, -1),
            ),
            incoming=wl("in", "a_standard", 10, 0),
            want=frozenset({"a_best_effort_low"}),
        ),
    ),
    _case(
        "use BorrowWithinCohort; don't allow preempting a lower-priority workload with priority "
        "above MaxPriorityThreshold, if borrowing is required even after the preemption",
        Case(
            admitted=(wl("b_standard", "b_standard", 10, 1),),
            incoming=wl("in", "a_standard", 10, 2),
            want=frozenset(),
        ),
    ),
    # Above the threshold, but a_standard is then within its nominal: it takes back what it lent.
    _case(
        "use BorrowWithinCohort; allow preempting a lower-priority workload with priority above "
        "MaxPriorityThreshold, if borrowing is not required after the preemption",
        Case(
            admitted=(wl("b_standard", "b_standard", 13, 1),),
            incoming=wl("in", "a_standard", 1, 2),
            want=frozenset({"b_standard"}),
        ),
    ),
    _case(
        "use BorrowWithinCohort; don't allow for preemption of lower-priority workload from the "
        "same ClusterQueue",
        Case(
            admitted=(wl("a_standard", "a_standard", 13, 1),),
            incoming=wl("in", "a_standard", 1, 2),
            want=frozenset(),
        ),
    ),
    # b_standard already holds more than its nominal: a_standard's borrowers are above the
    # threshold, so only b_standard's own lower-priority job may go, the incoming one borrowing.
    _case(
        "use BorrowWithinCohort; only preempt from CQ if no workloads below threshold and already "
        "above nominal",
        Case(
            admitted=(
                wl("a_standard_1", "a_standard", 10, 1),
                wl("a_standard_2", "a_standard", 1, 1),
                wl("b_standard_1", "b_standard", 1, 1),
                wl("b_standard_2", "b_standard", 1, 2),
            ),
            incoming=wl("in", "b_standard", 1, 3),
            want=frozenset({"b_standard_1"}),
        ),
    ),
    # The lowest borrower (-2, below the threshold) goes first; its queue then borrows no more, so
    # a_best_effort_low stays, and b_standard's own lower-priority job makes the rest of the room.
    _case(
        "use BorrowWithinCohort; preempt from CQ and from other CQs with workloads below threshold",
        Case(
            admitted=(
                wl("b_standard_high", "b_standard", 10, 2),
                wl("b_standard_mid", "b_standard", 1, 1),
                wl("a_best_effort_low", "a_best_effort", 1, -1),
                wl("a_best_effort_lower", "a_best_effort", 1, -2),
            ),
            incoming=wl("in", "b_standard", 2, 2),
            want=frozenset({"a_best_effort_lower", "b_standard_mid"}),
        ),
    ),
    # lend1 keeps 2 of its 6 and lends 4, lend2 keeps 4 and lends 2: the cohort pools 6. lend2
    # runs 7 (3 from the pool), lend1 3 (1 from it). The incoming 3 leaves lend1 at its nominal
    # 6: it reclaims from lend2's lower-priority job, not its own.
    _case(
        "reclaim quota from lender",
        Case(
            admitted=(
                wl("lend1-low", "lend1", 3, -1),
                wl("lend2-mid", "lend2", 3, 0),
                wl("lend2-high", "lend2", 4, 1),
            ),
            incoming=wl("in", "lend1", 3, 1),
            want=frozenset({"lend2-mid"}),
        ),
    ),
    _case(
        "preempt from all ClusterQueues in cohort-lend",
        Case(
            admitted=(
                wl("lend1-low", "lend1", 3, -1),
                wl("lend1-mid", "lend1", 2, 0),
                wl("lend2-low", "lend2", 3, -1),
                wl("lend2-mid", "lend2", 4, 0),
            ),
            incoming=wl("in", "lend1", 4, 0),
            want=frozenset({"lend1-low", "lend2-low"}),
        ),
    ),
    # lend1 can never hold more than the 2 it keeps plus the 6 the cohort pools: 9 never fits,
    # whatever is stopped.
    _case(
        "cannot preempt from other ClusterQueues if exceeds requestable quota including lending limit",
        Case(
            admitted=(wl("lend2-low", "lend2", 10, -1),),
            incoming=wl("in", "lend1", 9, 0),
            want=frozenset(),
        ),
    ),
    # a (nominal 2) holds 3: it borrows, so it may not take b's borrowed GPU back (b's jobs are
    # not of a lower priority, and taking back lent quota needs a within its nominal); its own
    # two lowest-priority jobs go, the incoming job borrowing.
    _case(
        "preemptions from cq when target queue is exhausted for the single requested resource",
        Case(
            admitted=(
                wl("a1", "a", 1, -2),
                wl("a2", "a", 1, -2),
                wl("a3", "a", 1, -1),
                wl("b1", "b", 1, 0),
                wl("b2", "b", 1, 0),
                wl("b3", "b", 1, 0),
            ),
            incoming=wl("in", "a", 2, 0),
            want=frozenset({"a1", "a2"}),
        ),
    ),
    # a holds 1 of its 2 and b borrows 3: b's lowest-priority borrower and a's own job make room
    # with a within its nominal, so reclaiming (any priority) covers b5.
    _case(
        "allow preemption from other cluster queues if target cq is not exhausted for the requested resource",
        Case(
            admitted=(
                wl("a1", "a", 1, -1),
                wl("b1", "b", 1, 0),
                wl("b2", "b", 1, 0),
                wl("b3", "b", 1, 0),
                wl("b4", "b", 1, 0),
                wl("b5", "b", 1, -1),
            ),
            incoming=wl("in", "a", 2, 0),
            want=frozenset({"a1", "b5"}),
        ),
    ),
    # Hierarchical cohorts: cohort-left and cohort-right under root. cq-right (nominal 0) borrows
    # 5 of cq-left's 10 through root; cq-left's 8 is within its nominal: it takes them back.
    _case(
        "long range preemption",
        Case(
            queues=(
                _queue("cq-left", 10, "cohort-left", reclaim="any"),
                _queue("cq-right", 0, "cohort-right"),
            ),
            cohorts=(CohortSpec("cohort-left", parent="root"), CohortSpec("cohort-right", parent="root")),
            admitted=(wl("to-be-preempted", "cq-right", 5, 0),),
            incoming=wl("in", "cq-left", 8, 0),
            want=frozenset({"to-be-preempted"}),
        ),
    ),
]


@pytest.mark.parametrize("case", PREEMPTION_CASES)
def test_kueue_preemption(case: Case) -> None:
    _check(case)


def test_no_workloads_borrowing_at_kueues_size_needs_no_preemption() -> None:
    # Kueue's "no workloads borrowing" as its table sizes it: 4 GPUs for c1, which holds 4 of
    # its 6 and may borrow the cohort's 4 free. Corral's admission admits it; nobody is stopped.
    w = _world(
        Case(
            admitted=(wl("c1-high", "c1", 4, 1), wl("c2-low-1", "c2", 4, -1)),
            incoming=wl("in", "c1", 4, 1),
            want=frozenset(),
        )
    )
    assert w.decide() == []
    assert _admitted(w.cycle(admission)) == ["in"]


# -- TestCandidatesOrdering -----------------------------------------------------------------------
#
# Kueue sorts the candidates; corral's order shows in whom it stops when the first candidate alone
# makes room: each case's incoming job needs one GPU and may stop every candidate. The jobs run in
# the order that would put the wrong one first if only the work each would lose counted (the
# earlier a job started, the more it loses), so the rule under test decides.

_PREEMPTOR = _queue("preemptor", 2, "org", within="lower-priority", reclaim="lower-priority")
_OTHER = _queue("other", 0, "org")

ORDERING_CASES = [
    _case(
        "workloads sorted by priority",
        Case(
            queues=(_queue("preemptor", 2, within="lower-priority"),),
            admitted=(wl("low", "preemptor", 1, -10), wl("high", "preemptor", 1, 10)),
            incoming=wl("in", "preemptor", 1, 20),
            want=frozenset({"low"}),
        ),
    ),
    # ``other`` borrows the preemptor queue's second GPU.
    _case(
        "workload from different CQ first",
        Case(
            queues=(_PREEMPTOR, _OTHER),
            admitted=(wl("other", "other", 1, 10), wl("preemptorCq", "preemptor", 1, 10)),
            incoming=wl("in", "preemptor", 1, 20),
            want=frozenset({"other"}),
        ),
    ),
    _case(
        "old workloads last",
        Case(
            queues=(_queue("preemptor", 3, within="lower-priority"),),
            admitted=(
                wl("older", "preemptor", 1, 0),
                wl("current", "preemptor", 1, 0),
                wl("younger", "preemptor", 1, 0),
            ),
            incoming=wl("in", "preemptor", 1, 1),
            want=frozenset({"younger"}),
        ),
    ),
    # The same case, the oldest job having just saved a checkpoint: Kueue's order reads only when
    # each was admitted and would stop ``younger``; corral's reads first what stopping each would
    # throw away (README: victim order within a priority), and ``older`` has nothing to lose.
    _case(
        "old workloads last, the oldest just checkpointed",
        Case(
            queues=(_queue("preemptor", 3, within="lower-priority"),),
            admitted=(
                wl("older", "preemptor", 1, 0),
                wl("current", "preemptor", 1, 0),
                wl("younger", "preemptor", 1, 0),
            ),
            checkpointed=("older",),
            incoming=wl("in", "preemptor", 1, 1),
            want=frozenset({"older"}),
        ),
    ),
    # Kueue runs this one with admission fair sharing on; a LocalQueue's usage orders only jobs of
    # the same ClusterQueue, so the job of the other queue comes first, as without it (corral has
    # no LocalQueues).
    _case(
        "workloads from different CQ are sorted based on priority and timestamp",
        Case(
            queues=(_PREEMPTOR, _OTHER),
            admitted=(
                wl("high_lq_usage_different_cq", "other", 1, 1),
                wl("mid_lq_usage", "preemptor", 1, 10),
            ),
            incoming=wl("in", "preemptor", 1, 20),
            want=frozenset({"high_lq_usage_different_cq"}),
        ),
    ),
]


@pytest.mark.parametrize("case", ORDERING_CASES)
def test_kueue_candidates_ordering(case: Case) -> None:
    _check(case)
