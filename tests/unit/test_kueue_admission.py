"""Kueue's admission table, as corral's admission answers it.

The cases follow ``TestSchedule`` in Kueue's ``pkg/scheduler/scheduler_test.go``
(kubernetes-sigs/kueue, the file as of commit 9129946e), those about which workloads one
scheduling cycle admits given quota: nominal quota, borrowing and lending limits, cohorts and
cohorts that hold quota of their own, priority and borrowing order, partial admission. Each case
carries Kueue's name, which its test id spells.

Translation. Kueue's CPUs (and its ``gpu`` resource) are GPUs one for one on corral's quota key
``"*"``; the resources ``r1`` and ``r2`` of three cases, each workload asking for one, are two GPU
models, each a quota key. A ClusterQueue is a queue with the same nominal quota, borrowing and
lending limits and queueing strategy; a Cohort is a cohort with the same parent and quota. Every
ClusterQueue of Kueue's table (``sales``, ``eng-alpha``, ``eng-beta``, ``lend-a``, ``lend-b``)
exists in every case, as in Kueue's test, so a cohort holds all its members. Kueue's ``eng``
queues have two flavors, ``on-demand`` then ``spot``; only ``on-demand`` is kept, the quota every kept case
admits into (a case whose outcome depends on falling back to ``spot`` is left out). A pod set of
``n`` pods of ``r`` CPUs is a gang of ``n`` workers of ``r`` GPUs; a minimum count makes it an
elastic job with that ``min_replicas``. A workload holding a quota reservation is a running job;
a pending one is a queued job, with its priority, and its creation time gives its place in
submission order. One admission cycle (``decide``) runs on that state, its events are folded,
and then the jobs holding quota must be Kueue's ``wantAssignments`` and the queued ones Kueue's
``wantLeft`` and ``wantInadmissibleLeft``. A second cycle must then admit nothing more: what
Kueue leaves waiting for quota has to keep waiting once this cycle's admissions are counted.

A job that names several GPU models chooses among them as a Kueue workload chooses a flavor; the
cases at the end of this file, in those terms, check that its order and its queue's hold are read
on the model it counts against now.

Kueue's cycle takes one head per ClusterQueue; corral's may admit several jobs of a queue. No kept
case has more than one pending workload per queue, so that never changes an outcome here.

Cases left out, and why:

- Flavors, which corral's one GPU quota key per model has no counterpart of (a job chooses
  between GPU models, not between flavors of one resource with fungibility rules): "use second
  flavor when the first has no preemption candidates; WhenCanPreempt: MayStopSearch", "flavors
  with mixed misconfiguration and insufficient quota", "flavors with mixed taint mismatch and
  exceeding limits", "flavors are structurally incompatible", "can borrow if needs reclaim from
  cohort in different flavor", "not enough resources to borrow, fallback to next flavor;
  WhenCanPreempt: TryNextFlavor", "workload should not fit in clusterQueue with nonexistent
  flavor", "don't assign flavor if there are no candidates for preemption", "admit to second
  flavor when first needs preemption; WhenCanPreempt: TryNextFlavor", "PreemptionOverBorrowing
  preference" (both) and "BorrowingOverPreemption preference".
- Several resources asked together, or a resource the queue does not list: "assign multiple
  resources and flavors", "cannot borrow resource not listed in clusterQueue", "admit workload
  with zero-quantity request for resource not in ClusterQueue", and several pod sets: "partial
  admission multiple variable pod sets", "partial admission disabled, multiple variable pod sets"
  (a corral job has one worker shape; partial admission is not a switch there).
- Admission checks, API errors and Kubernetes objects corral does not have: "workload fits in
  single clusterQueue, with check state ready" and "... pending", "pending admission check with
  nofit and fit flavors", "error during admission", "failed to match clusterQueue selector"
  (namespace selectors; corral's queue tenants are checked at submission), "container does not
  satisfy limitRange constraints", "container resource requests exceed limits", the two
  "prevent integer overflow ..." cases, and "workload-slice fits in single clusterQueue" (Kueue
  grows a job by admitting a replacement workload; corral grows a running elastic job in place,
  ``services/admission/grow.py``).
- Preemption, which the Kueue preemption ports cover (``test_kueue_preemption.py``): "preempt
  workloads in ClusterQueue and cohort", "multiple CQs need preemption", "partial admission
  single variable pod set, preempt first" and "..., preempt with partial admission" (Kueue
  prefers stopping a lower-priority job to admitting fewer pods; corral's admission admits what
  fits and its preemptor acts on its own), "minimal preemptions when target queue is exhausted",
  "A workload is only eligible to do preemptions if it fits fully within nominal quota", the
  three "multiple preemptions ..." cases (run to their end in
  ``test_kueue_integration_scenarios.py``), "prefer reclamation over cq priority based
  preemption", the two "prefer first preemption flavor ..." cases, "preempt when workload
  requests zero of a resource not defined in ClusterQueue" and the three preemption gate cases.
  "workload requiring reclaimation prioritized over wl in another full cq" is kept for what it
  says of admission: nothing fits, nothing is admitted.
- Fair sharing, whose admission cases Kueue keeps in ``scheduler_fs_test.go``: some of them
  follow this table (``FS_CASES``), with the cases they leave out.

The table has no case of a queueing strategy at work (strict FIFO blocking a queue, best effort
letting later workloads pass): Kueue tests that in its queue manager. The strategies of its
ClusterQueues are kept all the same.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from corral.events.jobs import JobsAdmitted
from corral.events.queues import CohortSpec, PreemptionPolicy, QueueSpec, Quota, ReclaimWithinCohort
from corral.projections.quota import ANY
from corral.projections.state import State
from corral.services.admission.decide import decide
from tests.unit.test_admission import Job, admitted, fold_all, job, of

# -- Kueue's ClusterQueues, as corral queues ----------------------------------------------------------


def cq(
    name: str,
    nominal: int,
    cohort: str | None = None,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    strategy: Literal["best-effort-fifo", "strict-fifo"] = "best-effort-fifo",
    reclaim: ReclaimWithinCohort = "any",
    weight: float = 1.0,
) -> QueueSpec:
    quota = Quota(nominal, borrowing_limit=borrowing_limit, lending_limit=lending_limit)
    return QueueSpec(
        name,
        cohort=cohort,
        quotas={ANY: quota},
        strategy=strategy,
        preemption=PreemptionPolicy(reclaim_within_cohort=reclaim),
        weight=weight,
    )


# The ClusterQueues every case of Kueue's table has. ``sales`` stands alone; the ``eng`` queues keep
# their on-demand flavor (Kueue's Resource(cpu, nominal, borrowingLimit)); the ``lend`` queues keep
# Resource(cpu, nominal, "", lendingLimit).
BASE_QUEUES = (
    cq("sales", 50, borrowing_limit=0, strategy="strict-fifo"),
    cq("eng-alpha", 50, cohort="eng", borrowing_limit=50, strategy="strict-fifo"),
    cq("eng-beta", 50, cohort="eng", borrowing_limit=10, strategy="strict-fifo"),
    cq("lend-a", 3, cohort="lend", lending_limit=2),
    cq("lend-b", 2, cohort="lend", lending_limit=2),
)
BASE_COHORTS = (CohortSpec("eng"), CohortSpec("lend"))


def running(job_id: str, queue: str, gpus: int, replicas: int = 1, priority: int = 0) -> Job:
    """A workload holding a quota reservation: ``replicas`` pods of ``gpus`` each."""
    return job(job_id, queue).gpus(gpus).replicas(replicas).with_(priority=priority).running()


def pending(
    job_id: str, queue: str, gpus: int, replicas: int = 1, priority: int = 0, min_count: int | None = None
) -> Job:
    """A pending workload: ``replicas`` pods of ``gpus`` each; ``min_count``: partial admission."""
    return job(job_id, queue).gpus(gpus).replicas(replicas, min_count).with_(priority=priority)


@dataclass(frozen=True)
class Case:
    # Jobs in submission (Kueue: creation) order.
    jobs: tuple[Job, ...]
    # Kueue's wantAssignments: every job holding quota after the cycle.
    holding: frozenset[str]
    # Kueue's wantLeft and wantInadmissibleLeft: the jobs still waiting.
    left: frozenset[str]
    queues: tuple[QueueSpec, ...] = ()
    cohorts: tuple[CohortSpec, ...] = ()
    # Replicas the cycle admits a job with, where Kueue admits fewer pods than asked.
    replicas: dict[str, int] = field(default_factory=dict)


def case(
    *jobs: Job,
    holding: Collection[str],
    left: Collection[str] = (),
    queues: tuple[QueueSpec, ...] = (),
    cohorts: tuple[CohortSpec, ...] = (),
    **kw: Any,
) -> Case:
    return Case(tuple(jobs), frozenset(holding), frozenset(left), queues, cohorts, **kw)


def capacity_case(reclaim: ReclaimWithinCohort) -> Case:
    """ClusterQueueA (2 GPUs) runs a1 (1) and waits with a2 (2); ClusterQueueB (0) waits with b1
    (1). a2 fits A's nominal once A's own a1 ends; whether A lends its idle GPU to b1 meanwhile
    depends, in Kueue, on whether A can always take it back."""
    lent = {"eng-beta/b1-pending"} if reclaim == "any" else set()
    return case(
        running("eng-alpha/a1-admitted", "ClusterQueueA", 1),
        pending("eng-alpha/a2-pending", "ClusterQueueA", 2),
        pending("eng-beta/b1-pending", "ClusterQueueB", 1),
        queues=(
            cq("ClusterQueueA", 2, cohort="root", reclaim=reclaim),
            cq("ClusterQueueB", 0, cohort="root"),
        ),
        cohorts=(CohortSpec("root"),),
        holding={"eng-alpha/a1-admitted"} | lent,
        left={"eng-alpha/a2-pending"} | ({"eng-beta/b1-pending"} - lent),
    )


# Kueue's three ClusterQueues of a cohort, each with r1 and r2 (nominal 10, borrowing limit 10).
# r1 and r2 are two resources of one flavor; a job asks for one of them, so here they are two GPU
# models, each its own quota key.
THREE_CQS = tuple(
    QueueSpec(
        f"cq{i}",
        cohort="co",
        quotas={"r1": Quota(10, borrowing_limit=10), "r2": Quota(10, borrowing_limit=10)},
    )
    for i in (1, 2, 3)
)


def on(j: Job, model: str) -> Job:
    return j.gpus(j.spec.resources.gpus, model)


# Kueue reserves for a queue that cannot always take lent quota back what its waiting job will
# need of the queue's nominal once the queue's own jobs end; corral keeps lent quota only for a
# job that fits the nominal on top of what the queue holds now.


CASES = [
    pytest.param(
        case(
            running("sales/assigned", "sales", 1, replicas=40),
            pending("sales/new", "sales", 1, replicas=11),
            holding={"sales/assigned"},
            left={"sales/new"},
        ),
        id="single clusterQueue full",
    ),
    pytest.param(
        # Kueue skips the workload of a ClusterQueue that does not exist; corral keeps the job
        # queued, admitting none of it, and tells its owner the queue is gone.
        case(
            pending("sales/missing-cq-workload", "non-existent-queue", 1),
            holding=set(),
            left={"sales/missing-cq-workload"},
        ),
        id="skip workload with missing or deleted ClusterQueue (NoFit)",
    ),
    pytest.param(
        case(pending("sales/foo", "nonexistent-cq", 1), holding=set(), left={"sales/foo"}),
        id="workload should not fit in nonexistent clusterQueue",
    ),
    pytest.param(
        case(
            pending("sales/new", "sales", 1),
            pending("eng-alpha/new", "eng-alpha", 1, replicas=51),  # borrows 1 from eng-beta
            holding={"sales/new", "eng-alpha/new"},
        ),
        id="admit in different cohorts",
    ),
    pytest.param(
        case(
            pending("eng-alpha/new", "eng-alpha", 1, replicas=40),
            pending("eng-beta/new", "eng-beta", 1, replicas=40),
            holding={"eng-alpha/new", "eng-beta/new"},
        ),
        id="admit in same cohort with no borrowing",
    ),
    pytest.param(
        # eng-alpha's 45 are within its nominal and go first; eng-beta's 56 would borrow 6 of
        # the 5 the cohort has left. (Kueue's eng-beta could later take the spot flavor, which
        # this translation leaves out; in this cycle it waits.)
        case(
            pending("eng-alpha/new", "eng-alpha", 1, replicas=45),
            pending("eng-beta/new", "eng-beta", 1, replicas=56),
            holding={"eng-alpha/new"},
            left={"eng-beta/new"},
        ),
        id="cannot borrow if cohort was assigned and would result in overadmission",
    ),
    pytest.param(
        case(
            pending("eng-alpha/new", "eng-alpha", 1, replicas=45),
            pending("eng-beta/new", "eng-beta", 1, replicas=55),
            holding={"eng-alpha/new", "eng-beta/new"},
        ),
        id="can borrow if cohort was assigned and will not result in overadmission",
    ),
    pytest.param(
        # lend-b is at its nominal 2; lend-a lends at most 2 of its 3, and b asks 3.
        case(
            running("lend/a", "lend-b", 2),
            pending("lend/b", "lend-b", 3),
            holding={"lend/a"},
            left={"lend/b"},
        ),
        id="workload exceeds lending limit when borrow in cohort",
    ),
    pytest.param(
        # root > child > {cq-lender (10, lends at most 3), cq-borrower (5, borrows up to 10)}.
        case(
            running("eng-alpha/wl-existing", "cq-borrower", 5),
            pending("eng-alpha/wl-pending", "cq-borrower", 4),
            queues=(
                cq("cq-lender", 10, cohort="child", lending_limit=3),
                cq("cq-borrower", 5, cohort="child", borrowing_limit=10),
            ),
            cohorts=(CohortSpec("root"), CohortSpec("child", parent="root")),
            holding={"eng-alpha/wl-existing"},
            left={"eng-alpha/wl-pending"},
        ),
        id="hierarchical cohort respects lending limit when borrowing",
    ),
    pytest.param(
        case(
            running("eng-alpha/wl-existing", "cq-borrower", 5),
            pending("eng-alpha/wl-borrowing", "cq-borrower", 5),
            queues=(
                cq("cq-lender", 10, cohort="child", lending_limit=5),
                cq("cq-borrower", 5, cohort="child", borrowing_limit=10),
            ),
            cohorts=(CohortSpec("root"), CohortSpec("child", parent="root")),
            holding={"eng-alpha/wl-existing", "eng-alpha/wl-borrowing"},
        ),
        id="hierarchical cohort allows borrowing up to lending limit",
    ),
    pytest.param(
        # eng-gamma (50, borrowing limit 10) already holds 51 of the cohort's on-demand 150 (its
        # 100 spot pods are left out with the flavor: they take all of the cohort's spot quota, so
        # no pending workload could use spot either). eng-beta's 50 and eng-alpha's 1 are within
        # their nominal; eng-gamma's next 50 would take it to 101, past its limit of 60.
        case(
            running("eng-gamma/existing", "eng-gamma", 1, replicas=51),
            pending("eng-beta/new", "eng-beta", 1, replicas=50),
            pending("eng-alpha/new-alpha", "eng-alpha", 1),
            pending("eng-gamma/new-gamma", "eng-gamma", 1, replicas=50),
            queues=(cq("eng-gamma", 50, cohort="eng", borrowing_limit=10),),
            holding={"eng-gamma/existing", "eng-beta/new", "eng-alpha/new-alpha"},
            left={"eng-gamma/new-gamma"},
        ),
        id="no overadmission while borrowing",
    ),
    pytest.param(
        # 50 pods of 2 with at least 20: as many as sales' 50 allow, 25.
        case(
            pending("sales/new", "sales", 2, replicas=50, min_count=20),
            holding={"sales/new"},
            replicas={"sales/new": 25},
        ),
        id="partial admission single variable pod set",
    ),
    pytest.param(
        case(
            on(pending("sales/wl1", "cq1", 16, priority=-1), "r1"),
            on(pending("sales/wl2", "cq2", 16, priority=-2), "r2"),
            queues=THREE_CQS,
            cohorts=(CohortSpec("co"),),
            holding={"sales/wl1", "sales/wl2"},
        ),
        id="two workloads can borrow different resources from the same flavor in the same cycle",
    ),
    pytest.param(
        case(
            on(pending("sales/wl1", "cq1", 16, priority=-1), "r1"),
            on(pending("sales/wl2", "cq2", 14, priority=-2), "r1"),
            queues=THREE_CQS,
            cohorts=(CohortSpec("co"),),
            holding={"sales/wl1", "sales/wl2"},
        ),
        id="two workloads can borrow the same resources from the same flavor in the same cycle"
        " if fits in the cohort quota",
    ),
    pytest.param(
        # Both borrow; the higher priority goes first and leaves 14 of the cohort's 30.
        case(
            on(pending("sales/wl1", "cq1", 16, priority=-1), "r1"),
            on(pending("sales/wl2", "cq2", 16, priority=-2), "r1"),
            queues=THREE_CQS,
            cohorts=(CohortSpec("co"),),
            holding={"sales/wl1"},
            left={"sales/wl2"},
        ),
        id="only one workload can borrow one resources from the same flavor in the same cycle"
        " if cohort quota cannot fit",
    ),
    pytest.param(
        # cq_a (0, borrows up to 3) holds 2 and would need 5 for a: it never fits. It must not
        # keep cq_b's b, which borrows 1 of cq_shared's 2 left.
        case(
            pending("eng-alpha/a", "cq_a", 3),
            pending("eng-beta/b", "cq_b", 1),
            running("eng-alpha/admitted_a", "cq_a", 2),
            queues=(
                cq("cq_shared", 4, cohort="preemption-while-borrowing", borrowing_limit=0),
                cq(
                    "cq_a",
                    0,
                    cohort="preemption-while-borrowing",
                    borrowing_limit=3,
                    reclaim="lower-priority",
                ),
                cq("cq_b", 0, cohort="preemption-while-borrowing", reclaim="lower-priority"),
            ),
            cohorts=(CohortSpec("preemption-while-borrowing"),),
            holding={"eng-alpha/admitted_a", "eng-beta/b"},
            left={"eng-alpha/a"},
        ),
        id="preemption while borrowing, workload waiting for preemption should not block"
        " a borrowing workload in another CQ",
    ),
    pytest.param(
        # More than sales could ever hold. Kueue keeps it pending; corral refuses such a job at
        # submission ("never-fits"), and one queued already is left waiting, as here.
        case(pending("sales/new", "sales", 100), holding=set(), left={"sales/new"}),
        id="not enough resources",
    ),
    pytest.param(
        # Of the cohort's 20, CQ1 (10) holds 5 and CQ3 (0) borrows 10: 5 are idle. CQ1's WL1 (10)
        # would take CQ1 to 15, borrowing 5 more than can be had; CQ2's WL2 (10) is within CQ2's
        # nominal, but only taking back what CQ3 borrows would make room for it (the preemption
        # ports cover that part). Admission admits neither.
        case(
            running("eng-alpha/Admitted-Workload-1", "CQ1", 5),
            pending("eng-alpha/WL1", "CQ1", 10),
            pending("eng-beta/WL2", "CQ2", 10),
            running("eng-gamma/Admitted-Workload-2", "CQ3", 5, priority=0),
            running("eng-gamma/Admitted-Workload-3", "CQ3", 5, priority=1),
            queues=(
                cq("CQ1", 10, cohort="other", reclaim="never"),
                cq("CQ2", 10, cohort="other", reclaim="any"),
                cq("CQ3", 0, cohort="other", reclaim="never"),
            ),
            cohorts=(CohortSpec("other"),),
            holding={
                "eng-alpha/Admitted-Workload-1",
                "eng-gamma/Admitted-Workload-2",
                "eng-gamma/Admitted-Workload-3",
            },
            left={"eng-alpha/WL1", "eng-beta/WL2"},
        ),
        id="workload requiring reclaimation prioritized over wl in another full cq",
    ),
    pytest.param(
        capacity_case("any"),
        id="capacity not blocked when lending clusterqueue can reclaim (ReclaimWithinCohort=Any)",
    ),
    pytest.param(
        capacity_case("lower-priority"),
        id="capacity blocked when lending clusterqueue not guaranteed to reclaim"
        " (ReclaimWithinCohort=LowerPriority)",
    ),
    pytest.param(
        capacity_case("never"),
        id="capacity blocked when lending clusterqueue not guaranteed to reclaim (ReclaimWithinCohort=Never)",
    ),
    pytest.param(
        # root > {cohort guaranteed (4 of its own) > queue guaranteed (0), queue best-effort (0)}.
        # Both heads borrow all they ask. guaranteed's comes from its own cohort, a subtree of
        # height 1; best-effort's from root, the whole tree, of height 2: guaranteed goes first
        # although best-effort has the higher priority, and best-effort finds nothing left.
        case(
            pending("eng-alpha/guaranteed", "guaranteed", 4, priority=0),
            pending("eng-alpha/best-effort", "best-effort", 4, priority=3),
            queues=(cq("guaranteed", 0, cohort="guaranteed"), cq("best-effort", 0, cohort="root")),
            cohorts=(CohortSpec("root"), CohortSpec("guaranteed", parent="root", quotas={ANY: Quota(4)})),
            holding={"eng-alpha/guaranteed"},
            left={"eng-alpha/best-effort"},
        ),
        id="in a hierarchical cohort, workload borrowing less is scheduled first",
    ),
]

# ``TestScheduleForFairSharing`` in Kueue's ``pkg/scheduler/scheduler_fs_test.go`` (the file as
# of commit ff69552e): the same cycle, with Kueue's fair sharing on. corral's admission always
# weighs shares (``services/admission/order.py``), so the cases run on the same table; each
# names its cohorts and queues, next to Kueue's base ones. Kueue's fair-sharing mode orders
# heads by each queue's dominant share with the job admitted; corral's order is Kueue's
# classical one, the shares (the job's own ask not counted) breaking ties (README: "Fair-share
# admission order is Kueue's classical one ..."), so where the two part, the case expects
# corral's. corral refuses a weight of 0: a tiny weight stands for it.
ZERO_WEIGHT = 1e-3

FS_CASES = [
    pytest.param(
        # b borrows 4 of cohort A's 8 with b0; b1 and c1 would each borrow 4 more. Kueue admits
        # c1, whose queue's share is 0 against b's infinite one, b1's priority only a tie-break.
        # corral ranks borrowers by priority before shares (order.py, rule 3: a borrower of a
        # higher priority could stop the lower one at once), so b1 goes first, and c1 no longer
        # fits.
        case(
            running("eng-alpha/b0", "b", 4),
            pending("eng-alpha/b1", "b", 4, priority=9001),
            pending("eng-alpha/c1", "c", 4),
            queues=(
                cq("b", 0, cohort="A", weight=ZERO_WEIGHT),
                cq("c", 0, cohort="A", weight=ZERO_WEIGHT),
            ),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(8)}),),
            holding={"eng-alpha/b0", "eng-alpha/b1"},
            left={"eng-alpha/c1"},
        ),
        id="fair sharing two queues with weight 0 schedules workload which borrows less",
    ),
    pytest.param(
        # As above, on weights of 123456789: the same order, priority before shares.
        case(
            running("eng-alpha/b0", "b", 4),
            pending("eng-alpha/b1", "b", 4, priority=9001),
            pending("eng-alpha/c1", "c", 4),
            queues=(cq("b", 0, cohort="A", weight=123456789), cq("c", 0, cohort="A", weight=123456789)),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(8)}),),
            holding={"eng-alpha/b0", "eng-alpha/b1"},
            left={"eng-alpha/c1"},
        ),
        id="fair sharing two queues with high weight schedules workload which borrows less",
    ),
    pytest.param(
        # a's quota is its cohort's, b's its own in a cohort of one, c stands alone: all admit.
        case(
            pending("eng-alpha/a1", "a", 10),
            pending("eng-alpha/b1", "b", 10),
            pending("eng-alpha/c1", "c", 10),
            queues=(cq("a", 0, cohort="A"), cq("b", 10, cohort="B"), cq("c", 10)),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(10)}), CohortSpec("B")),
            holding={"eng-alpha/a1", "eng-alpha/b1", "eng-alpha/c1"},
        ),
        id="fair sharing schedule singleton cqs and cq without cohort",
    ),
    pytest.param(
        case(
            pending("eng-alpha/b1", "b", 10, priority=99),
            pending("eng-alpha/c1", "c", 10, priority=101),
            queues=(cq("b", 0, cohort="A"), cq("c", 0, cohort="A")),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(10)}), CohortSpec("B")),
            holding={"eng-alpha/c1"},
            left={"eng-alpha/b1"},
        ),
        id="fair sharing schedule highest priority first",
    ),
    pytest.param(
        # Kueue's c1 was created a second before b1: here it is submitted first.
        case(
            pending("eng-alpha/c1", "c", 10, priority=101),
            pending("eng-alpha/b1", "b", 10, priority=101),
            queues=(cq("b", 0, cohort="A"), cq("c", 0, cohort="A")),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(10)}), CohortSpec("B")),
            holding={"eng-alpha/c1"},
            left={"eng-alpha/b1"},
        ),
        id="fair sharing schedule earliest timestamp first",
    ),
    pytest.param(
        # 100 on sales' 50, which borrows nothing. (At submission corral refuses a job its
        # queue could never hold; put straight into the state, admission leaves it waiting.)
        case(pending("sales/new", "sales", 100), holding=set(), left={"sales/new"}),
        id="not enough resources with fair sharing enabled",
    ),
    pytest.param(
        # Cohort A (100): b holds 10 with b0 and asks 50 more, c asks 75. Kueue weighs each
        # queue's share with its job admitted (b 60, c 75) and admits b1. corral's share leaves
        # the job's own ask out (README: "Fair-share admission order is Kueue's classical
        # one"): b's share is 10, c's 0, so c1 goes first, and b1 no longer fits.
        case(
            running("eng-alpha/b0", "b", 10),
            pending("eng-alpha/b1", "b", 50),
            pending("eng-alpha/c1", "c", 75),
            queues=(cq("b", 0, cohort="A"), cq("c", 0, cohort="A")),
            cohorts=(CohortSpec("A", quotas={ANY: Quota(100)}),),
            holding={"eng-alpha/b0", "eng-alpha/c1"},
            left={"eng-alpha/b1"},
        ),
        id="fair sharing schedule workload with lowest drf after admission",
    ),
    pytest.param(
        #            root
        #          /      \
        #   Cohort-A(10)  Cohort-B
        #       |         /      \
        #     cq-a(0)  cq-b(5)  cq-c(0)
        # c0 holds 10 of cq-c's, borrowing cq-b's 5 and 5 of Cohort-A's; 5 are free. Kueue
        # compares subtrees at root: Cohort-B borrows, Cohort-A would not with wl-a, so wl-a goes
        # first and wl-b no longer fits. corral's order is Kueue's classical one (README:
        # "Fair-share admission order is Kueue's classical one (who borrows least far up the tree
        # goes first)"): wl-b is within cq-b's own nominal, which it may take back from c0, so
        # it goes first, and wl-a waits.
        case(
            running("eng-alpha/c0", "cq-c", 10),
            pending("eng-alpha/wl-a", "cq-a", 5),
            pending("eng-alpha/wl-b", "cq-b", 5),
            queues=(
                cq("cq-a", 0, cohort="Cohort-A"),
                cq("cq-b", 5, cohort="Cohort-B"),
                cq("cq-c", 0, cohort="Cohort-B"),
            ),
            cohorts=(
                CohortSpec("root"),
                CohortSpec("Cohort-A", parent="root", quotas={ANY: Quota(10)}),
                CohortSpec("Cohort-B", parent="root"),
            ),
            holding={"eng-alpha/c0", "eng-alpha/wl-b"},
            left={"eng-alpha/wl-a"},
        ),
        id="with fair sharing: hierarchical nominal-first prefers non-borrowing subtree",
    ),
]


def world(c: Case) -> State:
    s = State()
    for cohort in BASE_COHORTS + c.cohorts:
        s.cohorts[cohort.name] = cohort
    for q in BASE_QUEUES + c.queues:
        s.queues[q.name] = q
    for seq, j in enumerate(c.jobs, start=1):
        j.with_(seq=seq).into(s)
    return s


@pytest.mark.parametrize("c", CASES + FS_CASES)
def test_one_admission_cycle_admits_what_kueue_admits(c: Case) -> None:
    s = world(c)
    out = decide(s, 0.0)
    got = admitted(out)
    assert fold_all(s, out) == 0
    holding = {j.id for j in s.jobs.values() if j.admission is not None}
    waiting = {j.id for j in s.jobs.values() if j.phase == "queued"}
    assert (holding, waiting) == (set(c.holding), set(c.left))
    for job_id, replicas in c.replicas.items():
        assert got[job_id].replicas == replicas
    # What Kueue leaves waiting for quota still waits once this cycle's admissions count.
    assert of(decide(s, 1.0), JobsAdmitted) == []


# -- the GPU model a job counts against ----------------------------------------------------------
#
# A job that names GPU models counts, like a Kueue workload choosing a flavor (``flavorassigner``,
# default fungibility: the first flavor that fits, borrowing or not), against the first of its
# models it fits now, and its borrowing and its queue's lending hold are read there
# (``Ledger.key_for``). Cohort ``c``: queue ``a`` with 4 H100 and 4 A100 of nominal, its own job
# on all 4 H100; queue ``b`` with no A100 of its own, so whatever it holds is borrowed.

TWO_MODELS = QueueSpec("a", cohort="c", quotas={"H100": Quota(4), "A100": Quota(4)})
BORROWER = QueueSpec("b", cohort="c", quotas={"A100": Quota(0)})


def _models_world(*jobs: Job) -> State:
    s = State()
    s.cohorts["c"] = CohortSpec("c")
    for q in (TWO_MODELS, BORROWER):
        s.queues[q.name] = q
    for seq, j in enumerate(jobs, start=1):
        j.with_(seq=seq).into(s)  # counted as the fold counts what it holds
    return s


def _admits(s: State) -> set[str]:
    out = decide(s, 0.0)
    assert fold_all(s, out) == 0
    return set(admitted(out))


def test_a_job_within_its_second_models_nominal_goes_before_a_borrower() -> None:
    # Kueue's "not enough resources to borrow, fallback to next flavor": a-next fits A100 within
    # a's nominal and borrows nothing; read on H100 it looked like a borrower as far as b's, and
    # b's borrower, of a queue with the lower share, took a's A100.
    s = _models_world(
        job("a-h100", "a").gpus(4, "H100").running(),
        job("a-next", "a").gpus(4, "H100", "A100"),
        job("b-borrow", "b").gpus(4, "A100"),
    )
    assert _admits(s) == {"a-next"}


def test_a_job_within_its_second_models_nominal_keeps_it_from_being_lent() -> None:
    # b borrows 2 of a's A100; a-next, first in a, waits for them. a keeps its A100 from being
    # lent again (its hold on the model it counts against, not on the H100 its own jobs fill).
    s = _models_world(
        job("a-h100", "a").gpus(4, "H100").running(),
        job("b-run", "b").gpus(2, "A100").running(),
        job("a-next", "a").gpus(4, "H100", "A100"),
        job("b-more", "b").gpus(2, "A100"),
    )
    assert "b-more" not in _admits(s)


def test_an_elastic_job_gets_its_whole_size_on_a_later_model_before_part_of_it_on_the_first() -> None:
    # Kueue's partial admission (``getInitialAssignments``) tries the whole count on every
    # flavor before any smaller one: a-next's 4 workers fit A100 whole, H100 only 2 of them.
    s = _models_world(
        job("a-h100", "a").gpus(2, "H100").running(),
        job("a-next", "a").gpus(1, "H100", "A100").replicas(4, 1),
    )
    out = decide(s, 0.0)
    assert [(a.job_id, a.replicas, dict(a.gpus)) for e in of(out, JobsAdmitted) for a in e.admissions] == [
        ("a-next", 4, {"A100": 4})
    ]


def test_an_elastic_job_that_fits_no_model_whole_gets_the_most_workers_any_gives() -> None:
    # Neither model holds all 4: H100 has room for 1, A100 for 3 (a's own jobs hold the rest, of
    # a higher priority, so no preemption gets the whole count either); Kueue's search over the
    # count ends at 3, on the model that gives them.
    s = _models_world(
        job("a-h100", "a").gpus(3, "H100").with_(priority=10).running(),
        job("a-a100", "a").gpus(1, "A100").with_(priority=10).running(),
        job("a-next", "a").gpus(1, "H100", "A100").replicas(4, 1),
    )
    out = decide(s, 0.0)
    assert [(a.job_id, a.replicas, dict(a.gpus)) for e in of(out, JobsAdmitted) for a in e.admissions] == [
        ("a-next", 3, {"A100": 3})
    ]
