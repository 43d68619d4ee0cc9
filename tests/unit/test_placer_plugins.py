"""The placer's plugins, gang search and cycle, one table per plugin.

Nodes are built directly as the fold would hold them (``NodeState``) with a small builder, so
each case reads as "a node like this, a job like that, this answer".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from corral.events import subjects
from corral.events.base import Event, Reason
from corral.events.decisions import GpuClaim, JobsPlaced, JobsUnschedulable, MigSlot, Placement, WorkerSlot
from corral.events.jobs import Admission, JobsAdmitted, JobSpec, Resources
from corral.events.nodes import GpuInfo, NodeCondition, NodeInventory
from corral.events.queues import ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.projections import claims, holds, indexes, quota
from corral.projections.fold import apply_event
from corral.projections.placement import gang, stack
from corral.projections.placement.framework import Need, Request
from corral.projections.placement.plugins import mig as mig_plugin
from corral.projections.placement.plugins.fit import FitFilter, node_fits
from corral.projections.placement.plugins.fragmentation import (
    FragTable,
    TaskShape,
    Workload,
    fgd_score,
    fragment,
    take_whole,
)
from corral.projections.placement.plugins.health import GpuHealthFilter, NodeHealthFilter
from corral.projections.placement.plugins.labels import LabelsFilter
from corral.projections.placement.plugins.mig import MigReserve
from corral.projections.placement.plugins.model import ModelFilter
from corral.projections.placement.plugins.packing import (
    BALANCE_SCALE,
    Fragmentation,
    PackingScore,
    SharedGpuReserve,
    balance,
    cluster_cpu_per_gpu,
    corral_choice,
    corral_score,
    fragmentation_of,
    kappa_of,
    memory_per_gpu,
    starved,
    tightness,
)
from corral.projections.placement.plugins.topology import IslandScore, WholeGpusReserve, levels
from corral.projections.placement.snapshot import NodeView, Snapshot
from corral.projections.state import GpuState, JobState, MigInstance, NodeState, State
from corral.services.placer.decide import admitted, decide
from corral.services.sim import baselines
from tests.builders import Cluster, JobBuilder, LogBuilder, job

# -- builders -------------------------------------------------------------------------------------


@dataclass
class N:
    """A node under construction: ``N(gpus=8).used(0, 1000).build()``."""

    name: str = "n1"
    gpus: int = 8
    model: str = "H100-80GB"
    memory: int = 81_559
    islands: list[int] | None = None
    mig: bool = False
    cpu: int = 64_000
    mem: int = 512_000
    labels: dict[str, str] = field(default_factory=dict)
    condition: NodeCondition = "ready"
    cordoned: bool = False
    draining: bool = False
    load: dict[int, int] = field(default_factory=dict)  # GPU -> milli used by others
    sick: set[int] = field(default_factory=set)
    slices: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # GPU -> MIG (profile, start)
    cpu_used: int = 0

    def used(self, gpu: int, milli: int) -> N:
        self.load[gpu] = milli
        return self

    def build(self) -> NodeState:
        islands = self.islands or [0] * self.gpus
        infos = tuple(
            GpuInfo(
                index=i,
                uuid=f"{self.name}-{i}",
                model=self.model,
                memory_mib=self.memory,
                island=islands[i],
                mig=self.mig,
            )
            for i in range(self.gpus)
        )
        inv = NodeInventory(cpu_milli=self.cpu, memory_mib=self.mem, gpus=infos, labels=self.labels)
        gpus = []
        for info in infos:
            g = GpuState(
                info=info,
                healthy=info.index not in self.sick,
                signal="xid:79" if info.index in self.sick else "",
            )
            if info.index in self.load:
                g.used_milli = self.load[info.index]
                g.holders = {"other": self.load[info.index]}
            for profile, start in self.slices.get(info.index, []):
                from corral.projections import mig

                p = mig.profile(self.model, profile)
                assert p is not None
                g.mig_used |= mig.mask(p, start)
                g.mig[start] = MigInstance("other", profile, mig.mask(p, start))
                g.holders = {"other": 1}
            gpus.append(g)
        return NodeState(
            name=self.name,
            inventory=inv,
            gpus=gpus,
            condition=self.condition,
            cordoned=self.cordoned,
            draining=self.draining,
            cpu_used=self.cpu_used,
        )

    def view(self) -> NodeView:
        return NodeView(self.build())


def req(
    gpus: int = 1,
    milli: int = 1000,
    mig: str | None = None,
    cpu: int = 1000,
    mem: int = 1024,
    models: tuple[str, ...] = (),
    min_memory: int = 0,
    replicas: int = 1,
    selector: dict[str, str] | None = None,
    pack: str = "none",
    required: bool = False,
) -> Request:
    res = Resources(
        gpus=gpus,
        gpu_milli=milli,
        mig=mig,
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_models=models,
        min_gpu_memory_mib=min_memory,
    )
    return Request(
        job_id="j",
        attempt=0,
        replicas=replicas,
        res=res,
        need=Need.of(res),
        selector=tuple(sorted((selector or {}).items())),
        pack=pack,  # type: ignore[arg-type]
        required=required,
        preemptible=True,
        runtime_estimate_s=None,
    )


def code(reason: Reason | None) -> str | None:
    return None if reason is None else reason.code


# -- filters --------------------------------------------------------------------------------------

HEALTH = [
    pytest.param(N(), req(), None, id="ready-node-passes"),
    pytest.param(N(cordoned=True), req(), "cordoned", id="cordoned"),
    pytest.param(N(condition="suspect"), req(), "node-not-ready", id="suspect"),
    pytest.param(N(condition="lost"), req(), "node-not-ready", id="lost"),
    pytest.param(N(condition="lost"), req(gpus=0), "node-not-ready", id="cpu-only-job-on-lost-node"),
]


@pytest.mark.parametrize(("node", "request_", "want"), HEALTH)
def test_node_health_filter(node: N, request_: Request, want: str | None) -> None:
    assert code(NodeHealthFilter().check(request_, node.view())) == want


def test_a_node_an_operator_drains_says_draining_not_cordoned() -> None:
    # A drain cordons the node too, and the job turned away read "cordoned", which the
    # operator who asked for a drain did not.
    said = NodeHealthFilter().check(req(), N(cordoned=True, draining=True).view())
    assert said is not None and (said.code, said.message) == ("cordoned", "node n1 is draining")
    said = NodeHealthFilter().check(req(), N(cordoned=True).view())
    assert said is not None and said.message == "node n1 is cordoned"


GPU_HEALTH = [
    pytest.param(N(), req(gpus=8), None, id="all-healthy"),
    pytest.param(N(sick={3}), req(gpus=8), "gpu-unhealthy", id="one-sick-of-eight-needed"),
    pytest.param(N(sick={3}), req(gpus=4), None, id="enough-healthy-left"),
    pytest.param(N(gpus=1, sick={0}), req(milli=500), "gpu-unhealthy", id="fraction-on-sick-gpu"),
    pytest.param(N(gpus=1, sick={0}), req(gpus=0), None, id="cpu-only-ignores-gpus"),
]


@pytest.mark.parametrize(("node", "request_", "want"), GPU_HEALTH)
def test_gpu_health_filter(node: N, request_: Request, want: str | None) -> None:
    assert code(GpuHealthFilter().check(request_, node.view())) == want


LABELS = [
    pytest.param({"rack": "r1"}, {"rack": "r1"}, None, id="match"),
    pytest.param({"rack": "r1"}, {"rack": "r2"}, "labels", id="other-value"),
    pytest.param({}, {"rack": "r1"}, "labels", id="missing-label"),
    pytest.param({"rack": "r1", "zone": "a"}, {"zone": "a"}, None, id="subset-matches"),
    pytest.param({"rack": "r1"}, {}, None, id="no-selector"),
]


@pytest.mark.parametrize(("labels", "selector", "want"), LABELS)
def test_labels_filter(labels: dict[str, str], selector: dict[str, str], want: str | None) -> None:
    assert code(LabelsFilter().check(req(selector=selector), N(labels=labels).view())) == want


MODEL = [
    pytest.param(N(), req(models=("H100-80GB",)), None, id="accepted-model"),
    pytest.param(N(), req(models=("A100-80GB", "H100-80GB")), None, id="one-of-a-list"),
    pytest.param(N(), req(models=("A100-80GB",)), "gpu-model", id="other-model"),
    pytest.param(N(gpus=0), req(), "gpu-model", id="no-gpus-at-all"),
    pytest.param(N(memory=16_000), req(min_memory=40_000), "gpu-memory", id="too-little-gpu-memory"),
    pytest.param(N(gpus=4), req(gpus=8), "gpu-count", id="node-smaller-than-worker"),
    pytest.param(N(mig=True), req(), "mig-mode", id="whole-gpu-on-mig-node"),
    pytest.param(N(mig=True), req(milli=300), "mig-mode", id="fraction-on-mig-node"),
    pytest.param(N(), req(mig="3g.40gb"), "mig-profile", id="mig-profile-on-non-mig-node"),
    pytest.param(N(mig=True), req(mig="3g.40gb"), None, id="mig-profile-ok"),
    pytest.param(N(mig=True), req(mig="3g.20gb"), "mig-profile", id="profile-of-another-model"),
    pytest.param(N(gpus=0), req(gpus=0), None, id="cpu-only-job"),
]


@pytest.mark.parametrize(("node", "request_", "want"), MODEL)
def test_model_filter(node: N, request_: Request, want: str | None) -> None:
    reason = ModelFilter().check(request_, node.view())
    assert code(reason) == want
    assert reason is None or not reason.preemption_helps  # hardware facts: preemption cannot help


FIT = [
    pytest.param(N(), req(gpus=8), None, id="eight-free"),
    pytest.param(N().used(0, 1000), req(gpus=8), "gpus", id="one-busy-of-eight"),
    pytest.param(N().used(0, 300), req(gpus=8), "gpus", id="shared-gpu-is-not-whole"),
    pytest.param(N(cpu=1000), req(cpu=2000), "cpu", id="cpu-short"),
    pytest.param(N(mem=1000), req(mem=2000), "memory", id="memory-short"),
    pytest.param(N(gpus=1).used(0, 600), req(milli=400), None, id="fraction-fits-exactly"),
    pytest.param(N(gpus=1).used(0, 700), req(milli=400), "gpus", id="fraction-too-big"),
    pytest.param(N(gpus=2).used(0, 1000).used(1, 900), req(milli=100), None, id="fraction-finds-room"),
    pytest.param(N(gpus=1, sick={0}), req(milli=100), "gpus", id="sick-gpu-has-no-room"),
    pytest.param(N(gpus=0), req(gpus=0, cpu=500), None, id="cpu-only-fits"),
    pytest.param(N(mig=True, gpus=1), req(mig="3g.40gb"), None, id="mig-empty-gpu"),
    pytest.param(
        N(mig=True, gpus=1, slices={0: [("3g.40gb", 0), ("3g.40gb", 4)]}),
        req(mig="1g.10gb"),
        "mig",
        id="mig-full",
    ),
    pytest.param(
        N(mig=True, gpus=1, slices={0: [("4g.40gb", 0)]}), req(mig="3g.40gb"), None, id="mig-3g-beside-4g"
    ),
    pytest.param(
        N(mig=True, gpus=1, slices={0: [("1g.10gb+me", 0)]}),
        req(mig="1g.10gb+me"),
        "mig",
        id="one-me-per-gpu",
    ),
]


@pytest.mark.parametrize(("node", "request_", "want"), FIT)
def test_fit_filter(node: N, request_: Request, want: str | None) -> None:
    reason = FitFilter().check(request_, node.view())
    assert code(reason) == want
    assert reason is None or reason.preemption_helps  # capacity: evicting work could help


def test_a_node_short_of_room_says_what_the_job_needs_and_what_it_has() -> None:
    # "needs 1 free GPUs": a one-GPU worker, the most common, read as several.
    one = FitFilter().check(req(gpus=1), N(gpus=1).used(0, 300).view())
    assert one is not None and one.message == "node n1: needs 1 free GPU it can use, has 0"
    four = FitFilter().check(req(gpus=4), N(gpus=2).view())
    assert four is not None and four.message == "node n1: needs 4 free GPUs it can use, has 2"
    cpu = FitFilter().check(req(cpu=2000), N(cpu=1000).view())
    assert cpu is not None and cpu.message == "node n1: needs 2000 milli-CPU free, has 1000"


NODE_FITS = [
    pytest.param((8000, 1000, "T4", (1000, 1000)), (4000, 500, TaskShape(4000, 1000, 2)), None, id="fits"),
    pytest.param(
        (8000, 1000, "T4", (1000, 999)), (4000, 500, TaskShape(4000, 1000, 2)), "gpus", id="second-gpu-short"
    ),
    pytest.param((8000, 1000, "T4", (1000,)), (9000, 500, TaskShape(9000, 500, 1)), "cpu", id="cpu"),
    pytest.param((8000, 1000, "T4", (1000,)), (100, 2000, TaskShape(100, 500, 1)), "memory", id="memory"),
    pytest.param(
        (8000, 1000, "T4", (1000,)),
        (100, 1, TaskShape(100, 500, 1, frozenset({"V100M16"}))),
        "gpu-model",
        id="model",
    ),
    pytest.param((8000, 1000, "T4", (0,)), (100, 1, TaskShape(100, 0, 0)), None, id="cpu-only-on-full-gpus"),
]


@pytest.mark.parametrize(("node", "task", "want"), NODE_FITS)
def test_node_fits_on_plain_numbers(
    node: tuple[int, int, str, tuple[int, ...]], task: tuple[int, int, TaskShape], want: str | None
) -> None:
    cpu_free, mem_free, model, gpus = node
    cpu, mem, shape = task
    assert node_fits(cpu_free, mem_free, model, gpus, cpu, mem, shape) == want


# -- reserves -------------------------------------------------------------------------------------

WHOLE_PICKS = [
    pytest.param(N(), req(gpus=2), (0, 1), id="lowest-indices"),
    pytest.param(
        N(islands=[0, 0, 1, 1, 2, 2, 3, 3]).used(0, 1000), req(gpus=1), (1,), id="tightest-island-first"
    ),
    pytest.param(
        N(islands=[0, 0, 1, 1, 2, 2, 3, 3]).used(0, 1000), req(gpus=2), (2, 3), id="island-with-room-for-both"
    ),
    pytest.param(
        N(islands=[0, 0, 0, 0, 1, 1, 1, 1]).used(0, 1000).used(4, 1000),
        req(gpus=4),
        (1, 2, 3, 5),
        id="spans-fewest-islands",
    ),
    pytest.param(N().used(0, 300), req(gpus=8), None, id="not-enough-whole"),
    pytest.param(N(sick={0}), req(gpus=1), (1,), id="skips-sick"),
]


@pytest.mark.parametrize(("node", "request_", "want"), WHOLE_PICKS)
def test_whole_gpus_reserve(node: N, request_: Request, want: tuple[int, ...] | None) -> None:
    got = WholeGpusReserve().pick(request_, node.view(), None)
    assert (None if got is None else tuple(c.gpu for c in got)) == want


def frag(*shapes: tuple[TaskShape, float]) -> Fragmentation:
    return Fragmentation(Workload(dict(shapes)))


SHARED_PICKS = [
    pytest.param("binpack", N(gpus=3).used(0, 200).used(1, 600), 300, 1, id="binpack-tightest"),
    pytest.param("spread", N(gpus=3).used(0, 200).used(1, 600), 300, 2, id="spread-emptiest"),
    pytest.param("binpack", N(gpus=2).used(0, 800), 300, 1, id="binpack-skips-too-small"),
    # With a workload of 500-milli tasks, 500 on a 500-free GPU fills it exactly: no fragment.
    pytest.param("corral", N(gpus=3).used(0, 500).used(1, 200), 500, 0, id="corral-exact-fill"),
    pytest.param("fgd", N(gpus=3).used(0, 500).used(1, 200), 500, 0, id="fgd-exact-fill"),
]


@pytest.mark.parametrize(("policy", "node", "milli", "want"), SHARED_PICKS)
def test_shared_gpu_reserve(policy: str, node: N, milli: int, want: int) -> None:
    f = frag((TaskShape(1000, 500, 1), 1.0))
    got = SharedGpuReserve(policy, f).pick(req(milli=milli), node.view(), None)  # type: ignore[arg-type]
    assert got is not None and got[0].gpu == want and got[0].milli == milli


MIG_PICKS = [
    pytest.param(N(mig=True, gpus=2), "1g.10gb", (0, 0), id="empty-gpus-first-index-slice-0"),
    pytest.param(
        N(mig=True, gpus=2, slices={1: [("3g.40gb", 0)]}), "1g.10gb", (1, 4), id="packs-onto-sliced-gpu"
    ),
    pytest.param(
        N(mig=True, gpus=1, slices={0: [("1g.10gb", 0)]}), "1g.10gb", (0, 1), id="next-to-neighbour-keeps-run"
    ),
    pytest.param(
        N(mig=True, gpus=1, slices={0: [("2g.20gb", 2)]}), "1g.10gb", (0, 0), id="fills-hole-before-run"
    ),
    pytest.param(N(mig=True, gpus=1, slices={0: [("7g.80gb", 0)]}), "1g.10gb", None, id="full"),
    pytest.param(N(mig=True, gpus=1, slices={0: [("3g.40gb", 0)]}), "3g.40gb", (0, 4), id="second-3g-at-4"),
]


@pytest.mark.parametrize(("node", "profile", "want"), MIG_PICKS)
def test_mig_reserve(node: N, profile: str, want: tuple[int, int] | None) -> None:
    got = MigReserve().pick(req(mig=profile), node.view(), None)
    if want is None:
        assert got is None
    else:
        assert got is not None and got[0].mig is not None
        assert (got[0].gpu, got[0].mig.start) == want and got[0].mig.profile == profile


@pytest.mark.parametrize(
    ("used", "want"),
    [
        pytest.param(0, 8, id="empty"),
        pytest.param(0b11111111, 0, id="full"),
        pytest.param(0b00000001, 7, id="first-taken"),
        pytest.param(0b00010000, 4, id="middle-taken"),
    ],
)
def test_largest_free_run(used: int, want: int) -> None:
    assert mig_plugin.largest_run(used) == want


# -- scores ---------------------------------------------------------------------------------------

ISLAND_SCORES = [
    pytest.param(req(gpus=2), (GpuClaim(0), GpuClaim(1)), [0, 0, 1, 1], 1.0, id="same-island"),
    pytest.param(req(gpus=2), (GpuClaim(1), GpuClaim(2)), [0, 0, 1, 1], 0.0, id="two-islands"),
    pytest.param(req(gpus=2), (GpuClaim(0), GpuClaim(1)), [-1, -1, -1, -1], 0.0, id="pcie-only"),
    pytest.param(req(gpus=1), (GpuClaim(0),), [0, 0, 1, 1], 0.0, id="one-gpu-indifferent"),
]


@pytest.mark.parametrize(("request_", "gpus", "islands", "want"), ISLAND_SCORES)
def test_island_score(request_: Request, gpus: tuple[GpuClaim, ...], islands: list[int], want: float) -> None:
    assert IslandScore().score(request_, N(gpus=4, islands=islands).view(), gpus) == want


def test_packing_binpack_prefers_fuller_and_spread_emptier() -> None:
    f = frag((TaskShape(1000, 1000, 1), 1.0))
    full, empty = N().used(0, 1000).used(1, 1000).view(), N().view()
    r, claim = req(gpus=1), (GpuClaim(2),)
    assert PackingScore("binpack", f).score(r, full, claim) > PackingScore("binpack", f).score(
        r, empty, claim
    )
    assert PackingScore("spread", f).score(r, full, claim) < PackingScore("spread", f).score(r, empty, claim)


def test_packing_fgd_prefers_filling_a_fragment() -> None:
    # Half-GPU and whole-GPU tasks: a half-used GPU is a fragment for the whole ones.
    f = frag((TaskShape(1000, 500, 1), 0.5), (TaskShape(1000, 1000, 1), 0.5))
    half, empty = N(gpus=2).used(0, 500).view(), N(gpus=2).view()
    r = req(milli=500)
    assert PackingScore("fgd", f).score(r, half, (GpuClaim(0, milli=500),)) > PackingScore("fgd", f).score(
        r, empty, (GpuClaim(0, milli=500),)
    )


BALANCE = [
    pytest.param(12_000, 1000, 12.0, True, 0, 0.0, id="gpu-task-balanced"),
    pytest.param(20_000, 1000, 12.0, True, 0, -8000.0, id="gpu-task-cpu-heavy"),
    pytest.param(4_000, 1000, 12.0, True, 0, -8000.0, id="gpu-task-cpu-light"),
    # A CPU-only task of 4,000 milli-CPU: the free GPU beside it, then what it takes from their
    # need, then the spare it leaves.
    pytest.param(20_000, 1000, 12.0, False, 4000, -(1000 * 1e4 + 12_000 * 1e-3), id="cpu-task-from-spare"),
    pytest.param(10_000, 1000, 12.0, False, 4000, -(1000 * 1e4 + 2000), id="cpu-task-takes-part"),
    pytest.param(4_000, 1000, 12.0, False, 4000, -(1000 * 1e4 + 4000), id="cpu-task-takes-all"),
    pytest.param(20_000, 0, 12.0, False, 4000, -(24_000 * 1e-3), id="cpu-task-beside-no-free-gpu"),
    pytest.param(0, 0, 12.0, False, 4000, -(4000 * 1e-3), id="cpu-task-fills-a-full-node"),
]


@pytest.mark.parametrize(("cpu", "gpu", "kappa", "gpu_task", "cpu_milli", "want"), BALANCE)
def test_corral_balance(
    cpu: int, gpu: int, kappa: float, gpu_task: bool, cpu_milli: int, want: float
) -> None:
    assert balance(cpu, gpu, kappa, gpu_task, cpu_milli) == pytest.approx(want)


# A GPU task's balance weighs the memory its node keeps for its free GPUs: mu MiB a milli-GPU
# (40 here), a shortfall counted in milli-CPU at kappa / mu a MiB, a surplus not at all.
MEMORY_BALANCE = [
    pytest.param(12_000, 1000, 40_000, 40.0, 0.0, id="memory-as-the-free-gpu-needs"),
    pytest.param(12_000, 1000, 300_000, 40.0, 0.0, id="spare-memory-is-not-stranded"),
    pytest.param(12_000, 1000, 20_000, 40.0, -20_000 * 12.0 / 40.0, id="memory-short-of-the-free-gpu"),
    pytest.param(0, 0, 0, 40.0, 0.0, id="no-free-gpu-needs-no-memory"),
    pytest.param(20_000, 1000, 0, 40.0, -8000.0 - 40_000 * 12.0 / 40.0, id="cpu-and-memory-both-count"),
    pytest.param(12_000, 1000, 0, 0.0, 0.0, id="mu-0-memory-not-weighed"),
]


@pytest.mark.parametrize(("cpu", "gpu", "mem", "mu", "want"), MEMORY_BALANCE)
def test_corral_balance_memory(cpu: int, gpu: int, mem: int, mu: float, want: float) -> None:
    assert balance(cpu, gpu, 12.0, True, 0, mem, mu) == pytest.approx(want)
    # A CPU-only task's order does not read memory.
    assert balance(cpu, gpu, 12.0, False, 4000, mem, mu) == balance(cpu, gpu, 12.0, False, 4000)


MEMORY_PER_GPU = [
    pytest.param([(4096, 1000, 2), (2048, 500, 2)], (8192 + 4096) / 3000, id="gpu-tasks-weighted-by-count"),
    pytest.param([(4096, 1000, 1), (65_536, 0, 10)], 4.096, id="cpu-only-tasks-do-not-count"),
    pytest.param([(65_536, 0, 10)], 0.0, id="no-gpu-task-not-weighed"),
    pytest.param([], 0.0, id="empty"),
]


@pytest.mark.parametrize(("asks", "want"), MEMORY_PER_GPU)
def test_memory_per_gpu(asks: list[tuple[int, int, float]], want: float) -> None:
    assert memory_per_gpu(asks) == pytest.approx(want)


def test_tightness_orders_shared_gpus_least_free_first_and_outweighs_balance() -> None:
    assert tightness(200) > tightness(500) > tightness(1000)
    # One milli-GPU of tightness is worth more than the worst balance a node can have, and a
    # whole GPU of it stays inside one FGD score step.
    assert tightness(500) - tightness(501) > -balance(0, 8000, 12.0, True, 0, 0, 40.0)
    assert (tightness(0) - tightness(1000)) / BALANCE_SCALE < 1.0


def test_corral_cpu_task_goes_beside_no_free_gpu_then_fits_spare_cpu() -> None:
    # The same CPU-only task on three nodes FGD scores the same: beside no free GPU first, then the
    # node whose spare CPU (beyond its free GPU's need) it fits tightest.
    w = Workload({TaskShape(12_000, 1000, 1): 1.0, TaskShape(4_000, 0, 0): 1.0})
    table, task = w.table("T4"), TaskShape(4_000, 0, 0)

    def score(cpu: int, gpus: tuple[int, ...]) -> float:
        return corral_choice(table, 12.0, cpu, gpus, task, fragment(table, cpu, gpus))[0]

    full, tight, roomy = score(8_000, (0, 0)), score(17_000, (1000, 0)), score(40_000, (1000, 0))
    assert round(full) == round(tight) == round(roomy) == 50
    assert full > tight > roomy


def test_corral_breaks_fgd_ties_by_balance() -> None:
    w = Workload({TaskShape(12_000, 1000, 1): 1.0})
    table = w.table("T4")
    # Two nodes FGD scores the same (a whole GPU on an idle 2-GPU node); the one whose CPU stays
    # in proportion to its GPUs wins.
    lean = corral_choice(
        table, 12.0, 24_000, (1000, 1000), TaskShape(12_000, 1000, 1), fragment(table, 24_000, (1000, 1000))
    )
    fat = corral_choice(
        table, 12.0, 90_000, (1000, 1000), TaskShape(12_000, 1000, 1), fragment(table, 90_000, (1000, 1000))
    )
    assert round(lean[0]) == round(fat[0]) == 50 and lean[0] > fat[0]


def test_kappa_is_the_workloads_cpu_per_milli_gpu() -> None:
    # CPU-only tasks do not count: their CPU need not sit beside a GPU.
    w = Workload(
        {TaskShape(10_000, 1000, 1): 1.0, TaskShape(6_000, 500, 1): 1.0, TaskShape(4_000, 0, 0): 1.0}
    )
    assert kappa_of(w) == pytest.approx(16_000 / 1500)


# GPU tasks ask 16,000 milli-CPU per 1,500 milli-GPU (10.67 per milli-GPU), CPU-only tasks 4,000
# more (2.67 per milli-GPU of the workload's GPU demand): 13.33 in all.
KAPPA_BOUNDS = [
    pytest.param(None, 16_000 / 1500, id="no-cluster-bound"),
    pytest.param(20.0, 16_000 / 1500, id="cpu-to-spare"),
    pytest.param(16_000 / 1500 + 4_000 / 1500, 16_000 / 1500, id="cpu-just-enough"),
    pytest.param(12.0, 12.0 - 4_000 / 1500, id="cpu-short-gpus-get-what-cpu-only-tasks-leave"),
    pytest.param(2.0, 0.0, id="cpu-only-tasks-want-it-all"),
]


@pytest.mark.parametrize(("cpu_per_gpu", "want"), KAPPA_BOUNDS)
def test_kappa_is_bounded_by_the_cpu_the_cluster_can_give(cpu_per_gpu: float | None, want: float) -> None:
    w = Workload(
        {TaskShape(10_000, 1000, 1): 1.0, TaskShape(6_000, 500, 1): 1.0, TaskShape(4_000, 0, 0): 1.0}
    )
    assert kappa_of(w, cpu_per_gpu) == pytest.approx(want)


def test_cluster_cpu_per_gpu_counts_only_nodes_with_gpus() -> None:
    state = State()
    for node in (N(name="a", gpus=8, cpu=96_000), N(name="b", gpus=2, cpu=104_000), N(name="c", gpus=0)):
        state.nodes[node.name] = node.build()
    assert cluster_cpu_per_gpu(state) == pytest.approx(200_000 / 10_000)
    assert cluster_cpu_per_gpu(State()) is None
    f = fragmentation_of(state)
    assert f.kappa == kappa_of(f.workload, 20.0)


def corral_on(table: FragTable, kappa: float, task: TaskShape, cpu: int, gpus: tuple[int, ...]) -> float:
    return corral_choice(table, kappa, cpu, gpus, task, fragment(table, cpu, gpus))[0]


# Which of two nodes FGD scores the same corral picks for a task (kappa 12 milli-CPU per
# milli-GPU unless the case says otherwise). The workload's GPU tasks ask 3,000 milli-CPU, so
# FGD's measure does not see the CPU a node loses as long as 3,000 are left.
CHOICES = [
    pytest.param(
        TaskShape(4_000, 0, 0),
        12.0,
        (20_000, (0, 0)),
        (60_000, (1000, 1000)),
        id="cpu-task-to-the-node-without-free-gpus",
    ),
    pytest.param(
        TaskShape(4_000, 0, 0),
        12.0,
        (12_000, (1000,)),
        (97_000, (1000,) * 8),
        id="cpu-task-strands-one-gpu-rather-than-break-a-whole-node",
    ),
    pytest.param(
        TaskShape(4_000, 0, 0),
        12.0,
        (60_000, (1000, 1000)),
        (20_000, (1000, 1000)),
        id="cpu-task-into-spare-cpu-rather-than-gpus-cpu",
    ),
    pytest.param(
        TaskShape(3_000, 1000, 1),
        12.0,
        (27_000, (1000, 1000, 1000)),
        (7_000, (1000, 1000, 1000)),
        id="gpu-task-leaves-cpu-for-the-free-gpus",
    ),
    pytest.param(
        TaskShape(3_000, 1000, 1),
        12.0,
        (27_000, (1000, 1000, 1000)),
        (90_000, (1000, 1000, 1000)),
        id="gpu-task-leaves-spare-cpu-for-cpu-heavy-tasks",
    ),
    pytest.param(
        TaskShape(3_000, 1000, 1),
        4.0,
        (15_000, (1000, 1000, 1000)),
        (27_000, (1000, 1000, 1000)),
        id="cpu-short-cluster-gpu-task-keeps-only-what-a-gpu-can-expect",
    ),
    # A 300-milli slice fills a 500-free GPU and a 600-free one equally in FGD's eyes (both stay
    # a fragment for the whole-GPU tasks): the tighter one wins, though the other node's CPU
    # would end closer to kappa times its free GPU (both nodes' CPU serves their GPU).
    pytest.param(
        TaskShape(1_000, 300, 1),
        12.0,
        (50_000, (500,)),
        (9_000, (600,)),
        id="shared-task-fills-the-tightest-gpu-before-balance",
    ),
    # The same slice where the looser GPU's node has too little CPU for it (4,600 milli-CPU serve
    # 383 of its 600 milli-GPU): there the slice asks less CPU than its share, so the node's CPU
    # serves what is left (3,600 for 300), and the 217 milli-GPU it no longer starves outweigh
    # the 100 of tightness.
    pytest.param(
        TaskShape(1_000, 300, 1),
        12.0,
        (4_600, (600,)),
        (50_000, (500,)),
        id="cpu-light-slice-relieves-a-cpu-starved-gpu-before-tightness",
    ),
]


@pytest.mark.parametrize(("task", "kappa", "win", "lose"), CHOICES)
def test_corral_choice(
    task: TaskShape, kappa: float, win: tuple[int, tuple[int, ...]], lose: tuple[int, tuple[int, ...]]
) -> None:
    table = Workload({TaskShape(3_000, 1000, 1): 1.0, TaskShape(4_000, 0, 0): 1.0}).table("T4")
    a, b = corral_on(table, kappa, task, *win), corral_on(table, kappa, task, *lose)
    assert round(a) == round(b), "FGD must score both the same for the tie-break to decide"
    assert a > b


# Which of two nodes with the same free CPU and GPUs a whole-GPU task goes to, by the memory each
# keeps once it is there (mu 40 MiB a milli-GPU: the two GPUs left need 80,000).
MEMORY_CHOICES = [
    pytest.param(100_000, 20_000, id="keeps-memory-for-the-free-gpus"),
    pytest.param(80_000, 79_000, id="any-shortfall-counts"),
]


@pytest.mark.parametrize(("win", "lose"), MEMORY_CHOICES)
def test_corral_choice_memory(win: int, lose: int) -> None:
    table = Workload({TaskShape(3_000, 1000, 1): 1.0}).table("T4")
    task, gpus, cpu = TaskShape(3_000, 1000, 1), (1000, 1000, 1000), 27_000
    before = fragment(table, cpu, gpus)
    a = corral_choice(table, 12.0, cpu, gpus, task, before, win, 40.0)[0]
    b = corral_choice(table, 12.0, cpu, gpus, task, before, lose, 40.0)[0]
    assert round(a) == round(b) and a > b
    # Without mu the memory is not weighed: both score the same.
    no_mu = corral_choice(table, 12.0, cpu, gpus, task, before, lose)[0]
    assert no_mu == corral_choice(table, 12.0, cpu, gpus, task, before, win)[0] == a


def test_live_corral_score_weighs_tightness_and_memory() -> None:
    # The live placer's score ranks as ``corral_choice`` does: a shared task on the tighter GPU,
    # a whole-GPU task where memory stays for the free GPUs.
    f = Fragmentation(Workload({TaskShape(1000, 1000, 1): 1.0}), mu=40.0)
    score = PackingScore("corral", f).score
    shared = req(milli=300, cpu=1000, mem=1024)
    tight, loose = N(gpus=1, cpu=50_000).used(0, 500).view(), N(gpus=1, cpu=4_600).used(0, 400).view()
    assert score(shared, tight, (GpuClaim(0, milli=300),)) > score(shared, loose, (GpuClaim(0, milli=300),))
    whole = req(cpu=12_000, mem=1024)
    roomy, short = N(gpus=2, cpu=24_000, mem=200_000).view(), N(gpus=2, cpu=24_000, mem=21_000).view()
    a, b = score(whole, roomy, (GpuClaim(0),)), score(whole, short, (GpuClaim(0),))
    assert round(a) == round(b) and a > b


# Milli-GPU of a node's free GPU its free CPU and memory cannot serve (kappa 12 milli-CPU and
# mu 40 MiB a free milli-GPU): each shortfall over what the free GPU needs, in milli-GPU.
STARVED = [
    pytest.param(24_000, 2000, 80_000, 12.0, 40.0, 0.0, id="cpu-and-memory-as-the-gpus-need"),
    pytest.param(90_000, 2000, 900_000, 12.0, 40.0, 0.0, id="spare-cpu-and-memory-starve-nothing"),
    pytest.param(12_000, 2000, 80_000, 12.0, 40.0, 1000.0, id="half-the-cpu-starves-a-gpu"),
    pytest.param(24_000, 2000, 40_000, 12.0, 40.0, 1000.0, id="half-the-memory-starves-a-gpu"),
    pytest.param(0, 2000, 0, 12.0, 40.0, 4000.0, id="both-gone-count-twice"),
    pytest.param(0, 0, 0, 12.0, 40.0, 0.0, id="no-free-gpu-starves-nothing"),
    pytest.param(0, 2000, 0, 0.0, 0.0, 0.0, id="kappa-and-mu-0-not-weighed"),
    pytest.param(12_000, 2000, None, 12.0, 40.0, 1000.0, id="memory-unknown-not-weighed"),
]


@pytest.mark.parametrize(("cpu", "gpu", "mem", "kappa", "mu", "want"), STARVED)
def test_starved(cpu: int, gpu: int, mem: int | None, kappa: float, mu: float, want: float) -> None:
    assert starved(cpu, gpu, mem, kappa, mu) == pytest.approx(want)


# Which of two nodes a shared task goes to when FGD scores both the same and the GPUs it would
# share are equally tight (530 free beside two whole GPUs): the one whose CPU and memory still
# serve the free GPUs once the task is on it, though on the other the node's CPU would end
# closer to kappa times its free GPU (the balance alone picked that one and starved two GPUs).
# kappa 12, mu 40; the workload's tasks ask 3,000 milli-CPU, so FGD does not see the CPU.
STARVING_CHOICES = [
    pytest.param(
        TaskShape(16_000, 470, 1),
        (96_000, 400_000),
        (20_000, 400_000),
        id="cpu-heavy-slice-to-the-node-with-cpu-for-its-gpus",
    ),
    pytest.param(
        TaskShape(4_000, 470, 1),
        (40_000, 200_000),
        (40_000, 60_000),
        id="memory-heavy-slice-to-the-node-with-memory-for-its-gpus",
    ),
    pytest.param(
        TaskShape(4_000, 470, 1),
        (22_000, 200_000),
        (60_000, 200_000),
        id="cpu-light-slice-still-fits-where-cpu-is-short",
    ),
]


@pytest.mark.parametrize(("task", "win", "lose"), STARVING_CHOICES)
def test_corral_shared_task_keeps_cpu_and_memory_for_the_free_gpus(
    task: TaskShape, win: tuple[int, int], lose: tuple[int, int]
) -> None:
    table = Workload({TaskShape(3_000, 1000, 1): 1.0, TaskShape(4_000, 0, 0): 1.0}).table("T4")
    gpus = (530, 1000, 1000)
    mem_ask = 50_000 if task.cpu_milli == 4_000 else 10_000

    def score(cpu: int, mem: int) -> float:
        before = fragment(table, cpu, gpus)
        return corral_choice(table, 12.0, cpu, gpus, task, before, mem - mem_ask, 40.0, mem_ask)[0]

    a, b = score(*win), score(*lose)
    assert round(a) == round(b), "FGD must score both the same for the tie-break to decide"
    assert a > b


def test_corral_tie_breaks_stay_within_a_score_step() -> None:
    # A slice asking 400 cores on a 400-core node at kappa 1 would starve 7,500 milli-GPU: more
    # than a score step's worth. The tie-breaks are bounded so that FGD's score still decides.
    s = corral_score(1000.0, 1000.0, 0, 7500, 1.0, True, 400_000, None, 0.0, 1000, 500, 0)
    assert s == pytest.approx(fgd_score(1000.0, 1000.0) - 0.45)


def test_live_corral_score_keeps_cpu_for_the_free_gpus() -> None:
    # The live placer's score ranks as ``corral_choice`` does: a CPU-heavy slice on two equally
    # tight GPUs goes where the node's CPU still serves its whole GPUs.
    # kappa 12 (3,000 milli-CPU per 250 milli-GPU), and the workload's tasks fit in what either
    # node keeps, so FGD scores both the same.
    f = Fragmentation(Workload({TaskShape(3000, 250, 1): 1.0}))
    score = PackingScore("corral", f).score
    shared = req(milli=470, cpu=16_000, mem=1024)
    rich = N(gpus=3, cpu=96_000, mem=400_000).used(0, 470).view()
    poor = N(gpus=3, cpu=20_000, mem=400_000).used(0, 470).view()
    a, b = score(shared, rich, (GpuClaim(0, milli=470),)), score(shared, poor, (GpuClaim(0, milli=470),))
    assert round(a) == round(b) and a > b


# -- fragmentation --------------------------------------------------------------------------------


def brute_fragment(w: Workload, model: str, cpu: int, gpus: tuple[int, ...]) -> float:
    """FGD's definition, task by task, as its simulator computes it."""
    total = 0.0
    r = sum(gpus)
    for s, p in w.shapes.items():
        if s.gpu_milli == 0 or (s.models and model not in s.models):
            total += p * r
            continue
        fits = sum(1 for g in gpus if g >= s.gpu_milli) >= s.gpus and cpu >= s.cpu_milli
        total += p * (sum(g for g in gpus if g < s.gpu_milli) if fits else r)
    return total


