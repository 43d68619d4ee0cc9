"""Time-less replay of the Alibaba GPU trace (``cluster-trace-gpu-v2023``, the "openb" trace).

The published protocol of the FGD paper, reproduced: only GPU nodes; pods sorted by name and
shuffled with the seed; the list inflated to 1.3x the cluster's GPU capacity with clones drawn at
random (with replacement) from the original pods; each pod tried once, in that order, and dropped
if it does not fit; nothing departs. After every pod the allocated share of the cluster's
milli-GPUs is recorded against the GPU demand that has arrived so far, and the curve is binned to
whole percent of capacity from 0 to 130 as the paper's analysis scripts bin it.

Ties are not broken by a fresh coin: the published simulator runs a patched Kubernetes
(``mental2008/kubernetes`` v1.20.5-minor, ``selectHost``) that picks, among the best-scored nodes,
the one with the smallest name, and it prefixes every node name with a seeded random permutation.
Ties therefore go to the first node of a random order fixed for the whole run, which packs like
first-fit; without it FGD and GpuPacking lose 2 to 5 points.

That simulator draws from Go's global random source while goroutines filter nodes in parallel, so
its exact sequence cannot be replayed. Here the seed drives Python's ``random.Random`` for the
shuffle, the clones, the node order and Random's draws, and the published numbers are matched in
distribution: each baseline's mean over seeds 42..51 falls within the published seed-to-seed
spread, within 0.1 of the published mean (``python -m bench.placer``; a three-seed check runs in
``tests/unit/test_alibaba.py``).

Fit is the placer's own (``plugins/fit.py``); the arithmetic of taking GPUs is the fold's
(``projections/claims.py``), done here on plain numbers for speed and checked against the real
thing when ``verify`` is set (the tests do). Node scores are the published plugins
(``baselines.py``), FGD and corral's policy (``plugins/fragmentation.py``, ``plugins/packing.py``).

Speed: a node is keyed by its whole state (model, free CPU, memory and GPUs, and the GPU kinds it
runs). Nodes in the same state share one bucket, and every score is computed once per pod shape
and bucket, then reused until a node leaves the bucket. A replay of ~10,000 pods on 1,213 nodes
thus scores each (shape, state) pair once instead of every node for every pod.
"""

from __future__ import annotations

import csv
import random
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress
from operator import attrgetter
from pathlib import Path

from corral.events import subjects
from corral.events.decisions import GpuClaim, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources
from corral.events.nodes import GpuInfo, NodeInventory, NodeRegistered
from corral.projections import claims
from corral.projections.fold import apply_event
from corral.projections.placement.plugins import fit, packing
from corral.projections.placement.plugins.fragmentation import (
    WHOLE,
    TaskShape,
    Workload,
    fgd_choice,
    fragment,
)
from corral.projections.shape import kind_of
from corral.projections.state import JobState, State
from corral.services.sim import baselines
from corral.services.sim.plot import line_chart

BASELINES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD")
CORRAL = "corral"
POLICIES = (*BASELINES, CORRAL)
INFLATION = 1.3
BINS = range(0, 131)
SEEDS = tuple(range(42, 52))


# -- the trace -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    shape: TaskShape

    @property
    def gpu_milli_total(self) -> int:
        return self.shape.gpu_milli * self.shape.gpus


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Nodes of a published node list (``sn,cpu_milli,memory_mib,gpu,model``); GPU nodes only."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["gpu"]) > 0:
                out.append(
                    TraceNode(
                        row["sn"],
                        int(row["cpu_milli"]),
                        int(row["memory_mib"]),
                        int(row["gpu"]),
                        row["model"],
                    )
                )
    return out


