"""Model: does the node have GPUs of a model the job accepts, with enough memory, in the right
mode (MIG GPUs for a MIG profile, non-MIG GPUs otherwise), and enough of them for one worker?

These are facts of the hardware, not of what is busy: no preemption changes them.
"""

from __future__ import annotations

from corral.events.base import Reason
from corral.projections import mig
from corral.projections.placement.framework import Need, Request
from corral.projections.placement.snapshot import GpuView, NodeView


def suits(need: Need, g: GpuView) -> bool:
    """Whether GPU ``g`` could ever serve ``need`` (busy or not, healthy or not)."""
    if not need.model_ok(g.model) or g.memory_mib < need.min_gpu_memory:
        return False
    if need.kind == "mig":
        return g.mig and need.mig is not None and mig.profile(g.model, need.mig) is not None
    return not g.mig


# Needs a view keeps the suitable GPUs of (``suitable``): a cycle asks a few; admission's idle copy
# of the inventory, whose views last, would keep one per shape it was ever asked about.
SUITABLE_MOST = 64


def suitable(need: Need, node: NodeView) -> list[GpuView]:
    """The GPUs of ``node`` that ``suits`` says could serve ``need``, in index order: worked out
    once per view and need, as the model, GPU health and fit filters each ask it of every node a
    job visits (of every node, when a job waits and its reasons are counted)."""
    found = node.suitable.get(need)
    if found is None:
        if len(node.suitable) >= SUITABLE_MOST:
            node.suitable.clear()
        found = node.suitable[need] = [g for g in node.gpus if suits(need, g)]
    return found


class ModelFilter:
    name = "model"
    static = True

    def check(self, req: Request, node: NodeView) -> Reason | None:
        need = req.need
        if need.kind == "cpu":
            return None
        # The usual answer first: enough suitable GPUs (each of them is of a model the job
        # accepts, with the memory it needs). Only a no is worth the walks that say why.
        fitting = suitable(need, node)
        if fitting and len(fitting) >= need.gpus:
            return None
        models = [g for g in node.gpus if need.model_ok(g.model)]
        if not models:
            have = sorted({g.model for g in node.gpus}) or ["no GPUs"]
            want = " or ".join(sorted(need.models)) if need.models else "any"
            return Reason("gpu-model", f"node {node.name} has {', '.join(have)}; the job wants {want}")
        big = [g for g in models if g.memory_mib >= need.min_gpu_memory]
        if not big:
            return Reason(
                "gpu-memory",
                f"node {node.name}: GPUs have {models[0].memory_mib} MiB, need {need.min_gpu_memory}",
            )
        fitting = [g for g in big if suits(need, g)]
        if need.kind == "mig" and not fitting:
            return Reason("mig-profile", f"node {node.name}: no GPU in MIG mode offers {need.mig}")
        if not fitting:
            return Reason(
                "mig-mode", f"node {node.name}: its GPUs are in MIG mode, shared by MIG instances only"
            )
        if len(fitting) < need.gpus:
            return Reason(
                "gpu-count", f"node {node.name} has {len(fitting)} suitable GPUs; a worker needs {need.gpus}"
            )
        return None