FRAG_CASES = [
    pytest.param(96_000, (1000,) * 8, id="idle-node"),
    pytest.param(96_000, (190, 1000, 530, 0, 0, 60, 1000, 1000), id="mixed-leftovers"),
    pytest.param(2_000, (1000, 1000), id="cpu-starved"),
    pytest.param(50_000, (0, 0, 0), id="full"),
]


@pytest.mark.parametrize(("cpu", "gpus"), FRAG_CASES)
def test_fragment_matches_fgd_definition(cpu: int, gpus: tuple[int, ...]) -> None:
    w = Workload(
        {
            TaskShape(3152, 810, 1): 0.2,
            TaskShape(11_300, 1000, 1): 0.3,
            TaskShape(12_500, 0, 0): 0.1,
            TaskShape(8000, 470, 1): 0.15,
            TaskShape(16_000, 1000, 2): 0.1,
            TaskShape(4000, 230, 1, frozenset({"T4"})): 0.15,
        }
    )
    for model in ("G2", "T4"):
        assert fragment(w.table(model), cpu, gpus) == pytest.approx(brute_fragment(w, model, cpu, gpus))


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        pytest.param(1000.0, 1000.0, 50, id="no-change"),
        pytest.param(1000.0, 0.0, 73, id="fragmentation-falls"),
        pytest.param(0.0, 1000.0, 26, id="fragmentation-grows"),
    ],
)
def test_fgd_score_is_the_truncated_sigmoid(before: float, after: float, want: int) -> None:
    assert fgd_score(before, after) == want


