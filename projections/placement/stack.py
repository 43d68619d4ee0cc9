"""The one place the placement chain is assembled. Read top to bottom, this is the placer.

Filters run cheapest and most final first, so that a node's recorded reason is the one an
operator can act on (a cordoned node says "cordoned", not "no CPU"):

1. node health: a suspect, lost or cordoned node takes nothing, whatever it has free;
2. labels: the job's ``node_selector`` rules out whole pools with a dictionary lookup;
3. model: hardware facts (GPU model, GPU memory, MIG mode and profiles, GPUs per node) that no
   amount of waiting or preemption changes;
4. GPU health: of the suitable GPUs, enough must be healthy;
5. fit: only now what is free at this moment (CPU, memory, free GPUs or MIG slices); the only
   "no" that waiting or preemption can turn into a "yes".

Reserve plugins then pick concrete GPUs on a node that passed, one per kind of need: whole GPUs
(NVLink-island aware), a fraction of a shared GPU (fragmentation aware), a MIG slot (contiguity
aware). CPU-only workers take no GPU.

Scores rank the nodes that passed: keeping a multi-GPU worker inside one NVLink island outweighs
everything (weight 1000 on a 0/1 score, so it wins over any packing difference, 0..100), then
the packing policy decides. Gang-level topology (one island, node, rack, block, or spread) is
not a score: ``gang.py`` searches domains in the order the job's intent allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.projections.placement.framework import Chain
from corral.projections.placement.plugins.fit import FitFilter
from corral.projections.placement.plugins.health import GpuHealthFilter, NodeHealthFilter
from corral.projections.placement.plugins.labels import LabelsFilter
from corral.projections.placement.plugins.mig import MigReserve
from corral.projections.placement.plugins.model import ModelFilter
from corral.projections.placement.plugins.packing import Fragmentation, PackingScore, Policy, SharedGpuReserve
from corral.projections.placement.plugins.topology import IslandScore, WholeGpusReserve


@dataclass(frozen=True)
class PlacerConfig:
    """How the placer places. ``limit``: feasible candidates scored per worker (the index hands
    them out best-fit first); ``label_keys``: the node labels that name racks and blocks;
    ``reservations``: hold GPUs for the first job that does not fit (see ``backfill.py``)."""

    packing: Policy = "corral"
    limit: int = 8
    label_keys: dict[str, str] = field(default_factory=lambda: {"rack": "rack", "block": "block"})
    reservations: bool = True


def build(config: PlacerConfig, frag: Fragmentation) -> Chain:
    filters = (
        NodeHealthFilter(),
        LabelsFilter(),
        ModelFilter(),
        GpuHealthFilter(),
        FitFilter(),
    )
    reserves = (
        WholeGpusReserve(),
        SharedGpuReserve(config.packing, frag),
        MigReserve(),
    )
    scores = (
        (IslandScore(), 1000.0),
        (PackingScore(config.packing, frag), 1.0),
    )
    return Chain(filters, reserves, scores, config.limit)
