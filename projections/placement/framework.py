"""The placer's plugin points and the chain that runs them (after the Kubernetes scheduler
framework and Nomad's feasibility/rank iterators).

A job is turned into a ``Request`` (what each worker needs and how the gang wants to sit). For one
worker, the chain walks candidate nodes in the order an index hands them out:

- **Filter** plugins say no to a node, with a coded ``Reason`` (``events.base.Reason``: code,
  message for people, and whether preemption could change the answer). The first no wins.
- a **Reserve** plugin picks the concrete GPUs (whole, a fraction or a MIG slot) on a node that
  passed, or says the node has none that suit.
- **Score** plugins rank the nodes that passed; weighted scores add up, the highest wins, and
  ties go to the node the index handed out first (deterministic).

Only the first ``limit`` feasible candidates are scored (Nomad's limit iterator): candidates come
best-fit first from the index, so the search stays bounded on large clusters. When no node fits,
``diagnose`` runs the filters over every node and counts the reasons, as Kubernetes'
"0/N nodes are available" does; within a cycle it keeps each node's reason per shape and asks
again only the nodes the cycle has taken from or given back to since.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from corral.events.base import Reason
from corral.events.decisions import GpuClaim
from corral.events.jobs import Resources, TopologyPack
from corral.events.queues import PriorityClassSpec
from corral.projections import runtimes, thrash
from corral.projections.placement.snapshot import NodeView, Snapshot
from corral.projections.shape import Shape, ShapeKind, placed_resources
from corral.projections.state import JobState, State

# Static filters' answers a chain keeps (per need, node selector and node) before it lets them
# go: a cycle asks far fewer; a chain kept for long, as admission's idle copy of the inventory
# is, would keep one for every need it was ever asked about.
MEMO_MOST = 1 << 16

NeedKind = ShapeKind


@dataclass(frozen=True, slots=True)
class Need(Shape):
    """What one worker needs, read once from the job's ``Resources``: its shape, and the GPU
    models and GPU memory it may land on."""

    models: frozenset[str]
    min_gpu_memory: int

    @classmethod
    def of(cls, res: Resources) -> Need:
        s = Shape.of(res)
        models = frozenset(res.gpu_models)
        return cls(s.kind, s.gpus, s.milli, s.mig, s.cpu, s.memory, models, res.min_gpu_memory_mib)

    def model_ok(self, model: str) -> bool:
        return not self.models or model in self.models

    def describe(self) -> str:
        what = self.gpus_text()
        if self.models:
            what += f" ({' or '.join(sorted(self.models))})"
        return f"{what}, {self.cpu} milli-CPU, {self.memory} MiB"


@dataclass(frozen=True, slots=True)
class Request:
    """One job's placement request for this cycle."""

    job_id: str
    attempt: int
    replicas: int
    res: Resources
    need: Need
    selector: tuple[tuple[str, str], ...]
    pack: TopologyPack
    required: bool
    preemptible: bool
    runtime_estimate_s: float | None
    # Nodes not to try for it (``avoided``): nodes that failed its starts
    # for their own fault. Outside the chain's caches, which are per shape, not per job.
    avoid: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        job: JobState,
        priority_classes: Mapping[str, PriorityClassSpec] | None = None,
        state: State | None = None,
    ) -> Request:
        """``job``'s request; with ``state``, as the placer places it: off the nodes it avoids
        (``avoided``), which the preemptor's search for an admitted job reads too."""
        spec = job.spec
        replicas = job.admission.replicas if job.admission is not None else spec.replicas
        pc = (priority_classes or {}).get(spec.priority_class)
        res = placed_resources(job)  # an admitted job of several models: the one it counts against
        return cls(
            job_id=job.id,
            attempt=job.attempt,
            replicas=replicas,
            res=res,
            need=Need.of(res),
            selector=tuple(sorted(spec.node_selector.items())),
            pack=spec.topology.pack,
            required=spec.topology.required,
            # As the fold judges a victim: the job and its priority class must both allow it, and
            # the class's cap on its preemptions must not have run out.
            preemptible=spec.preemptible and (pc is None or pc.preemptible) and not thrash.capped(job, pc),
            # The owner's estimate, else the one learned from history (``runtimes.py``).
            runtime_estimate_s=runtimes.of(job),
            avoid=avoided(state, job) if state is not None else frozenset(),
        )