def test_typical_workload_keeps_the_most_common_shapes() -> None:
    a, b, c = TaskShape(1, 100, 1), TaskShape(2, 200, 1), TaskShape(3, 300, 1)
    w = Workload.typical({a: 90.0, b: 6.0, c: 4.0}, threshold_pct=95)
    assert set(w.shapes) == {a, b}
    assert w.shapes[a] == pytest.approx(90 / 96)


def test_take_whole_lowest_free_first() -> None:
    assert take_whole((1000, 500, 1000, 1000), 2) == ((0, 500, 0, 1000), (0, 2))


# -- the published baselines -------------------------------------------------------------------

BASELINE_CASES = [
    pytest.param(baselines.best_fit(64_000, (1000, 1000), TaskShape(32_000, 1000, 1)), 81, id="bestfit"),
    pytest.param(baselines.dot_product(64_000, (1000, 1000), TaskShape(32_000, 1000, 1)), 92, id="dotprod"),
    pytest.param(baselines.gpu_packing((1000,) * 8, TaskShape(1000, 500, 1)), 25, id="packing-idle-node"),
    pytest.param(
        baselines.gpu_packing((1000, 0), TaskShape(1000, 1000, 1)), 49, id="packing-free-gpu-on-used-node"
    ),
    pytest.param(baselines.gpu_packing((1000, 400), TaskShape(1000, 300, 1)), 96, id="packing-shared-gpu"),
    pytest.param(baselines.gpu_packing((1000, 400), TaskShape(1000, 0, 0)), 0, id="packing-cpu-only"),
    pytest.param(
        baselines.gpu_clustering((1000, 0), {"1-gpu": 1}, TaskShape(1, 1000, 1)),
        96,
        id="clustering-same-kind",
    ),
    pytest.param(
        baselines.gpu_clustering((1000, 0), {"1-gpu": 1, "share-gpu": 2}, TaskShape(1, 1000, 1)),
        71,
        id="clustering-mixed",
    ),
    pytest.param(baselines.gpu_clustering((1000, 1000), {}, TaskShape(1, 1000, 1)), 43, id="clustering-idle"),
    pytest.param(
        baselines.gpu_clustering((1000, 0), {"share-gpu": 1}, TaskShape(1, 1000, 1)),
        21,
        id="clustering-other-kind",
    ),
]


