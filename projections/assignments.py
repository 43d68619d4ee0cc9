"""What one node's agent must know of the log: its node's assignments, derived from the fold.

An agent does not fold the whole log (1,250 agents would be 1,250 full consumers of the stream,
each holding every job ever run). The assignments service folds it once, computes each node's
``NodeView`` with ``node_view`` and writes it where that node's agent watches (one key per node
in the ``corral_assignments`` bucket); the agent's pure ``decide`` reads only that view. So the
view and the fold never disagree: the view is one pure function of the folded state, the same
one the simulator and the agent's unit tests call.

Invariants:

- A job is in a node's view while the node has something to do or to remember for it: ranks of
  its current attempt's placement here, while the job is not over (placed, starting, running,
  checkpointing, and the waiting points preempted and interrupted, whose workers must stop), or
  workers here the log still counts as live (from any attempt: they hold their GPUs until their
  exit is folded). A finished job with nothing live here leaves the view: an agent stops and
  forgets every worker whose job is not in it.
- Only what the fold accepted is in it: ranks come from ``JobState.placement``, never from a
  proposal.
- What changes only when the node's assignments change is in it, and nothing that changes with
  every record (no log position in the comparison): the service writes a node's key only when
  the view's body differs from what it last wrote. ``seq`` says how far the log was folded when
  it was written, so a reader keeps the newest of two.
- Everything a worker's start needs that the log decides is here (GPUs by UUID, torchrun's
  rendezvous variables, the job's command, environment, mounts and image, where it resumes from);
  what the node decides (its checkpoint root, MIG instances' UUIDs) is the agent's to add.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import msgspec

from corral.events.decisions import GpuClaim, MigSlot, Placement, WorkerSlot
from corral.events.jobs import Mount
from corral.events.nodes import NodeInventory
from corral.projections import shape, trace_ids
from corral.projections.lifecycle import FINAL, Phase
from corral.projections.state import JobState, NodeState, State

PORT_BASE = 20000  # below Linux's ephemeral range (32768-60999), so no client socket holds it
PORT_SPAN = 10000
ADDRESS_LABEL = "address"


class GpuBinding(msgspec.Struct, frozen=True, omit_defaults=True):
    """A GPU claim resolved on this node: index, UUID, and the share or MIG slot."""

    index: int
    uuid: str
    milli: int = 1000
    mig: MigSlot | None = None


class AssignedRank(msgspec.Struct, frozen=True, omit_defaults=True):
    """One worker of the current attempt placed on this node."""

    rank: int
    gpus: tuple[GpuBinding, ...] = ()
    rendezvous: dict[str, str] = {}  # torchrun's variables for this rank


class Assignment(msgspec.Struct, frozen=True, omit_defaults=True):
    """One job as one node's agent sees it. Rank sets name this node's ranks only."""

    job_id: str
    attempt: int
    phase: Phase
    phase_since: float = 0.0
    restarts: int = 0
    deadline: float = 0.0  # log time a checkpoint (or a shrink) must be done by
    ranks: tuple[AssignedRank, ...] = ()  # the current attempt's placement here
    started: tuple[int, ...] = ()  # of those, the ranks whose start the log has folded
    leaving: tuple[int, ...] = ()  # of those, the ranks an elastic shrink takes away
    left: tuple[int, ...] = ()  # ranks the shrink took away in this attempt, exits folded
    held_attempt: int = -1  # the attempt whose workers hold GPUs now (-1: none)
    live: tuple[int, ...] = ()  # ranks here of the held attempt, started and not exited
    # what a worker runs: the job's spec, as far as the agent needs it
    command: tuple[str, ...] = ()
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    image: str | None = None
    grace_seconds: float = 30.0
    checkpointable: bool = False
    gpu_milli: int = 0  # a fractional GPU's share (0: whole GPUs, a MIG slice or none)
    resume_from: str = ""  # the location of the job's last checkpoint
    traceparent: str = ""  # the job's span in its trace (``projections/trace_ids.py``)
    # The log position of the job's submission: a job id used again once its job was let go
    # names another run, whose workers get directories of their own (``agent.decide.run_dir``).
    run: int = 0


class NodeView(msgspec.Struct, frozen=True, omit_defaults=True):
    """A node's assignments: the value of its key. ``inventory`` None: the log has not
    registered the node (nothing is started before it has)."""

    node: str
    seq: int = 0  # the log position the view was computed at (not part of what changed)
    time: float = 0.0  # the log time there: the agent reads deadlines against it (not a change)
    inventory: NodeInventory | None = None
    used_milli: tuple[int, ...] = ()  # per GPU, what the fold says is held: heartbeats report it
    jobs: tuple[Assignment, ...] = ()
    # The log position of the shutdown the node's agent has not come back from (0: none): an
    # agent that reads it registers the node again, which puts it back in service.
    shut_down: int = 0

    def job(self, job_id: str) -> Assignment | None:
        for a in self.jobs:
            if a.job_id == job_id:
                return a
        return None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(NodeView)


def encode(view: NodeView) -> bytes:
    return _encoder.encode(view)


def decode(raw: bytes) -> NodeView:
    """Raises ``msgspec.DecodeError`` (a ``ValueError``) for what is not a node's view."""
    return _decoder.decode(raw)


