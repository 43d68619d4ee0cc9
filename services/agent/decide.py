"""The node agent's pure core: what this node must start, checkpoint and stop, given its view.

``decide(view, workers, now, checkpoint_root)`` compares what the log says should run on the
view's node (its ``NodeView``: ``projections/assignments.py``, one pure function of the folded
state) with what the runtime runs (``workers``: worker -> its phase in the runtime) and returns
actions. It has no IO and no clock; calling it twice on the same input gives the same answer.
It reads nothing but the view, so an agent's cost is its node's jobs, never the log's.

Invariants:

- Only placements the fold accepted start anything: a job's ``placement`` at its current
  ``attempt`` in phase placed/starting/running, for the ranks it puts on this node and that have
  not started yet (the view holds nothing else). A voided proposal never reaches it.
- An elastic job that shrank stops its ranks at and above its admitted count (they leave by the
  shrink's deadline; the job goes on with the rest); one that grew starts its added ranks as
  their placement arrives, with ``WORLD_SIZE`` the grown size: an elastic job's workers agree on
  membership themselves (torchrun's ``--nnodes=MIN:MAX`` rendezvous, Horovod elastic).
- A worker runs only while the fold wants it: a job moving to checkpointing asks its workers to
  checkpoint (or stops them at once when the job cannot checkpoint); past the grace deadline, or
  once they have checkpointed, they are stopped. Cancelled, preempted, interrupted, finished or
  superseded (older attempt, unknown job, rank moved) workers are stopped.
- A worker the log says is live here but the runtime does not run (the agent restarted, its
  worker died with it) is reported gone, so the fold can restart the gang.

The environment of a worker follows torchrun: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``, ``MASTER_ADDR`` (the ``address`` label of rank
0's node, else its name) and ``MASTER_PORT`` (derived from job id and attempt, so every rank
computes the same port without talking). ``CUDA_VISIBLE_DEVICES`` lists GPU UUIDs; a MIG slot is
written ``mig:<GPU uuid>/<profile>@<start slice>`` (e.g. ``mig:GPU-1a2b…/3g.40gb@4``), a
placeholder the runtime replaces by the MIG instance's own ``MIG-…`` UUID once the instance exists
(a CUDA program never sees the placeholder on a real node). corral's own variables
(``CORRAL_JOB_ID``, ``CORRAL_ATTEMPT``, ``CORRAL_CHECKPOINT_DIR``, ``CORRAL_RESUME_FROM``) win over
the job's environment of the same name. ``TRACEPARENT`` names the worker's run in its job's trace,
so the job's own spans join it; ``OTEL_SERVICE_NAME`` (``corral-job`` unless the job names itself)
and ``OTEL_RESOURCE_ATTRIBUTES`` (job, attempt, rank) go with it, and the agent passes on where its own
``OTEL_EXPORTER_OTLP_*`` settings send spans, not its credentials (``workers.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

import msgspec

from corral.events.base import Event
from corral.events.decisions import MigSlot
from corral.events.heartbeats import XidReport
from corral.events.jobs import Mount
from corral.events.nodes import CheckpointCompleted, WorkerExited, WorkerStarted
from corral.projections import mig, trace_ids
from corral.projections.assignments import AssignedRank, Assignment, GpuBinding, NodeView
from corral.projections.lifecycle import FINAL
from corral.projections.state import WHOLE

# What the runtime is doing with a worker. ``exited``: its exit is reported but the log may not
# show it yet; the runtime keeps it until ``Forget``.
WorkerPhase = Literal["starting", "running", "checkpoint-requested", "checkpointed", "stopping", "exited"]
StopReason = Literal["cancelled", "preempted", "interrupted", "job-over", "superseded", "shrunk"]

STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when a job is over or interrupted
# How long a worker sent SIGKILL may still be there before its GPUs are said to be held by a
# process that cannot be killed (Slurm's ``UnkillableStepTimeout``, 60 s by default, drains the
# node): the health monitor fails them, so work placed there goes elsewhere, until it is gone.
UNKILLABLE_S = 60.0
LATE_GRACE = 2.0  # after a checkpoint deadline has passed
GONE_CODE = -1  # exit code reported for a worker the agent lost track of
START_FAILED_CODE = 127  # exit code reported for a worker that never started (as a shell would)

_RUNS: frozenset[str] = frozenset({"placed", "starting", "running"})


class WorkerKey(NamedTuple):
    job_id: str
    attempt: int
    rank: int


# -- actions -----------------------------------------------------------------------------------


class StartWorker(msgspec.Struct, frozen=True, omit_defaults=True):
    job_id: str
    attempt: int
    rank: int
    gpus: tuple[GpuBinding, ...]
    env: dict[str, str]
    command: tuple[str, ...]
    checkpoint_dir: str  # this worker's: $CORRAL_CHECKPOINT_DIR
    job_checkpoint_dir: str  # every attempt's and rank's, where resumes read from
    mounts: tuple[Mount, ...] = ()
    image: str | None = None
    grace_seconds: float = 30.0
    run: int = 0  # which submission of the job id (``Assignment.run``): its directories' name

    @property
    def key(self) -> WorkerKey:
        return WorkerKey(self.job_id, self.attempt, self.rank)


class StartGang(msgspec.Struct, frozen=True):
    """Start these workers of one gang together, behind one start barrier."""

    job_id: str
    attempt: int
    workers: tuple[StartWorker, ...]


class RequestCheckpoint(msgspec.Struct, frozen=True):
    """Ask the worker to checkpoint by ``deadline`` (log time, seconds since the epoch)."""

    key: WorkerKey
    deadline: float


class StopWorker(msgspec.Struct, frozen=True):
    """SIGTERM, then SIGKILL after ``grace`` seconds."""

    key: WorkerKey
    reason: StopReason
    grace: float


class ReportGone(msgspec.Struct, frozen=True):
    """The log has this worker live here, but the runtime does not run it: report it exited."""

    key: WorkerKey
    run: int = 0  # its job's run (``Assignment.run``): where its files are


class Forget(msgspec.Struct, frozen=True):
    """The log has caught up with this worker's exit: the runtime may drop it."""

    key: WorkerKey


