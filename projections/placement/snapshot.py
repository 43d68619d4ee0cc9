"""One placement cycle's view of the cluster: what is free where, indexed for the search.

The state is never touched. A ``Snapshot`` reads it once (one pass over every GPU to count free
whole GPUs per node and model) and builds a ``NodeView`` only for nodes the search visits. What
the cycle gives away is taken from those views (``take``) and can be given back (``give_back``):
a gang that does not fit whole is rolled back, a reservation is hidden from the jobs that may not
use it, and the placer's projection of the future releases what running jobs hold. So two
placements of one cycle never collide, and the arithmetic is the fold's
(``projections/claims.py``): whole GPUs need a GPU nobody holds, fractions add up to at most 1000
milli, MIG instances need their memory slices free.

Invariants: a view's numbers are the state's minus this cycle's takes plus its give-backs, and
the whole-GPU index holds every ready node under the count of its free whole GPUs per model.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from corral.events.decisions import GpuClaim, Placement
from corral.events.jobs import Resources
from corral.projections import mig
from corral.projections.state import WHOLE, GpuState, NodeState, State


class GpuView:
    """One GPU as this cycle sees it."""

    __slots__ = (
        "index",
        "model",
        "memory_mib",
        "island",
        "mig",
        "healthy",
        "free",
        "holders",
        "mig_used",
        "me",
    )

    def __init__(self, g: GpuState) -> None:
        self.index = g.info.index
        self.model = g.info.model
        self.memory_mib = g.info.memory_mib
        self.island = g.info.island
        self.mig = g.info.mig
        self.healthy = g.healthy
        self.free = g.free_milli
        self.holders = len(g.holders)  # a whole GPU needs a GPU nobody holds
        self.mig_used = g.mig_used
        self.me = bool(g.mig) and any(i.profile.endswith("+me") for i in g.mig.values())
        if g.held_in_other_mode:  # nothing new on it until that work is gone (``claims``)
            self.free, self.holders, self.mig_used = 0, max(self.holders, 1), (1 << mig.SLICES) - 1

    @property
    def whole_free(self) -> bool:
        return self.healthy and not self.mig and self.holders == 0 and self.free == WHOLE


class NodeView:
    """One node as this cycle sees it: the state's numbers minus what the cycle has taken."""

    __slots__ = (
        "name", "ready", "cordoned", "draining", "condition", "labels", "cpu_free", "mem_free",
        "workers_free", "gpus", "version", "suitable",
    )  # fmt: skip

    def __init__(self, node: NodeState) -> None:
        self.name = node.name
        self.version = 0  # bumped by every take and give-back: answers about the node may be cached by it
        self.ready = node.schedulable
        self.cordoned = node.cordoned
        self.draining = node.draining
        self.condition = node.standing
        self.labels = node.inventory.labels
        self.cpu_free = node.inventory.cpu_milli - node.cpu_used
        self.mem_free = node.inventory.memory_mib - node.memory_used
        self.workers_free = node.inventory.max_workers - node.workers
        self.gpus = [GpuView(g) for g in node.gpus]
        # Per need, the GPUs that could ever serve it (``plugins/model.suitable``): facts of the
        # hardware, which no take or give-back changes, asked by several plugins of each node.
        self.suitable: dict[Hashable, list[GpuView]] = {}

    def free_whole(self, model: str) -> int:
        return sum(1 for g in self.gpus if g.model == model and g.whole_free)


