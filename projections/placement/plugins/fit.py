"""Fit: does one more worker fit on the node's free CPU, memory and GPUs?

``node_fits`` is the arithmetic on plain numbers, shared with the trace simulator: CPU, memory,
and enough GPUs each with at least the worker's per-GPU demand free (a whole GPU needs a GPU
nobody holds, a fraction needs that many milli-GPU free on one GPU). ``FitFilter`` applies it to a
node of the live cluster, counting only GPUs that suit the job (model, memory, health, MIG mode)
and, for MIG, asking whether the profile still has a valid free start on some GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.events.base import Reason
from corral.projections.placement.framework import Request
from corral.projections.placement.plugins import mig as mig_plugin
from corral.projections.placement.plugins.fragmentation import TaskShape
from corral.projections.placement.plugins.model import suitable
from corral.projections.placement.snapshot import NodeView


def node_fits(
    cpu_free: int, mem_free: int, model: str, gpu_free: Sequence[int], cpu: int, mem: int, shape: TaskShape
) -> str | None:
    """The code of the first resource that is short (``cpu``, ``memory``, ``gpu-model``,
    ``gpus``), or None when the task fits. ``gpu_free`` is the free milli-GPU per usable GPU."""
    if cpu > cpu_free:
        return "cpu"
    if mem > mem_free:
        return "memory"
    if shape.gpus:
        if shape.models and model not in shape.models:
            return "gpu-model"
        room = 0
        for g in gpu_free:
            if g >= shape.gpu_milli:
                room += 1
        if room < shape.gpus:
            return "gpus"
    return None


class FitFilter:
    name = "fit"
    static = False

    def check(self, req: Request, node: NodeView) -> Reason | None:
        need = req.need
        if node.workers_free < 1:
            return _short("workers", node, "runs the most workers it may")
        usable = [g for g in suitable(need, node) if g.healthy]
        if need.kind == "mig":
            if node.cpu_free < need.cpu:
                return _short_cpu(node, need.cpu)
            if node.mem_free < need.memory:
                return _short_memory(node, need.memory)
            if not any(mig_plugin.free_starts(g, need) for g in usable):
                return _short("mig", node, f"no free slices for a MIG {need.mig} instance")
            return None
        # Whole GPUs count only if nobody holds them; fractions see each GPU's free milli.
        free = [g.free if (need.kind == "fraction" or g.holders == 0) else 0 for g in usable]
        shape = TaskShape(need.cpu, need.milli, need.gpus)
        code = node_fits(node.cpu_free, node.mem_free, "", free, need.cpu, need.memory, shape)
        if code is None:
            return None
        if code == "cpu":
            return _short_cpu(node, need.cpu)
        if code == "memory":
            return _short_memory(node, need.memory)
        if need.kind == "fraction":
            return _short(
                "gpus", node, f"no GPU has {need.milli} milli-GPU free (most: {max(free, default=0)})"
            )
        whole = sum(1 for g in free if g >= need.milli)
        gpus = f"{need.gpus} free GPU{'s' if need.gpus != 1 else ''}"
        return _short("gpus", node, f"needs {gpus} it can use, has {whole}")


def _short_cpu(node: NodeView, cpu: int) -> Reason:
    return _short("cpu", node, f"needs {cpu} milli-CPU free, has {node.cpu_free}")


def _short_memory(node: NodeView, memory: int) -> Reason:
    return _short("memory", node, f"needs {memory} MiB of memory free, has {node.mem_free}")


def _short(code: str, node: NodeView, what: str) -> Reason:
    # Capacity can be freed by evicting lower-priority work: preemption may help.
    return Reason(code, f"node {node.name}: {what}", True)
