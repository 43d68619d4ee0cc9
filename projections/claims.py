"""GPU, CPU and memory arithmetic of placements: checking a gang's claims against the state,
taking them, and giving them back. The fold uses it to arbitrate placement proposals; the placer
uses the same checks so that what it proposes is what the fold accepts. What a job holds
(``JobState.held``) changes only here and through ``indexes.hold``, which keeps the index of the
jobs holding GPUs on each node."""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping, Sequence

import msgspec

from corral.events.base import Reason
from corral.events.decisions import GpuClaim, MigSlot, Placement, WorkerSlot
from corral.events.jobs import Resources
from corral.projections import indexes, mig, shape
from corral.projections.state import WHOLE, GpuState, JobState, MigInstance, NodeState, State


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


_gpu_index = operator.attrgetter("gpu")


def check_worker_shape(
    res: Resources, claims: tuple[GpuClaim, ...], k: shape.ShapeKind | None = None
) -> None:
    """A worker's claims must be exactly what the job asked for: no more, no less. (``k``: the
    shape's kind, when the caller has it: a gang's checks read it once for all its workers.)"""
    if k is None:
        k = shape.kind(res)
    if k == "mig":
        if len(claims) != 1 or claims[0].mig is None or claims[0].mig.profile != res.mig:
            raise ClaimError("shape", f"each worker needs one MIG {res.mig} instance")
        return
    if k == "fraction":
        if len(claims) != 1 or claims[0].mig is not None or claims[0].milli != res.gpu_milli:
            raise ClaimError("shape", f"each worker needs {res.gpu_milli} milli-GPU of one GPU")
        return
    if len(claims) != res.gpus:
        raise ClaimError("shape", f"each worker needs {res.gpus} whole GPUs")
    for c in claims:
        if c.milli != WHOLE or c.mig is not None:
            raise ClaimError("shape", f"each worker needs {res.gpus} whole GPUs")
    if len(claims) > 1 and len(set(map(_gpu_index, claims))) != len(claims):
        raise ClaimError("shape", "a worker names the same GPU twice")


def check(state: State, job: JobState, placement: Placement) -> None:
    """Raise ClaimError unless every claim of ``placement`` can be taken right now.

    The checks run in three rounds, and the first that fails is the one reported: each worker's
    node, labels and shape; then CPU and memory per node; then each GPU, in the order claimed."""
    _check(state, job, placement)


def place(state: State, job: JobState, placement: Placement) -> None:
    """``check``, then ``take``: the fold's call. A gang of whole idle GPUs, one worker per node
    (the common placement), is taken from what the check looked up, without a second look."""
    checked = _check(state, job, placement)
    if checked is None:
        take(state, job, placement)
        return
    on, idle = checked
    res = job.spec.resources
    cpu, memory = res.cpu_milli, res.memory_mib
    for node in on:
        node.cpu_used += cpu
        node.memory_used += memory
        node.workers += 1
    job_id = job.id
    for gpu in idle:  # as ``take`` does for a whole GPU that nothing holds
        gpu.used_milli += WHOLE
        gpu.holders[job_id] = WHOLE
    indexes.hold(state, job, placement)


def _check(
    state: State, job: JobState, placement: Placement
) -> tuple[list[NodeState], list[GpuState]] | None:
    """``check``; then, if each worker has a node of its own and claims only whole GPUs that
    nothing holds, the workers' nodes and those GPUs (else None: checked all the same)."""
    spec = job.spec
    workers = placement.workers
    want = job.admission.replicas if job.admission is not None else spec.replicas
    in_order = len(workers) == want
    if in_order:
        for i, w in enumerate(workers):
            if w.rank != i:
                in_order = False
                break
    if not in_order:
        ranks = sorted(w.rank for w in workers)
        if ranks != list(range(want)):
            raise ClaimError("gang", f"placement names ranks {ranks}, the gang is ranks 0..{want - 1}")
    return _check_workers(state, job, workers)