@pytest.mark.parametrize(("got", "want"), BASELINE_CASES)
def test_published_scores(got: int, want: int) -> None:
    assert got == want


# -- topology levels and the gang search ------------------------------------------------------


@pytest.mark.parametrize(
    ("pack", "required", "want"),
    [
        pytest.param("nvlink", False, ("island", "node", "rack", "block", "cluster"), id="nvlink-preferred"),
        pytest.param("nvlink", True, ("island",), id="nvlink-required"),
        pytest.param("rack", False, ("rack", "block", "cluster"), id="rack-preferred"),
        pytest.param("node", True, ("node",), id="node-required"),
        pytest.param("spread", False, ("cluster",), id="spread"),
        pytest.param("none", False, ("cluster",), id="none"),
    ],
)
def test_topology_levels(pack: str, required: bool, want: tuple[str, ...]) -> None:
    assert levels(req(pack=pack, required=required)) == want


def cluster_state(count: int, profile: str = "h100-8x") -> State:
    return LogBuilder().nodes(Cluster(count, profile)).fold()


def place(state: State, request_: Request) -> Placement | tuple[Reason, ...]:
    config = stack.PlacerConfig()
    chain = stack.build(config, fragmentation_of(state))
    return gang.place(chain, Snapshot(state), request_, config.label_keys)