Action = StartGang | RequestCheckpoint | StopWorker | ReportGone | Forget


# -- what the runtime reports back ---------------------------------------------------------------


class Started(msgspec.Struct, frozen=True):
    key: WorkerKey
    pid: int


class StartFailed(msgspec.Struct, frozen=True):
    """``node_fault``: the node kept it from starting, not the job (``StartError.node``)."""

    key: WorkerKey
    reason: str
    node_fault: bool = False


class Exited(msgspec.Struct, frozen=True):
    """``code``: the exit status, 128+N for a worker killed by signal N. ``stopped``: corral stopped it."""

    key: WorkerKey
    code: int
    stopped: bool = False
    pid: int = 0  # as its start was reported


class Checkpointed(msgspec.Struct, frozen=True):
    key: WorkerKey
    step: int
    location: str


Report = Started | StartFailed | Exited | Checkpointed


# -- deciding ------------------------------------------------------------------------------------


def decide(
    view: NodeView,
    workers: Mapping[WorkerKey, WorkerPhase],
    now: float,
    checkpoint_root: str,
    runs: Mapping[WorkerKey, int] | None = None,
    busy: Mapping[WorkerKey, tuple[GpuBinding, ...]] | None = None,
) -> list[Action]:
    """The actions that bring what runs on ``view.node`` in line with its view of the log.
    ``runs``: the run (``Assignment.run``) of each worker the runtime holds, where it knows it:
    an exited worker of an earlier job of the id is not the job's of the view. ``busy``: the GPUs
    of each worker the runtime runs or is starting (not exited): a gang whose GPUs one of them
    still uses waits for it to end (``_in_use``)."""
    actions: list[Action] = []
    seen: set[WorkerKey] = set()
    using = _GpusInUse(view, busy) if busy else None
    for job in view.jobs:
        if not job.ranks:
            continue  # only workers of an older attempt are live here: ``_gone`` and the loop below
        keys = [WorkerKey(job.job_id, job.attempt, r.rank) for r in job.ranks]
        seen.update(keys)
        ours = keys
        earlier: set[WorkerKey] = set()
        if runs is not None:
            # A worker of an earlier job of the id (let go since) under the same key, still
            # running (its node was lost, and came back): not this job's. It stops; this job's
            # rank starts once its exit is reported and forgotten.
            earlier = {k for k in keys if k in workers and runs.get(k, job.run) != job.run}
            for k in sorted(earlier):
                if workers[k] not in ("stopping", "exited"):
                    actions.append(StopWorker(k, "superseded", STOP_GRACE))
            if earlier:
                ours = [k for k in keys if k not in earlier]
        if job.phase in _RUNS:
            leaving = job.leaving
            if leaving:  # an elastic job that shrank: its ranks above its admitted count stop
                grace = max(LATE_GRACE, job.deadline - now)
                for k in ours:
                    if k.rank in leaving and workers.get(k) not in (None, "stopping", "exited"):
                        actions.append(StopWorker(k, "shrunk", grace))
            fresh = [
                r
                for r, k in zip(job.ranks, keys, strict=True)
                if k not in workers and r.rank not in job.started and r.rank not in leaving
            ]
            if fresh and view.inventory is not None:
                if earlier or using is not None and using.taken(fresh, set(ours)):
                    continue  # its GPUs are still another worker's: it starts once that one ended
                starts = tuple(start_worker(job, r, checkpoint_root) for r in fresh)
                actions.append(StartGang(job.job_id, job.attempt, starts))
        elif job.phase == "checkpointing":
            actions.extend(_checkpointing(job, ours, workers, now))
        else:
            reason = _stop_reason(job)
            active = [k for k in ours if workers.get(k) not in (None, "stopping", "exited")]
            actions.extend(StopWorker(k, reason, STOP_GRACE) for k in active)
    for key, phase in workers.items():
        if key in seen and phase != "exited":
            continue
        owner = view.job(key.job_id)
        if phase == "exited":
            if owner is not None and runs is not None and runs.get(key, owner.run) != owner.run:
                # A worker of an earlier job of the id (let go since): the job it was of is gone,
                # and held here, its key would keep the new job's worker from starting.
                actions.append(Forget(key))
            elif _exit_folded(owner, key):
                actions.append(Forget(key))
        elif phase != "stopping":
            actions.append(StopWorker(key, _stop_reason(owner), STOP_GRACE))
    actions.extend(_gone(view, workers))
    return actions