def _check_workers(
    state: State, job: JobState, workers: tuple[WorkerSlot, ...]
) -> tuple[list[NodeState], list[GpuState]] | None:
    """``_check`` of the workers themselves, whatever ranks they are."""
    spec = job.spec
    res = shape.placed_resources(job)
    nodes = state.nodes
    selector = spec.node_selector
    k = shape.kind(res)
    whole = k in ("whole", "cpu")
    if len(workers) == 1:  # most jobs: one worker, so the rounds are one after the other
        w = workers[0]
        node = nodes.get(w.node)
        if node is None or not node.schedulable or selector:
            node = _worker_node(nodes, w, selector)
        check_worker_shape(res, w.gpus, k)
        inventory = node.inventory
        if (
            node.cpu_used + res.cpu_milli > inventory.cpu_milli
            or node.memory_used + res.memory_mib > inventory.memory_mib
            or node.workers >= inventory.max_workers
        ):
            _check_room(node, w.node, res.cpu_milli, res.memory_mib, 1)
        idle: list[GpuState] = []
        return ([node], idle) if _check_gpus(node, w.gpus, res, whole, idle) else None
    on = []
    for w in workers:
        on.append(_worker_node(nodes, w, selector))
        check_worker_shape(res, w.gpus, k)
    if len({w.node for w in workers}) != len(workers):
        _check_shared(state, res, workers)
        return None
    # One worker per node, so each (node, GPU) is claimed by one worker, once.
    for node, w in zip(on, workers, strict=True):
        _check_room(node, w.node, res.cpu_milli, res.memory_mib, 1)
    idle = []
    all_idle = True
    for node, w in zip(on, workers, strict=True):
        if not _check_gpus(node, w.gpus, res, whole, idle):
            all_idle = False
    return (on, idle) if all_idle else None


def _worker_node(nodes: dict[str, NodeState], w: WorkerSlot, selector: dict[str, str]) -> NodeState:
    node = nodes.get(w.node)
    if node is None:
        raise ClaimError("node", f"node {w.node} is not registered")
    if not node.schedulable:
        raise ClaimError("node", f"node {w.node} is {node.standing}")
    if selector and any(node.inventory.labels.get(k) != v for k, v in selector.items()):
        raise ClaimError("labels", f"node {w.node} lacks the labels the job selects")
    return node


def _check_room(node: NodeState, name: str, cpu: int, memory: int, workers: int) -> None:
    inventory = node.inventory
    if node.cpu_used + cpu > inventory.cpu_milli:
        raise ClaimError("cpu", f"node {name} has not {cpu} milli-CPU free")
    if node.memory_used + memory > inventory.memory_mib:
        raise ClaimError("memory", f"node {name} has not {memory} MiB free")
    if node.workers + workers > inventory.max_workers:
        why = f"node {name} runs {node.workers} workers, {workers} more is past its {inventory.max_workers}"
        raise ClaimError("workers", why)


def _check_gpus(
    node: NodeState, claims: tuple[GpuClaim, ...], res: Resources, whole: bool, idle: list[GpuState]
) -> bool:
    """Each GPU one worker claims, on a node where no other worker of the gang claims any. True
    if every claim is a whole GPU that nothing holds; those GPUs are added to ``idle``. ``whole``:
    the job's workers take whole GPUs or none (``shape.kind``), so, their shape checked, claim
    only whole GPUs and nothing of MIG."""
    all_idle = True
    gpus = node.gpus
    models = res.gpu_models
    memory = res.min_gpu_memory_mib
    for c in claims:
        # The common claim, a whole idle healthy GPU that suits the job, passes here at once;
        # any other goes through every check, which says what is wrong if anything is.
        i = c.gpu
        if whole and 0 <= i < len(gpus):
            gpu = gpus[i]
            info = gpu.info
            if (
                not gpu.holders
                and gpu.used_milli <= 0
                and gpu.healthy
                and not info.mig
                and info.memory_mib >= memory
                and (not models or info.model in models)
            ):
                idle.append(gpu)
                continue
        _check_gpu(node, i, (c,), res)
        all_idle = False
    return all_idle


