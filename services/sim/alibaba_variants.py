"""The openb pod-list family: workloads derived from the default list, as the FGD artifact has them.

Alibaba's ``cluster-trace-gpu-v2023`` publishes, beside ``openb_pod_list_default``, pod lists
"sampled from the default one, emphasizing certain types of workloads" and lists that "augment
tasks with GPU type requirements" (its README). They are not in ``shared/traces``, so they are
built here from the default list, deterministically (one fixed seed per variant name), by the
recipe the published files show (their counts and shares, measured file by file):

- ``multigpuN`` (20, 30, 40, 50): every default pod stays; multi-GPU pods drawn uniformly, with
  replacement, from the default's 75 multi-GPU pods are appended until multi-GPU pods ask for
  N % of the list's GPU demand (milli-GPU). The published lists stop at 20.4, 30.2, 40.2, 50.3 %.
- ``gpushareN`` (20, 40, 60, 80, 100): the CPU-only pods stay and the number of GPU pods stays
  (7,064); the GPU pods are redrawn, with replacement, shared ones from the default's shared pods
  and the others from its whole-GPU pods, as many shared ones as puts shared pods' GPU demand
  closest to N % (the published lists: 20.0, 40.1, 60.0, 80.0, 100 %).
- ``gpuspecN`` (5, 10, 20, 25, 33): the same pods; N % of the GPU pods, chosen uniformly, get a
  GPU-model constraint. The constraint is drawn from the production mix the artifact uses (the
  published ``gpuspec33``: T4 54 %, G2 14 %, P100 12 %, ...), among the constraints whose models
  have a node that could hold the pod on an empty cluster; as in the published lists no
  constraint makes a pod unplaceable. "About 33 % of GPU tasks in our production cluster have
  GPU type constraints" (the README), so ``gpuspec33`` is the production case.
- ``cpuN`` (0, 37, 50, 72, 100, 200, 235, 250, 300 per mille): the GPU pods stay; CPU-only pods
  make up N per mille of all pods (the default has 133), drawn from the default's CPU-only pods:
  a subset without replacement when fewer, draws with replacement when more.

Redrawn lists are shuffled and renamed ``openb-pod-NNNN`` as the published ones are; lists that
keep the default pods keep their names. The replay's protocol does not change: sorted by name,
shuffled with the replay seed, inflated to 1.3x the cluster's GPU capacity with clones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from corral.projections.placement.plugins.fragmentation import WHOLE
from corral.services.sim.alibaba import Pod, TraceNode

DEFAULT = "default"

# The GPU-model constraints of the published gpuspec33 list and how many of its pods carry each:
# the mix of the production cluster, which the artifact reuses for every gpuspec list. A model
# the published list names twice in one constraint (``V100M16|V100M32|V100M32``) is counted once.
SPEC_MIX: tuple[tuple[str, int], ...] = (
    ("T4", 1291),
    ("G2", 331),
    ("P100", 279),
    ("V100M16|V100M32", 163),
    ("P100|V100M16|V100M32", 103),
    ("G3", 86),
    ("G2|P100|T4|V100M16|V100M32", 39),
    ("P100|T4|V100M16|V100M32", 33),
    ("A10|G2|T4|V100M16|V100M32", 24),
    ("V100M32", 20),
    ("A10|T4", 6),
    ("P100|V100M16", 4),
    ("A10|G2|P100|T4|V100M16|V100M32", 3),
    ("T4|V100M16|V100M32", 3),
    ("V100M16", 3),
)

MULTIGPU = (20, 30, 40, 50)
GPUSHARE = (20, 40, 60, 80, 100)
GPUSPEC = (5, 10, 20, 25, 33)
CPU = (0, 37, 50, 72, 100, 200, 235, 250, 300)


# -- what a pod is -----------------------------------------------------------------------------------


def is_gpu(p: Pod) -> bool:
    return p.shape.gpus > 0


def is_multi(p: Pod) -> bool:
    return p.shape.gpus > 1


def is_shared(p: Pod) -> bool:
    return p.shape.gpus == 1 and p.shape.gpu_milli < WHOLE


def gpu_demand(pods: Sequence[Pod]) -> int:
    return sum(p.gpu_milli_total for p in pods)


def _pool(pods: Sequence[Pod], keep: Callable[[Pod], bool], what: str) -> list[Pod]:
    out = [p for p in pods if keep(p)]
    if not out:
        raise ValueError(f"the pod list has no {what} pods to draw from")
    return out


def _renamed(pods: Sequence[Pod], start: int = 0) -> list[Pod]:
    return [Pod(f"openb-pod-{start + i:04d}", p.cpu_milli, p.memory_mib, p.shape) for i, p in enumerate(pods)]


# -- the recipes -------------------------------------------------------------------------------------


def multigpu(pods: Sequence[Pod], pct: int, rng: random.Random) -> list[Pod]:
    """Append multi-GPU pods drawn from the list's own until they ask for ``pct`` % of its GPU
    demand."""
    multi = _pool(pods, is_multi, "multi-GPU")
    total, heavy = gpu_demand(pods), gpu_demand(multi)
    extra: list[Pod] = []
    while heavy * 100 < pct * total:
        p = multi[rng.randrange(len(multi))]
        extra.append(p)
        heavy += p.gpu_milli_total
        total += p.gpu_milli_total
    return [*pods, *_renamed(extra, start=len(pods))]


def gpushare(pods: Sequence[Pod], pct: int, rng: random.Random) -> list[Pod]:
    """Redraw the GPU pods, as many as before, so that shared pods ask for ``pct`` % of the GPU
    demand; the CPU-only pods stay."""
    shared = _pool(pods, is_shared, "shared-GPU")
    whole = _pool(pods, lambda p: is_gpu(p) and not is_shared(p), "whole-GPU")
    n = len(shared) + len(whole)
    # Two draw streams; k shared pods from the first and n - k whole ones from the second, with
    # the k whose shared share of GPU demand is closest to pct.
    s_draws = [shared[rng.randrange(len(shared))] for _ in range(n)]
    w_draws = [whole[rng.randrange(len(whole))] for _ in range(n)]
    s_sum = [0]
    for p in s_draws:
        s_sum.append(s_sum[-1] + p.gpu_milli_total)
    w_sum = [0]
    for p in w_draws:
        w_sum.append(w_sum[-1] + p.gpu_milli_total)

    def miss(k: int) -> float:
        both = s_sum[k] + w_sum[n - k]
        return abs(s_sum[k] / both - pct / 100) if both else 1.0

    k = min(range(n + 1), key=miss)
    out = [p for p in pods if not is_gpu(p)] + s_draws[:k] + w_draws[: n - k]
    rng.shuffle(out)
    return _renamed(out)


def can_hold(nodes: Sequence[TraceNode], models: frozenset[str], p: Pod) -> bool:
    """Some node of an accepted model could hold ``p`` on an empty cluster."""
    s = p.shape
    return any(
        n.model in models and n.gpus >= s.gpus and n.cpu_milli >= p.cpu_milli and n.memory_mib >= p.memory_mib
        for n in nodes
    )


def gpuspec(pods: Sequence[Pod], nodes: Sequence[TraceNode], pct: int, rng: random.Random) -> list[Pod]:
    """Give ``pct`` % of the GPU pods a GPU-model constraint from the production mix."""
    gpu = [i for i, p in enumerate(pods) if is_gpu(p)]
    chosen = rng.sample(gpu, round(pct * len(gpu) / 100))
    specs = [frozenset(s.split("|")) for s, _ in SPEC_MIX]
    weights = [w for _, w in SPEC_MIX]
    out = list(pods)
    for i in sorted(chosen):
        p = pods[i]
        fits = [k for k, models in enumerate(specs) if can_hold(nodes, models, p)]
        k = rng.choices(fits, weights=[weights[k] for k in fits])[0]
        out[i] = Pod(p.name, p.cpu_milli, p.memory_mib, p.shape._replace(models=specs[k]))
    return out


def cpu(pods: Sequence[Pod], per_mille: int, rng: random.Random) -> list[Pod]:
    """Keep the GPU pods; CPU-only pods drawn from the list's own make up ``per_mille`` of all."""
    gpu = [p for p in pods if is_gpu(p)]
    cpu_only = _pool(pods, lambda p: not is_gpu(p), "CPU-only") if per_mille else []
    want = round(len(gpu) * per_mille / (1000 - per_mille))
    if want <= len(cpu_only):
        drawn = rng.sample(cpu_only, want)
    else:
        drawn = [cpu_only[rng.randrange(len(cpu_only))] for _ in range(want)]
    out = gpu + drawn
    rng.shuffle(out)
    return _renamed(out)