def load_pods(path: str | Path) -> list[Pod]:
    """Pods of a published pod list. ``gpu_milli`` is per GPU; ``gpu_spec`` lists acceptable
    models separated by ``|``. A CPU-only pod asks for 0 milli-GPU."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_gpu"])
            milli = int(row["gpu_milli"]) if gpus else 0
            models = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m)
            out.append(
                Pod(
                    row["name"],
                    int(row["cpu_milli"]),
                    int(row["memory_mib"]),
                    TaskShape(int(row["cpu_milli"]), milli, gpus if milli else 0, models),
                )
            )
    return out


def arrival_order(pods: Sequence[Pod], capacity_milli: int, seed: int, ratio: float = INFLATION) -> list[Pod]:
    """The published order: sorted by name, shuffled, then inflated with random clones.

    Clones are drawn from the name-sorted originals while the arrived GPU demand stays within
    ``ratio`` x capacity. As in the published simulator, the stopping test adds the clone's
    per-GPU milli (not its total), so a final multi-GPU clone may overshoot slightly.
    """
    rng = random.Random(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    arrivals = list(ordered)
    rng.shuffle(arrivals)
    target = ratio * capacity_milli
    total = sum(p.gpu_milli_total for p in ordered)
    i = 0
    while total < target:
        clone = ordered[rng.randrange(len(ordered))]
        if total + clone.shape.gpu_milli > target:
            break
        total += clone.gpu_milli_total
        arrivals.append(Pod(f"{clone.name}-clone-{i}", clone.cpu_milli, clone.memory_mib, clone.shape))
        i += 1
    return arrivals


def typical_workload(pods: Iterable[Pod]) -> Workload:
    """FGD's target workload, from the original pods as the published runs configure it: CPU-only
    pods included, popularity threshold 95 %, step 1. CPU requests of 0 count as Kubernetes'
    non-zero default of 100 milli-CPU."""
    counts: dict[TaskShape, float] = {}
    for p in pods:
        s = p.shape
        key = TaskShape(s.cpu_milli or 100, s.gpu_milli, s.gpus, s.models)
        counts[key] = counts.get(key, 0.0) + 1.0
    return Workload.typical(counts, 95.0, 1)


def memory_per_gpu(pods: Iterable[Pod]) -> float:
    """MiB per milli-GPU the pod list's GPU pods ask (corral's ``mu``), from the original pods as
    the target workload is."""
    return packing.memory_per_gpu((p.memory_mib, p.gpu_milli_total, 1) for p in pods)


def build_state(nodes: Sequence[TraceNode]) -> State:
    """The trace's cluster as corral's state: each node registered through the fold, whole GPUs of
    one model each."""
    state = State()
    for seq, n in enumerate(nodes, start=1):
        gpus = tuple(
            GpuInfo(index=i, uuid=f"{n.name}-gpu{i}", model=n.model, memory_mib=0) for i in range(n.gpus)
        )
        inv = NodeInventory(cpu_milli=n.cpu_milli, memory_mib=n.memory_mib, gpus=gpus)
        apply_event(state, seq, subjects.node(n.name), NodeRegistered(node=n.name, inventory=inv), float(seq))
    return state


# -- node scores -----------------------------------------------------------------------------------

Key = tuple[int, int, int, tuple[int, ...], frozenset[str]]  # model, cpu, memory, GPU free, GPU kinds
Choice = tuple[float, tuple[int, ...] | None]  # score, GPUs (None: chosen at random when taken)


class _Bucket:
    """Nodes that are in the same state. ``first`` is the one that wins a tie (smallest rank);
    ``frag`` caches the state's fragmentation for FGD and corral."""

    __slots__ = ("key", "nodes", "first", "frag")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.nodes: list[int] = []
        self.first = -1
        self.frag: float | None = None

    def add(self, node: int, rank: list[int]) -> None:
        self.nodes.append(node)
        if self.first < 0 or rank[node] < rank[self.first]:
            self.first = node

    def remove(self, node: int, rank: list[int]) -> None:
        self.nodes.remove(node)
        if node == self.first:
            self.first = min(self.nodes, key=rank.__getitem__) if self.nodes else -1


Scorer = Callable[["Replay", _Bucket, TaskShape], Choice]