def _check_shared(state: State, res: Resources, workers: tuple[WorkerSlot, ...]) -> None:
    """CPU, memory and GPU checks of a gang with several workers on one node: what they claim
    there together must fit."""
    count: dict[str, int] = {}
    taken: dict[tuple[str, int], list[GpuClaim]] = {}
    for w in workers:
        count[w.node] = count.get(w.node, 0) + 1
        for c in w.gpus:
            taken.setdefault((w.node, c.gpu), []).append(c)
    for name, n in count.items():
        _check_room(state.nodes[name], name, res.cpu_milli * n, res.memory_mib * n, n)
    for (name, index), claims in taken.items():
        _check_gpu(state.nodes[name], index, claims, res)


def _where(node: NodeState, index: int) -> str:
    return f"GPU {index} of {node.name}"


def _check_gpu(node: NodeState, index: int, claims: Sequence[GpuClaim], res: Resources) -> None:
    # Messages are composed only when a check fails: this runs for every GPU a placement claims.
    if not 0 <= index < len(node.gpus):
        raise ClaimError("gpu", f"node {node.name} has no GPU {index}")
    gpu = node.gpus[index]
    if not gpu.healthy:
        raise ClaimError("unhealthy", f"{_where(node, index)} is unhealthy ({gpu.signal or 'reported bad'})")
    if gpu.held_in_other_mode:
        raise ClaimError("busy", f"{_where(node, index)} is held by work of the mode it left")
    info = gpu.info
    if res.gpu_models and info.model not in res.gpu_models:
        raise ClaimError("model", f"{_where(node, index)} is a {info.model}")
    if info.memory_mib < res.min_gpu_memory_mib:
        raise ClaimError("gpu-memory", f"{_where(node, index)} has {info.memory_mib} MiB")
    if info.mig:
        _check_mig(node, index, claims)
        return
    need = 0
    whole = False
    for c in claims:
        if c.mig is not None:
            raise ClaimError("mig", f"{_where(node, index)} is not in MIG mode")
    for c in claims:
        need += c.milli
        if c.milli == WHOLE:
            whole = True
    if whole and (len(claims) > 1 or gpu.holders):
        raise ClaimError("busy", f"{_where(node, index)} is not free")
    if gpu.used_milli + need > WHOLE:
        raise ClaimError("busy", f"{_where(node, index)} has {gpu.free_milli} milli-GPU free, not {need}")


def _check_mig(node: NodeState, index: int, claims: Sequence[GpuClaim]) -> None:
    gpu = node.gpus[index]
    model = gpu.info.model
    used = gpu.mig_used
    me = any(i.profile.endswith("+me") for i in gpu.mig.values())
    for c in claims:
        slot = c.mig
        if slot is None:
            where = _where(node, index)
            raise ClaimError("mig", f"{where} is in MIG mode; it is shared by MIG instances only")
        if not mig.fits(model, slot.profile, slot.start, used):
            raise ClaimError(
                "mig", f"MIG {slot.profile} cannot start at slice {slot.start} on {_where(node, index)}"
            )
        if slot.profile.endswith("+me"):
            if me:
                raise ClaimError("mig", f"{_where(node, index)} already has its one +me instance")
            me = True
        p = mig.profile(model, slot.profile)
        assert p is not None
        used |= mig.mask(p, slot.start)


def take(state: State, job: JobState, placement: Placement) -> None:
    """Take every claim of ``placement``, unchecked: ``job`` holds it."""
    _take(state, job, placement.workers)
    indexes.hold(state, job, placement)


