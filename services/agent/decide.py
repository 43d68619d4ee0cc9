"""The node agent's pure core: what this node must start, checkpoint and stop, given the fold.

``decide(state, node, workers, now, checkpoint_root)`` compares what the log says should run on
``node`` with what the runtime runs (``workers``: worker -> its phase in the runtime) and returns
actions. It has no IO and no clock; calling it twice on the same input gives the same answer.

Invariants:

- Only placements the fold accepted start anything: a job's ``placement`` at its current
  ``attempt`` in phase placed/starting/running, for the ranks it puts on this node and that have
  not started yet. A voided proposal never reaches ``state.jobs[...].placement``.
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
the job's environment of the same name.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Literal, NamedTuple

import msgspec

from corral.events.base import Event
from corral.events.decisions import GpuClaim, MigSlot, Placement, WorkerSlot
from corral.events.jobs import Mount
from corral.events.nodes import CheckpointCompleted, WorkerExited, WorkerStarted
from corral.projections import indexes, shape
from corral.projections.lifecycle import FINAL
from corral.projections.state import JobState, NodeState, State

# What the runtime is doing with a worker. ``exited``: its exit is reported but the log may not
# show it yet; the runtime keeps it until ``Forget``.
WorkerPhase = Literal["starting", "running", "checkpoint-requested", "checkpointed", "stopping", "exited"]
StopReason = Literal["cancelled", "preempted", "interrupted", "job-over", "superseded", "shrunk"]

PORT_BASE = 20000  # below Linux's ephemeral range (32768-60999), so no client socket holds it
PORT_SPAN = 10000
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when a job is over or interrupted
LATE_GRACE = 2.0  # after a checkpoint deadline has passed
GONE_CODE = -1  # exit code reported for a worker the agent lost track of
START_FAILED_CODE = 127  # exit code reported for a worker that never started (as a shell would)
ADDRESS_LABEL = "address"

_RUNS: frozenset[str] = frozenset({"placed", "starting", "running"})


class WorkerKey(NamedTuple):
    job_id: str
    attempt: int
    rank: int


# -- actions -----------------------------------------------------------------------------------


class GpuBinding(msgspec.Struct, frozen=True, omit_defaults=True):
    """A GPU claim resolved on this node: index, UUID, and the share or MIG slot."""

    index: int
    uuid: str
    milli: int = 1000
    mig: MigSlot | None = None


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


class Forget(msgspec.Struct, frozen=True):
    """The log has caught up with this worker's exit: the runtime may drop it."""

    key: WorkerKey


Action = StartGang | RequestCheckpoint | StopWorker | ReportGone | Forget


# -- what the runtime reports back ---------------------------------------------------------------


class Started(msgspec.Struct, frozen=True):
    key: WorkerKey
    pid: int


class StartFailed(msgspec.Struct, frozen=True):
    key: WorkerKey
    reason: str


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
    state: State,
    node: str,
    workers: Mapping[WorkerKey, WorkerPhase],
    now: float,
    checkpoint_root: str,
) -> list[Action]:
    """The actions that bring what runs on ``node`` in line with the folded ``state``."""
    actions: list[Action] = []
    here = state.nodes.get(node)
    seen: set[WorkerKey] = set()
    for job in _concerned(state, node, workers):
        p = job.placement
        if p is None or p.attempt != job.attempt:
            continue
        mine = [w for w in p.workers if w.node == node]
        if not mine:
            continue
        keys = [WorkerKey(job.id, job.attempt, w.rank) for w in mine]
        seen.update(keys)
        if job.phase in _RUNS:
            leaving = job.leaving
            if leaving:  # an elastic job that shrank: its ranks above its admitted count stop
                grace = max(LATE_GRACE, preemption_deadline(job) - now)
                for k in keys:
                    if k.rank in leaving and workers.get(k) not in (None, "stopping", "exited"):
                        actions.append(StopWorker(k, "shrunk", grace))
            fresh = [
                w
                for w, k in zip(mine, keys, strict=True)
                if k not in workers and w.rank not in job.started and w.rank not in leaving
            ]
            if fresh and here is not None:
                starts = tuple(start_worker(state, here, job, p, w, checkpoint_root) for w in fresh)
                actions.append(StartGang(job.id, job.attempt, starts))
        elif job.phase == "checkpointing":
            actions.extend(_checkpointing(job, keys, workers, now))
        else:
            reason = _stop_reason(job)
            active = [k for k in keys if workers.get(k) not in (None, "stopping", "exited")]
            actions.extend(StopWorker(k, reason, STOP_GRACE) for k in active)
    for key, phase in workers.items():
        if key in seen and phase != "exited":
            continue
        owner = state.jobs.get(key.job_id)
        if phase == "exited":
            if _exit_folded(owner, key):
                actions.append(Forget(key))
        elif phase != "stopping":
            actions.append(StopWorker(key, _stop_reason(owner), STOP_GRACE))
    actions.extend(_gone(state, node, workers))
    return actions


