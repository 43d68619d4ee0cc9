"""The published node scores corral is compared with on the Alibaba trace.

Each is the Kubernetes score plugin of the FGD paper's simulator (hkust-adsl
kubernetes-scheduler-simulator, ``pkg/simulator/plugin``), reduced to arithmetic on plain numbers:
a node is its free milli-CPU, the free milli-GPU of each GPU in index order, and (for
GpuClustering) how many pods of each GPU kind it already runs. Scores are integers in 0..100 as
the framework's are; the highest wins and ties break at random.

Constants are the simulator's: the largest node it normalises by has 128 CPUs and 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.projections.placement.plugins.fragmentation import WHOLE, TaskShape
from corral.projections.shape import kind_of

MAX_CPU = 128_000
MAX_GPU = 8_000
MAX_SCORE = 100

NO_GPU = "no-gpu"
SHARED = "share-gpu"


def affinity(shape: TaskShape) -> str:
    """The pod's GPU kind as GpuClustering groups pods: no GPU, a shared GPU, or ``<n>-gpu``."""
    if shape.gpus == 0 or shape.gpu_milli == 0:
        return NO_GPU
    if kind_of(shape.gpus, shape.gpu_milli, None) == "fraction":
        return SHARED
    return f"{shape.gpus}-gpu"


def best_fit(cpu_free: int, gpu_free: Sequence[int], shape: TaskShape) -> int:
    """BestFit: the less CPU and GPU the node has left after the pod, the better (equal weights)."""
    left = 0.5 * (cpu_free - shape.cpu_milli) / MAX_CPU
    left += 0.5 * (sum(gpu_free) - shape.gpu_milli * shape.gpus) / MAX_GPU
    return int((1.0 - left) * MAX_SCORE)


def dot_product(cpu_free: int, gpu_free: Sequence[int], shape: TaskShape) -> int:
    """DotProd (Tetris), GPUs merged into one dimension and both normalised by the largest node:
    the smaller the dot product of free and requested resources, the better."""
    dot = (cpu_free / MAX_CPU) * (shape.cpu_milli / MAX_CPU)
    dot += (sum(gpu_free) / MAX_GPU) * (shape.gpu_milli * shape.gpus / MAX_GPU)
    return int(MAX_SCORE * (1.0 - dot / 2.0))


def gpu_packing(gpu_free: Sequence[int], shape: TaskShape) -> int:
    """GpuPacking: first GPUs already shared, then free GPUs on nodes in use, then idle nodes."""
    if shape.gpu_milli <= 0:
        return 0
    full = sum(1 for g in gpu_free if g == WHOLE)
    if full == len(gpu_free):
        return max(MAX_SCORE // 3 - full, full)
    need, full_used, used = shape.gpus, 0, []
    for i in sorted(range(len(gpu_free)), key=lambda j: gpu_free[j]):
        if need == 0:
            break
        if shape.gpu_milli <= gpu_free[i]:
            need -= 1
            used.append(i)
            if gpu_free[i] == WHOLE:
                full_used += 1
    if need:
        return 0
    if full_used:
        return max(MAX_SCORE // 2 - full_used, MAX_SCORE // 3)
    free_pct = sum(gpu_free[i] * 100 // WHOLE for i in used)
    return max(MAX_SCORE - free_pct // 10, MAX_SCORE // 2)


def gpu_clustering(gpu_free: Sequence[int], kinds: Mapping[str, int], shape: TaskShape) -> int:
    """GpuClustering: put pods of one GPU kind together: nodes running only this kind first, then
    nodes running it among others, then empty nodes, then nodes of other kinds; fuller first."""
    kind = affinity(shape)
    if kind == NO_GPU:
        return 0
    fill = (MAX_SCORE // 4) * (MAX_GPU - sum(gpu_free)) // MAX_GPU
    if kinds.get(kind, 0) > 0:
        return fill + (MAX_SCORE * 3 // 4 if len(kinds) == 1 else MAX_SCORE * 2 // 4)
    return fill + (MAX_SCORE // 4 if not kinds else 0)


def best_fit_gpu(gpu_free: Sequence[int], shape: TaskShape) -> tuple[int, ...]:
    """The simulator's default GPU choice: the tightest GPU for a shared pod (lowest index among
    equals), the lowest-indexed free GPUs for whole ones."""
    if kind_of(shape.gpus, shape.gpu_milli, None) == "fraction":
        best = -1
        for i, g in enumerate(gpu_free):
            if g >= shape.gpu_milli and (best < 0 or g < gpu_free[best]):
                best = i
        return (best,)
    out: list[int] = []
    for i, g in enumerate(gpu_free):
        if len(out) == shape.gpus:
            break
        if g == WHOLE:
            out.append(i)
    return tuple(out)