class _GpusInUse:
    """What the runtime's live workers use of each GPU (by UUID). The fold gives a job's GPUs
    back once no worker of it is known to live: a worker whose start was under way when its job
    was stopped (its GPU failed, it was cancelled or preempted before its start was folded) may
    still hold them while another job is placed there. A gang never starts beside such a worker
    on GPUs it uses: whole, a share past the GPU's, or MIG memory slices it holds."""

    def __init__(self, view: NodeView, busy: Mapping[WorkerKey, tuple[GpuBinding, ...]]) -> None:
        self.on: dict[str, list[tuple[WorkerKey, GpuBinding]]] = {}  # GPU UUID -> its live users
        for key, gpus in busy.items():
            for g in gpus:
                self.on.setdefault(g.uuid, []).append((key, g))
        self.models = {g.uuid: g.model for g in view.inventory.gpus} if view.inventory is not None else {}

    def _slices(self, uuid: str, slot: MigSlot) -> int:
        p = mig.profile(self.models.get(uuid, ""), slot.profile)
        return mig.mask(p, slot.start) if p is not None else 1 << slot.start

    def taken(self, ranks: list[AssignedRank], mine: set[WorkerKey]) -> bool:
        """Whether a GPU ``ranks`` ask for is used by a live worker other than ``mine``."""
        for r in ranks:
            for g in r.gpus:
                others = [b for key, b in self.on.get(g.uuid, ()) if key not in mine]
                if not others:
                    continue
                if g.mig is not None:
                    if any(b.mig is None for b in others):
                        return True  # the GPU is whole or shared, not in MIG, under another
                    held = 0
                    for b in others:
                        held |= self._slices(g.uuid, b.mig) if b.mig is not None else 0
                    if held & self._slices(g.uuid, g.mig):
                        return True
                elif any(b.mig is not None for b in others) or sum(b.milli for b in others) + g.milli > WHOLE:
                    return True
        return False


