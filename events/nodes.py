"""Node family: inventories, what agents saw their workers do, and health facts.

Subject: ``corral.ev.node.<node>``. Agents write only their own node's subject; the health monitor
writes health facts for any node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from corral.events.base import Event, Index, Int
from corral.events.heartbeats import XidReport

NodeCondition = Literal["ready", "suspect", "lost"]

# Labels, a node's and those a job selects nodes by or carries: as many and as long as
# Kubernetes allows, about. Every reader of the cluster (the placer's domains, the read service's
# node rows, every dashboard) carries a node's labels; unbounded, one node's agent made the
# answer of every node larger than a message, for every tenant.
MAX_LABELS = 64
MAX_LABEL_BYTES = 320  # key + value
MAX_GPU_NAME = 128  # a GPU's model or UUID: NVML's are under 100 characters
# A checkpoint's location: as long as a path may be. It is the job's next attempts'
# ``CORRAL_RESUME_FROM`` on whatever node they run, so a NUL or any control character in it (which
# no environment can carry) made every later start of the job fail, on every node.
MAX_LOCATION = 4096


def labels_problem(labels: Mapping[str, str]) -> str | None:
    """What is wrong with ``labels`` (too many, too long, control characters); None if nothing."""
    if len(labels) > MAX_LABELS or any(_utf8(k) + _utf8(v) > MAX_LABEL_BYTES for k, v in labels.items()):
        return f"at most {MAX_LABELS} entries of at most {MAX_LABEL_BYTES} bytes each"
    if not all(k.isprintable() and v.isprintable() for k, v in labels.items()):
        return "keys and values may not have control characters"
    return None


def location_problem(location: str) -> str | None:
    """Why ``location`` cannot be a checkpoint's location; None if it can."""
    if not 0 < len(location) <= MAX_LOCATION or not location.isprintable():
        return f"a checkpoint's location is 1..{MAX_LOCATION} printable characters"
    return None


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode(errors="surrogatepass"))


class GpuInfo(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One physical GPU as discovered (NVML) or simulated.

    ``island`` groups GPUs joined by NVLink/NVSwitch all-to-all; -1 means PCIe only.
    ``mig`` is true when the GPU is in MIG mode: it is then shared by MIG instances only.
    """

    index: Int
    uuid: str
    model: str
    memory_mib: Int
    island: Int = -1
    mig: bool = False
    nvlinks: Int = 0


# The most workers a node runs at once unless its agent says otherwise, as a kubelet's
# ``--max-pods``: CPU and memory alone bound nothing for workers that ask a milli-CPU each.
MAX_WORKERS = 256


class NodeInventory(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """What a node has. ``max_workers``: the most workers of any jobs it runs at once."""

    cpu_milli: Int
    memory_mib: Int
    gpus: tuple[GpuInfo, ...] = ()
    labels: dict[str, str] = {}
    max_workers: Int = MAX_WORKERS


class NodeRegistered(Event, frozen=True, kw_only=True):
    """An agent (or the simulator) announces a node and what it has. Re-registering replaces the
    inventory; GPUs held by running work stay held."""

    node: str
    inventory: NodeInventory


# A worker's report names its job's ``run`` (``Assignment.run``: the log position of the job's
# submission; 0: not known): a job id used again once its job was let go has attempts and ranks
# of the same numbers, and a report of the earlier job's process (a worker still running on a
# node that was lost, and came back) is no fact about the new one.


class WorkerStarted(Event, frozen=True, kw_only=True):
    """``failed``: no process was started. The fold takes a worker's exit only after its start,
    so an agent reports a start that failed as one so marked, its ``WorkerExited`` next saying
    why (``start_error`` or ``node_fault``); a job's history says nothing of it as a start."""

    node: str
    job_id: str
    attempt: Index
    rank: Index
    pid: Int = 0
    run: Int = 0
    failed: bool = False


class WorkerExited(Event, frozen=True, kw_only=True):
    """``code`` is the exit status; ``stopped`` says corral itself stopped the worker; ``pid`` is
    the one its start reported (0 if none did): a rank of an elastic job may run more than once in
    one attempt, and each run's start and exit are facts of their own. ``xids``: the XIDs its
    agent saw on the worker's GPUs lately, with a failed exit: one that says the GPU is at fault
    (``projections.xids.hardware``) makes the exit the GPU's failure, not the job's.
    ``node_fault``: why the node, not the job, kept the worker from starting (its directories
    could not be made, no container engine or sandbox works there, a device it was given is not
    there), as its agent judged: the job goes back to its queue without counting a restart, and
    a node that keeps failing starts so is taken out of placement (``NodeState.start_faults``)."""

    node: str
    job_id: str
    attempt: Index
    rank: Index
    code: Int
    stopped: bool = False
    pid: Int = 0
    run: Int = 0
    xids: tuple[XidReport, ...] = ()
    node_fault: str = ""
    # Why a worker that never started could not, where that is the job's own doing (its command
    # not found, its image not to be had): what its owner is told, not only "code 127".
    start_error: str = ""


class CheckpointCompleted(Event, frozen=True, kw_only=True):
    node: str
    job_id: str
    attempt: Index
    location: str
    step: Int
    run: Int = 0


class NodeShutdown(Event, frozen=True, kw_only=True):
    """An agent stopping its node's workers because it was told to stop (``corral up`` stopping
    the whole corral, ``corral serve agent --stop-workers``): the node is taken out of service,
    not failing. The fold interrupts the jobs holding GPUs on the node without counting a
    restart, as for a lost node; their workers' exits that follow are the stops of attempts
    already over. Written before the first worker is stopped, after every report made until
    then. ``at``: the agent's clock when it began; with the node it names this shutdown, since
    a node may be shut down twice within the stream's duplicate window. ``registers_again``:
    its agent registers the node again when it is back, so the node takes no new work until
    then (an agent that does not, of an older build, leaves it in service, as its logs were
    folded)."""

    node: str
    at: float
    reason: str = ""
    registers_again: bool = False


# What a node agent writes of its node, each with what its event's id begins with (the agent's
# ``msg_id``): the intake takes no other kind from a node, and no id another writer's could be
# (a decision's id names its role, ``placer:<based_on>:<index>``, and ``corral verify`` reruns
# the cycle an id names).
REPORT_IDS: dict[type[Event], str] = {
    NodeRegistered: "register:",
    WorkerStarted: "started:",
    WorkerExited: "exited:",
    CheckpointCompleted: "checkpoint:",
    NodeShutdown: "shutdown:",
}


def agent_producer(node: str) -> str:
    """What the producer of every event node ``node``'s agent writes begins with (the agent's
    host and pid follow): the role traces and ``corral verify`` read from it is ``agent``."""
    return f"agent/{node}@"


class NodeConditionChanged(Event, frozen=True, kw_only=True):
    """Health monitor: node suspect (missed heartbeats), lost (timed out) or ready again."""

    node: str
    condition: NodeCondition
    reason: str = ""


class GpuHealthChanged(Event, frozen=True, kw_only=True):
    """Health monitor: a GPU turned unhealthy (or healthy again), with the signal, e.g. ``xid:79``.
    ``uuid``: the GPU's, as the monitor knew it at ``gpu``; where the node has registered since and
    that index now names another GPU, the verdict is void (it was about a GPU that moved or left)."""

    node: str
    gpu: Int
    healthy: bool
    signal: str = ""
    uuid: str = ""


class NodeCordoned(Event, frozen=True, kw_only=True):
    """No new work lands on a cordoned node; ``drain`` also moves its running work away."""

    node: str
    cordoned: bool
    drain: bool = False
    reason: str = ""
