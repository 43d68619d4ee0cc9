"""GPU, CPU and memory arithmetic of placements: checking a gang's claims against the state,
taking them, and giving them back. The fold uses it to arbitrate placement proposals; the placer
uses the same checks so that what it proposes is what the fold accepts."""

from __future__ import annotations

from events.base import Reason
from events.decisions import GpuClaim, Placement
from events.jobs import Resources
from projections import mig
from projections.state import WHOLE, JobState, MigInstance, NodeState, State


class ClaimError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.reason = Reason(code, message)


def claim_milli(gpu_model: str, claim: GpuClaim) -> int:
    """How much of a GPU a claim takes, in milli-GPU; a MIG slot counts its memory share."""
    if claim.mig is None:
        return claim.milli
    p = mig.profile(gpu_model, claim.mig.profile)
    return 0 if p is None else p.size * WHOLE // mig.SLICES


def check_worker_shape(res: Resources, claims: tuple[GpuClaim, ...]) -> None:
    """A worker's claims must be exactly what the job asked for: no more, no less."""
    if res.mig is not None:
        if len(claims) != 1 or claims[0].mig is None or claims[0].mig.profile != res.mig:
            raise ClaimError("shape", f"each worker needs one MIG {res.mig} instance")
        return
    if res.gpus == 1 and 0 < res.gpu_milli < WHOLE:
        if len(claims) != 1 or claims[0].mig is not None or claims[0].milli != res.gpu_milli:
            raise ClaimError("shape", f"each worker needs {res.gpu_milli} milli-GPU of one GPU")
        return
    if len(claims) != res.gpus or any(c.milli != WHOLE or c.mig is not None for c in claims):
        raise ClaimError("shape", f"each worker needs {res.gpus} whole GPUs")
    if len({c.gpu for c in claims}) != len(claims):
        raise ClaimError("shape", "a worker names the same GPU twice")


def check(state: State, job: JobState, placement: Placement) -> None:
    """Raise ClaimError unless every claim of ``placement`` can be taken right now."""
    spec = job.spec
    res = spec.resources
    ranks = sorted(w.rank for w in placement.workers)
    want = job.admission.replicas if job.admission is not None else spec.replicas
    if ranks != list(range(want)):
        raise ClaimError("gang", f"placement names ranks {ranks}, the gang is ranks 0..{want - 1}")
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    taken: dict[tuple[str, int], list[GpuClaim]] = {}
    for w in placement.workers:
        node = state.nodes.get(w.node)
        if node is None:
            raise ClaimError("node", f"node {w.node} is not registered")
        if not node.schedulable:
            raise ClaimError("node", f"node {w.node} is {_node_condition(node)}")
        if any(node.inventory.labels.get(k) != v for k, v in spec.node_selector.items()):
            raise ClaimError("labels", f"node {w.node} lacks the labels the job selects")
        check_worker_shape(res, w.gpus)
        cpu[w.node] = cpu.get(w.node, 0) + res.cpu_milli
        mem[w.node] = mem.get(w.node, 0) + res.memory_mib
        for c in w.gpus:
            taken.setdefault((w.node, c.gpu), []).append(c)
    for name, need in cpu.items():
        node = state.nodes[name]
        if node.cpu_used + need > node.inventory.cpu_milli:
            raise ClaimError("cpu", f"node {name} has not {need} milli-CPU free")
        if node.memory_used + mem[name] > node.inventory.memory_mib:
            raise ClaimError("memory", f"node {name} has not {mem[name]} MiB free")
    for (name, index), claims in taken.items():
        _check_gpu(state.nodes[name], index, claims, res)


def _node_condition(node: NodeState) -> str:
    return "cordoned" if node.cordoned else node.condition


def _check_gpu(node: NodeState, index: int, claims: list[GpuClaim], res: Resources) -> None:
    if not 0 <= index < len(node.gpus):
        raise ClaimError("gpu", f"node {node.name} has no GPU {index}")
    gpu = node.gpus[index]
    where = f"GPU {index} of {node.name}"
    if not gpu.healthy:
        raise ClaimError("unhealthy", f"{where} is unhealthy ({gpu.signal or 'reported bad'})")
    if res.gpu_models and gpu.info.model not in res.gpu_models:
        raise ClaimError("model", f"{where} is a {gpu.info.model}")
    if gpu.info.memory_mib < res.min_gpu_memory_mib:
        raise ClaimError("gpu-memory", f"{where} has {gpu.info.memory_mib} MiB")
    if gpu.info.mig:
        used = gpu.mig_used
        me = any(i.profile.endswith("+me") for i in gpu.mig.values())
        for c in claims:
            if c.mig is None:
                raise ClaimError("mig", f"{where} is in MIG mode; it is shared by MIG instances only")
            if not mig.fits(gpu.info.model, c.mig.profile, c.mig.start, used):
                raise ClaimError("mig", f"MIG {c.mig.profile} cannot start at slice {c.mig.start} on {where}")
            if c.mig.profile.endswith("+me"):
                if me:
                    raise ClaimError("mig", f"{where} already has its one +me instance")
                me = True
            p = mig.profile(gpu.info.model, c.mig.profile)
            assert p is not None
            used |= mig.mask(p, c.mig.start)
        return
    if any(c.mig is not None for c in claims):
        raise ClaimError("mig", f"{where} is not in MIG mode")
    need = sum(c.milli for c in claims)
    if any(c.milli == WHOLE for c in claims) and (len(claims) > 1 or gpu.holders):
        raise ClaimError("busy", f"{where} is not free")
    if gpu.used_milli + need > WHOLE:
        raise ClaimError("busy", f"{where} has {gpu.free_milli} milli-GPU free, not {need}")


def take(state: State, job: JobState, placement: Placement) -> None:
    res = job.spec.resources
    for w in placement.workers:
        node = state.nodes[w.node]
        node.cpu_used += res.cpu_milli
        node.memory_used += res.memory_mib
        for c in w.gpus:
            gpu = node.gpus[c.gpu]
            m = claim_milli(gpu.info.model, c)
            gpu.used_milli += m
            gpu.holders[job.id] = gpu.holders.get(job.id, 0) + m
            if c.mig is not None:
                p = mig.profile(gpu.info.model, c.mig.profile)
                assert p is not None
                gpu.mig_used |= mig.mask(p, c.mig.start)
                gpu.mig[c.mig.start] = MigInstance(job.id, c.mig.profile)
    job.held = placement


def release(state: State, job: JobState) -> None:
    """Give back everything the job holds. Tolerates nodes that re-registered meanwhile."""
    placement = job.held
    if placement is None:
        return
    res = job.spec.resources
    for w in placement.workers:
        node = state.nodes.get(w.node)
        if node is None:
            continue
        node.cpu_used = max(0, node.cpu_used - res.cpu_milli)
        node.memory_used = max(0, node.memory_used - res.memory_mib)
        for c in w.gpus:
            if not 0 <= c.gpu < len(node.gpus):
                continue
            gpu = node.gpus[c.gpu]
            held = gpu.holders.pop(job.id, 0)
            gpu.used_milli = max(0, gpu.used_milli - held)
            inst = gpu.mig.get(c.mig.start) if c.mig is not None else None
            if c.mig is not None and inst is not None and inst.job_id == job.id:
                p = mig.profile(gpu.info.model, c.mig.profile)
                if p is not None:
                    gpu.mig_used &= ~mig.mask(p, c.mig.start)
                del gpu.mig[c.mig.start]
    job.held = None