class Snapshot:
    """The cycle's view: lazily built node views, a whole-GPU index and the overlay."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._views: dict[str, NodeView] = {}
        # model -> free whole GPU count -> nodes (dicts as insertion-ordered sets: deterministic)
        self._whole: dict[str, list[dict[str, None]]] = {}
        self._count: dict[tuple[str, str], int] = {}
        # labels -> node -> its path (``domains``)
        self._domains: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        self.ready: list[str] = []
        # The chain's answers for this snapshot (whether and how a worker fits a node), keyed by
        # the node's version: valid only for this snapshot, whose views the versions count.
        self.picks: dict[Hashable, Any] = {}
        # Nodes with a shared GPU that has room left, and nodes with MIG GPUs: where fractions and
        # MIG slices go first (a superset: a visit checks what is really free).
        self.partial: dict[str, None] = {}
        self.sliced: dict[str, None] = {}
        # Every node a take or give-back touched, in order (repeats kept): who may answer
        # differently now. ``Chain.diagnose`` re-asks only these nodes since it last asked.
        self.touched: list[str] = []
        self.diagnoses: dict[Hashable, Any] = {}
        # The cycle's one walk of the whole cluster (1,250 nodes, 10,000 GPUs): each GPU read
        # once, for the whole-GPU index and for where fractions and MIG slices may go.
        ready, index, sliced, partial = self.ready, self._index, self.sliced, self.partial
        for name, node in state.nodes.items():
            if not node.schedulable:
                continue
            ready.append(name)
            # Free whole GPUs per model, models in the order the node lists them (a model with
            # none free still files the node under 0).
            counts: dict[str, int] = {}
            for g in node.gpus:
                info = g.info
                model = info.model
                if g.healthy and not info.mig and not g.holders:
                    counts[model] = counts.get(model, 0) + 1
                elif model not in counts:
                    counts[model] = 0
                if g.healthy:
                    if info.mig:
                        sliced[name] = None
                    elif 0 < g.free_milli < WHOLE:
                        partial[name] = None
            for model, n in counts.items():
                index(name, model, n)

    # -- reading ------------------------------------------------------------------------------

    def view(self, name: str) -> NodeView:
        v = self._views.get(name)
        if v is None:
            v = self._views[name] = NodeView(self.state.nodes[name])
        return v

    def models(self) -> list[str]:
        return list(self._whole)

    def by_free_whole(self, models: Iterable[str], at_least: int, most_first: bool = False) -> Iterator[str]:
        """Ready nodes with at least ``at_least`` free whole GPUs of one of ``models``: tightest
        first (bin packing) or, with ``most_first``, emptiest first (spreading)."""
        lists = [self._whole[m] for m in models if m in self._whole]
        top = max((len(b) for b in lists), default=0)
        counts = range(top - 1, at_least - 1, -1) if most_first else range(at_least, top)
        seen: set[str] = set()
        for n in counts:
            for buckets in lists:
                if n < len(buckets):
                    for name in list(buckets[n]):
                        if name not in seen:
                            seen.add(name)
                            yield name

    def buckets(self, model: str) -> list[dict[str, None]]:
        """The whole-GPU index of ``model``: the ready nodes with ``n`` free whole GPUs at
        position ``n``, in the order ``by_free_whole`` hands them out. Read only."""
        return self._whole.get(model, [])

    def free_whole_count(self, name: str, model: str) -> int:
        return self._count.get((name, model), 0)

    def domains(self, labels: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """Each ready node's domain as its path of ``labels``' values, widest first (a rack is
        its block's and its own: racks of two blocks may share a name), for nodes that carry the
        last, the domain's own, label; an upper label a node lacks reads as "". Read once per
        snapshot, as every gang of the cycle that asks for a domain reads them all."""
        found = self._domains.get(labels)
        if found is None:
            nodes = self.state.nodes
            own = labels[-1]
            found = {}
            for name in self.ready:
                tags = nodes[name].inventory.labels
                if own in tags:
                    found[name] = tuple(tags.get(k, "") for k in labels)
            self._domains[labels] = found
        return found

    # -- the overlay ----------------------------------------------------------------------------

    def take(self, name: str, res: Resources, gpus: tuple[GpuClaim, ...]) -> None:
        """Give one worker's share of node ``name`` away for the rest of the cycle."""
        self._apply(name, res, gpus, -1)

    def give_back(self, name: str, res: Resources, gpus: tuple[GpuClaim, ...]) -> None:
        """Undo a ``take``, or hand back what a running worker holds (a projected release)."""
        self._apply(name, res, gpus, +1)

    def release(self, placement: Placement, res: Resources) -> None:
        for w in placement.workers:
            if w.node in self.state.nodes:
                self.give_back(w.node, res, w.gpus)

    def forget_answers(self) -> None:
        """Let go of the chain's answers kept for this snapshot (``picks``, ``diagnoses``) and of
        the nodes touched: a snapshot kept beyond a cycle (admission's idle copy of the
        inventory) would keep an answer for every version of every node it ever took from."""
        self.picks.clear()
        self.diagnoses.clear()
        self.touched.clear()

    def _apply(self, name: str, res: Resources, gpus: tuple[GpuClaim, ...], sign: int) -> None:
        v = self.view(name)
        v.version += 1
        self.touched.append(name)
        v.cpu_free += sign * res.cpu_milli
        v.mem_free += sign * res.memory_mib
        v.workers_free += sign
        touched: set[str] = set()
        for c in gpus:
            if not 0 <= c.gpu < len(v.gpus):
                continue
            g = v.gpus[c.gpu]
            if c.mig is not None:
                p = mig.profile(g.model, c.mig.profile)
                if p is None:
                    continue
                m = mig.mask(p, c.mig.start)
                g.mig_used = g.mig_used & ~m if sign > 0 else g.mig_used | m
                g.free += sign * (p.size * WHOLE // mig.SLICES)
                if c.mig.profile.endswith("+me"):
                    g.me = sign < 0
            else:
                g.free += sign * c.milli
                if 0 < g.free < WHOLE:
                    self.partial[name] = None
            g.holders = max(0, g.holders - sign)
            touched.add(g.model)
        if v.ready:
            for model in touched:
                self._index(name, model, v.free_whole(model))

    def _index(self, name: str, model: str, n: int) -> None:
        buckets = self._whole.setdefault(model, [])
        old = self._count.get((name, model))
        if old == n:
            return
        if old is not None:
            buckets[old].pop(name, None)
        while len(buckets) <= n:
            buckets.append({})
        buckets[n][name] = None
        self._count[(name, model)] = n
