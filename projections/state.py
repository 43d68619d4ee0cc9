"""The cluster state every service folds from the log.

These are mutable msgspec Structs, untracked by the cyclic garbage collector (``gc=False``: they
never form cycles, and a fold of millions of records would otherwise spend a third of its time in
collections). The fold updates them in place (a copy per event would cost
more than the rest of the fold together), and msgspec gives snapshots and equality for free.
Nothing here is stored that the fold cannot derive again from the log.
"""

from __future__ import annotations

import msgspec

from corral.events.base import Reason
from corral.events.decisions import Placement
from corral.events.jobs import Admission, JobSpec
from corral.events.nodes import GpuInfo, NodeCondition, NodeInventory
from corral.events.queues import CohortSpec, FairShareSpec, PriorityClassSpec, QueueSpec, RetentionSpec
from corral.projections.lifecycle import Phase

WHOLE = 1000  # milli-GPU in one GPU


class MigInstance(msgspec.Struct, gc=False):
    """A MIG instance a job holds, with the memory slices (``mask``) and the share of the GPU
    (``milli``) it took: given back as taken, whatever model the GPU is said to be by then (the
    same profile name spans other slices on another model, or none)."""

    job_id: str
    profile: str
    mask: int = 0
    milli: int = 0


class GpuState(msgspec.Struct, gc=False):
    info: GpuInfo
    healthy: bool = True
    signal: str = ""
    used_milli: int = 0
    mig_used: int = 0  # bit mask of the 8 MIG memory slices taken
    mig: dict[int, MigInstance] = {}  # start slice -> instance
    holders: dict[str, int] = {}  # job id -> milli-GPU it holds here (MIG: its memory share)

    @property
    def free_milli(self) -> int:
        return WHOLE - self.used_milli

    @property
    def idle(self) -> bool:
        return not self.holders

    @property
    def held_in_other_mode(self) -> bool:
        """Held by claims of the mode it left: its node re-registered it into or out of MIG mode
        while work held it (a whole GPU's job, or MIG instances). Nothing new is taken on it until
        those are given back: a MIG slice placed beside a whole GPU's job was one GPU held twice."""
        if not self.info.mig:
            return bool(self.mig)
        if not self.holders:
            return False
        instances = {i.job_id for i in self.mig.values()}
        return any(job_id not in instances for job_id in self.holders)


class NodeState(msgspec.Struct, gc=False):
    name: str
    inventory: NodeInventory
    gpus: list[GpuState]
    condition: NodeCondition = "ready"
    cordoned: bool = False
    draining: bool = False
    cordon_reason: str = ""  # why it is cordoned (the admin's words, or the health monitor's)
    cpu_used: int = 0
    memory_used: int = 0
    workers: int = 0  # workers that hold CPU, memory or GPUs here (at most ``inventory.max_workers``)
    # The jobs whose workers its agent could not start here, in a row, for the node's own fault
    # (``WorkerExited.node_fault``), each once, the latest few: any other exit here, or a person
    # lifting its cordon, empties it.
    start_faults: tuple[str, ...] = ()
    # The log position of the shutdown its agent has not come back from (``NodeShutdown``; 0:
    # none): until the agent registers the node again nothing new goes here, though its
    # heartbeats stop only as it exits and the health monitor calls it lost a minute later.
    shut_down: int = 0

    @property
    def schedulable(self) -> bool:
        return self.condition == "ready" and not self.cordoned and not self.shut_down

    @property
    def standing(self) -> str:
        """The node as the scheduler reads it, in one word or two: "ready" only when it takes
        new work; else its agent's silence, its shutdown, or its cordon (or drain)."""
        if self.condition != "ready":
            return self.condition
        if self.shut_down:
            return "shut down"
        if self.cordoned:
            return "draining" if self.draining else "cordoned"
        return "ready"


class Checkpoint(msgspec.Struct, frozen=True, gc=False):
    location: str
    step: int
    attempt: int
    seq: int
    time: float = 0.0  # log time it completed: work since then is what a preemption loses