def _random(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    return 0.0, None


def _dot_product(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    gpus = b.key[3]
    return baselines.dot_product(b.key[1], gpus, s), baselines.best_fit_gpu(gpus, s)


def _gpu_clustering(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    gpus = b.key[3]
    kinds = dict.fromkeys(b.key[4], 1)
    return baselines.gpu_clustering(gpus, kinds, s), baselines.best_fit_gpu(gpus, s)


def _gpu_packing(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    gpus = b.key[3]
    return baselines.gpu_packing(gpus, s), baselines.best_fit_gpu(gpus, s)


def _best_fit(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    gpus = b.key[3]
    return baselines.best_fit(b.key[1], gpus, s), baselines.best_fit_gpu(gpus, s)


def _fgd(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    table = r.tables[b.key[0]]
    if b.frag is None:
        b.frag = fragment(table, b.key[1], b.key[3])
    score, gpus = fgd_choice(table, b.key[1], b.key[3], r.frag_shape(s), b.frag)
    return float(score), gpus


def _corral(r: Replay, b: _Bucket, s: TaskShape) -> Choice:
    table = r.tables[b.key[0]]
    if b.frag is None:
        b.frag = fragment(table, b.key[1], b.key[3])
    mem_after = b.key[2] - r.asking_memory
    return packing.corral_choice(
        table, r.kappa, b.key[1], b.key[3], r.frag_shape(s), b.frag, mem_after, r.mu, r.asking_memory
    )


SCORERS: dict[str, Scorer] = {
    "Random": _random,
    "DotProd": _dot_product,
    "GpuClustering": _gpu_clustering,
    "GpuPacking": _gpu_packing,
    "BestFit": _best_fit,
    "FGD": _fgd,
    CORRAL: _corral,
}


# -- one replay --------------------------------------------------------------------------------------


@dataclass
class Curve:
    """One replay: allocation (% of milli-GPU) per arrived-demand bin, and what it cost."""

    policy: str
    seed: int
    bins: dict[int, float]
    pods: int
    placed: int
    wall_s: float

    @property
    def at_130(self) -> float:
        return self.bins.get(130, float("nan"))


class Replay:
    """Plays one arrival order against one policy. Nodes live in compact lists; ``verify`` also
    applies every placement with the fold's own check and take on a real ``State`` and compares.

    Ties: the published simulator runs a Kubernetes patched to pick, among the best-scored nodes,
    the one with the smallest name, and it prefixes node names with a seeded random permutation.
    So ties go to the first node of a random order fixed for the whole replay (``rank``), which
    packs far better than a fresh coin per pod. Random itself draws a node uniformly among those
    that fit, as its PreScore plugin does.
    """

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        policy: str,
        workload: Workload,
        rng: random.Random,
        verify: bool = False,
        mu: float = 0.0,
    ) -> None:
        if policy not in SCORERS:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        self.scorer = SCORERS[policy]
        self.uniform = policy == "Random"
        self.rng = rng
        self.rank = list(range(len(nodes)))
        rng.shuffle(self.rank)
        self.models = sorted({n.model for n in nodes})
        self.tables = [workload.table(m) for m in self.models]
        self.names = [n.name for n in nodes]
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model = [model_index[n.model] for n in nodes]
        self.cpu = [n.cpu_milli for n in nodes]
        self.mem = [n.memory_mib for n in nodes]
        self.gpus = [(WHOLE,) * n.gpus for n in nodes]
        self.kinds: list[dict[str, int]] = [{} for _ in nodes]
        self.buckets: dict[Key, _Bucket] = {}
        self.where: list[_Bucket] = []
        for i in range(len(nodes)):
            b = self._bucket(self._key(i))
            b.add(i, self.rank)
            self.where.append(b)
        self.capacity = sum(n.gpus for n in nodes) * WHOLE
        self.used = 0
        self.kappa = packing.kappa_of(workload, sum(self.cpu) / self.capacity)
        self.mu = mu
        # The memory of the pod being scored (scores are kept per shape and memory, and a
        # scorer sees the shape only; corral weighs the memory a node keeps for its GPUs).
        self.asking_memory = 0
        self.shape_ids: dict[tuple[TaskShape, int], int] = {}
        self.scores: list[dict[_Bucket, float]] = []
        self.choices: list[dict[_Bucket, tuple[int, ...] | None]] = []
        self.state = build_state(nodes) if verify else None

    def frag_shape(self, s: TaskShape) -> TaskShape:
        """The shape as FGD weighs it: CPU requests of 0 count as 100 milli-CPU (Kubernetes'
        non-zero default), as in the workload the fragmentation is measured against."""
        return s if s.cpu_milli else s._replace(cpu_milli=100)

    def _key(self, i: int) -> Key:
        return (self.model[i], self.cpu[i], self.mem[i], self.gpus[i], frozenset(self.kinds[i]))

    def _bucket(self, key: Key) -> _Bucket:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = _Bucket(key)
        return b

    def _feasible(self, pod: Pod, b: _Bucket) -> bool:
        model, cpu, mem, gpus, _ = b.key
        return (
            fit.node_fits(cpu, mem, self.models[model], gpus, pod.cpu_milli, pod.memory_mib, pod.shape)
            is None
        )

    def place(self, pod: Pod) -> int | None:
        """Try ``pod`` once; returns the node it landed on, or None.

        Scores live in one dict per pod shape, keyed by bucket: a bucket's score for a shape is
        computed the first time the shape meets it and stays valid while the bucket lives (its
        state cannot change; a node that changes moves to another bucket).
        """
        self.asking_memory = pod.memory_mib
        sid = self.shape_ids.setdefault((pod.shape, pod.memory_mib), len(self.shape_ids))
        if sid == len(self.scores):
            self.scores.append({})
            self.choices.append({})
        scores, choices = self.scores[sid], self.choices[sid]
        buckets = list(self.buckets.values())
        vals: list[float | None] = list(map(scores.get, buckets))
        if None in vals:
            for i, v in enumerate(vals):
                if v is None:
                    b = buckets[i]
                    if self._feasible(pod, b):
                        score, gpus = self.scorer(self, b, pod.shape)
                        choices[b] = gpus
                    else:
                        score = _INFEASIBLE
                    vals[i] = scores[b] = score
        best = max(vals, default=_INFEASIBLE)  # type: ignore[type-var]  # no None is left
        if best == _INFEASIBLE:
            return None
        if self.uniform:
            # Every node that fits, equally likely: draw one among the tied buckets' nodes.
            tied = list(compress(buckets, map(best.__eq__, vals)))
            ends = list(accumulate(map(len, map(_NODES, tied))))
            pick = self.rng.randrange(ends[-1])
            i = bisect_right(ends, pick)
            b = tied[i]
            node = b.nodes[pick - (ends[i - 1] if i else 0)]
        else:
            if vals.count(best) == 1:
                b = buckets[vals.index(best)]
            else:
                rank = self.rank
                b = min(
                    (t for t, v in zip(buckets, vals, strict=True) if v == best), key=lambda t: rank[t.first]
                )
            node = b.first
        gpus = choices[b]
        if gpus is None:
            gpus = self._random_gpus(self.gpus[node], pod.shape)
        self._take(node, pod, gpus)
        return node

    def _random_gpus(self, free: tuple[int, ...], s: TaskShape) -> tuple[int, ...]:
        """The published Random policy's GPU choice: any GPU with room for a shared pod, the
        lowest-indexed free GPUs for whole ones."""
        if kind_of(s.gpus, s.gpu_milli, None) == "fraction":
            room = [i for i, g in enumerate(free) if g >= s.gpu_milli]
            return (room[self.rng.randrange(len(room))],)
        return baselines.best_fit_gpu(free, s)

    def _take(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        s = pod.shape
        old = self.where[node]
        old.remove(node, self.rank)
        if not old.nodes:
            del self.buckets[old.key]
        self.cpu[node] -= pod.cpu_milli
        self.mem[node] -= pod.memory_mib
        if s.gpus:
            free = list(self.gpus[node])
            for g in gpus:
                free[g] -= s.gpu_milli
            self.gpus[node] = tuple(free)
            self.used += s.gpu_milli * s.gpus
            kind = baselines.affinity(s)
            self.kinds[node][kind] = self.kinds[node].get(kind, 0) + 1
        b = self._bucket(self._key(node))
        b.add(node, self.rank)
        self.where[node] = b
        if self.state is not None:
            self._verify(node, pod, gpus)

    def _verify(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        """Apply the same placement the way the fold does and insist both agree."""
        assert self.state is not None
        s = pod.shape
        shared = kind_of(s.gpus, s.gpu_milli, None) == "fraction"
        res = Resources(
            gpus=s.gpus,
            gpu_milli=s.gpu_milli if shared else WHOLE,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )
        job = JobState(
            id=pod.name,
            tenant="trace",
            spec=JobSpec(queue="trace", resources=res),
            submitted_seq=0,
            submitted_at=0.0,
        )
        name = self.names[node]
        slot = WorkerSlot(0, name, tuple(GpuClaim(g, milli=s.gpu_milli if shared else WHOLE) for g in gpus))
        p = Placement(pod.name, 0, (slot,))
        claims.check(self.state, job, p)
        claims.take(self.state, job, p)
        ns = self.state.nodes[name]
        got = (
            ns.inventory.cpu_milli - ns.cpu_used,
            ns.inventory.memory_mib - ns.memory_used,
            tuple(g.free_milli for g in ns.gpus),
        )
        want = (self.cpu[node], self.mem[node], self.gpus[node])
        if got != want:
            raise AssertionError(f"{name}: fold arithmetic {got} != replay arithmetic {want}")


_INFEASIBLE = float("-inf")
_NODES = attrgetter("nodes")


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[Pod],
    policy: str,
    seed: int,
    verify: bool = False,
    limit: int | None = None,
) -> Curve:
    """Replay the published protocol once. ``limit`` stops after that many pods (for tests)."""
    started = time.perf_counter()
    capacity = sum(n.gpus for n in nodes) * WHOLE
    order = arrival_order(pods, capacity, seed)
    if limit is not None:
        order = order[:limit]
    # The order's random draws are done; ties continue the same seeded sequence in a fresh source
    # so that every policy sees the same arrivals for a seed.
    rng = random.Random(seed * 1_000_003 + 1)
    r = Replay(nodes, policy, typical_workload(pods), rng, verify, memory_per_gpu(pods))
    arrived, placed = 0, 0
    events: list[tuple[int, int]] = []
    for pod in order:
        arrived += pod.gpu_milli_total
        if r.place(pod) is not None:
            placed += 1
        events.append((arrived, r.used))
    return Curve(policy, seed, bin_curve(events, capacity), len(order), placed, time.perf_counter() - started)


def bin_curve(events: Sequence[tuple[int, int]], capacity: int) -> dict[int, float]:
    """The paper's binning: each event's arrived demand as a whole percent of capacity (rounded),
    its allocation as a percent with two decimals; a bin's value is the mean of its events (or of
    the neighbouring bins' events when it has none), to two decimals."""
    by_bin: dict[int, list[float]] = {}
    for arrived, used in events:
        b = round(arrived * 100 / capacity)
        by_bin.setdefault(b, []).append(round(used * 100 / capacity, 2))
    out: dict[int, float] = {}
    for x in BINS:
        vals = by_bin.get(x)
        if not vals:
            vals = [v for y in (x - 1, x, x + 1) for v in by_bin.get(y, [])]
            if not vals:
                continue
        out[x] = round(sum(vals) / len(vals), 2)
    return out


# -- many replays, the table and the plot ------------------------------------------------------------


@dataclass
class Results:
    curves: list[Curve] = field(default_factory=list)

    def policies(self) -> list[str]:
        return list(dict.fromkeys(c.policy for c in self.curves))

    def of(self, policy: str) -> list[Curve]:
        return [c for c in self.curves if c.policy == policy]

    def mean_at(self, policy: str, x: int = 130) -> float:
        vals = [c.bins[x] for c in self.of(policy) if x in c.bins]
        return sum(vals) / len(vals) if vals else float("nan")

    def mean_curve(self, policy: str) -> dict[int, float]:
        return {x: self.mean_at(policy, x) for x in BINS}

    def to_json(self) -> dict[str, object]:
        return {
            p: {
                "mean_at_130": round(self.mean_at(p), 3),
                "seeds": {str(c.seed): c.at_130 for c in self.of(p)},
                "wall_s_per_run": round(sum(c.wall_s for c in self.of(p)) / max(1, len(self.of(p))), 3),
            }
            for p in self.policies()
        }


def run(
    nodes_csv: str | Path,
    pods_csv: str | Path,
    policies: Iterable[str] = POLICIES,
    seeds: Iterable[int] = SEEDS,
    verify: bool = False,
) -> Results:
    """Replay every policy for every seed on one node list and one pod list."""
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    out = Results()
    for policy in policies:
        for seed in seeds:
            out.curves.append(replay(nodes, pods, policy, seed, verify))
    return out


def versus(results: Results, policy: str = CORRAL, other: str = "FGD") -> dict[str, float]:
    """``policy`` against ``other`` at 130 %, seed by seed: both means, and the worst and mean of
    ``policy`` minus ``other`` over the seeds both ran (the worst is the figure that must stay
    above 0 for ``policy`` to beat ``other`` on every seed)."""
    theirs = {c.seed: c.at_130 for c in results.of(other)}
    margins = [c.at_130 - theirs[c.seed] for c in results.of(policy) if c.seed in theirs]
    return {
        policy: round(results.mean_at(policy), 3),
        other: round(results.mean_at(other), 3),
        "worst_margin": round(min(margins), 3) if margins else float("nan"),
        "mean_margin": round(sum(margins) / len(margins), 3) if margins else float("nan"),
        "seeds_ahead": sum(1 for m in margins if m > 0),
        "seeds": len(margins),
    }


def load_published(path: str | Path) -> dict[str, dict[str, float]]:
    """The published summary (``published_alloc_ratio_default.csv``): per policy, its mean, min and
    max at 130 %. Policy names lose their ``NN-`` prefix."""
    out: dict[str, dict[str, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row["sc_policy"].split("-", 1)[-1]
            out[name] = {
                "mean": float(row["mean@130"]),
                "min": float(row["min@130"]),
                "max": float(row["max@130"]),
            }
    return out


def table(results: Results, published: dict[str, dict[str, float]] | None = None) -> str:
    """Allocation at 130 % per policy: mean, min and max over seeds, the published figures beside
    them, and the wall time of one replay."""
    head = f"{'policy':<14}{'mean@130':>10}{'min':>8}{'max':>8}{'seeds':>7}"
    if published:
        head += f"{'published':>11}{'pub. min..max':>16}"
    head += f"{'s/run':>8}"
    lines = [head, "-" * len(head)]
    for p in results.policies():
        vals = [c.at_130 for c in results.of(p)]
        wall = sum(c.wall_s for c in results.of(p)) / len(vals)
        line = f"{p:<14}{results.mean_at(p):>10.2f}{min(vals):>8.2f}{max(vals):>8.2f}{len(vals):>7}"
        if published:
            pub = published.get(p)
            line += (
                f"{pub['mean']:>11.2f}{pub['min']:>8.2f}..{pub['max']:<6.2f}" if pub else f"{'-':>11}{'':>16}"
            )
        line += f"{wall:>8.2f}"
        lines.append(line)
    return "\n".join(lines)


def plot(results: Results, path: str | Path, title: str = "GPU allocation vs arrived demand") -> Path:
    """The mean allocation curve of every policy, 0..130 % arrived, as a PNG."""
    series = {
        f"{p} ({results.mean_at(p):.2f})": [(x, v) for x, v in results.mean_curve(p).items() if v == v]
        for p in results.policies()
    }
    return line_chart(
        series,
        path,
        (0, 130),
        (0, 100),
        title=title,
        x_label="arrived GPU demand (% of capacity)",
        y_label="GPU allocation %",
        ticks=(13, 10),
    )


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,43,50`` (or a mix) as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.append(int(part))
    return out