def avoided(state: State, job: JobState) -> frozenset[str]:
    """The nodes not to place ``job`` on (``Request.avoid``), as the placer places it and the
    preemptor searches for it: those that failed its starts for their own fault
    (``JobState.fault_nodes``) while their run of failed starts still counts it
    (``NodeState.start_faults``). A node with a full disk takes no attempt of a job twice, so
    the job's free requeues go to other nodes; once a worker runs there, or a person lifts the
    node's cordon, the run is over and the node may host the job again."""
    if not job.fault_nodes:
        return frozenset()
    nodes = state.nodes
    return frozenset(n for n in job.fault_nodes if n in nodes and job.id in nodes[n].start_faults)


class Filter(Protocol):
    name: str
    static: bool  # its answer depends only on the node's hardware, labels and health, not on what is free

    def check(self, req: Request, node: NodeView) -> Reason | None:
        """None if ``node`` could host one more worker of ``req``, else why not."""
        ...


class Reserve(Protocol):
    name: str
    kinds: frozenset[NeedKind]

    def pick(self, req: Request, node: NodeView, island: int | None) -> tuple[GpuClaim, ...] | None:
        """The GPUs one worker would get on ``node`` (within NVLink ``island`` if given)."""
        ...


class Score(Protocol):
    name: str

    def score(self, req: Request, node: NodeView, gpus: tuple[GpuClaim, ...]) -> float:
        """Higher is better. Called only for nodes that passed every filter."""
        ...


@dataclass(frozen=True, slots=True)
class Pick:
    node: str
    gpus: tuple[GpuClaim, ...]
    score: float