def test_eight_ranks_pack_nvlink_land_on_one_node() -> None:
    got = place(cluster_state(4), req(gpus=1, replicas=8, pack="nvlink"))
    assert isinstance(got, Placement)
    assert len({w.node for w in got.workers}) == 1
    assert sorted(c.gpu for w in got.workers for c in w.gpus) == list(range(8))


def test_gang_is_all_or_nothing() -> None:
    state = cluster_state(2)
    snap = Snapshot(state)
    config = stack.PlacerConfig()
    chain = stack.build(config, fragmentation_of(state))
    got = gang.place(chain, snap, req(gpus=8, replicas=3), config.label_keys)
    assert not isinstance(got, Placement)
    # Nothing stays taken: both nodes still offer all their GPUs to the next job.
    assert all(snap.view(n).free_whole("H100-80GB") == 8 for n in state.nodes)


def test_a_gang_that_some_nodes_refuse_says_the_rest_cannot_hold_it_all() -> None:
    # node-01 is full; node-00 could take one 8-GPU worker of three. Said alone, node-01's
    # reason read as if node-00 could hold the gang.
    state = cluster_state(2)
    for g in state.nodes["node-01"].gpus:
        g.used_milli, g.holders = 1000, {"x": 1000}
    got = place(state, req(gpus=8, replicas=3))
    assert isinstance(got, tuple)
    assert [r.code for r in got][-1] == "gang"
    assert got[-1].message.startswith("no room for all 3 workers") and got[-1].preemption_helps
    # One worker is no gang: its nodes' reasons say it all.
    one = place(state, req(gpus=8, models=("A100-80GB",)))
    assert isinstance(one, tuple) and [r.code for r in one] == ["gpu-model"]