def _take(state: State, job: JobState, workers: tuple[WorkerSlot, ...]) -> None:
    res = job.spec.resources
    job_id = job.id
    nodes = state.nodes
    cpu, memory = res.cpu_milli, res.memory_mib
    for w in workers:
        node = nodes[w.node]
        node.cpu_used += cpu
        node.memory_used += memory
        node.workers += 1
        gpus = node.gpus
        for c in w.gpus:
            gpu = gpus[c.gpu]
            if c.mig is not None:
                _take_mig(gpu, c, job_id)
                continue
            m = c.milli
            gpu.used_milli += m
            holders = gpu.holders
            if job_id in holders:
                holders[job_id] += m
            else:
                holders[job_id] = m


def _take_mig(gpu: GpuState, c: GpuClaim, job_id: str) -> None:
    assert c.mig is not None
    m = claim_milli(gpu.info.model, c)
    gpu.used_milli += m
    gpu.holders[job_id] = gpu.holders.get(job_id, 0) + m
    p = mig.profile(gpu.info.model, c.mig.profile)
    assert p is not None
    taken = mig.mask(p, c.mig.start)
    gpu.mig_used |= taken
    gpu.mig[c.mig.start] = MigInstance(job_id, c.mig.profile, taken, m)


def release(state: State, job: JobState) -> None:
    """Give back everything the job holds. Tolerates nodes that re-registered meanwhile."""
    placement = job.held
    if placement is None:
        return
    res = job.spec.resources
    job_id = job.id
    nodes = state.nodes
    cpu, memory = res.cpu_milli, res.memory_mib
    for w in placement.workers:
        node = nodes.get(w.node)
        if node is None:
            continue
        left = node.cpu_used - cpu
        node.cpu_used = left if left > 0 else 0
        left = node.memory_used - memory
        node.memory_used = left if left > 0 else 0
        node.workers = node.workers - 1 if node.workers > 0 else 0
        gpus = node.gpus
        n = len(gpus)
        for c in w.gpus:
            i = c.gpu
            if i >= n or i < 0:
                continue
            gpu = gpus[i]
            held = gpu.holders.pop(job_id, None)
            if held is not None:
                left = gpu.used_milli - held
                gpu.used_milli = left if left > 0 else 0
            elif gpu.used_milli < 0:
                gpu.used_milli = 0
            if c.mig is not None:
                _release_mig(gpu, c.mig, job_id)
    indexes.hold(state, job, None)


def claimed(placement: Placement | None) -> frozenset[tuple[str, int]]:
    """The GPUs a placement claims, by node and index (none for None)."""
    if placement is None:
        return frozenset()
    return frozenset((w.node, c.gpu) for w in placement.workers for c in w.gpus)


def nodes_of(placement: Placement | None) -> frozenset[str]:
    """The nodes a placement's workers are on (none for None)."""
    if placement is None:
        return frozenset()
    return frozenset(w.node for w in placement.workers)


def relayout(
    nodes: Mapping[str, NodeState],
    seq: int,
    gone: Sequence[JobState] = (),
    shrunk: Sequence[tuple[JobState, int]] = (),
    placed: Sequence[tuple[JobState, Placement]] = (),
) -> State:
    """The nodes a change of layout touches, as they would stand after it: copies of them (from
    ``nodes``) with the jobs ``gone`` holding nothing, each ``shrunk`` job holding only its first
    ranks, then each of ``placed`` checked and taken in order. Raise ClaimError at the first
    placement that does not hold. ``nodes`` is never touched. The fold judges a preemption that
    moves jobs by it, and the preemptor checks its proposals with it before it makes them."""
    names = {w.node for job in gone if job.held is not None for w in job.held.workers}
    names |= {w.node for job, _ in shrunk if job.held is not None for w in job.held.workers}
    names |= {w.node for _, p in placed for w in p.workers}
    trial = State(seq=seq, nodes={})
    for name in sorted(names):
        src = nodes.get(name)
        if src is not None:
            trial.nodes[name] = copy.deepcopy(src)
    for job in gone:
        release(trial, msgspec.structs.replace(job))
    for job, keep in shrunk:
        assert job.held is not None
        shadow = msgspec.structs.replace(job)
        release(trial, shadow)
        kept = tuple(w for w in job.held.workers if w.rank < keep)
        take(trial, shadow, Placement(job.id, job.attempt, kept))
    for job, placement in placed:
        shadow = msgspec.structs.replace(job, held=None)
        check(trial, shadow, placement)
        take(trial, shadow, placement)
    return trial