def body(view: NodeView) -> bytes:
    """What decides whether a node's key is written again: the view without its log position."""
    return _encoder.encode(msgspec.structs.replace(view, seq=0, time=0.0))


# -- computing a view ------------------------------------------------------------------------------


def node_view(state: State, node: str, jobs: Iterable[str] | None = None) -> NodeView:
    """``node``'s view of ``state``. ``jobs``: the ids that may concern the node (a caller that
    indexes jobs by node passes its own, so a view costs O(the node's jobs)); None: every job."""
    here = state.nodes.get(node)
    ids = state.jobs.keys() if jobs is None else sorted(set(jobs))
    found = []
    for job_id in ids:
        job = state.jobs.get(job_id)
        if job is not None:
            a = assignment(state, job, node)
            if a is not None:
                found.append(a)
    found.sort(key=lambda a: a.job_id)
    return NodeView(
        node=node,
        seq=state.seq,
        time=state.time,
        inventory=None if here is None else here.inventory,
        used_milli=() if here is None else tuple(g.used_milli for g in here.gpus),
        jobs=tuple(found),
        shut_down=0 if here is None else here.shut_down,
    )


def nodes_of(job: JobState) -> set[str]:
    """Every node whose view may hold ``job``: those of its current placement and of its held
    one. (A superset: ``assignment`` decides.)"""
    out: set[str] = set()
    for p in (job.placement, job.held):
        if p is not None:
            out.update(w.node for w in p.workers)
    return out


def assignment(state: State, job: JobState, node: str) -> Assignment | None:
    """What ``node`` must know of ``job``, or None when nothing (see the module's invariants)."""
    p = job.placement
    mine = [w for w in p.workers if w.node == node] if p is not None and p.attempt == job.attempt else []
    held = job.held
    live: list[int] = []
    if held is not None and job.live:
        live = sorted(w.rank for w in held.workers if w.node == node and w.rank in job.live)
    if not live and (not mine or job.phase in FINAL):
        return None
    here = state.nodes.get(node)
    ranks = []
    if p is not None and here is not None:
        ranks = [AssignedRank(w.rank, bind_gpus(here, w.gpus), rendezvous_env(state, p, w)) for w in mine]
    mine_ranks = {w.rank for w in mine}
    spec = job.spec
    return Assignment(
        job_id=job.id,
        attempt=job.attempt,
        phase=job.phase,
        phase_since=job.phase_since,
        restarts=job.restarts,
        deadline=preemption_deadline(job),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        started=tuple(sorted(mine_ranks & job.started)),
        leaving=tuple(sorted(mine_ranks.intersection(job.leaving))),
        left=tuple(sorted(job.left)),
        held_attempt=-1 if held is None else held.attempt,
        live=tuple(live),
        command=spec.command,
        env=spec.env,
        mounts=spec.mounts,
        image=spec.image,
        grace_seconds=spec.grace_seconds,
        checkpointable=spec.checkpointable,
        gpu_milli=spec.resources.gpu_milli if shape.kind(spec.resources) == "fraction" else 0,
        resume_from="" if job.checkpoint is None else job.checkpoint.location,
        # The job's own span (``trace_ids``): the agent hangs its workers' runs under the attempt.
        traceparent=trace_ids.job_trace(job.id, job.submitted_seq, job.traceparent).traceparent,
        run=job.submitted_seq,
    )


def preemption_deadline(job: JobState) -> float:
    """When a checkpointing job's grace runs out: the deadline the preemption named, or (for a
    preemption recorded without one) its grace period after the fold moved it to checkpointing."""
    return job.preempt_deadline or job.phase_since + job.spec.grace_seconds


# -- a worker's contract -------------------------------------------------------------------------


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of one attempt: the same on every node, different between attempts
    (a restarted gang never meets a straggler of the last one)."""
    return PORT_BASE + zlib.crc32(f"{job_id}:{attempt}".encode()) % PORT_SPAN


def bind_gpus(node: NodeState, claims: tuple[GpuClaim, ...]) -> tuple[GpuBinding, ...]:
    out = []
    for c in claims:
        uuid = node.gpus[c.gpu].info.uuid if 0 <= c.gpu < len(node.gpus) else f"GPU-missing-{c.gpu}"
        out.append(GpuBinding(c.gpu, uuid, c.milli, c.mig))
    return tuple(out)


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