def test_required_node_packing_fails_rather_than_split() -> None:
    got = place(cluster_state(2), req(gpus=4, replicas=3, pack="node", required=True))
    assert isinstance(got, tuple) and got[0].code == "gang"


def test_preferred_node_packing_falls_back_to_two_nodes() -> None:
    got = place(cluster_state(2), req(gpus=4, replicas=3, pack="node"))
    assert isinstance(got, Placement) and len({w.node for w in got.workers}) == 2


def test_spread_puts_workers_on_distinct_nodes() -> None:
    got = place(cluster_state(4), req(gpus=1, replicas=4, pack="spread", required=True))
    assert isinstance(got, Placement) and len({w.node for w in got.workers}) == 4


def test_rack_packing_keeps_the_gang_in_one_rack() -> None:
    got = place(cluster_state(8), req(gpus=8, replicas=3, pack="rack", required=True))
    assert isinstance(got, Placement)
    state = cluster_state(8)
    assert len({state.nodes[w.node].inventory.labels["rack"] for w in got.workers}) == 1


def test_binpack_fills_the_busier_node_first() -> None:
    state = cluster_state(2)
    state.nodes["node-01"].gpus[0].used_milli = 1000
    state.nodes["node-01"].gpus[0].holders = {"x": 1000}
    got = place(state, req(gpus=1))
    assert isinstance(got, Placement) and got.workers[0].node == "node-01"


def test_unschedulable_reasons_count_nodes_by_code() -> None:
    got = place(cluster_state(2), req(gpus=1, models=("A100-80GB",)))
    assert isinstance(got, tuple)
    assert got[0].code == "gpu-model" and got[0].message.startswith("2/2 nodes")
    assert not got[0].preemption_helps


# -- the cycle ----------------------------------------------------------------------------------


def fold_events(state: State, events: list[Event]) -> State:
    seq = state.seq
    for ev in events:
        seq += 1
        apply_event(state, seq, subjects.decision("placer"), ev, state.time + 1)
    return state


QUEUE = QueueSpec("team-a", quotas={quota.ANY: Quota(100_000)})


def admitted_log(*jobs: tuple[str, JobBuilder, int], nodes: int = 2, profile: str = "h100-8x") -> LogBuilder:
    """Nodes, a queue with ample quota, and ``jobs`` submitted, accepted and admitted as
    admission would (each admission names the GPUs its gang holds)."""
    log = LogBuilder().nodes(Cluster(nodes, profile)).admin("queue", ApplyQueue(queue=QUEUE))
    for job_id, spec, replicas in jobs:
        log.submit("alice", job_id, spec).accept(job_id)
        res = spec.build().resources
        gpus = quota.admission_gpus(quota.ANY, quota.worker_milli(res) * replicas)
        body = JobsAdmitted(
            based_on=log.last_seq, now=1000.0, admissions=(Admission(job_id, 0, replicas, gpus),)
        )
        log.event(subjects.decision("admission"), body)
    return log