class JobState(msgspec.Struct, gc=False):
    id: str
    tenant: str
    spec: JobSpec
    submitted_seq: int
    submitted_at: float
    phase: Phase = "submitted"
    attempt: int = 0
    priority: int = 0
    admission: Admission | None = None
    # Where its admission stands in admission's order: the record's seq and its place in the
    # record. Admission lists a cycle's admissions in the order it chose them (priority, the
    # queues' fair share, each queue's own order); the placer places them in that order.
    admitted_at: tuple[int, int] = (0, 0)
    placement: Placement | None = None
    started: set[int] = set()  # ranks that started in this attempt
    live: set[int] = set()  # ranks started and not yet exited (they still hold their GPUs)
    exit_codes: dict[int, int] = {}
    left: set[int] = set()  # ranks an elastic shrink took away in this attempt, their exits folded
    held: Placement | None = None  # the GPUs this job holds now (maybe from an older attempt)
    # What its held GPUs count for in its queue's GPU time (``State.gpu_time``): the quota key
    # (that of the admission they were placed under, which a requeue clears before they are
    # given back) and milli-GPU, as quota charges them.
    held_key: str = ""
    held_milli: int = 0
    checkpoint: Checkpoint | None = None
    reasons: tuple[Reason, ...] = ()
    restarts: int = 0
    preemptions: int = 0
    # The nodes that failed its starts for their own fault, in order, each start uncharged (at
    # most ``fold_nodes.NODE_FAULTS_FREE``): the placer tries none of them for it again while
    # that node's run of failed starts still counts it (``NodeState.start_faults``).
    fault_nodes: tuple[str, ...] = ()
    # Admitted as one that may not borrow (``quota.Ledger.may_borrow``): what it holds is its
    # queue's fixed part (``State.quota_held_fixed``) until it holds none, whatever happens
    # meanwhile. None: never admitted by the fold (a state made by hand reads the rule itself).
    fixed: bool | None = None
    preempted_at: tuple[float, ...] = ()  # log times of the latest preemptions and shrinks (anti-thrash)
    preempted_for: str = ""  # the beneficiary of the preemption under way
    # Where a move (a consolidation, ``PreemptionRequested.moves``) is to put it: the placer
    # holds those GPUs for it while it stops and is admitted again, until it is placed (or ends).
    moved_to: Placement | None = None
    # Where it ran when a planned shutdown of its node interrupted it (``NodeShutdown`` with
    # ``registers_again``: corral stopped on purpose, to start again): it keeps that place, so a
    # restart reorders no work (``queueing.keeps_place``), until it is placed again, its
    # admission is withdrawn, or it ends.
    kept_place: Placement | None = None
    # Every job it was preempted for (the latest MAX_PREEMPTION_TIMES), with when each of the two
    # last had its priority changed: while neither changed, neither is stopped for the other
    # again, so two jobs never take the same GPUs from each other in turn. (A shrink is not
    # counted: an elastic job may shrink, then be stopped whole, for one job.)
    stopped_for: tuple[tuple[str, int, int], ...] = ()  # (beneficiary, its priority_seq, this job's)
    # Those of ``stopped_for`` that were moves (a consolidation): stopped to run elsewhere, to
    # make room for the other, not preempted for it; what ``explain`` tells the admin.
    moved_for: tuple[tuple[str, int, int], ...] = ()
    # The log position of its last change of priority, or of its submission: never the same for
    # two jobs, so a ``stopped_for`` entry never names a later job given a let-go job's id.
    priority_seq: int = 0
    # The jobs stopped or shrunk for it that still name it in ``preempted_for``, in the order
    # they were (kept by ``indexes.name``). When it ends they stop naming it, so none names a
    # later job of its id, and an ended beneficiary counts for none before it is let go too.
    victims: tuple[str, ...] = ()
    # While queued, the GPU model (quota key) of the stops made for it, where it names several
    # (``PreemptionRequested.key``; empty: its first): every reader of the preemption rule
    # charges it there, whatever each one's view of the quota. Emptied when it is admitted.
    reclaim_key: str = ""
    preempt_deadline: float = 0.0  # log time by which the preemption under way must be done
    phase_since: float = 0.0
    # Log time its current attempt entered its queue (accepted, or requeued): where the attempt's
    # span starts, which a trace taken up from a snapshot could not know otherwise.
    attempt_since: float = 0.0
    updated_seq: int = 0
    traceparent: str = ""  # the trace every event about this job joins
    # The runtime estimate learned, at its submission, from the jobs that finished before it
    # (``projections/runtimes.py``; read a job's estimate with ``runtimes.of``: its owner's, when
    # given, stands).
    learned_s: float | None = None
    # Its owner's record at its submission: the worst overrun of their estimates
    # (``runtimes.overrun``; None while too few are on record), read by the short-job lane.
    overrun: float | None = None
    ran_s: float = 0.0  # log time it spent running, over all its attempts
    # Log time before which admission may not admit it again: the back-off of an admission
    # withdrawn for its placement timeout (``AdmissionWithdrawn.admit_after``).
    admit_after: float = 0.0
    # A running elastic job: log time of its latest growth, and before which it may not grow
    # again, a growth of it withdrawn for the same timeout (``AdmissionWithdrawn.admit_after``).
    grown_at: float = 0.0
    grow_after: float = 0.0
    # An elastic job's most workers as its owner submitted it, once a resize changed
    # ``spec.replicas`` (None: never resized): a submit of its id is the same job only with it.
    sent_replicas: int | None = None

    @property
    def leaving(self) -> list[int]:
        """Ranks of a running elastic job that shrank and have not exited yet: those its placement
        holds at or above its admitted count. Empty for every other job."""
        adm, placement = self.admission, self.placement
        if self.phase != "running" or adm is None or placement is None:
            return []
        return [w.rank for w in placement.workers if w.rank >= adm.replicas]


