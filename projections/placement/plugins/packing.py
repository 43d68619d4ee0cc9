"""Packing: where on the cluster a worker's GPUs should go so that little capacity is stranded.

Named policies, chosen by the placer's configuration:

- ``binpack``: fill the fullest nodes and GPUs first (keeps whole nodes free for big gangs).
- ``spread``: the emptiest first (keeps load and failure impact even).
- ``fgd``: Fragmentation Gradient Descent as published (Weng et al., ATC'23): the node whose
  expected fragmentation grows least, on the integer 0..100 sigmoid scale of the paper's plugin.
- ``corral``: FGD's score first, then corral's tie-breaks among nodes FGD scores the same (its
  integer scale ties many): a shared task's tightest GPU, then resource balance, keeping each
  node's free CPU and memory in proportion to its free GPU, ``kappa`` milli-CPU and ``mu`` MiB
  per milli-GPU being what a free GPU can expect (``kappa_of``, ``memory_per_gpu``):

  - a shared task goes where the GPU it shares has the least free milli-GPU (best fit over the
    whole cluster; within a node it already took FGD's best GPU, the tightest among equals), so
    fewer GPUs are left part used, counting as lost too the milli-GPU of the node it starves of
    CPU or memory (``starved``): a CPU-heavy slice does not fill a GPU of a node with little CPU
    per GPU and leave that node's whole GPUs without cores.
  - a GPU task goes where the node's remaining CPU stays closest to ``kappa`` times its remaining
    free GPU and its memory falls least short of ``mu`` times it. Neither CPU-starved GPUs (idle
    for want of CPU) nor CPU-rich nodes filled with CPU-light tasks (their CPU lost to the
    CPU-heavy ones) are made, nor GPUs beside memory that is gone. Memory beyond the GPUs' need
    does not count: the trace's cluster has about twice the memory per GPU its tasks ask.
  - a CPU-only task goes beside the fewest free GPUs first (its CPU can strand at most those, and
    none beside a full node's), then takes the least of the CPU those GPUs will need (``kappa``
    times them), then goes into the tightest spare, so that large spares stay whole for large
    tasks.

  ``kappa`` is what the workload's GPU tasks ask per milli-GPU, capped by the cluster's CPU per
  milli-GPU less what CPU-only tasks ask per milli-GPU of the workload. A CPU-only task's CPU need
  not sit beside a GPU, so it does not raise kappa (counting it made kappa grow with the number
  of CPU-only tasks and, once CPU ran out first, sent CPU-only tasks onto the CPU of free GPUs);
  but when the workload asks more CPU per GPU than the cluster has, a free GPU will not get the
  GPU tasks' full ask, and holding it beside every free GPU kept cores idle while GPU tasks went
  elsewhere. FGD's fragmentation already sees CPU (a GPU is a fragment for a task whose CPU the
  node lacks) but only once the CPU is gone, at its integer resolution, and only for the shapes
  in its target workload: on the cpu300 list it has no multi-GPU shape, so it does not see a
  CPU-only task take the cores an 8-GPU task needs from a whole node. Taking the least reserved
  CPU first put one CPU-only task on every whole 8-GPU node (a few cores each); going beside the
  fewest free GPUs first leaves them whole. FGD does not see memory at all.

  Multi-GPU tasks are not what the multigpu lists turn on: FGD and corral both take a node's
  lowest-indexed free GPUs for them and score the node by fragmentation alike, and by the end
  whole GPUs have run out under either. What a packed cluster leaves unallocated there is the
  leftover of part-used GPUs (mostly 190 milli-GPU beside the list's most common 810-milli
  slices, the same under both) and whole GPUs beside memory or CPU that is gone: with the CPU
  balance alone corral left 18 to 20 such GPUs where FGD left 10 to 14 (8-GPU G2 nodes have
  48 GiB a GPU, filled by memory-heavy tasks), and it broke FGD's ties on slices by CPU only.
  The memory term and the tightest GPU took those back.

  On the Alibaba trace (seeds 42..51, GPU allocation at 130 % demand; corral minus FGD in the
  same replay: mean, worst seed, seeds ahead), before shared tasks counted the GPU they starve:
  cpu250 +0.15, -0.07, 8 of 10; multigpu20 +0.15, -0.08, 8; multigpu30 +0.09, -0.02, 7;
  multigpu40 +0.09, -0.05, 8; multigpu50 +0.12, -0.02, 9 (every other list 10 of 10). The seeds
  behind lost a few whole GPUs beside no cores or memory, mostly on 4-GPU nodes with 8 cores a
  GPU. Since, on the 101 variant-seeds replayed again (every seed of multigpu30..50 and
  gpushare40, the closest seeds of the rest): cpu250 +0.26, +0.16, 10; multigpu20 +0.35, +0.10,
  10; multigpu30 +0.21, +0.08, 10; multigpu40 +0.20, +0.00, 9 (seed 46 ties: two fewer whole GPUs
  stranded, two more in slivers); multigpu50 +0.18, +0.05, 10; gpuspec05 +0.49, +0.36. Of the
  seeds replayed again, 8 lead by less than before (by 0.01 to 0.08), the least +0.05.
  Within a node a shared task takes the GPU with the best FGD score, the tightest among equals.

The fragmentation arithmetic is ``fragmentation.py``; the trace simulator calls ``corral_choice``
and the FGD functions directly, the live placer through ``SharedGpuReserve`` and ``PackingScore``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from corral.events.decisions import GpuClaim
from corral.events.jobs import Resources
from corral.projections import indexes
from corral.projections.placement.framework import NeedKind, Request
from corral.projections.placement.plugins.fragmentation import (
    WHOLE,
    FragTable,
    TaskShape,
    Workload,
    fgd_score,
    fragment,
    take_shared,
    take_whole,
)
from corral.projections.placement.plugins.model import suitable
from corral.projections.placement.snapshot import GpuView, NodeView
from corral.projections.shape import Shape, kind_of
from corral.projections.state import State

Policy = Literal["binpack", "spread", "fgd", "corral"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread", "fgd", "corral")

# The balance term only orders nodes FGD scores the same: it stays well inside one score step.
BALANCE_SCALE = 1e10
# A milli-GPU of a shared GPU's tightness outweighs any balance (a few 1e5 milli-CPU at most),
# and 1000 of them stay a tenth of a score step. Milli-GPU a shared task starves (``starved``)
# weigh the same as milli-GPU of tightness: both are GPU the node is left unable to give.
TIGHT_STEP = 1e6
# Every tie-break together stays within this share of a score step either way, so that it only
# orders nodes FGD scores the same (a task asking hundreds of cores on a CPU-poor node could
# otherwise starve more than a step's worth of milli-GPU). On the trace the largest shared task
# starves under 3,000 milli-GPU: the bound never binds there.
TIE_BOUND = 0.45 * BALANCE_SCALE


def balance(
    cpu_after: int,
    gpu_after: int,
    kappa: float,
    gpu_task: bool,
    cpu_milli: int = 0,
    mem_after: int | None = None,
    mu: float = 0.0,
) -> float:
    """corral's tie-break, larger is better. ``kappa``: milli-CPU a free milli-GPU can expect
    (``kappa_of``); ``gpu_after``: the node's free milli-GPU after the task; ``cpu_milli``: a
    CPU-only task's CPU; ``mem_after``: the node's free memory (MiB) after the task and ``mu``
    the MiB a free milli-GPU can expect (``memory_per_gpu``; 0: memory is not weighed).

    A GPU task: how far the node's free CPU ends from what its free GPUs will need, plus how far
    its free memory falls short of what they will need (in milli-CPU: ``kappa / mu`` per MiB).
    Only a shortfall of memory counts: the cluster has about twice the memory per GPU its tasks
    ask, so memory beyond the GPUs' need is not stranded, and weighing it both ways sent
    memory-light tasks to memory-rich nodes at the CPU balance's expense; but a node with little
    memory per GPU (the trace's 8-GPU G2 nodes have 48 GiB a GPU) filled with memory-heavy tasks
    keeps whole GPUs no task can take. A CPU-only task, in this order: the node's free GPU
    (fewest first: a task's CPU can strand at most the GPUs beside it, and none beside a full
    node's), then the CPU it takes that those GPUs will need (least first), then the CPU they
    will not need (least first, so large spares stay whole for large tasks). Fewest GPUs comes
    before least CPU taken because the CPU a node keeps for its GPUs is not a smooth quantity: a
    whole 8-GPU node that gives up a few cores to a CPU-only task can no longer take an 8-GPU
    task that asks for nearly all of its CPU, and taking the least CPU first spreads CPU-only
    tasks over exactly those whole nodes."""
    surplus = cpu_after - kappa * gpu_after
    if gpu_task:
        short = 0.0
        if mem_after is not None and mu > 0:
            short = max(mu * gpu_after - mem_after, 0.0) * kappa / mu
        return -abs(surplus) - short
    taken = min(max(-surplus, 0.0), float(cpu_milli))
    spare = max(surplus + cpu_milli, 0.0)
    return -(gpu_after * 1e4 + taken + spare * 1e-3)


def tightness(gpu_free: int) -> float:
    """corral's first tie-break for a shared task: the free milli-GPU of the GPU it shares, least
    first (larger is better). Among nodes FGD scores the same, the slice goes where it fills a GPU
    most (best fit over the whole cluster, not only within the node), so fewer GPUs are left part
    used; what is left of them at the end is the leftover no task fits in, and most of what a
    packed cluster does not allocate. Ahead of the balance, which only orders equal fits."""
    return -gpu_free * TIGHT_STEP


def starved(cpu_free: float, gpu_free: float, mem_free: float | None, kappa: float, mu: float) -> float:
    """Milli-GPU of a node's free GPU that its free CPU and memory cannot serve: the CPU short of
    ``kappa`` per free milli-GPU, in milli-GPU (``/ kappa``), plus the memory short of ``mu`` per
    free milli-GPU, in milli-GPU (``/ mu``). A factor at 0 (or memory None) is not weighed."""
    out = 0.0
    if kappa > 0:
        out += max(kappa * gpu_free - cpu_free, 0.0) / kappa
    if mem_free is not None and mu > 0:
        out += max(mu * gpu_free - mem_free, 0.0) / mu
    return out


def corral_score(
    before: float,
    after: float,
    cpu_after: int,
    gpu_after: int,
    kappa: float,
    gpu_task: bool,
    cpu_milli: int = 0,
    mem_after: int | None = None,
    mu: float = 0.0,
    shared_on: int | None = None,
    shared_milli: int = 0,
    memory_mib: int = 0,
) -> float:
    """FGD's score, then corral's tie-breaks: for a shared task the tightness of the GPU it
    shares (``shared_on``: that GPU's free milli-GPU before the task) less the milli-GPU of the
    node it starves of CPU or memory (``starved`` after, less before: the task asks
    ``shared_milli``, ``cpu_milli`` and ``memory_mib``; a task that asks less than its share
    starves less and gains), then the balance.

    Tightness alone sent a CPU-heavy slice (a 470-milli task asking 11 cores) to the tightest GPU
    wherever it was, on nodes with 8 cores a GPU as readily as on ones with 52: two such slices
    on one GPU of a 4-GPU, 32-core node left three whole GPUs 13 cores, and by the end two of them
    beside under a core. Both terms are milli-GPU the cluster can no longer give, so they add: the
    slice goes to a looser GPU when the GPU it would starve on the tight one outweighs the
    leftover it fills, and a CPU-light slice fills the GPUs of a CPU-poor node first. FGD sees
    such starving only once the node's CPU drops below a task shape's ask, and only at its
    integer resolution."""
    tie = balance(cpu_after, gpu_after, kappa, gpu_task, cpu_milli, mem_after, mu)
    if shared_on is not None:
        mem_before = None if mem_after is None else mem_after + memory_mib
        worse = starved(cpu_after, gpu_after, mem_after, kappa, mu) - starved(
            cpu_after + cpu_milli, gpu_after + shared_milli, mem_before, kappa, mu
        )
        tie += tightness(shared_on) - worse * TIGHT_STEP
    return fgd_score(before, after) + max(-TIE_BOUND, min(tie, TIE_BOUND)) / BALANCE_SCALE


def corral_choice(
    table: FragTable,
    kappa: float,
    cpu_free: int,
    gpu_free: Sequence[int],
    shape: TaskShape,
    before: float,
    mem_after: int | None = None,
    mu: float = 0.0,
    memory_mib: int = 0,
) -> tuple[float, tuple[int, ...]]:
    """corral's score for ``shape`` on a node (which must fit) and the GPUs it takes there.
    ``mem_after``: the node's free memory once the task is on it (None: not weighed)."""
    cpu_after = cpu_free - shape.cpu_milli
    left = sum(gpu_free) - shape.gpu_milli * shape.gpus
    if kind_of(shape.gpus, shape.gpu_milli, None) == "fraction":
        best: tuple[float, int] | None = None
        where = -1
        after = 0.0
        for i, g in enumerate(gpu_free):
            if g >= shape.gpu_milli:
                frag_after = fragment(table, cpu_after, take_shared(gpu_free, i, shape.gpu_milli))
                key = (fgd_score(before, frag_after), -g)
                if best is None or key > best:
                    best, where, after = key, i, frag_after
        assert best is not None
        score = corral_score(
            before,
            after,
            cpu_after,
            left,
            kappa,
            True,
            shape.cpu_milli,
            mem_after,
            mu,
            gpu_free[where],
            shape.gpu_milli,
            memory_mib,
        )
        return score, (where,)
    if shape.gpus == 0 or shape.gpu_milli == 0:
        after = fragment(table, cpu_after, gpu_free)
        return corral_score(before, after, cpu_after, left, kappa, False, shape.cpu_milli), ()
    free_after, chosen = take_whole(gpu_free, shape.gpus)
    after = fragment(table, cpu_after, free_after)
    return corral_score(before, after, cpu_after, left, kappa, True, mem_after=mem_after, mu=mu), chosen


def workload_of(state: State) -> Workload:
    """The target workload the live placer measures fragmentation against: the worker shapes of
    every job not yet finished (queued ones included: they are the workload to come), weighted
    by their worker count. Read from the workers per ask the fold keeps (``State.workers_by_ask``),
    so every replica of the placer agrees on it and a cycle costs the kinds of ask, not the jobs."""
    return _workload(_unfinished_asks(state))


def _unfinished_asks(state: State) -> dict[Resources, int]:
    """Workers of unfinished jobs per kind of ask, in the fold's order (each kind decoded once)."""
    return {indexes.ask_of(key): workers for key, workers in state.workers_by_ask.items()}


def _workload(asks: dict[Resources, int]) -> Workload:
    counts: dict[TaskShape, float] = {}
    for res, workers in asks.items():
        shape = _task_shape(res)
        if shape is not None:
            counts[shape] = counts.get(shape, 0.0) + workers
    # The scores sum over the shapes in this order: one that depends on the shapes alone, not on
    # the order the jobs are found in.
    return Workload(dict(sorted(counts.items(), key=_shape_order)))


def memory_per_gpu(asks: Iterable[tuple[int, int, float]]) -> float:
    """MiB a free milli-GPU can expect: the memory GPU tasks ask per milli-GPU they ask. ``asks``:
    (memory MiB, milli-GPU in all, how many) per task kind; CPU-only tasks (0 milli-GPU) do not
    count, as in ``kappa_of``. 0 when no task asks for a GPU (memory is then not weighed)."""
    mem = gpu = 0.0
    for memory, milli, n in asks:
        if milli > 0:
            mem += n * memory
            gpu += n * milli
    return mem / gpu if gpu > 0 else 0.0


def _task_shape(res: Resources) -> TaskShape | None:
    worker = Shape.of(res)
    if worker.kind == "mig":
        return None  # MIG slices are packed by the MIG plugin, not by milli-GPU
    return TaskShape(worker.cpu, worker.milli, res.gpus, frozenset(res.gpu_models))


def _shape_order(item: tuple[TaskShape, float]) -> tuple[int, int, int, tuple[str, ...]]:
    s = item[0]
    return s.cpu_milli, s.gpu_milli, s.gpus, tuple(sorted(s.models))


def kappa_of(workload: Workload, cpu_per_gpu: float | None = None) -> float:
    """Milli-CPU a free milli-GPU can expect: what the workload's GPU tasks ask per milli-GPU,
    but no more than the cluster can give once CPU-only tasks have had theirs.

    ``cpu_per_gpu`` is the cluster's milli-CPU per milli-GPU (``cluster_cpu_per_gpu``; None: no
    bound). CPU-only tasks' CPU need not sit beside a GPU, so it does not raise what a GPU needs;
    but when the workload asks more CPU per GPU than the cluster has, CPU runs out before GPU
    and a free GPU can expect only what CPU-only tasks leave per GPU. Keeping the GPU tasks'
    full ask beside every free GPU then only holds cores for GPUs that will never get them."""
    gpu_tasks = [(s, p) for s, p in workload.shapes.items() if s.gpus > 0 and s.gpu_milli > 0]
    cpu = sum(p * s.cpu_milli for s, p in gpu_tasks)
    gpu = sum(p * s.gpu_milli * s.gpus for s, p in gpu_tasks)
    if gpu <= 0:
        return 0.0
    kappa = cpu / gpu
    if cpu_per_gpu is None:
        return kappa
    cpu_only = sum(p * s.cpu_milli for s, p in workload.shapes.items() if s.gpus == 0 or s.gpu_milli == 0)
    return max(0.0, min(kappa, cpu_per_gpu - cpu_only / gpu))


def cluster_cpu_per_gpu(state: State) -> float | None:
    """Milli-CPU per milli-GPU over the nodes that have GPUs (None: there are none). CPU-only
    nodes are left out: their CPU is never beside a GPU."""
    cpu = gpu = 0
    for node in state.nodes.values():
        n = len(node.inventory.gpus)
        if n:
            cpu += node.inventory.cpu_milli
            gpu += n * WHOLE
    return cpu / gpu if gpu else None


class Fragmentation:
    """A cycle's workload, its per-model tables, kappa and mu (``memory_per_gpu``), computed
    once per cycle."""

    def __init__(self, workload: Workload, cpu_per_gpu: float | None = None, mu: float = 0.0) -> None:
        self.workload = workload
        self.kappa = kappa_of(workload, cpu_per_gpu)
        self.mu = mu

    def view(self, node: NodeView, req: Request) -> tuple[FragTable, list[GpuView]]:
        """The node as the fragmentation measure sees it: its non-MIG healthy GPUs of the first
        model the job accepts (a node has one model in practice)."""
        gpus = [g for g in node.gpus if g.healthy and not g.mig]
        model = next((g.model for g in gpus if req.need.model_ok(g.model)), gpus[0].model if gpus else "")
        gpus = [g for g in gpus if g.model == model]
        return self.workload.table(model), gpus


def fragmentation_of(state: State) -> Fragmentation:
    """The live placer's cycle measure: the state's workload against the state's cluster."""
    asks = _unfinished_asks(state)
    # MIG workers have no milli-GPU share (``Shape.gpu_milli`` is 0): they do not count.
    mu = memory_per_gpu((r.memory_mib, Shape.of(r).gpu_milli, n) for r, n in asks.items())
    return Fragmentation(_workload(asks), cluster_cpu_per_gpu(state), mu)


class SharedGpuReserve:
    """The GPU a fractional worker shares on a node."""

    name = "shared-gpu"
    kinds: frozenset[NeedKind] = frozenset({"fraction"})

    def __init__(self, policy: Policy, frag: Fragmentation) -> None:
        self.policy = policy
        self.frag = frag

    def pick(self, req: Request, node: NodeView, island: int | None) -> tuple[GpuClaim, ...] | None:
        need = req.need
        room = [
            g
            for g in suitable(need, node)
            if g.healthy and g.free >= need.milli and (island is None or g.island == island)
        ]
        if not room:
            return None
        if self.policy == "spread":
            g = max(room, key=lambda g: (g.free, -g.index))
        elif self.policy == "binpack":
            g = min(room, key=lambda g: (g.free, g.index))
        else:
            table, gpus = self.frag.view(node, req)
            free = [x.free for x in gpus]
            before = fragment(table, node.cpu_free, free)
            cpu_after = node.cpu_free - need.cpu
            best: tuple[int, int, int] | None = None
            g = room[0]
            for i, x in enumerate(gpus):
                if x in room:
                    s = fgd_score(before, fragment(table, cpu_after, take_shared(free, i, need.milli)))
                    key = (s, -x.free, -x.index) if self.policy == "corral" else (s, 0, -x.index)
                    if best is None or key > best:
                        best, g = key, x
        return (GpuClaim(g.index, milli=need.milli),)


class PackingScore:
    """How well a worker's GPUs pack on a node, on a 0..100 scale, by the configured policy."""

    name = "packing"

    def __init__(self, policy: Policy, frag: Fragmentation) -> None:
        self.policy = policy
        self.frag = frag

    def score(self, req: Request, node: NodeView, gpus: tuple[GpuClaim, ...]) -> float:
        need = req.need
        if need.kind == "mig":
            return 0.0  # MIG slices are packed by the MIG plugin
        table, view = self.frag.view(node, req)
        free = [g.free for g in view]
        taken = {c.gpu: (c.milli if need.kind == "fraction" else WHOLE) for c in gpus}
        after = [f - taken.get(g.index, 0) for f, g in zip(free, view, strict=True)]
        total = len(view) * WHOLE
        if self.policy in ("binpack", "spread"):
            if not total:
                return 0.0
            used = 100.0 * (total - sum(after)) / total
            return used if self.policy == "binpack" else 100.0 - used
        before = fragment(table, node.cpu_free, free)
        frag_after = fragment(table, node.cpu_free - need.cpu, after)
        if self.policy == "fgd":
            return float(fgd_score(before, frag_after))
        shared_on = None
        if need.kind == "fraction":
            # The shared GPU's free milli-GPU before the task (the GPU reserve picked it in the view).
            shared_on = next((f for f, g in zip(free, view, strict=True) if g.index == gpus[0].gpu), None)
        return corral_score(
            before,
            frag_after,
            node.cpu_free - need.cpu,
            sum(after),
            self.frag.kappa,
            need.kind != "cpu",
            need.cpu,
            node.mem_free - need.memory,
            self.frag.mu,
            shared_on,
            need.milli if shared_on is not None else 0,
            need.memory,
        )