def test_a_cycle_of_many_placements_is_cut_into_events_a_message_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8,800 placements in one event (a failover after a burst) were 1.2 MB, refused by the
    # server every cycle for good. Cut to a small budget here: each event within it, all placed.
    from corral.events import codec

    monkeypatch.setattr(codec, "EVENT_BYTES", 1024)
    jobs = [(f"j{i:02d}-{'x' * 40}", job().gpus(1), 1) for i in range(40)]
    state = admitted_log(*jobs, nodes=5).fold()
    events = decide(state, 2000.0)
    placed = [e for e in events if isinstance(e, JobsPlaced)]
    assert len(placed) > 3
    for e in placed:
        size = sum(len(codec.encode(p)) + 1 for p in e.placements)
        assert size <= 1024 or len(e.placements) == 1
    fold_events(state, events)
    assert state.void_total == 0 and {state.jobs[j].phase for j, _, _ in jobs} == {"placed"}


def test_runs_by_size_keep_order_and_put_a_large_item_alone() -> None:
    from corral.events import codec

    items = ["a" * 10, "b" * 10, "c" * 100, "d" * 10, "e" * 10]
    runs = list(codec.by_size(items, budget=30))
    assert runs == [("a" * 10, "b" * 10), ("c" * 100,), ("d" * 10, "e" * 10)]
    assert [x for run in runs for x in run] == items and list(codec.by_size([])) == []


def test_one_cycle_one_placed_event_for_all_jobs() -> None:
    state = admitted_log(("a", job().gpus(4), 1), ("b", job().gpus(4), 1), ("c", job().milli(250), 1)).fold()
    events = decide(state, 2000.0)
    assert [type(e) for e in events] == [JobsPlaced]
    placed = events[0]
    assert isinstance(placed, JobsPlaced) and placed.based_on == state.seq and placed.now == 2000.0
    assert [p.job_id for p in placed.placements] == ["a", "b", "c"]
    before = state.void_total
    fold_events(state, events)
    assert state.void_total == before and all(j.phase == "placed" for j in state.jobs.values())


def test_placements_of_one_cycle_never_collide() -> None:
    state = admitted_log(*[(f"j{i}", job().gpus(3), 1) for i in range(6)], nodes=2).fold()
    events = decide(state, 2000.0)
    fold_events(state, events)
    assert state.void_total == 0
    placed = [j for j in state.jobs.values() if j.phase == "placed"]
    assert len(placed) == 4  # a 3-GPU worker cannot span nodes: two per 8-GPU node
    for node in state.nodes.values():
        assert all(g.used_milli <= 1000 and len(g.holders) <= 1 for g in node.gpus)


def test_priority_then_submission_order() -> None:
    state = admitted_log(("low", job().gpus(8), 1), ("high", job().gpus(8), 1), nodes=1).fold()
    state.jobs["high"].priority = 10  # as JobAccepted(priority=10) would have set it
    assert [j.id for j in admitted(state)] == ["high", "low"]
    events = decide(state, 2000.0)
    assert isinstance(events[0], JobsPlaced) and events[0].placements[0].job_id == "high"


def test_unschedulable_reported_once_until_reasons_change() -> None:
    state = admitted_log(("big", job().gpus(8).replicas(3), 3), nodes=2).fold()
    events = decide(state, 2000.0)
    assert [type(e) for e in events] == [JobsUnschedulable]
    fold_events(state, events)
    assert state.jobs["big"].reasons and decide(state, 2001.0) == []


def test_a_job_whose_old_workers_still_hold_gpus_waits() -> None:
    state = admitted_log(("a", job().gpus(1), 1)).fold()
    indexes.hold(state, state.jobs["a"], Placement("a", 0, (WorkerSlot(0, "node-00", (GpuClaim(0),)),)))
    events = decide(state, 2000.0)
    assert isinstance(events[0], JobsUnschedulable) and events[0].jobs[0].reasons[0].code == "draining"


def test_same_state_same_events() -> None:
    state = admitted_log(
        *[(f"j{i}", job().gpus(1 + i % 3), 1) for i in range(7)], ("s", job().milli(300), 1)
    ).fold()
    assert decide(state, 5.0) == decide(msgspec.convert(msgspec.to_builtins(state), State), 5.0)


# -- reservation and backfill ----------------------------------------------------------------------


def running_holder(
    state: State, job_id: str, node: str, gpus: range, estimate: float | None, since: float
) -> None:
    spec = JobSpec(
        queue="q", resources=Resources(gpus=len(gpus)), runtime_estimate_s=estimate, preemptible=False
    )
    holder = JobState(
        id=job_id,
        tenant="t",
        spec=spec,
        submitted_seq=0,
        submitted_at=0.0,
        phase="running",
        phase_since=since,
    )
    p = Placement(job_id, 0, (WorkerSlot(0, node, tuple(GpuClaim(i) for i in gpus)),))
    claims.take(state, holder, p)
    holder.placement = p
    indexes.add(state, holder)


def admit(state: State, job_id: str, spec: JobSpec, seq: int, replicas: int = 1) -> None:
    j = JobState(id=job_id, tenant="t", spec=spec, submitted_seq=seq, submitted_at=0.0, phase="admitted")
    j.admission = Admission(job_id, 0, replicas)
    indexes.add(state, j)


def test_expected_end() -> None:
    spec = JobSpec(queue="q", runtime_estimate_s=100.0, grace_seconds=30.0)
    j = JobState(
        id="x", tenant="t", spec=spec, submitted_seq=0, submitted_at=0.0, phase="running", phase_since=50.0
    )
    assert holds.expected_end(j, 10.0) == 150.0
    j.phase = "checkpointing"
    assert holds.expected_end(j, 10.0) == 80.0
    j.phase, j.spec = "running", JobSpec(queue="q")
    assert math.isinf(holds.expected_end(j, 10.0))


def reservation_state() -> State:
    """One 8-GPU node: 4 GPUs held until t=1000; a head job wants all 8."""
    state = cluster_state(1)
    running_holder(state, "old", "node-00", range(4), estimate=1000.0, since=0.0)
    admit(state, "head", JobSpec(queue="q", resources=Resources(gpus=8), preemptible=False), seq=10)
    return state


BACKFILL = [
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), runtime_estimate_s=500.0, preemptible=False),
        0,
        True,
        id="ends-before-start",
    ),
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), runtime_estimate_s=5000.0, preemptible=False),
        0,
        False,
        id="ends-after-start",
    ),
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), preemptible=False), 0, False, id="no-estimate"
    ),
    # A preemptible job of the head's priority may be one the head's queue's policy cannot stop
    # (its own queue's, or one within its queue's nominal): it would hold the GPUs for good.
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), preemptible=True),
        0,
        False,
        id="preemptible-same-priority",
    ),
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), preemptible=True),
        5,
        True,
        id="preemptible-lower-priority",
    ),
    pytest.param(
        JobSpec(queue="q", resources=Resources(gpus=2), preemptible=False),
        5,
        False,
        id="lower-priority-not-preemptible",
    ),
]


