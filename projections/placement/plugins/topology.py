"""Topology: keep a gang's ranks close, as its ``topology`` intent asks.

Within a node, GPUs joined all-to-all by NVLink/NVSwitch form an island (``GpuInfo.island``;
-1 is PCIe only, an island of one). Across nodes the domains are the node itself, then the
``rack`` and ``block`` labels (the label keys are configurable; a rack is named by its block and
its own label, so that racks of two blocks may share a name). A job asks to pack its whole gang
into one ``nvlink`` island, one ``node``, one ``rack`` or one ``block`` (``required``: that or
nothing; preferred: that if possible, else the next wider domain, down to anywhere), or to
``spread`` its workers over distinct nodes. ``levels`` lists the domains to try in order.

``WholeGpusReserve`` picks a worker's whole GPUs inside one island when one has room: the island
it fills best (so roomy islands stay whole for bigger workers), lowest GPU indices first; else it
spans the fewest islands. ``IslandScore`` prefers nodes where that is possible.
"""

from __future__ import annotations

from typing import Literal

from corral.events.decisions import GpuClaim
from corral.projections.placement.framework import NeedKind, Request
from corral.projections.placement.snapshot import GpuView, NodeView
from corral.projections.state import WHOLE

Level = Literal["island", "node", "rack", "block", "cluster"]
WIDER: tuple[Level, ...] = ("island", "node", "rack", "block", "cluster")
_START: dict[str, Level] = {"nvlink": "island", "node": "node", "rack": "rack", "block": "block"}


def levels(req: Request) -> tuple[Level, ...]:
    """The domains to try, narrowest first. ``spread`` and ``none`` place workers anywhere."""
    start = _START.get(req.pack)
    if start is None:
        return ("cluster",)
    if req.required:
        return (start,)
    return WIDER[WIDER.index(start) :]


def path_labels(level: Level, label_keys: dict[str, str]) -> tuple[str, ...]:
    """The labels that name a ``rack`` or ``block`` domain, widest first: a rack is named by its
    block too (two blocks may each have a rack ``r1``, as Kueue's topologies do)."""
    if level == "rack":
        return (label_keys["block"], label_keys["rack"])
    return (label_keys[level],)


def islands(gpus: list[GpuView]) -> dict[int, list[GpuView]]:
    """GPUs by NVLink island; a PCIe-only GPU (island -1) is an island of its own."""
    out: dict[int, list[GpuView]] = {}
    for g in gpus:
        key = g.island if g.island >= 0 else -1 - g.index
        out.setdefault(key, []).append(g)
    return out


def whole_free(req: Request, node: NodeView, island: int | None = None) -> list[GpuView]:
    """The GPUs of ``node`` a whole-GPU worker of ``req`` could take now."""
    need = req.need
    models, memory = need.models, need.min_gpu_memory
    return [
        g
        for g in node.gpus
        if g.healthy
        and not g.mig
        and g.holders == 0
        and g.free >= WHOLE
        and (not models or g.model in models)
        and g.memory_mib >= memory
        and (island is None or g.island == island)
    ]


class WholeGpusReserve:
    name = "whole-gpus"
    kinds: frozenset[NeedKind] = frozenset({"whole"})

    def pick(self, req: Request, node: NodeView, island: int | None) -> tuple[GpuClaim, ...] | None:
        k = req.need.gpus
        free = whole_free(req, node, island)
        if len(free) < k:
            return None
        groups = sorted(islands(free).items(), key=lambda kv: (len(kv[1]), kv[0]))
        for _, grp in groups:
            if len(grp) >= k:
                return tuple(GpuClaim(g.index) for g in grp[:k])
        chosen: list[GpuView] = []
        for _, grp in sorted(groups, key=lambda kv: (-len(kv[1]), kv[0])):
            chosen.extend(grp[: k - len(chosen)])
            if len(chosen) == k:
                break
        return tuple(GpuClaim(g.index) for g in sorted(chosen, key=lambda g: g.index))


class IslandScore:
    """1 when a multi-GPU worker's GPUs share one NVLink island, else 0."""

    name = "island"

    def score(self, req: Request, node: NodeView, gpus: tuple[GpuClaim, ...]) -> float:
        if req.need.kind != "whole" or len(gpus) < 2:
            return 0.0
        ids = {node.gpus[c.gpu].island for c in gpus}
        return 1.0 if len(ids) == 1 and next(iter(ids)) >= 0 else 0.0