# -- by name -------------------------------------------------------------------------------------------


Recipe = Callable[[Sequence[Pod], Sequence[TraceNode], random.Random], list[Pod]]


def _recipe(kind: str, n: int) -> Recipe:
    def make(pods: Sequence[Pod], nodes: Sequence[TraceNode], rng: random.Random) -> list[Pod]:
        if kind == "multigpu":
            return multigpu(pods, n, rng)
        if kind == "gpushare":
            return gpushare(pods, n, rng)
        if kind == "gpuspec":
            return gpuspec(pods, nodes, n, rng)
        return cpu(pods, n, rng)

    return make


RECIPES: dict[str, Recipe] = {
    **{f"multigpu{n}": _recipe("multigpu", n) for n in MULTIGPU},
    **{f"gpushare{n}": _recipe("gpushare", n) for n in GPUSHARE},
    **{f"gpuspec{n:02d}": _recipe("gpuspec", n) for n in GPUSPEC},
    **{(f"cpu{n:03d}" if n else "cpu0"): _recipe("cpu", n) for n in CPU},
}
FAMILY: tuple[str, ...] = (DEFAULT, *RECIPES)


def build(name: str, pods: Sequence[Pod], nodes: Sequence[TraceNode]) -> list[Pod]:
    """The pod list ``name`` of the family, derived from the default list ``pods`` on ``nodes``.

    The seed is the variant's name, so a variant is the same list on every run and machine
    (Python seeds ``random.Random`` from a string by its SHA-512)."""
    if name == DEFAULT:
        return list(pods)
    recipe = RECIPES.get(name)
    if recipe is None:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(FAMILY)}")
    return recipe(pods, nodes, random.Random(f"openb-{name}"))
