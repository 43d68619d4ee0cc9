"""GPU fragmentation as FGD measures it (Weng et al., USENIX ATC'23), and corral's refinement.

A node's *fragment* for a task is the GPU capacity that task could not use there: all of the node's
free milli-GPU when the task does not fit (or wants no GPU, or not this model), else only the free
leftovers of GPUs too small for it. Against a *target workload* M (task shapes with their
probabilities) the node's fragmentation is the expected fragment:

    F(n) = sum_m p_m * f_n(m)  =  R(n) - sum_{m fits n} p_m * S_m(n)

where R is the node's free milli-GPU and S_m the free milli-GPU on GPUs big enough for m. The second
form is what ``fragment`` computes: task shapes are grouped by per-GPU demand, so one pass over the
node's GPUs per group gives every shape's fit and usable capacity.

Everything here is pure arithmetic on plain numbers (a node is its model, free CPU and the free
milli-GPU of each GPU, in index order), so the live placer and the trace simulator share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from corral.projections.shape import kind_of

WHOLE = 1000


class TaskShape(NamedTuple):
    """What one task (one worker) asks of a node. ``models`` empty means any GPU model."""

    cpu_milli: int
    gpu_milli: int  # per GPU, 1..1000; 0 for a CPU-only task
    gpus: int
    models: frozenset[str] = frozenset()


class FragTable(NamedTuple):
    """The target workload as seen by nodes of one GPU model: per-GPU demand groups, each with the
    (GPU count, CPU, probability) of its shapes. Shapes this model cannot serve are left out: they
    see all of a node's free GPU as fragment, which the ``R`` term of ``fragment`` already counts."""

    groups: tuple[tuple[int, tuple[tuple[int, int, float], ...]], ...]


class Workload:
    """The target workload M: task shapes and their probabilities (summing to 1)."""

    def __init__(self, shapes: Mapping[TaskShape, float]) -> None:
        total = sum(shapes.values())
        self.shapes: dict[TaskShape, float] = {s: p / total for s, p in shapes.items()} if total > 0 else {}
        self._tables: dict[str, FragTable] = {}

    @classmethod
    def typical(
        cls, counts: Mapping[TaskShape, float], threshold_pct: float = 95.0, step: int = 1
    ) -> Workload:
        """FGD's "typical pods": the most frequent shapes covering ``threshold_pct`` % of tasks.

        Shapes are ranked by count, ties broken by the larger CPU, then GPU milli, then GPU count,
        then model list (the simulator's ``sort.Reverse`` over its ``Less``), and taken ``step`` at
        a time until the threshold is covered; the kept ones are renormalised.
        """
        total = sum(counts.values())
        ranked = sorted(
            counts.items(),
            key=lambda kv: (
                kv[1],
                kv[0].cpu_milli,
                kv[0].gpu_milli,
                kv[0].gpus,
                "|".join(sorted(kv[0].models)),
            ),
            reverse=True,
        )
        want = threshold_pct * total / 100.0
        kept: dict[TaskShape, float] = {}
        covered, i = 0.0, 0
        while covered < want and i < len(ranked):
            for shape, n in ranked[i : i + step]:
                kept[shape] = n
                covered += n
            i += step
        return cls(kept)

    def table(self, model: str) -> FragTable:
        t = self._tables.get(model)
        if t is None:
            groups: dict[int, list[tuple[int, int, float]]] = {}
            for s, p in self.shapes.items():
                if s.gpu_milli <= 0 or s.gpus <= 0:
                    continue  # a CPU-only task leaves every free GPU stranded
                if s.models and model not in s.models:
                    continue
                groups.setdefault(s.gpu_milli, []).append((s.gpus, s.cpu_milli, p))
            t = FragTable(tuple((d, tuple(items)) for d, items in sorted(groups.items())))
            self._tables[model] = t
        return t


def fragment(table: FragTable, cpu_free: int, gpu_free: Sequence[int]) -> float:
    """F(n): the node's expected stranded milli-GPU under the workload (see the module doc)."""
    f = float(sum(gpu_free))
    for d, items in table.groups:
        fit = usable = 0
        for g in gpu_free:
            if g >= d:
                fit += 1
                usable += g
        if not fit:
            continue  # groups are ascending in demand: no larger one fits either
        w = 0.0
        for k, c, p in items:
            if k <= fit and c <= cpu_free:
                w += p
        f -= w * usable
    return f


def fgd_score(before: float, after: float) -> int:
    """FGD's node score: 100 * sigmoid(fragmentation decrease / 1000), truncated to an integer as
    the Kubernetes framework's int64 scores are (so many nodes tie, and ties break at random)."""
    x = (before - after) / 1000.0
    return int(100.0 / (1.0 + math.exp(-x)))


def take_shared(gpu_free: Sequence[int], index: int, milli: int) -> tuple[int, ...]:
    out = list(gpu_free)
    out[index] -= milli
    return tuple(out)


def take_whole(gpu_free: Sequence[int], count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Take ``count`` fully free GPUs, lowest indices first; returns (new free vector, indices)."""
    out = list(gpu_free)
    chosen: list[int] = []
    for i, g in enumerate(out):
        if len(chosen) == count:
            break
        if g == WHOLE:
            chosen.append(i)
            out[i] = 0
    return tuple(out), tuple(chosen)


def fgd_choice(
    table: FragTable, cpu_free: int, gpu_free: Sequence[int], shape: TaskShape, before: float | None = None
) -> tuple[int, tuple[int, ...]]:
    """FGD's score for ``shape`` on a node, and the GPUs it would use there.

    A shared task tries every GPU with room and keeps the first best; a whole-GPU task takes the
    lowest-indexed free GPUs. The caller has checked that the task fits.
    """
    if before is None:
        before = fragment(table, cpu_free, gpu_free)
    cpu_after = cpu_free - shape.cpu_milli
    if kind_of(shape.gpus, shape.gpu_milli, None) == "fraction":
        best, where = -1, -1
        for i, g in enumerate(gpu_free):
            if g >= shape.gpu_milli:
                s = fgd_score(before, fragment(table, cpu_after, take_shared(gpu_free, i, shape.gpu_milli)))
                if s > best:
                    best, where = s, i
        return best, (where,)
    if shape.gpus == 0 or shape.gpu_milli == 0:
        return fgd_score(before, fragment(table, cpu_after, gpu_free)), ()
    after, chosen = take_whole(gpu_free, shape.gpus)
    return fgd_score(before, fragment(table, cpu_after, after)), chosen
