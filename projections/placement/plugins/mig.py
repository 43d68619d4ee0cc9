"""MIG: which GPU and which start slice a MIG instance gets.

Only starts NVIDIA allows for the profile, on free memory slices, at most one ``+me`` instance per
GPU (``projections/mig.py``; the fold checks the same). Among the valid choices the instance goes
to a GPU already sliced (idle GPUs stay whole for 7g jobs and full-GPU work), the one it fills
best, and within it to the start that leaves the largest contiguous run of free slices, so bigger
profiles still find room later. Ties: lowest start, then lowest GPU index.
"""

from __future__ import annotations

from corral.events.decisions import GpuClaim, MigSlot
from corral.projections import mig
from corral.projections.placement.framework import Need, NeedKind, Request
from corral.projections.placement.plugins.model import suitable
from corral.projections.placement.snapshot import GpuView, NodeView


def free_starts(g: GpuView, need: Need) -> list[int]:
    if need.mig is None or (need.mig.endswith("+me") and g.me):
        return []
    return mig.free_starts(g.model, need.mig, g.mig_used)


def largest_run(used: int) -> int:
    """The longest run of free memory slices in a GPU whose taken slices are ``used``."""
    best = run = 0
    for s in range(mig.SLICES):
        run = 0 if used >> s & 1 else run + 1
        best = max(best, run)
    return best


def placeable(model: str, used: int) -> int:
    """How many (profile, start) placements would still be valid: a measure of what room is left."""
    return sum(len(mig.free_starts(model, name, used)) for name in mig.profiles(model))


class MigReserve:
    name = "mig"
    kinds: frozenset[NeedKind] = frozenset({"mig"})

    def pick(self, req: Request, node: NodeView, island: int | None) -> tuple[GpuClaim, ...] | None:
        need = req.need
        assert need.mig is not None
        best: tuple[tuple[int, int, int, int, int, int], GpuClaim] | None = None
        for g in suitable(need, node):
            if not g.healthy or (island is not None and g.island != island):
                continue
            p = mig.profile(g.model, need.mig)
            assert p is not None
            for start in free_starts(g, need):
                after = g.mig_used | mig.mask(p, start)
                key = (
                    1 if g.mig_used else 0,
                    -bin(~after & 0xFF).count("1"),
                    largest_run(after),
                    placeable(g.model, after),
                    -start,
                    -g.index,
                )
                if best is None or key > best[0]:
                    best = (key, GpuClaim(g.index, mig=MigSlot(need.mig, start)))
        return None if best is None else (best[1],)