def _checkpointing(
    job: Assignment, keys: list[WorkerKey], workers: Mapping[WorkerKey, WorkerPhase], now: float
) -> list[Action]:
    deadline = job.deadline
    out: list[Action] = []
    for k in keys:
        phase = workers.get(k)
        if phase in ("starting", "running"):
            if job.checkpointable and now < deadline:
                out.append(RequestCheckpoint(k, deadline))
            else:
                out.append(StopWorker(k, "preempted", max(LATE_GRACE, deadline - now)))
        elif phase == "checkpoint-requested" and now >= deadline:
            out.append(StopWorker(k, "preempted", LATE_GRACE))
        elif phase == "checkpointed":
            out.append(StopWorker(k, "preempted", max(LATE_GRACE, deadline - now)))
    return out


def _stop_reason(job: Assignment | None) -> StopReason:
    """Why a worker stops. A job no longer in the view is over here (finished, or moved on to
    another attempt or node, with nothing of it live here): a worker of it is superseded."""
    if job is None:
        return "superseded"
    if job.phase == "cancelled":
        return "cancelled"
    if job.phase in ("preempted", "checkpointing"):
        return "preempted"
    if job.phase == "interrupted":
        return "interrupted"
    if job.phase in FINAL:
        return "job-over"
    return "superseded"


def _live_in_log(job: Assignment | None, key: WorkerKey) -> bool:
    return job is not None and job.held_attempt == key.attempt and key.rank in job.live


def _exit_folded(job: Assignment | None, key: WorkerKey) -> bool:
    """Whether the log has caught up with a worker the runtime saw end: it is not live there, and
    if its attempt still runs, its start is folded too (a failed start is reported as a start and
    an exit, and the rank must not be started again before the fold has seen both)."""
    if job is None:
        return True
    if _live_in_log(job, key):
        return False
    if key.rank in job.left and key.attempt == job.attempt:
        return True  # a rank an elastic job shrank away from: a growth may start it anew
    return not (job.attempt == key.attempt and job.phase in _RUNS and key.rank not in job.started)


def _gone(view: NodeView, workers: Mapping[WorkerKey, WorkerPhase]) -> list[Action]:
    out: list[Action] = []
    for job in view.jobs:
        for rank in job.live:
            key = WorkerKey(job.job_id, job.held_attempt, rank)
            if key not in workers:
                out.append(ReportGone(key, job.run))
    return out


# -- a worker's contract -------------------------------------------------------------------------


def mig_placeholder(gpu_uuid: str, slot: MigSlot) -> str:
    return f"mig:{gpu_uuid}/{slot.profile}@{slot.start}"


def run_dir(job_id: str, run: int) -> str:
    """The directory of one run of a job id, relative to where a node keeps jobs' directories:
    a job id is free again once its job was let go, and another tenant's job of the same id must
    find neither the files nor the checkpoints of the first."""
    return f"{job_id}/run-{run}"


def checkpoint_dirs(root: str, job_id: str, run: int, attempt: int, rank: int) -> tuple[str, str]:
    """(the worker's checkpoint directory, the job's run's) under ``root``."""
    job_dir = f"{root.rstrip('/')}/{run_dir(job_id, run)}"
    return f"{job_dir}/attempt-{attempt}/rank-{rank}", job_dir