def grow(state: State, job: JobState, placement: Placement) -> None:
    """Take the GPUs of the ranks ``placement`` adds to a running job: its admitted ranks
    ``0..n-1``, the first of them the workers the job holds, unchanged. Raise ClaimError (taking
    nothing) unless every added claim can be taken now."""
    held = job.held
    want = job.admission.replicas if job.admission is not None else 0
    if held is None or placement.attempt != held.attempt:
        raise ClaimError("gang", f"job {job.id} holds no GPUs of attempt {placement.attempt}")
    workers = tuple(sorted(placement.workers, key=lambda w: w.rank))
    ranks = [w.rank for w in workers]
    if ranks != list(range(want)):
        raise ClaimError("gang", f"placement names ranks {ranks}, the grown gang is ranks 0..{want - 1}")
    kept = len(held.workers)
    if kept >= want or workers[:kept] != tuple(sorted(held.workers, key=lambda w: w.rank)):
        why = f"a growth of {job.id} keeps its {kept} workers where they are and adds some"
        raise ClaimError("gang", why)
    added = workers[kept:]
    _check_workers(state, job, added)
    _take(state, job, added)
    indexes.hold(state, job, placement)


def slot_of(placement: Placement, rank: int) -> WorkerSlot | None:
    """The worker of ``rank`` in ``placement``: the fold's one look-up of a rank. The placer
    lists a gang's ranks in order, so it is looked for at its own index first: every start and
    exit of a gang of n workers walked the list, n² in all. A placement may list them in any
    order (each rank once: the fold refuses any other), so one elsewhere is found by the walk."""
    workers = placement.workers
    if 0 <= rank < len(workers):
        w = workers[rank]
        if w.rank == rank:
            return w
    for w in workers:
        if w.rank == rank:
            return w
    return None


def release_rank(state: State, job: JobState, rank: int) -> None:
    """Give back what one worker of the job holds (an elastic job's rank that left); the job
    keeps the rest."""
    held = job.held
    if held is None:
        return
    slot = slot_of(held, rank)
    if slot is None:
        return
    res = job.spec.resources
    node = state.nodes.get(slot.node)
    if node is not None:
        node.cpu_used = max(0, node.cpu_used - res.cpu_milli)
        node.memory_used = max(0, node.memory_used - res.memory_mib)
        node.workers = max(0, node.workers - 1)
        for c in slot.gpus:
            if not 0 <= c.gpu < len(node.gpus):
                continue
            gpu = node.gpus[c.gpu]
            milli = _release_mig(gpu, c.mig, job.id) if c.mig is not None else c.milli
            holders = gpu.holders
            if job.id in holders:
                gave = min(milli, holders[job.id])
                if holders[job.id] > gave:
                    holders[job.id] -= gave
                else:
                    del holders[job.id]
                gpu.used_milli = max(0, gpu.used_milli - gave)
    kept = tuple(w for w in held.workers if w.rank != rank)
    indexes.hold(state, job, msgspec.structs.replace(held, workers=kept))


def _release_mig(gpu: GpuState, slot: MigSlot, job_id: str) -> int:
    """Give back the job's MIG instance at ``slot``: the memory slices it took. Returns the share
    of the GPU it held (0: none of the job's there)."""
    inst = gpu.mig.get(slot.start)
    if inst is None or inst.job_id != job_id:
        return 0
    del gpu.mig[slot.start]
    gpu.mig_used &= ~inst.mask
    return inst.milli
