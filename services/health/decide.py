"""The health monitor's pure policy: which GPU signals matter, and the node state machine.

Heartbeats travel on core NATS (``corral.hb.<node>``), not in the log; this module turns them
into logged facts only when something changes. It has no IO and no clock: time comes in as
``now`` (the monitor's receive time; an agent's own clock is never trusted).

GPU signals (``XID_ACTIONS``, ``sample_signals``), per NVIDIA's XID catalogue and the k8s device
plugin:

- ``ignore``: application errors (XID 13, 31, 43, 45, 68). The job fails; the GPU is fine.
- ``record``: worth knowing, no action now (XID 63, a row remap that succeeded).
- ``alert``: tell a person, change nothing (XID 92, a high single-bit ECC rate).
- ``gpu``: the GPU is unhealthy: it leaves the capacity the placer sees and the fold interrupts
  the jobs on it (XID 48, 62, 64, 74, 94, 95, 109, 119, 120, 140; any XID not in the table,
  61 included; uncorrectable ECC; pending or failed row remaps; pending page retirement; NVLinks
  down that were up at registration; a process its agent sent SIGKILL a minute ago still holding
  it, ``process:unkillable``, as Slurm's ``UnkillableStepTimeout``).
- ``node``: the GPU is unhealthy and the whole node is cordoned and drained (XID 79, fallen off
  the bus, needs a reboot; a GPU NVML reports lost or no longer lists).

XID and ``node`` verdicts are sticky: the GPU stays unhealthy until someone clears it after a
reset (an admin's uncordon with ``repaired``, ``corral node uncordon NODE --repaired``, which
the fold applies too; ``clear`` for one GPU). Counter signals (ECC, remaps, NVLinks, an
unkillable process) clear themselves when the counters do, or the process is gone. An XID is
about the GPU its report's UUID names (indexes change when a node registers again); one the
agent could not name a GPU for drains the node and fails none. A verdict names the GPU's UUID
too, and the fold voids one whose index names another GPU by then (``adopt``).

Node conditions (``HeartbeatTracker``): ready → suspect after ``suspect_after`` missed heartbeat
intervals, or at the first heartbeat whose agent says it cannot do its work (its work directory
full: every start there would fail and be charged to its job) → lost after ``lost_after``
seconds of silence. A suspect or lost node becomes ready
again only after on-time heartbeats, every one of them saying the agent is well, for
``probation`` seconds: a node that flaps is not trusted. The health monitor never uncordons a
node; a person does.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

from corral.events.base import Event
from corral.events.heartbeats import GpuHealthSample, Heartbeat, XidReport
from corral.events.nodes import (
    GpuHealthChanged,
    NodeCondition,
    NodeConditionChanged,
    NodeCordoned,
    NodeInventory,
    NodeRegistered,
)
from corral.events.queues import CordonNode, DeleteNode
from corral.projections.state import State
from corral.projections.xids import XID_ACTIONS as XID_ACTIONS
from corral.projections.xids import Action, xid_action

# The XID policy is the fold's too (an exit that reports one): ``projections.xids``.


def sample_signals(sample: GpuHealthSample, expected_nvlinks: int) -> list[tuple[str, Action]]:
    """The signals one health sample raises, each with its action; empty when the GPU is well."""
    if sample.lost:
        return [("gpu:lost", "node")]
    out: list[tuple[str, Action]] = []
    if sample.ecc_uncorrected:
        out.append((f"ecc:uncorrected:{sample.ecc_uncorrected}", "gpu"))
    if sample.remap_failed:
        out.append(("row-remap:failed", "gpu"))
    if sample.remap_pending:
        out.append(("row-remap:pending", "gpu"))
    if sample.retired_pages_pending:
        out.append(("page-retire:pending", "gpu"))
    if sample.unkillable:
        out.append(("process:unkillable", "gpu"))
    if sample.nvlinks_active < expected_nvlinks:
        out.append((f"nvlink:down:{expected_nvlinks - sample.nvlinks_active}", "gpu"))
    return out


# -- heartbeats ----------------------------------------------------------------------------------


class Notice(NamedTuple):
    """A signal that changes no state but an operator should see (``record`` and ``alert``)."""

    node: str
    gpu: int
    signal: str
    action: Action


# What one heartbeat may say, and what is kept of it for the operator between two evaluations:
# a node's agent (its own, or one that lies) sent 50,000 XIDs a heartbeat, each a notice kept
# and logged, a million warnings a tick. A real node reports a few XIDs an interval; repeats of
# one notice are counted, and a node's notices past ``MAX_NOTICES`` distinct ones only counted.
MAX_XIDS = 64
MAX_NOTICES = 64
# Nodes kept before the names heard of but never registered, and silent since, are let go on a
# heartbeat (``HeartbeatTracker._forget_silent``): the size doubles with what stays.
FORGET_PAST = 1_024
_URGENCY = {"node": 0, "gpu": 1}


class _Gpu:
    __slots__ = ("uuid", "nvlinks", "healthy", "signal", "sticky", "live")

    def __init__(self, uuid: str, nvlinks: int) -> None:
        self.uuid = uuid
        self.nvlinks = nvlinks
        self.healthy = True  # what the log says (or will, once our last change is folded)
        self.signal = ""
        self.sticky = ""  # an XID verdict: stays until cleared
        self.live = ""  # the worst counter signal of the latest sample


# Jobs whose starts a node may fail in a row for its own fault (``WorkerExited.node_fault``: its
# disk full, its container engine broken) before it is taken out of placement: such a node fails
# every job placed on it at once and, free again at once, takes the next, a black hole that
# empties the queues. The fold counts them, each job once (``NodeState.start_faults``): one job
# failing its own starts, whatever the node says, does not cordon node after node.
QUARANTINE_AFTER = 3


class _Node:
    __slots__ = (
        "known", "condition", "cordoned", "draining", "gpus", "since", "last_seen", "last_seq",
        "probation_from", "drain_signal", "early", "unwell", "quarantine",
    )  # fmt: skip

    def __init__(self, since: float) -> None:
        self.known = False  # registered in the log: only then are its facts written
        self.condition: NodeCondition = "ready"
        self.cordoned = False
        self.draining = False
        self.gpus: list[_Gpu] = []
        self.since = since  # when silence started counting if it never heartbeated
        self.last_seen: float | None = None
        self.last_seq = -1
        self.probation_from: float | None = None  # start of the current run of good heartbeats
        self.drain_signal = ""
        # XIDs on GPUs of a registration not folded yet (by UUID): marked once it is.
        self.early: dict[str, tuple[str, Action]] = {}
        # What its agent's latest heartbeat said it cannot do ("" while it says it is well).
        self.unwell = ""
        # Why it is to be cordoned for the starts it failed in a row ("" if it is not).
        self.quarantine = ""


# What an agent says is wrong becomes the reason of its node's condition, kept in the log: a line
# of at most this many characters, however much an agent taken over sends.
MAX_WHY = 256


def _said(why: str) -> str:
    line = "".join(c if c.isprintable() else " " for c in why[:MAX_WHY]).strip()
    return line or "its agent cannot do its work"


class HeartbeatTracker:
    """Heartbeats in, node and GPU health facts out, each fact once.

    Feed it the log's node facts (``sync`` from a folded state at start, ``observe`` for each node
    event folded since) and heartbeats (``record``); ``evaluate(now)`` returns the events that
    bring the log in line with what the heartbeats say, and assumes they will be appended.

    ``evaluate`` runs every tick over thousands of nodes whose heartbeats say all is well, so it
    visits only the nodes that may have a fact to state: those a fact, a registration, a clear
    or a heartbeat left with a GPU whose signal disagrees with its health or a drain to ask for
    (``_pending``), those not ready (``_unready``), and those silent longer than a heartbeat
    may be (``_heard``, a heap by when each node was last heard of). Any other node is ready,
    heard of lately and in line with the log: it has nothing to state.
    """

    def __init__(
        self,
        interval: float = 5.0,
        suspect_after: int = 3,
        lost_after: float = 60.0,
        probation: float = 30.0,
    ) -> None:
        self.interval = interval
        self.suspect_after = suspect_after
        self.lost_after = lost_after
        self.probation = probation
        self._nodes: dict[str, _Node] = {}
        self._notices: dict[Notice, int] = {}  # each notice since the last taken, how often
        self._noticed: dict[str, int] = {}  # per node, distinct notices kept, then those past them
        self._pending: set[str] = set()
        self._unready: set[str] = set()
        # (when last heard of, stamp, node): a node's latest entry has its stamp in ``_stamps``;
        # older ones are passed over as they come to the top.
        self._heard: list[tuple[float, int, str]] = []
        self._stamps: dict[str, int] = {}
        self._stamp = 0
        self._forget_past = FORGET_PAST

    @property
    def _suspect_silence(self) -> float:
        return self.suspect_after * self.interval

    def _node(self, name: str, now: float) -> _Node:
        n = self._nodes.get(name)
        if n is None:
            if len(self._nodes) >= self._forget_past:
                self._forget_silent(now)
            n = self._nodes[name] = _Node(now)
            self._heard_of(name, n)
        return n

    def _forget_silent(self, now: float) -> None:
        """Let go of the names heard of but never registered, and silent longer than a ready
        node may be, as ``evaluate`` does: a standby never evaluates, and anyone may heartbeat
        on a server without logins, so each name made up stayed in every standby for good. The
        size that triggers this doubles with what stays, so each new name pays a constant share."""
        most = self._watched_silence
        for name, n in list(self._nodes.items()):
            if not n.known and now - (n.last_seen if n.last_seen is not None else n.since) > most:
                del self._nodes[name]
                self._stamps.pop(name, None)
                self._pending.discard(name)
                self._unready.discard(name)
        self._forget_past = max(FORGET_PAST, 2 * len(self._nodes))

    def _heard_of(self, name: str, n: _Node) -> None:
        """Note when ``name`` was last heard of (its silence counts from then)."""
        self._stamp += 1
        self._stamps[name] = self._stamp
        last = n.last_seen if n.last_seen is not None else n.since
        heapq.heappush(self._heard, (last, self._stamp, name))
        if len(self._heard) > 4 * len(self._nodes) + 64:
            # A standby replica records heartbeats but never evaluates: keep the latest only.
            self._heard = [e for e in self._heard if self._stamps.get(e[2]) == e[1]]
            heapq.heapify(self._heard)

    def _set_condition(self, name: str, n: _Node, condition: NodeCondition) -> None:
        n.condition = condition
        if condition == "ready":
            self._unready.discard(name)
            # Watched again (its last entry may be gone: a clock set back makes a silent node
            # heard of lately again).
            self._heard_of(name, n)
        else:
            self._unready.add(name)

    # what the log says

    def sync(self, state: State, now: float) -> None:
        """Adopt the log's view of every node (a monitor starting from a snapshot or replay)."""
        for name, ns in state.nodes.items():
            n = self._node(name, now)
            self._register(n, ns.inventory)
            self._pending.add(name)
            self._set_condition(name, n, ns.condition)
            n.cordoned, n.draining = ns.cordoned, ns.draining
            if len(ns.start_faults) >= QUARANTINE_AFTER and not ns.cordoned:
                n.quarantine = _quarantine(len(ns.start_faults), "")
            for g, gs in zip(n.gpus, ns.gpus, strict=False):
                g.healthy, g.signal = gs.healthy, gs.signal
                if not gs.healthy and _sticky(gs.signal):
                    g.sticky = gs.signal

    def adopt(self, name: str, state: State) -> None:
        """Adopt what the log says of node ``name``'s GPUs, by UUID, where it was said otherwise
        than by a verdict the tracker observes: the fold refused one of ours (judged on the GPUs
        the node had before it registered again: stated again at the GPU's index now), or failed
        a GPU a worker died of (its agent named the XID in the exit: kept as a verdict of ours,
        so that a counter signal clearing later does not say the GPU well)."""
        n = self._nodes.get(name)
        ns = state.nodes.get(name)
        if n is None or ns is None:
            return
        said = {gs.info.uuid: gs for gs in ns.gpus}
        for g in n.gpus:
            gs = said.get(g.uuid)
            if gs is not None:
                g.healthy, g.signal = gs.healthy, gs.signal
                if not gs.healthy and _sticky(gs.signal):
                    g.sticky = g.sticky or gs.signal
        self._pending.add(name)

    def start_faults(self, name: str, count: int, why: str) -> bool:
        """The fold counts ``count`` jobs whose starts node ``name`` failed in a row for its own
        fault, the latest for ``why``: from ``QUARANTINE_AFTER`` on, the node is cordoned (not drained:
        what runs there may be well; a person looks, and lifts the cordon). Whether there is a
        fact to state."""
        n = self._nodes.get(name)
        if n is None or not n.known or n.cordoned or count < QUARANTINE_AFTER:
            return False
        n.quarantine = _quarantine(count, why)
        self._pending.add(name)
        return True

    def observe(self, event: Event, now: float) -> bool:
        """A node event folded from the log (ours or anyone's), or an admin's cordon request the
        fold accepted. Whether it was a node fact ``evaluate`` reads (a worker's report is not)."""
        name = getattr(event, "node", None)
        if not isinstance(name, str):
            return False
        if isinstance(event, DeleteNode):  # gone for good: nothing of it is kept
            self._nodes.pop(name, None)
            self._stamps.pop(name, None)
            self._pending.discard(name)
            self._unready.discard(name)
            return True
        if isinstance(event, NodeConditionChanged | GpuHealthChanged | NodeCordoned | CordonNode):
            n = self._node(name, now)
        elif isinstance(event, NodeRegistered):
            self._register(self._node(name, now), event.inventory)
            self._pending.add(name)
            return True
        else:
            return False
        self._pending.add(name)
        if isinstance(event, NodeConditionChanged):
            self._set_condition(name, n, event.condition)
        elif isinstance(event, NodeCordoned | CordonNode):  # CordonNode: an admin, by hand
            n.cordoned, n.draining = event.cordoned, event.cordoned and event.drain
            # A quarantine not said yet (a standby never evaluates) is settled either way: the
            # node is cordoned, or a person lifted its cordon and the fold forgot its run.
            n.quarantine = ""
            if isinstance(event, CordonNode) and event.repaired:  # reset by a person: cleared
                for g in n.gpus:
                    g.sticky, g.healthy, g.signal = "", True, ""
        elif isinstance(event, GpuHealthChanged):
            i = _index(n, event.gpu, event.uuid)
            if i is not None:
                g = n.gpus[i]
                g.healthy, g.signal = event.healthy, event.signal
                if not event.healthy and _sticky(event.signal):
                    g.sticky = event.signal
        return True

    def _register(self, n: _Node, inventory: NodeInventory) -> None:
        old = {g.uuid: g for g in n.gpus}
        n.known = True
        n.gpus = []
        for info in inventory.gpus:
            g = _Gpu(info.uuid, info.nvlinks)
            prev = old.get(info.uuid)
            if prev is not None:
                g.sticky = prev.sticky  # a GPU that failed stays failed across an agent restart
                # ... and the fold keeps its health by UUID (``fold_nodes._registered``): what
                # the log says of it is what it said before the registration.
                g.healthy, g.signal = prev.healthy, prev.signal
            n.gpus.append(g)
        early, n.early = n.early, {}
        for i, g in enumerate(n.gpus):
            if g.uuid in early:
                signal, action = early[g.uuid]
                self._act(n, "", i, signal, action, sticky=True)

    def clear(self, node: str, gpu: int) -> None:
        """A person reset the GPU: forget its sticky XID verdict."""
        n = self._nodes.get(node)
        if n is not None and 0 <= gpu < len(n.gpus):
            n.gpus[gpu].sticky = ""
            self._pending.add(node)

    # what the heartbeats say

    def record(self, node: str, now: float, payload: Heartbeat) -> None:
        n = self._node(node, now)
        if payload.seq == n.last_seq and n.last_seen is not None:
            return  # repeated
        # One that goes back is the agent's next run, not a late one: core NATS keeps an agent's
        # heartbeats in order. Dropped, one heartbeat with a huge sequence (or an agent
        # restarted after its clock stepped back) left its node silent, and lost, for good.
        gap = now - (n.last_seen if n.last_seen is not None else n.since)
        n.last_seen, n.last_seq = now, payload.seq
        self._heard_of(node, n)
        if n.condition != "ready":
            self._unready.add(node)  # visited until it is trusted again, or lost again
        n.unwell = "" if payload.ok else _said(payload.why)
        if n.unwell and n.condition == "ready":
            self._pending.add(node)  # placed on, its starts would fail: taken out of placement
        if not payload.ok or gap > self._suspect_silence:
            n.probation_from = now if payload.ok else None
        elif n.probation_from is None:
            n.probation_from = now
        by_uuid = {s.uuid: s for s in payload.gpus}
        # Whether the node has a fact to state now (``_pending``): a GPU whose signal disagrees
        # with its health, or a drain to ask for. An XID may mark any GPU: it always has.
        stating = bool(payload.xids)
        for i, g in enumerate(n.gpus):
            sample = by_uuid.get(g.uuid)
            signals: list[tuple[str, Action]]
            if sample is None and payload.gpus:
                signals = [("gpu:missing", "node")]  # NVML no longer lists it
            else:
                signals = sample_signals(sample, g.nvlinks) if sample is not None else []
            g.live = ""
            for signal, action in signals:
                self._act(n, node, i, signal, action, sticky=False)
            if (g.sticky or g.live) and g.healthy or not (g.sticky or g.live or g.healthy):
                stating = True
        xids: Sequence[XidReport] = payload.xids
        if len(xids) > MAX_XIDS:
            # One of each (GPU, XID), those that drain the node first, then those that fail a GPU:
            # a storm of one GPU's XID must not crowd out another GPU's failure, said once.
            one_each = {(x.gpu, x.uuid, x.xid): x for x in xids}.values()
            xids = sorted(one_each, key=lambda x: _URGENCY.get(xid_action(x.xid), 2))[:MAX_XIDS]
        for x in xids:
            # A MIG instance's XID marks its whole GPU: the fold keeps health per GPU.
            signal, action = f"xid:{x.xid}", xid_action(x.xid)
            if x.gpu == -1:
                # The agent could not say which GPU (or cannot watch them at all): none is known
                # bad, and none can be trusted. Drained, each job checkpoints within its grace,
                # and the heartbeats' samples name a GPU that fell off the bus.
                if action in ("gpu", "node") and not n.drain_signal:
                    n.drain_signal = f"{signal} on a GPU the agent could not name"
                elif action in ("record", "alert"):
                    self._notice(Notice(node, -1, signal, action))
                continue
            gpu = _index(n, x.gpu, x.uuid)
            if gpu is not None:
                self._act(n, node, gpu, signal, action, sticky=True)
            elif x.uuid and action in ("gpu", "node") and len(n.early) < _EARLY:
                n.early[x.uuid] = (signal, action)  # of a registration still to be folded
        if stating or n.drain_signal:
            self._pending.add(node)

    def _act(self, n: _Node, node: str, gpu: int, signal: str, action: Action, sticky: bool) -> None:
        g = n.gpus[gpu]
        if action in ("record", "alert"):
            self._notice(Notice(node, gpu, signal, action))
            return
        if action == "ignore":
            return
        if sticky or action == "node":  # a GPU that fell off the bus stays suspect until reset
            g.sticky = g.sticky or signal
        elif not g.live:
            g.live = signal
        if action == "node" and not n.drain_signal:
            n.drain_signal = f"{signal} on GPU {gpu}"

    def _notice(self, notice: Notice) -> None:
        notices = self._notices
        if notice in notices:
            notices[notice] += 1
            return
        noticed = self._noticed.get(notice.node, 0)
        self._noticed[notice.node] = noticed + 1
        if noticed < MAX_NOTICES:
            notices[notice] = 1

    def take_notices(self) -> list[tuple[Notice, int]]:
        """The notices since the last taken, each with how often it came, and for each node with
        more than ``MAX_NOTICES`` distinct ones a last ``(Notice(node, -1, "", "record"), n)``
        counting the ``n`` not kept."""
        out = list(self._notices.items())
        out += [
            (Notice(node, -1, "", "record"), n - MAX_NOTICES)
            for node, n in self._noticed.items()
            if n > MAX_NOTICES
        ]
        self._notices, self._noticed = {}, {}
        return out

    # deciding

    def evaluate(self, now: float, *, every_node: bool = False) -> list[Event]:
        """The facts to state at ``now``, node by node in name order. ``every_node``: visit
        every node, not only those that may have one (what the visits are tested against)."""
        silent = self._silent(now)
        visit = set(self._nodes) if every_node else self._pending | self._unready | set(silent)
        self._pending = set()
        out: list[Event] = []
        for name in sorted(visit):
            n = self._nodes[name]
            if n.known:
                out.extend(self._condition(name, n, now))
                out.extend(self._gpu_health(name, n))
                out.extend(self._cordon(name, n))
                if n.condition == "lost" and n.probation_from is None:
                    # Lost and silent: nothing changes until it is heard again (``record``), so
                    # it is not visited at every evaluation, however many nodes were ever lost.
                    self._unready.discard(name)
            elif now - (n.last_seen if n.last_seen is not None else n.since) > self._watched_silence:
                # Heard of but never registered, and silent since: let go, so that names made up
                # (anyone may heartbeat on a server without logins) do not stay for good. (Its
                # registration, if it comes, makes it anew.)
                del self._nodes[name]
                self._stamps.pop(name, None)
                self._unready.discard(name)
        # A silent node not registered yet stays ready, unwatched: its registration visits it.
        return out

    @property
    def _watched_silence(self) -> float:
        """How long a ready node may be silent before it is visited (``_condition``'s test)."""
        return min(self._suspect_silence, self.lost_after)

    def _silent(self, now: float) -> list[str]:
        """The nodes not heard of for longer than a ready node may be silent (``_condition``'s
        test), taken off the heap: each turns suspect or lost when visited, or is not
        registered yet."""
        most = self._watched_silence
        heard, stamps = self._heard, self._stamps
        out: list[str] = []
        while heard and now - heard[0][0] > most:
            _, stamp, name = heapq.heappop(heard)
            if stamps.get(name) == stamp:
                out.append(name)
        return out

    def _condition(self, name: str, n: _Node, now: float) -> list[Event]:
        last = n.last_seen if n.last_seen is not None else n.since
        silence = now - last
        new: NodeCondition | None = None
        reason = ""
        if n.condition != "lost" and silence > self.lost_after:
            new, reason = "lost", f"no heartbeat for {silence:.0f}s"
        elif n.condition == "ready" and silence > self._suspect_silence:
            missed = int(silence // self.interval)
            new, reason = "suspect", f"missed {missed} heartbeats ({silence:.0f}s)"
        elif n.condition == "ready" and n.unwell:
            new, reason = "suspect", n.unwell
        elif (
            n.condition != "ready"
            and n.probation_from is not None
            and silence <= self._suspect_silence
            and last - n.probation_from >= self.probation
        ):
            new, reason = "ready", f"healthy heartbeats for {last - n.probation_from:.0f}s"
        if new is None:
            return []
        self._set_condition(name, n, new)
        if new != "ready":
            n.probation_from = None  # trust is earned again from the next heartbeat on
        return [NodeConditionChanged(node=name, condition=new, reason=reason)]

    def _gpu_health(self, name: str, n: _Node) -> list[Event]:
        out: list[Event] = []
        for i, g in enumerate(n.gpus):
            signal = g.sticky or g.live
            if signal and g.healthy:
                g.healthy, g.signal = False, signal
                out.append(GpuHealthChanged(node=name, gpu=i, healthy=False, signal=signal, uuid=g.uuid))
            elif not signal and not g.healthy:
                g.healthy, g.signal = True, ""
                out.append(GpuHealthChanged(node=name, gpu=i, healthy=True, uuid=g.uuid))
        return out

    def _cordon(self, name: str, n: _Node) -> list[Event]:
        quarantine, n.quarantine = n.quarantine, ""
        if n.drain_signal:  # a drain cordons too
            signal, n.drain_signal = n.drain_signal, ""
            if n.cordoned and n.draining:
                return []
            n.cordoned = n.draining = True
            return [NodeCordoned(node=name, cordoned=True, drain=True, reason=signal)]
        if quarantine and not n.cordoned:
            n.cordoned = True
            return [NodeCordoned(node=name, cordoned=True, reason=quarantine)]
        return []

    def condition(self, node: str) -> NodeCondition | None:
        n = self._nodes.get(node)
        return n.condition if n is not None else None


# The most XIDs kept per node for GPUs it has not registered yet (a node has at most
# ``MAX_GPUS_PER_NODE`` GPUs; an agent that names many unknown ones is not believed further).
_EARLY = 64


def _quarantine(count: int, why: str) -> str:
    """A quarantine's reason, as the cordon's reason in the log: a bounded line."""
    last = f"; the last: {why}" if why else ""
    return _said(f"quarantined: the starts of {count} jobs in a row failed for the node's own fault{last}")


def _index(n: _Node, gpu: int, uuid: str) -> int | None:
    """The index of the GPU a report names: by its UUID where it gives one (indexes change when a
    node registers again), else by index; None if the node has no such GPU as we know it."""
    if uuid:
        return next((i for i, g in enumerate(n.gpus) if g.uuid == uuid), None)
    return gpu if 0 <= gpu < len(n.gpus) else None


def _sticky(signal: str) -> bool:
    return signal.startswith(("xid:", "gpu:"))
