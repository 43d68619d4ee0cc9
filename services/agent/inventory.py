"""Simulated node inventories: what a node agent reports when the machine has no GPUs.

The profiles follow real machines (see shared GPU facts: DGX/HGX H100 and A100 NVSwitch boards,
PCIe A100 pairs joined by NVLink bridges, T4 inference boxes, an H100 node in MIG mode). They
produce the same ``NodeRegistered`` events as NVML discovery, so the rest of corral cannot tell.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.events.nodes import GpuInfo, NodeInventory

GIB = 1024


def _gpus(
    node: str, model: str, memory_mib: int, islands: list[int], nvlinks: int = 0, mig: bool = False
) -> tuple[GpuInfo, ...]:
    return tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{node}-{i:02d}",
            model=model,
            memory_mib=memory_mib,
            island=island,
            mig=mig,
            nvlinks=nvlinks if island >= 0 else 0,
        )
        for i, island in enumerate(islands)
    )


def h100_8x_nvswitch(node: str) -> NodeInventory:
    """HGX H100 8-GPU: four NVSwitches, NV18 between every pair: one island of eight."""
    return NodeInventory(
        cpu_milli=224_000,
        memory_mib=2048 * GIB,
        gpus=_gpus(node, "H100-80GB", 81_559, [0] * 8, nvlinks=18),
    )


def a100_8x_nvlink(node: str) -> NodeInventory:
    """Eight A100-80GB, NVLink within pairs only (PCIe cards with NVLink bridges): four islands."""
    return NodeInventory(
        cpu_milli=128_000,
        memory_mib=1024 * GIB,
        gpus=_gpus(node, "A100-80GB", 81_920, [0, 0, 1, 1, 2, 2, 3, 3], nvlinks=12),
    )


def a100_4x_pcie(node: str) -> NodeInventory:
    """Four A100-40GB PCIe cards, no NVLink."""
    return NodeInventory(
        cpu_milli=64_000,
        memory_mib=512 * GIB,
        gpus=_gpus(node, "A100-40GB", 40_960, [-1] * 4),
    )


def t4_2x(node: str) -> NodeInventory:
    """Two T4 inference cards on PCIe; no NVLink, no MIG."""
    return NodeInventory(
        cpu_milli=32_000,
        memory_mib=128 * GIB,
        gpus=_gpus(node, "T4", 15_360, [-1] * 2),
    )


def h100_8x_mig(node: str) -> NodeInventory:
    """An HGX H100 node with every GPU in MIG mode, for MIG-sliced inference and notebooks."""
    return NodeInventory(
        cpu_milli=224_000,
        memory_mib=2048 * GIB,
        gpus=_gpus(node, "H100-80GB", 81_559, [0] * 8, nvlinks=18, mig=True),
    )


PROFILES: dict[str, Callable[[str], NodeInventory]] = {
    "h100-8x": h100_8x_nvswitch,
    "a100-8x": a100_8x_nvlink,
    "a100-4x-pcie": a100_4x_pcie,
    "t4-2x": t4_2x,
    "h100-8x-mig": h100_8x_mig,
}
# `corral up --profile mixed` cycles through every profile, so a small cluster shows them all.
MIXED = tuple(PROFILES)


def cluster(count: int, profile: str = "mixed", prefix: str = "node") -> list[tuple[str, NodeInventory]]:
    """``count`` nodes named ``<prefix>-NN``, of one profile or cycling through all of them."""
    if profile != "mixed" and profile not in PROFILES:
        raise ValueError(f"unknown node profile {profile!r}; known: mixed, {', '.join(PROFILES)}")
    kinds = MIXED if profile == "mixed" else (profile,)
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        name = f"{prefix}-{i:02d}"
        inv = PROFILES[kind](name)
        # Simulated nodes all live on this machine: workers meet at loopback for rendezvous.
        labels = {
            "profile": kind,
            "rack": f"rack-{i // 4}",
            "block": f"block-{i // 16}",
            "address": "127.0.0.1",
        }
        out.append((name, NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus, labels)))
    return out