class Rejection(msgspec.Struct, frozen=True):
    """A request or proposal the fold refused, and why. ``code`` values:
    ``malformed``, ``unknown``, ``forbidden``, ``illegal``, ``void``, ``duplicate``, ``fault``."""

    seq: int
    subject: str
    code: str
    message: str
    job_id: str = ""
    # A batch decision is arbitrated item by item: the jobs whose part the fold voided, and why
    # (the rest was applied). Data, not text, so no reader parses the message for it.
    voided: tuple[tuple[str, str], ...] = ()


class GpuTime(msgspec.Struct, gc=False):
    """The GPU time one queue held on one quota key, decayed with the fair-share half-life:
    ``decayed`` milli-GPU-seconds as they stood at log time ``at``, and the milli-GPU it has
    held since (``projections/gpu_time.py`` keeps and reads it)."""

    decayed: float = 0.0
    at: float = 0.0
    holding: int = 0


class State(msgspec.Struct, gc=False):
    seq: int = 0  # last folded stream sequence
    time: float = 0.0  # stream time of the last folded record
    nodes: dict[str, NodeState] = {}
    jobs: dict[str, JobState] = {}
    queues: dict[str, QueueSpec] = {}
    cohorts: dict[str, CohortSpec] = {}
    priority_classes: dict[str, PriorityClassSpec] = {}
    rejections: list[Rejection] = []  # newest last, the most recent MAX_REJECTIONS only
    # Per requesting tenant ("": the services), the position of the newest of its rejections no
    # longer kept: a verdict on its request at or before it may have been let go.
    rejections_lost: dict[str, int] = {}
    # ... at most ``MAX_REJECTIONS_LOST`` tenants of them, those of the oldest position let go
    # past it, the newest such position kept for all of them (a verdict at or before it is
    # said to be unknown): one entry a tenant ever refused was kept for good.
    rejections_lost_floor: int = 0
    # Per requesting tenant, the positions of its refusals in ``rejections``, oldest first: the
    # one a flood of its own pushes out is found there, not by a walk of all that are kept.
    rejections_kept: dict[str, list[int]] = {}
    rejected_total: int = 0
    void_total: int = 0
    faults: int = 0  # internal errors caught by the fold; non-zero means a corral bug
    # milli-GPU held per queue and quota key by jobs in quota-holding phases, kept by the fold so
    # that arbitrating an admission costs O(queues), not O(jobs).
    quota_held: dict[str, dict[str, int]] = {}
    # ... of it, what jobs that may not be preempted hold: those stay within their queue's
    # nominal (``Ledger.may_borrow``).
    quota_held_fixed: dict[str, dict[str, int]] = {}
    fair_share: FairShareSpec = FairShareSpec()
    # GPU time held per queue and quota key, from placement to release, decayed: what fair share
    # orders queues by. Kept by the fold at each change of what a queue holds, in log time.
    gpu_time: dict[str, dict[str, GpuTime]] = {}
    retention: RetentionSpec = RetentionSpec()
    # Finished jobs that gave their GPUs back, in the order they did (log time, job id, the
    # job's submitted_seq), from ``finished_from`` on: the fold lets the first go once
    # ``retention.finished_s`` has passed (``projections/retention.py``).
    finished: list[tuple[float, str, int]] = []
    finished_from: int = 0
    let_go: int = 0  # finished jobs the state let go, in all
    # Indexes of ``jobs`` the fold keeps (``projections/indexes.py``): job ids per phase, in the
    # order they entered it; per queue, its queued jobs' places (-priority, submitted_seq, id),
    # sorted: the order the queue serves them in; per node, the ids of the jobs holding GPUs
    # there; per queue, the ids of its jobs holding quota; per worker ask (its Resources as
    # JSON), the workers unfinished jobs ask for; per beneficiary, the jobs stopped for it that
    # name it; per queue, its queued jobs that carry a reason; per host shape
    # (``indexes.host_shape``), its queued jobs; per form (``indexes.form_key``), its queued
    # jobs' places, sorted as a queue's. So that a cycle costs the jobs it asks for, not every
    # job that ever existed.
    jobs_by_phase: dict[str, dict[str, None]] = {}
    queued_by_queue: dict[str, list[tuple[int, int, str]]] = {}
    holding_by_node: dict[str, dict[str, None]] = {}
    holding_quota_by_queue: dict[str, dict[str, None]] = {}
    workers_by_ask: dict[str, int] = {}
    naming_by_beneficiary: dict[str, dict[str, None]] = {}
    explained_by_queue: dict[str, dict[str, None]] = {}
    queued_by_shape: dict[str, dict[str, None]] = {}
    queued_by_form: dict[str, list[tuple[int, int, str]]] = {}
    # ... and per phase, the ids of its elastic jobs (``min_replicas`` given), in the order they
    # entered it: the running ones are those that may grow or shrink.
    elastic_by_phase: dict[str, dict[str, None]] = {}
    # Per tenant, the ids of its jobs in ``jobs`` (any phase, finished ones not let go yet
    # included), in the order they were submitted: what the limit of
    # ``RetentionSpec.jobs_per_tenant`` is judged by, and what a tenant's list of its jobs reads
    # (a walk of every tenant's jobs made each page of a tenant's list cost the whole cluster).
    jobs_by_tenant: dict[str, dict[str, None]] = {}
    # ... and what their specs hold (``indexes.spec_bytes``): what ``RetentionSpec``'s
    # ``spec_bytes_per_tenant`` is judged by.
    spec_bytes_by_tenant: dict[str, int] = {}
    # The ids of the jobs a place is held for (``JobState.kept_place`` or ``moved_to`` given), in
    # the order they were given one: a handful, which the placer, the preemptor and a
    # registration that renumbers GPUs read instead of every job waiting (``indexes.keep_place``).
    places_held: dict[str, None] = {}
    # Per class of similar jobs, the running times of the latest that succeeded, the class
    # updated longest ago first: what runtime estimates are learned from (``runtimes.py``).
    runtimes: dict[str, list[float]] = {}
    # Per class, (submitted at, running time) of the ``runtimes.LATEST`` jobs that succeeded
    # submitted last, in submission order: what a new job's estimate is learned from.
    latest_runs: dict[str, list[tuple[float, float]]] = {}
    # Per tenant, its classes among those (not its queues'), updated longest ago first: what
    # each tenant's share of them is bounded by (``runtimes.MAX_CLASSES_PER_TENANT``).
    runtime_classes: dict[str, dict[str, None]] = {}
    # Per tenant, running time over the owner's estimate of their ``runtimes.RECORD`` latest
    # estimated jobs that succeeded, the tenant updated longest ago first (``runtimes.overrun``).
    estimate_record: dict[str, list[float]] = {}


MAX_REJECTIONS = 1000
MAX_REJECTIONS_PER_TENANT = 250  # of those, the most of one tenant's requests
MAX_REJECTIONS_LOST = 1024  # tenants whose newest refusal let go is kept (``rejections_lost``)
