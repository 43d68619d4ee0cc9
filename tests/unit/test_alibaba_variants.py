"""The openb pod-list family built from the default list: each variant is the same list on every
build, has the property its name promises in the artifact's own terms (share of GPU demand for
multigpu and gpushare, share of GPU pods for gpuspec, per mille of all pods for cpu), leaves the
rest of the workload as the default has it, and replays through FGD and corral with the fold's
own arithmetic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.projections.placement.plugins.fragmentation import TaskShape
from corral.services.sim import alibaba
from corral.services.sim import alibaba_variants as variants

TRACE = Path("/work/shared/traces/alibaba-gpu-2023")
NODES_CSV = TRACE / "openb_node_list_gpu_node.csv"
PODS_CSV = TRACE / "openb_pod_list_default.csv"

pytestmark = pytest.mark.skipif(not NODES_CSV.exists(), reason="the Alibaba trace is not available")

Trace = tuple[list[alibaba.TraceNode], list[alibaba.Pod]]


@pytest.fixture(scope="module")
def trace() -> Trace:
    return alibaba.load_nodes(NODES_CSV), alibaba.load_pods(PODS_CSV)


Kind = Callable[[alibaba.Pod], bool]


def shapes(pods: list[alibaba.Pod], keep: Kind | None = None) -> Counter[tuple[int, int, TaskShape]]:
    return Counter((p.cpu_milli, p.memory_mib, p.shape) for p in pods if keep is None or keep(p))


def share(pods: list[alibaba.Pod], kind: Kind) -> float:
    """Percent of the GPU demand asked by pods of ``kind``."""
    return 100 * variants.gpu_demand([p for p in pods if kind(p)]) / variants.gpu_demand(pods)


def not_gpu(p: alibaba.Pod) -> bool:
    return not variants.is_gpu(p)


@pytest.mark.parametrize("name", variants.FAMILY)
def test_every_variant_is_the_same_list_on_every_build(name: str, trace: Trace) -> None:
    nodes, pods = trace
    built = variants.build(name, pods, nodes)
    assert variants.build(name, pods, nodes) == built
    assert len({p.name for p in built}) == len(built)  # names stay unique: the replay sorts by them
    if name != variants.DEFAULT:
        assert built != pods


@pytest.mark.parametrize("pct", variants.MULTIGPU)
def test_multigpu_adds_multi_gpu_pods_up_to_their_share_of_gpu_demand(pct: int, trace: Trace) -> None:
    nodes, pods = trace
    built = variants.build(f"multigpu{pct}", pods, nodes)
    assert built[: len(pods)] == pods  # every default pod stays, as it was
    added = built[len(pods) :]
    assert added and all(variants.is_multi(p) for p in added)
    assert set(shapes(added)) <= set(shapes(pods, variants.is_multi))  # sizes from the default's own
    assert pct <= share(built, variants.is_multi) < pct + 1
    assert share(pods, variants.is_multi) < 10  # the default is far below any of them


@pytest.mark.parametrize("pct", variants.GPUSHARE)
def test_gpushare_redraws_gpu_pods_to_the_shared_share_of_gpu_demand(pct: int, trace: Trace) -> None:
    nodes, pods = trace
    built = variants.build(f"gpushare{pct}", pods, nodes)
    assert abs(share(built, variants.is_shared) - pct) < 0.5
    gpu = [p for p in built if variants.is_gpu(p)]
    assert len(gpu) == sum(1 for p in pods if variants.is_gpu(p))
    assert set(shapes(gpu)) <= set(shapes(pods, variants.is_gpu))
    assert shapes(built, not_gpu) == shapes(pods, not_gpu)


@pytest.mark.parametrize("pct", variants.GPUSPEC)
def test_gpuspec_constrains_that_share_of_gpu_pods_to_models_that_can_hold_them(
    pct: int, trace: Trace
) -> None:
    nodes, pods = trace
    built = variants.build(f"gpuspec{pct:02d}", pods, nodes)
    gpu = [p for p in built if variants.is_gpu(p)]
    constrained = [p for p in gpu if p.shape.models]
    assert len(constrained) == round(pct * len(gpu) / 100)
    mix = {frozenset(s.split("|")) for s, _ in variants.SPEC_MIX}
    assert all(p.shape.models in mix and variants.can_hold(nodes, p.shape.models, p) for p in constrained)
    # Nothing else changes: the same pods, names and requests, constraint aside.
    plain = [
        alibaba.Pod(p.name, p.cpu_milli, p.memory_mib, p.shape._replace(models=frozenset())) for p in built
    ]
    assert plain == pods


def test_gpuspec_follows_the_production_mix(trace: Trace) -> None:
    nodes, pods = trace
    built = variants.build("gpuspec33", pods, nodes)
    seen = Counter(p.shape.models for p in built if p.shape.models)
    assert seen.most_common(1)[0][0] == frozenset({"T4"})  # over half the constraints, as published
    assert 0.45 < seen[frozenset({"T4"})] / sum(seen.values()) < 0.6


@pytest.mark.parametrize("per_mille", variants.CPU)
def test_cpu_sets_the_share_of_cpu_only_pods(per_mille: int, trace: Trace) -> None:
    nodes, pods = trace
    built = variants.build(f"cpu{per_mille:03d}" if per_mille else "cpu0", pods, nodes)
    cpu_only = [p for p in built if not variants.is_gpu(p)]
    assert abs(1000 * len(cpu_only) / len(built) - per_mille) < 0.5
    assert shapes(built, variants.is_gpu) == shapes(pods, variants.is_gpu)
    assert set(shapes(cpu_only)) <= set(shapes(pods, not_gpu))


def test_an_unknown_variant_names_the_known_ones(trace: Trace) -> None:
    nodes, pods = trace
    with pytest.raises(ValueError, match="multigpu50"):
        variants.build("multigpu60", pods, nodes)


def test_a_list_without_what_a_recipe_draws_from_is_refused(trace: Trace) -> None:
    nodes, pods = trace
    single = [p for p in pods if not variants.is_multi(p)]
    with pytest.raises(ValueError, match="no multi-GPU pods"):
        variants.build("multigpu20", single, nodes)


@pytest.mark.parametrize("name", ["multigpu50", "gpushare100", "gpuspec33", "cpu300"])
def test_a_variant_replays_through_fgd_and_corral(name: str, trace: Trace) -> None:
    """A slice of each kind of variant through both policies, every placement checked against the
    fold's own check and take (GPU-model constraints included): the same arrivals, both place."""
    nodes, pods = trace
    built = variants.build(name, pods, nodes)
    curves = {
        p: alibaba.replay(nodes, built, p, 42, verify=True, limit=1500) for p in ("FGD", alibaba.CORRAL)
    }
    assert curves["FGD"].pods == curves[alibaba.CORRAL].pods == 1500
    for c in curves.values():
        assert c.placed > 1000 and c.bins
