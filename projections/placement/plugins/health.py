"""Health: only ready, uncordoned nodes take work, and only on healthy GPUs.

A node that is suspect, lost, shut down by its agent or cordoned is skipped whole; a node whose
suitable GPUs are unhealthy (an XID, ECC or NVLink fault reported by the health monitor) cannot
host the worker even if they are idle. Neither is something preemption can fix.
"""

from __future__ import annotations

from corral.events.base import Reason
from corral.projections.placement.framework import Request
from corral.projections.placement.plugins.model import suitable
from corral.projections.placement.snapshot import NodeView


class NodeHealthFilter:
    name = "node-health"
    static = True

    def check(self, req: Request, node: NodeView) -> Reason | None:
        if node.cordoned:
            # A drain cordons the node too; the operator asked for a drain, and reads that.
            what = "draining" if node.draining else "cordoned"
            return Reason("cordoned", f"node {node.name} is {what}")
        if node.condition != "ready":
            return Reason("node-not-ready", f"node {node.name} is {node.condition}")
        return None


class GpuHealthFilter:
    name = "gpu-health"
    static = True

    def check(self, req: Request, node: NodeView) -> Reason | None:
        need = req.need
        if need.kind == "cpu":
            return None
        fitting = suitable(need, node)
        healthy = sum(1 for g in fitting if g.healthy)
        if healthy < need.gpus:
            bad = ", ".join(str(g.index) for g in fitting if not g.healthy)
            return Reason("gpu-unhealthy", f"node {node.name}: GPUs {bad} are unhealthy")
        return None