class Chain:
    """Filters, reserves and weighted scores, run in the order ``stack.build`` gives them."""

    def __init__(
        self,
        filters: Iterable[Filter],
        reserves: Iterable[Reserve],
        scores: Iterable[tuple[Score, float]],
        limit: int = 8,
    ) -> None:
        self.filters = tuple(filters)
        self.static = tuple(f for f in self.filters if f.static)
        self.dynamic = tuple(f for f in self.filters if not f.static)
        self.reserves = tuple(reserves)
        self.scores = tuple(scores)
        self.limit = limit
        # Within a cycle a static filter's answer for a node never changes: ask it once. Whether
        # and how well a worker fits depends only on the node's state: cache it by the node's
        # version (a gang's next worker re-reads the same candidates, unchanged but for one).
        self._static_memo: dict[tuple[Need, tuple[tuple[str, str], ...], str], Reason | None] = {}

    def reject(self, req: Request, node: NodeView) -> Reason | None:
        """The first filter's no, static filters first (they are ordered so in ``stack.py``)."""
        reason = self._static(req, node.name, lambda: node)
        if reason is not None:
            return reason
        for f in self.dynamic:
            reason = f.check(req, node)
            if reason is not None:
                return reason
        return None

    def _static(self, req: Request, name: str, view: Callable[[], NodeView]) -> Reason | None:
        key = (req.need, req.selector, name)
        try:
            return self._static_memo[key]
        except KeyError:
            if len(self._static_memo) >= MEMO_MOST:  # a chain kept for long (admission's idle copy)
                self._static_memo.clear()
            node = view()
            reason = self._static_memo[key] = next(
                (r for f in self.static if (r := f.check(req, node)) is not None), None
            )
            return reason

    def statically_fits(self, req: Request, snap: Snapshot, name: str) -> bool:
        """Whether no static filter (hardware, labels, health) turns node ``name`` down for
        ``req``: what a domain of the gang search may count as its room."""
        return self._static(req, name, lambda: snap.view(name)) is None

    def reserve(self, req: Request, node: NodeView, island: int | None = None) -> tuple[GpuClaim, ...] | None:
        for r in self.reserves:
            if req.need.kind in r.kinds:
                return r.pick(req, node, island)
        return ()  # a CPU-only worker takes no GPU

    def best(
        self,
        snap: Snapshot,
        req: Request,
        candidates: Iterable[str],
        island: int | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> Pick | None:
        """The best-scored of the first ``limit`` candidates that pass every filter and have
        GPUs to give; earlier candidates win ties."""
        best: Pick | None = None
        seen = 0
        avoid = req.avoid
        for name in candidates:
            if name in exclude or name in avoid:
                continue
            node = snap.view(name)
            key = (req.need, req.selector, name, node.version, island)
            try:
                pick = snap.picks[key]
            except KeyError:
                pick = snap.picks[key] = self._evaluate(req, node, island)
            if pick is None:
                continue
            if best is None or pick.score > best.score:
                best = pick
            seen += 1
            if seen >= self.limit:
                break
        return best

    def _evaluate(self, req: Request, node: NodeView, island: int | None) -> Pick | None:
        if self.reject(req, node) is not None:
            return None
        gpus = self.reserve(req, node, island)
        if gpus is None:
            return None
        return Pick(node.name, gpus, sum(w * s.score(req, node, gpus) for s, w in self.scores))

    def diagnose(self, snap: Snapshot, req: Request) -> tuple[Reason, ...]:
        """Why no node takes a worker of ``req``: every node's first no, counted by code.

        A cycle that runs out of room asks this for every job that waits, and each answer is
        a walk of every node (at 1,250 nodes, 30 ms: nearly all of a saturated cycle). A node's
        answer depends only on the job's shape and selector and on the node's view, so each
        node's reason is kept per shape for the snapshot, and later asks re-ask only the nodes
        taken from or given back to since (``Snapshot.touched``). The counts are the walk's."""
        key = (req.need, req.selector)
        found: _Diagnosis | None = snap.diagnoses.get(key)
        if found is None:
            names = list(snap.state.nodes)
            reasons = [self._why_not(req, snap.view(name)) for name in names]
            found = snap.diagnoses[key] = _Diagnosis(
                {name: i for i, name in enumerate(names)}, reasons, len(snap.touched), _counted(reasons)
            )
            return found.out
        touched = snap.touched
        if found.seen < len(touched):
            changed = False
            reasons = found.reasons
            for name in set(touched[found.seen :]):
                i = found.at.get(name)
                if i is None:
                    continue
                reason = self._why_not(req, snap.view(name))
                if reason != reasons[i]:
                    reasons[i] = reason
                    changed = True
            found.seen = len(touched)
            if changed:
                found.out = _counted(reasons)
        return found.out

    def diagnose_walk(self, snap: Snapshot, req: Request) -> tuple[Reason, ...]:
        """``diagnose`` without what it keeps: every node asked afresh. The reference it must
        agree with (the tests compare the two)."""
        return _counted([self._why_not(req, snap.view(name)) for name in snap.state.nodes])

    def _why_not(self, req: Request, node: NodeView) -> Reason | None:
        reason = self.reject(req, node)
        if reason is None and self.reserve(req, node) is None:
            reason = Reason("gpus", f"no free GPU suits {req.need.describe()}", True)
        return reason


@dataclass(slots=True)
class _Diagnosis:
    """One shape's answer from every node of a snapshot, and how much of the snapshot's
    ``touched`` it has seen."""

    at: dict[str, int]  # node -> its place in the state's order
    reasons: list[Reason | None]
    seen: int
    out: tuple[Reason, ...]


def _counted(reasons: list[Reason | None]) -> tuple[Reason, ...]:
    """Nodes' first noes counted by code, most common first; each with an example."""
    counts: dict[str, list[Reason]] = {}
    for reason in reasons:
        if reason is not None:
            counts.setdefault(reason.code, []).append(reason)
    if not counts:
        return ()
    total = len(reasons)
    out = []
    for code, rs in sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        example = rs[0].message if len(rs) == 1 else f"e.g. {rs[0].message}"
        out.append(Reason(code, f"{len(rs)}/{total} nodes, {example}", any(r.preemption_helps for r in rs)))
    return tuple(out)