@pytest.mark.parametrize(("spec", "head_priority", "backfills"), BACKFILL)
def test_backfill_around_the_heads_reservation(spec: JobSpec, head_priority: int, backfills: bool) -> None:
    state = reservation_state()
    state.jobs["head"].priority = head_priority
    admit(state, "small", spec, seq=11)
    events = decide(state, 100.0)
    placed = [p.job_id for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    waiting = {u.job_id: u.reasons for e in events if isinstance(e, JobsUnschedulable) for u in e.jobs}
    assert waiting["head"][0].code == "reserved"
    assert ("small" in placed) == backfills
    if not backfills:
        assert waiting["small"][0].code == "reservation"


@pytest.mark.parametrize(("preemptions", "backfills"), [(0, True), (1, False)])
def test_no_backfill_for_a_job_whose_cap_on_preemptions_ran_out(preemptions: int, backfills: bool) -> None:
    # Backfilled into the head's reserved GPUs, it could never be stopped for the head, which
    # waited for it to end.
    state = reservation_state()
    state.priority_classes["capped"] = PriorityClassSpec("capped", 0, max_preemptions=1)
    state.jobs["head"].priority = 5
    small = JobSpec(queue="q", resources=Resources(gpus=2), preemptible=True, priority_class="capped")
    admit(state, "small", small, seq=11)
    state.jobs["small"].preemptions = preemptions
    placed = [p.job_id for e in decide(state, 100.0) if isinstance(e, JobsPlaced) for p in e.placements]
    assert ("small" in placed) is backfills


def test_no_reservation_for_a_job_no_node_could_ever_hold() -> None:
    state = cluster_state(1)
    admit(state, "huge", JobSpec(queue="q", resources=Resources(gpus=8), replicas=2), seq=10, replicas=2)
    events = decide(state, 0.0)
    reasons = events[0].jobs[0].reasons  # type: ignore[attr-defined]
    assert all(not r.code.startswith("reserved") for r in reasons)


def test_mig_slots_placed_are_valid() -> None:
    state = admitted_log(
        *[(f"m{i}", job().mig("3g.40gb"), 1) for i in range(3)], nodes=1, profile="h100-8x-mig"
    ).fold()
    fold_events(state, decide(state, 1.0))
    assert state.void_total == 0
    slots = [w.gpus[0].mig for j in state.jobs.values() if j.placement for w in j.placement.workers]
    assert all(isinstance(s, MigSlot) and s.start in (0, 4) for s in slots)
    # Packed onto one GPU (two 3g fill it) before slicing a second one.
    gpus = sorted(w.gpus[0].gpu for j in state.jobs.values() if j.placement for w in j.placement.workers)
    assert gpus == [0, 0, 1]


def test_projection_counts_what_this_cycle_placed() -> None:
    """A job placed earlier in the cycle, with no runtime estimate, holds its GPUs in the
    projection too: the head's reservation cannot start when the old job ends."""
    state = reservation_state()
    admit(state, "first", JobSpec(queue="q", resources=Resources(gpus=2), preemptible=False), seq=5)
    state.jobs["first"].priority = 10
    admit(state, "small", JobSpec(queue="q", resources=Resources(gpus=2), runtime_estimate_s=50.0), seq=11)
    events = decide(state, 100.0)
    placed = [p.job_id for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    waiting = {u.job_id: u.reasons for e in events if isinstance(e, JobsUnschedulable) for u in e.jobs}
    assert placed == ["first", "small"]
    # Free only when a job with no runtime estimate ends: a reservation with no start in sight.
    why = waiting["head"][0]
    assert why.code == "reserved-untimed" and "without a runtime estimate" in why.message


def test_reservation_reason_is_stable_across_cycles() -> None:
    state = reservation_state()
    first = decide(state, 100.0)
    fold_events(state, first)
    assert state.jobs["head"].reasons[0].code == "reserved"
    assert decide(state, 200.0) == []  # nothing changed: nothing re-announced


# -- places held for a job back from a planned shutdown, or moved ----------------------------------


@dataclass
class Held:
    """A job admitted again with its place held (kept across a planned shutdown of its node, or
    named by a consolidation's move), what the nodes look like now, and where the cycle puts it."""

    id: str
    nodes: int
    gpus: int  # per worker
    place: list[tuple[str, tuple[int, ...]]]  # rank -> (node, GPUs) it ran on, or is moved to
    at: dict[int, tuple[str, tuple[int, ...]]]  # rank -> where the cycle must put it
    moved: bool = False
    now: Callable[[State], None] = lambda state: None  # what changed since the place was held
    never: set[tuple[str, int | None]] = field(default_factory=set)  # (node, GPU; None: any) it must not get
    placed: bool = True


def _sick(node: str, gpu: int) -> Callable[[State], None]:
    def change(state: State) -> None:
        g = state.nodes[node].gpus[gpu]
        g.healthy, g.signal = False, "xid:79"

    return change


def _cordoned(node: str) -> Callable[[State], None]:
    def change(state: State) -> None:
        state.nodes[node].cordoned = True

    return change


def _relabelled(node: str) -> Callable[[State], None]:
    def change(state: State) -> None:  # registered again in another pool than the job's
        inv = state.nodes[node].inventory
        state.nodes[node].inventory = msgspec.structs.replace(inv, labels={**inv.labels, "pool": "b"})

    return change


N0, N1, N2 = "node-00", "node-01", "node-02"

HELD = [
    Held(
        "kept-on-gpus-2-3-of-an-idle-node: back on 2-3, not the first two free",
        nodes=1,
        gpus=2,
        place=[(N0, (2, 3))],
        at={0: (N0, (2, 3))},
    ),
    Held(
        "a-two-node-gang-kept: back on its two nodes and their GPUs",
        nodes=3,
        gpus=2,
        place=[(N1, (4, 5)), (N2, (6, 7))],
        at={0: (N1, (4, 5)), 1: (N2, (6, 7))},
    ),
    Held(
        "a-gang-with-a-kept-gpu-now-unhealthy: the other worker stays, this one is searched",
        nodes=2,
        gpus=2,
        place=[(N0, (2, 3)), (N1, (2, 3))],
        at={0: (N0, (2, 3))},
        now=_sick(N1, 3),
        never={(N1, 3)},
    ),
    Held(
        "a-gang-with-a-kept-node-now-cordoned: the other worker stays, none goes there",
        nodes=3,
        gpus=2,
        place=[(N0, (2, 3)), (N1, (2, 3))],
        at={0: (N0, (2, 3))},
        now=_cordoned(N1),
        never={(N1, None)},
    ),
    Held(
        "one-worker-with-a-kept-gpu-now-unhealthy: searched as ever, never on that GPU",
        nodes=1,
        gpus=2,
        place=[(N0, (2, 3))],
        at={},
        now=_sick(N0, 3),
        never={(N0, 3)},
    ),
    Held(
        "kept-on-a-node-now-in-another-pool: not placed there, whatever is free",
        nodes=1,
        gpus=2,
        place=[(N0, (2, 3))],
        at={},
        now=_relabelled(N0),
        placed=False,
    ),
    Held(
        "moved-to-gpus-6-7: lands on the place its move named",
        nodes=2,
        gpus=2,
        place=[(N1, (6, 7))],
        at={0: (N1, (6, 7))},
        moved=True,
    ),
]


def held_state(case: Held) -> State:
    """``case``'s nodes, and its job ``back`` admitted with its place held; every node in pool
    ``a``, which the job asks for."""
    state = cluster_state(case.nodes)
    for node in state.nodes.values():
        node.inventory = msgspec.structs.replace(
            node.inventory, labels={**node.inventory.labels, "pool": "a"}
        )
    spec = JobSpec(
        queue="q",
        replicas=len(case.place),
        resources=Resources(gpus=case.gpus),
        node_selector={"pool": "a"},
        preemptible=False,
    )
    j = JobState(id="back", tenant="t", spec=spec, submitted_seq=5, submitted_at=0.0, phase="admitted")
    j.admission = Admission("back", 0, len(case.place))
    place = Placement(
        "back",
        0,
        tuple(WorkerSlot(r, n, tuple(GpuClaim(g) for g in gpus)) for r, (n, gpus) in enumerate(case.place)),
    )
    if case.moved:
        j.moved_to, j.preempted_for = place, "gone"  # its move's beneficiary, placed and ended
    else:
        j.kept_place = place
    indexes.add(state, j)
    case.now(state)
    return state


@pytest.mark.parametrize("case", HELD, ids=[c.id.split(":")[0] for c in HELD])
def test_a_job_with_its_place_held_lands_on_those_very_gpus(case: Held) -> None:
    state = held_state(case)
    events = decide(state, 100.0)
    placed = {p.job_id: p for e in events if isinstance(e, JobsPlaced) for p in e.placements}
    assert ("back" in placed) is case.placed
    if not case.placed:
        return
    got = {w.rank: (w.node, tuple(c.gpu for c in w.gpus)) for w in placed["back"].workers}
    assert sorted(got) == list(range(len(case.place)))
    assert {r: got[r] for r in case.at} == case.at
    for node, gpus in got.values():
        assert (node, None) not in case.never and not {(node, g) for g in gpus} & case.never
    fold_events(state, events)
    assert state.void_total == 0 and state.jobs["back"].phase == "placed"