def _checkpointing(
    job: JobState, keys: list[WorkerKey], workers: Mapping[WorkerKey, WorkerPhase], now: float
) -> list[Action]:
    deadline = preemption_deadline(job)
    out: list[Action] = []
    for k in keys:
        phase = workers.get(k)
        if phase in ("starting", "running"):
            if job.spec.checkpointable and now < deadline:
                out.append(RequestCheckpoint(k, deadline))
            else:
                out.append(StopWorker(k, "preempted", max(LATE_GRACE, deadline - now)))
        elif phase == "checkpoint-requested" and now >= deadline:
            out.append(StopWorker(k, "preempted", LATE_GRACE))
        elif phase == "checkpointed":
            out.append(StopWorker(k, "preempted", max(LATE_GRACE, deadline - now)))
    return out


def preemption_deadline(job: JobState) -> float:
    """When a checkpointing job's grace runs out: the deadline the preemption named, or (for a
    preemption recorded without one) its grace period after the fold moved it to checkpointing."""
    return job.preempt_deadline or job.phase_since + job.spec.grace_seconds


def _stop_reason(job: JobState | None) -> StopReason:
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


def _live_in_log(job: JobState | None, key: WorkerKey) -> bool:
    return (
        job is not None and job.held is not None and job.held.attempt == key.attempt and key.rank in job.live
    )


def _exit_folded(job: JobState | None, key: WorkerKey) -> bool:
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


def _concerned(state: State, node: str, workers: Mapping[WorkerKey, WorkerPhase]) -> list[JobState]:
    """The jobs that may have work on ``node``, in submission order: those holding GPUs there
    (every job the fold has placed or running there holds them) and those the runtime runs
    workers of. It costs the node's jobs, not the cluster's."""
    found = {job.id: job for job in indexes.holding_on(state, node)}
    jobs = state.jobs
    for key in workers:
        if key.job_id not in found:
            job = jobs.get(key.job_id)
            if job is not None:
                found[job.id] = job
    return sorted(found.values(), key=lambda j: (j.submitted_seq, j.id))


def _gone(state: State, node: str, workers: Mapping[WorkerKey, WorkerPhase]) -> list[Action]:
    out: list[Action] = []
    for job in indexes.holding_on(state, node):
        held = job.held
        if held is None or not job.live:
            continue
        for w in held.workers:
            key = WorkerKey(job.id, held.attempt, w.rank)
            if w.node == node and w.rank in job.live and key not in workers:
                out.append(ReportGone(key))
    return out


