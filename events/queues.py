"""Queue family: queues, cohorts, priority classes, the fair-share settings and how long finished
jobs are kept, all changed by admin requests.

Admin requests arrive on ``corral.in.admin.<verb>``; only the admin identity may publish there.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.events.base import Int, Request

WithinQueue = Literal["never", "lower-priority", "lower-or-newer-equal-priority"]
ReclaimWithinCohort = Literal["never", "lower-priority", "any"]
BorrowWithinCohort = Literal["never", "lower-priority"]
# Kueue's fair-sharing preemption strategies (KEP-1714, rules S2-a and S2-b).
FairSharingStrategy = Literal["less-than-or-equal-to-final-share", "less-than-initial-share"]


class Quota(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """GPUs of one model (``"*"`` = any model): nominal, plus how many may be borrowed from and
    lent to the cohort. ``None`` limits mean unlimited."""

    nominal: Int = 0
    borrowing_limit: Int | None = None
    lending_limit: Int | None = None


class PreemptionPolicy(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """Whom a queue's waiting jobs may stop (Kueue's ClusterQueue ``preemption``; the
    defaults differ: corral preempts by checkpoint, so stopping work costs little).

    - ``within_queue``: jobs of the same queue, of a lower priority (``lower-priority``), also
      of equal priority submitted later (``lower-or-newer-equal-priority``), or none (``never``);
    - ``reclaim_within_cohort``: jobs of other queues of the cohort tree that hold quota lent by
      the job's side of the tree, when the job's side stays within its own quota with it
      (it takes back what it lent): of any priority (``any``), a lower one, or none;
    - ``borrow_within_cohort``: jobs of other queues that borrow, when the job itself would
      borrow: of a lower priority (``lower-priority``), and with ``borrow_priority_threshold``
      only those of that priority or below; or none (``never``: then a job that asks more than
      its queue's nominal has nobody stopped for it, its own queue's jobs included, unless fair
      sharing may, or a cohort below the tree's root holds it: Kueue's flavor assigner);
    - ``fair_sharing``: jobs of other queues that borrow, of any priority, when the job itself
      would borrow and its queue's fair share stays no worse than theirs (Kueue's fair-sharing
      preemption): the strategies, tried in order, each only if the ones before found no
      victims enough: ``less-than-or-equal-to-final-share`` (the job's queue's share with the
      job admitted is at most the victim's queue's once its victims are gone) and
      ``less-than-initial-share`` (strictly below the victim's queue's share before). A share
      is the queue's decayed GPU time held (``projections/gpu_time.py``) above its nominal,
      over its weight (``projections.preemption.share``). Empty (the default): none;
    - ``max_grace_seconds``: the most time a job of another queue is given to checkpoint when
      stopped, moved or shrunk for one of this queue's jobs (its own ``grace_seconds`` when
      less; ``projections.preemption.grace_s``). A tenant sets its job's grace, up to a day: a
      borrower asking that much would keep a lender waiting a day for the quota it lent. None:
      no cap.
    """

    within_queue: WithinQueue = "lower-priority"
    reclaim_within_cohort: ReclaimWithinCohort = "any"
    borrow_within_cohort: BorrowWithinCohort = "lower-priority"
    borrow_priority_threshold: Int | None = None
    fair_sharing: tuple[FairSharingStrategy, ...] = ()
    max_grace_seconds: float | None = 600.0


DEFAULT_PREEMPTION = PreemptionPolicy()


class QueueSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    name: str
    cohort: str | None = None
    quotas: dict[str, Quota] = {}
    weight: float = 1.0
    tenants: tuple[str, ...] = ()
    # How the queue's jobs wait (``projections.queueing``): by submission, holding the quota a
    # job that does not fit needs while later ones go if they leave it room (best-effort-fifo);
    # by submission, none passing the first (strict-fifo); shortest first, with aging.
    strategy: Literal["best-effort-fifo", "strict-fifo", "shortest-first"] = "best-effort-fifo"
    preemption: PreemptionPolicy = DEFAULT_PREEMPTION


class CohortSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """A cohort pools its queues' unused quota; ``parent`` nests cohorts (org → team cohorts).
    ``share_own_quota``: the quota the cohort holds of its own is its queues' too, split by their
    weights, for jobs that may not be preempted (which otherwise stay within their queue's
    nominal): a burst pool every team is entitled to a part of, not only a pool to borrow."""

    name: str
    parent: str | None = None
    quotas: dict[str, Quota] = {}
    share_own_quota: bool = False


class PriorityClassSpec(
    msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    name: str
    value: Int
    preemptible: bool = True
    min_runtime_s: float = 0.0
    cooldown_s: float = 0.0
    max_preemptions_per_hour: Int | None = None
    max_preemptions: Int | None = None  # over the job's whole life: then it runs to its end


class FairShareSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """Cluster-wide fair-share settings. ``half_life_s``: how fast the GPU-time a queue held is
    forgotten (a GPU-second held that long ago weighs half of one held now). It is part of the
    log, not of a service's config, because the fold keeps each queue's decayed holding: every
    replica and every replay must decay it alike.

    ``short_job_gpu_s``: the short-job lane (``projections.queueing.short``). Among the queues'
    next jobs that borrow equally far, one expected to need at most this much GPU time (its
    runtime estimate times its GPUs, checked against its class's history) goes before fair-share
    order. 0: no lane."""

    half_life_s: float = 24 * 3600.0
    short_job_gpu_s: float = 0.0


class RetentionSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """How long the cluster's state keeps a finished job. ``finished_s``: seconds of log time
    after a job reached a final phase and gave its GPUs back; then the fold lets it go (its
    history stays in the log and in the read service's view). Part of the log, like the
    half-life, because which jobs the state holds decides whether a job id is free again:
    every replica and every replay must let jobs go alike. 0 lets a job go at the next record.

    One hour by default: long enough for a person or a client to look at a job that just ended
    (its phase, exit codes, why it failed) and for a client retrying a submission after a lost
    reply to be told it is a duplicate, short enough that a cluster finishing 10,000 jobs an
    hour keeps about that many, not every job it ever ran.

    ``jobs_per_tenant``: the most jobs one tenant may have in the state, in any phase (finished
    ones not let go yet, and those admission rejected, included). The fold refuses a submission
    past it, with the reason; the tenant may submit again as its jobs end and are let go. So a
    tenant that submits without end, valid jobs or not, holds a bounded part of every
    replica's memory and of every decision's work, whatever the retention period. 250,000 by
    default: more than a team's backlog on any cluster corral is measured on (the largest
    benchmark queues 100,000 jobs of one tenant).

    ``spec_bytes_per_tenant``: the most its jobs' specs in the state may hold, measured as the
    services hold them (``projections.indexes.spec_bytes``: a fixed part per job and every
    string it carries, command, env, mounts, labels, by its length): the count alone let one
    tenant fill every service's memory with jobs of 200 KiB each, rejected or not. 128 MiB by
    default: 100,000 jobs of a usual spec (a command, a few variables) hold some 60 MiB."""

    finished_s: float = 3600.0
    jobs_per_tenant: Int = 250_000
    spec_bytes_per_tenant: Int = 128 * 1024 * 1024


class ApplyQueue(Request, frozen=True, kw_only=True):
    queue: QueueSpec


class ApplyCohort(Request, frozen=True, kw_only=True):
    cohort: CohortSpec


class ApplyPriorityClass(Request, frozen=True, kw_only=True):
    priority_class: PriorityClassSpec


class DeleteQueue(Request, frozen=True, kw_only=True):
    name: str


class DeleteCohort(Request, frozen=True, kw_only=True):
    """Forget a cohort: refused while a queue or a cohort names it as its parent, or while its
    quota is lent in its tree (what was lent could not be taken back)."""

    name: str


class DeletePriorityClass(Request, frozen=True, kw_only=True):
    """Forget a priority class: refused while a job that has not finished names it (its
    priority, and whether and how often it may be preempted, come from the class)."""

    name: str


class ApplyFairShare(Request, frozen=True, kw_only=True):
    fair_share: FairShareSpec


class ApplyRetention(Request, frozen=True, kw_only=True):
    retention: RetentionSpec


class CordonNode(Request, frozen=True, kw_only=True):
    """Cordon (``drain``: and move its work away) or uncordon a node. ``repaired``, with an
    uncordon: the node's GPUs were reset or replaced, and the failures recorded on them (an XID,
    a GPU fallen off the bus) are cleared; a GPU still bad is failed again by what its next
    heartbeats say."""

    node: str
    cordoned: bool = True
    drain: bool = False
    reason: str = ""
    repaired: bool = False


class DeleteNode(Request, frozen=True, kw_only=True):
    """Forget a node taken out of the cluster for good: it leaves the state, and every service
    and answer with it. Refused while any job holds GPUs, CPU or memory there (drain it first);
    an agent that registers the node again brings it back as new."""

    node: str