def visible_devices(gpus: tuple[GpuBinding, ...]) -> str:
    return ",".join(g.uuid if g.mig is None else mig_placeholder(g.uuid, g.mig) for g in gpus)


def start_worker(job: Assignment, rank: AssignedRank, checkpoint_root: str) -> StartWorker:
    ckpt, job_ckpt = checkpoint_dirs(checkpoint_root, job.job_id, job.run, job.attempt, rank.rank)
    env = dict(job.env)
    env.update(rank.rendezvous)
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(rank.gpus)
    if job.gpu_milli:
        env["CORRAL_GPU_MILLI"] = str(job.gpu_milli)
    env["CORRAL_JOB_ID"] = job.job_id
    env["CORRAL_ATTEMPT"] = str(job.attempt)
    env["CORRAL_CHECKPOINT_DIR"] = ckpt
    if job.resume_from:
        env["CORRAL_RESUME_FROM"] = job.resume_from
    else:
        env.pop("CORRAL_RESUME_FROM", None)
    trace = trace_ids.from_traceparent(job.job_id, job.traceparent)
    if trace is not None:
        # The job's own spans join its trace under this worker's run (W3C's variable for it).
        env["TRACEPARENT"] = trace_ids.traceparent(trace.trace_id, trace.worker_span(job.attempt, rank.rank))
        env.setdefault("OTEL_SERVICE_NAME", "corral-job")
        where = f"corral.job.id={job.job_id},corral.attempt={job.attempt},corral.rank={rank.rank}"
        given = env.get("OTEL_RESOURCE_ATTRIBUTES")
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"{given},{where}" if given else where
    return StartWorker(
        job_id=job.job_id,
        attempt=job.attempt,
        rank=rank.rank,
        gpus=rank.gpus,
        env=env,
        command=job.command,
        checkpoint_dir=ckpt,
        job_checkpoint_dir=job_ckpt,
        mounts=job.mounts,
        image=job.image,
        grace_seconds=job.grace_seconds,
        run=job.run,
    )


# -- reports into events -------------------------------------------------------------------------


def report_events(node: str, report: Report, xids: tuple[XidReport, ...] = ()) -> list[Event]:
    """The node events a runtime report becomes (``xids``: those seen on a failed worker's GPUs).

    A worker that never started is reported as a start marked failed (``WorkerStarted.failed``:
    not one its history tells) and an exit with ``START_FAILED_CODE``, so the fold fails or
    restarts its gang by the job's restart policy; or, where the node kept it from starting
    (``StartFailed.node_fault``), sends the job back to its queue, no restart counted, the reason
    in ``WorkerExited.node_fault``. Only rank 0's checkpoint is the job's (data-parallel ranks
    hold the same weights); other ranks' reports only tell the agent they are ready to stop.
    """
    k = report.key
    if isinstance(report, Started):
        return [WorkerStarted(node=node, job_id=k.job_id, attempt=k.attempt, rank=k.rank, pid=report.pid)]
    if isinstance(report, Exited):
        ev = WorkerExited(
            node=node,
            job_id=k.job_id,
            attempt=k.attempt,
            rank=k.rank,
            code=report.code,
            stopped=report.stopped,
            pid=report.pid,
            xids=xids,
        )
        return [ev]
    if isinstance(report, StartFailed):
        return [
            WorkerStarted(node=node, job_id=k.job_id, attempt=k.attempt, rank=k.rank, failed=True),
            WorkerExited(
                node=node,
                job_id=k.job_id,
                attempt=k.attempt,
                rank=k.rank,
                code=START_FAILED_CODE,
                node_fault=report.reason if report.node_fault else "",
                start_error="" if report.node_fault else report.reason,
            ),
        ]
    if k.rank != 0:
        return []
    return [
        CheckpointCompleted(
            node=node, job_id=k.job_id, attempt=k.attempt, location=report.location, step=report.step
        )
    ]
