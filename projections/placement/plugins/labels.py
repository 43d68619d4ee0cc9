"""Labels: the job's ``node_selector`` must match the node's labels exactly (every key, every
value), as the fold's placement check insists."""

from __future__ import annotations

from corral.events.base import Reason
from corral.projections.placement.framework import Request
from corral.projections.placement.snapshot import NodeView


class LabelsFilter:
    name = "labels"
    static = True

    def check(self, req: Request, node: NodeView) -> Reason | None:
        for key, value in req.selector:
            have = node.labels.get(key)
            if have != value:
                got = "no such label" if have is None else f"{key}={have}"
                return Reason("labels", f"node {node.name}: wants {key}={value}, has {got}")
        return None