# -- a worker's contract -------------------------------------------------------------------------


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of one attempt: the same on every node, different between attempts
    (a restarted gang never meets a straggler of the last one)."""
    return PORT_BASE + zlib.crc32(f"{job_id}:{attempt}".encode()) % PORT_SPAN


def mig_placeholder(gpu_uuid: str, slot: MigSlot) -> str:
    return f"mig:{gpu_uuid}/{slot.profile}@{slot.start}"


def checkpoint_dirs(root: str, job_id: str, attempt: int, rank: int) -> tuple[str, str]:
    """(the worker's checkpoint directory, the job's) under ``root``."""
    job_dir = f"{root.rstrip('/')}/{job_id}"
    return f"{job_dir}/attempt-{attempt}/rank-{rank}", job_dir


def bind_gpus(node: NodeState, claims: tuple[GpuClaim, ...]) -> tuple[GpuBinding, ...]:
    out = []
    for c in claims:
        uuid = node.gpus[c.gpu].info.uuid if 0 <= c.gpu < len(node.gpus) else f"GPU-missing-{c.gpu}"
        out.append(GpuBinding(c.gpu, uuid, c.milli, c.mig))
    return tuple(out)


def visible_devices(gpus: tuple[GpuBinding, ...]) -> str:
    return ",".join(g.uuid if g.mig is None else mig_placeholder(g.uuid, g.mig) for g in gpus)


def start_worker(
    state: State, node: NodeState, job: JobState, placement: Placement, slot: WorkerSlot, checkpoint_root: str
) -> StartWorker:
    spec = job.spec
    gpus = bind_gpus(node, slot.gpus)
    ckpt, job_ckpt = checkpoint_dirs(checkpoint_root, job.id, job.attempt, slot.rank)
    env = dict(spec.env)
    env.update(rendezvous_env(state, placement, slot))
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus)
    if shape.kind(spec.resources) == "fraction":
        env["CORRAL_GPU_MILLI"] = str(spec.resources.gpu_milli)
    env["CORRAL_JOB_ID"] = job.id
    env["CORRAL_ATTEMPT"] = str(job.attempt)
    env["CORRAL_CHECKPOINT_DIR"] = ckpt
    if job.checkpoint is not None:
        env["CORRAL_RESUME_FROM"] = job.checkpoint.location
    else:
        env.pop("CORRAL_RESUME_FROM", None)
    return StartWorker(
        job_id=job.id,
        attempt=job.attempt,
        rank=slot.rank,
        gpus=gpus,
        env=env,
        command=spec.command,
        checkpoint_dir=ckpt,
        job_checkpoint_dir=job_ckpt,
        mounts=spec.mounts,
        image=spec.image,
        grace_seconds=spec.grace_seconds,
    )


def rendezvous_env(state: State, placement: Placement, slot: WorkerSlot) -> dict[str, str]:
    """torchrun's variables for ``slot``: ranks, world sizes, group rank, master address/port."""
    ranks = sorted(placement.workers, key=lambda w: w.rank)
    nodes: list[str] = []
    for w in ranks:
        if w.node not in nodes:
            nodes.append(w.node)  # node order = order of each node's lowest rank
    local = [w.rank for w in ranks if w.node == slot.node]
    master = ranks[0].node if ranks else slot.node
    master_node = state.nodes.get(master)
    address = master_node.inventory.labels.get(ADDRESS_LABEL, master) if master_node else master
    return {
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(len(ranks)),
        "LOCAL_RANK": str(local.index(slot.rank)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(nodes.index(slot.node)),
        "NODE_RANK": str(nodes.index(slot.node)),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(master_port(placement.job_id, placement.attempt)),
    }


# -- reports into events -------------------------------------------------------------------------


def report_events(node: str, report: Report) -> list[Event]:
    """The node events a runtime report becomes.

    A worker that never started is reported as started and exited with ``START_FAILED_CODE``, so
    the fold fails or restarts its gang by the job's restart policy. Only rank 0's checkpoint is
    the job's (data-parallel ranks hold the same weights); other ranks' reports only tell the
    agent they are ready to stop.
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
        )
        return [ev]
    if isinstance(report, StartFailed):
        return [
            WorkerStarted(node=node, job_id=k.job_id, attempt=k.attempt, rank=k.rank),
            WorkerExited(node=node, job_id=k.job_id, attempt=k.attempt, rank=k.rank, code=START_FAILED_CODE),
        ]
    if k.rank != 0:
        return []
    return [
        CheckpointCompleted(
            node=node, job_id=k.job_id, attempt=k.attempt, location=report.location, step=report.step
        )
    ]
