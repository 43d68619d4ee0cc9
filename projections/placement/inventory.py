"""Whether any part of the cluster could ever host a job: the placer's own gang search, run over
an idle copy of the inventory.

The inventory is every node registered in the State that has not left (a lost node is gone
until it is ready again). Cordoned, draining and suspect nodes count, and so do unhealthy GPUs:
all of those come back. On the idle copy every node is ready, every GPU free and healthy, so
what the placement chain (``stack.py``) and the gang search (``gang.py``) still refuse there is
what no waiting, preemption or repair changes: a GPU model, a MIG profile, a GPU count, CPU or
memory per worker that no node has, a node selector no node matches, or a gang that no island,
node, rack or block (as its topology asks) could hold. The verdict is the placer's; only the
wording of the reason, with the figures a person needs to act on it, is this module's.

A job is judged at its smallest gang (``min_replicas`` for an elastic job): if that cannot be
hosted, nothing of it can.

With no node at all there is nothing to judge by (a cluster still starting, or every node gone
at once, which is an outage, not a job that is too big): every job passes.

The inventory changes rarely and the same job shapes come back cycle after cycle, so the idle
copy and the verdicts per shape (``indexes.host_shape``) are kept per thread while the inventory
stays the same (as ``quota.fold_ledger`` keeps its tree): the answer is the same as building them
anew. The queued jobs are judged shape by shape from the fold's index of them
(``State.queued_by_shape``, ``unhosted_queued``): a deep backlog of a few shapes costs a few
look-ups, and only the jobs of shapes no node can host are walked. A job naming several GPU
models runs on the one its admission counts against, which its queue's quotas decide
(``_charged``): the queued jobs of such a shape are walked, judged once per queue.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace

import msgspec

from corral.events.base import Reason
from corral.events.decisions import Placement
from corral.events.jobs import JobSpec
from corral.events.nodes import NodeInventory
from corral.projections import indexes, mig, quota
from corral.projections.placement import gang, stack
from corral.projections.placement.framework import Chain, Need, Request
from corral.projections.placement.plugins.fragmentation import Workload
from corral.projections.placement.plugins.model import suits
from corral.projections.placement.plugins.packing import Fragmentation
from corral.projections.placement.plugins.topology import islands, levels, path_labels
from corral.projections.placement.snapshot import GpuView, NodeView, Snapshot
from corral.projections.shape import placed_resources
from corral.projections.state import GpuState, JobState, NodeState, State

CODE = "no-node"  # the code of every reason given here: no node of the inventory can host the job
# Shapes remembered per inventory; past that the memory starts again. Every queued shape is asked
# about every cycle (``unhosted_queued``), so this is kept well above the shapes a backlog holds:
# one past it would judge every shape again each cycle.
MAX_VERDICTS = 1 << 16
MAX_TOUCHED = 1 << 12  # takes and give-backs on the idle copy between two lettings-go of its answers
# Specs remembered per inventory: twice the jobs not finished, and this many more. A spec is
# asked about again only while its job waits or holds quota, so past that the memory holds
# mostly jobs long finished (each spec kept alive), and starts again: remembering every spec
# judged would hold every job ever submitted under one inventory, a million after a million
# jobs. Starting again costs each live job one look-up by shape, once per that many new specs.
MIN_SPECS = 1 << 12

# How far a worker got through the chain's filters on a node, by the code of the first no: the
# nodes that got furthest are the ones a reason speaks of ("the largest node that ...").
_STAGES = ("labels", "gpu-model", "gpu-memory", "mig-profile", "mig-mode", "gpu-count", "cpu", "memory")
_STAGE = {code: i for i, code in enumerate(_STAGES)}

_Fingerprint = list[tuple[str, NodeInventory]]
_UNJUDGED = Reason("", "")  # what a look-up answers for a spec not judged yet


class _Idle:
    """The idle copy of one inventory, its chain and the verdicts given on it so far."""

    def __init__(self, nodes: _Fingerprint, label_keys: dict[str, str]) -> None:
        state = State(
            nodes={
                name: NodeState(name=name, inventory=inv, gpus=[GpuState(info=g) for g in inv.gpus])
                for name, inv in nodes
            }
        )
        self.snap = Snapshot(state)
        config = stack.PlacerConfig(label_keys=label_keys)
        self.chain: Chain = stack.build(config, Fragmentation(Workload({})))
        self.label_keys = label_keys
        self.verdicts: dict[str, Reason | None] = {}  # by host shape (``indexes.host_shape``)
        self.most: dict[tuple[str, int, tuple[str, ...]], int] = {}  # an elastic shape's most workers at once
        # By the job's spec object (a job keeps its spec for life), cycle after cycle: a look-up
        # by its id costs less than building the shape's key. Every spec judged is kept alive
        # in ``specs``, so that no other object can take its id meanwhile. (The id shifted: the
        # low bits of an address are all zero, and the dict indexes by the low bits.)
        self.by_spec: dict[int, Reason | None] = {}
        self.specs: list[JobSpec] = []


class _Kept(threading.local):
    built: tuple[_Fingerprint, dict[str, str], _Idle] | None = None


_kept = _Kept()


class Inventory:
    """The nodes a job could ever run on, as of ``state``. Build one per cycle and ask it about
    every job: verdicts are shared by jobs of the same shape."""

    def __init__(self, state: State, label_keys: Mapping[str, str] | None = None) -> None:
        self.nodes: _Fingerprint = [
            (name, node.inventory) for name, node in state.nodes.items() if node.condition != "lost"
        ]
        self.label_keys = dict(label_keys) if label_keys is not None else stack.PlacerConfig().label_keys
        self.queues = state.queues
        self._idle: _Idle | None = None
        self.max_specs = 2 * indexes.count(state, *indexes.UNFINISHED) + MIN_SPECS

    @property
    def empty(self) -> bool:
        return not self.nodes

    def never_fits(self, job: JobState) -> Reason | None:
        """Why no node of the inventory could host ``job`` even with the whole cluster idle, or
        None if some could (or there is no inventory to judge by)."""
        if not self.nodes:
            return None
        spec = job.spec
        idle = self._idle if self._idle is not None else self._built()
        if len(spec.resources.gpu_models) > 1:
            return self._charged(idle, job)
        verdict = idle.by_spec.get(id(spec) >> 4, _UNJUDGED)
        if verdict is not _UNJUDGED:
            return verdict
        verdict = self._judged(idle, job)
        if len(idle.specs) >= self.max_specs:
            idle.by_spec.clear()
            idle.specs.clear()
        idle.by_spec[id(spec) >> 4] = verdict
        idle.specs.append(spec)
        return verdict

    def hosts_spec(self, spec: JobSpec, model: str) -> bool:
        """Whether some node could host a job of ``spec`` on GPUs of ``model``, one of the several
        it names (where it would run if admitted on that model's quota, ``shape.placed_resources``):
        ``Ledger.hosts``, for a job not admitted yet."""
        if not self.nodes:
            return True
        idle = self._idle if self._idle is not None else self._built()
        return self._judged(idle, _on(JobState("", "", spec, 0, 0.0), model)) is None

    def most_workers(self, job: JobState, model: str | None = None) -> int:
        """The most workers of ``job`` the whole cluster could host at once, idle, as its
        topology asks, between its least and most (its most for a job that is not elastic, or
        where there is no inventory to judge by). Admission admits and grows an elastic job to
        no more: admitted at a size no placement can ever find, it would be withdrawn at the
        placement timeout and admitted at that size again, for ever, holding quota it never
        uses, though a smaller gang of it would run at once. With ``model``, one of the several
        it names: on GPUs of that model only (where it runs if admitted on its quota)."""
        if model is not None:
            job = _on(job, model)
        spec = job.spec
        lo, hi = quota.min_replicas(spec), spec.replicas
        if spec.min_replicas is None or lo >= hi or not self.nodes:
            return hi
        idle = self._idle if self._idle is not None else self._built()
        # An admitted job of several models is placed on its admitted one (``Request.of``).
        key = (indexes.host_shape(spec), hi, placed_resources(job).gpu_models)
        found = idle.most.get(key)
        if found is None:
            found = _most(idle, Request.of(job), max(lo, 1), hi)
            if len(idle.most) >= MAX_VERDICTS:
                idle.most.clear()
            idle.most[key] = found
        return found

    def unhosted(self, jobs: Iterable[JobState]) -> list[tuple[JobState, Reason]]:
        """``never_fits`` over many jobs: those no node could host, with why."""
        if not self.nodes:
            return []
        known = (self._idle if self._idle is not None else self._built()).by_spec.get
        out = []
        for job in jobs:
            why = known(id(job.spec) >> 4, _UNJUDGED)
            if why is None:
                continue
            if why is _UNJUDGED:
                why = self.never_fits(job)
                if why is None:
                    continue
            out.append((job, why))
        return out

    def unhosted_queued(self, state: State) -> list[tuple[JobState, Reason]]:
        """``unhosted`` over the queued jobs of ``state``, judged shape by shape
        (``State.queued_by_shape``): each shape once per inventory, then only the jobs of the
        shapes no node can host, shape by shape, each in the order it entered the queue."""
        if not self.nodes:
            return []
        idle = self._idle if self._idle is not None else self._built()
        jobs = state.jobs
        out: list[tuple[JobState, Reason]] = []
        for shape, ids in state.queued_by_shape.items():
            first = jobs[next(iter(ids))]
            if len(first.spec.resources.gpu_models) > 1:  # judged by each queue's quota
                by_queue: dict[str, Reason | None] = {}
                for job in map(jobs.__getitem__, ids):
                    queue = job.spec.queue
                    why = by_queue[queue] if queue in by_queue else self._charged(idle, job)
                    by_queue[queue] = why
                    if why is not None:
                        out.append((job, why))
                continue
            why = idle.verdicts.get(shape, _UNJUDGED)
            if why is _UNJUDGED:
                why = self._judged(idle, first, shape)
            if why is not None:
                out.extend((jobs[i], why) for i in ids)
        return out

    def _charged(self, idle: _Idle, job: JobState) -> Reason | None:
        """The verdict on a job naming several GPU models, as its quota would place it: it runs
        on the one model its admission counts against (``shape.placed_resources``), so it must
        fit on some one model it could be charged to, not on GPUs of several at once. Those are
        its admitted model, else the models its queue has quota for (``quota.candidate_keys``);
        a job charged to the any-model quota runs on any of them."""
        spec = job.spec
        models = spec.resources.gpu_models
        adm = job.admission
        queue = self.queues.get(spec.queue)
        # An admitted job is placed on its admitted model; one stopping or interrupted gives its
        # admission up when requeued, and is admitted again on whichever model has room.
        if adm is not None and job.phase == "admitted" and len(adm.gpus) == 1:
            keys = tuple(adm.gpus)
        elif queue is not None:
            keys = quota.candidate_keys(queue, spec.resources)
        else:
            keys = models
        keys = tuple(k for k in keys if k in models)
        if not keys:
            return self._judged(idle, job)
        first: Reason | None = None
        for model in keys:
            why = self._judged(idle, _on(job, model))
            if why is None:
                return None
            first = first or why
        assert first is not None
        if len(keys) == len(models):
            return Reason(CODE, f"on no one GPU model it names: {first.message}")
        return Reason(CODE, f"charged to its queue's quota of {' or '.join(keys)}: {first.message}")

    def _judged(self, idle: _Idle, job: JobState, shape: str | None = None) -> Reason | None:
        key = indexes.host_shape(job.spec) if shape is None else shape
        try:
            return idle.verdicts[key]
        except KeyError:
            pass
        spec = job.spec
        n = quota.min_replicas(spec)
        req = replace(Request.of(job), replicas=n)
        verdict = _judge(idle, req, n < spec.replicas) if n > 0 else None
        _tidy(idle)
        if len(idle.verdicts) >= MAX_VERDICTS:
            idle.verdicts.clear()
        idle.verdicts[key] = verdict
        return verdict

    def _built(self) -> _Idle:
        if self._idle is None:
            kept = _kept.built
            if kept is None or kept[1] != self.label_keys or kept[0] != self.nodes:
                kept = _kept.built = (self.nodes, self.label_keys, _Idle(self.nodes, self.label_keys))
            self._idle = kept[2]
        return self._idle


def _on(job: JobState, model: str) -> JobState:
    """``job`` asking GPUs of ``model`` only, one of the several it names."""
    res = msgspec.structs.replace(job.spec.resources, gpu_models=(model,))
    return msgspec.structs.replace(job, spec=msgspec.structs.replace(job.spec, resources=res))


def never_fits(state: State, job: JobState) -> Reason | None:
    """``Inventory(state).never_fits(job)``: for one job; ask an ``Inventory`` about many."""
    return Inventory(state).never_fits(job)


# -- the verdict ------------------------------------------------------------------------------------


def _placed(idle: _Idle, req: Request) -> Placement | tuple[Reason, ...]:
    """The placer's search for ``req`` on the idle copy, which it leaves idle."""
    found = gang.place(idle.chain, idle.snap, req, idle.label_keys)
    if not isinstance(found, tuple):
        idle.snap.release(found, req.res)
    return found


def _tidy(idle: _Idle) -> None:
    """Each search takes from the idle copy and gives back: answers keyed by versions of its
    nodes no later search asks about, kept for as long as the inventory lasts, unless let go."""
    if len(idle.snap.touched) >= MAX_TOUCHED:
        idle.snap.forget_answers()


def _most(idle: _Idle, req: Request, lo: int, hi: int) -> int:
    """The most workers of ``req``, ``lo`` to ``hi``, a placement on the idle copy finds (``lo``
    when not even those: ``never_fits`` says why). Fewer workers fit where more do, so halving."""

    def fits(n: int) -> bool:
        return not isinstance(_placed(idle, replace(req, replicas=n)), tuple)

    if not fits(hi):
        while lo < hi - 1:  # lo fits (or is the least asked), hi does not
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        hi = lo
    _tidy(idle)
    return hi


def _judge(idle: _Idle, req: Request, elastic: bool) -> Reason | None:
    found = _placed(idle, req)
    if not isinstance(found, tuple):
        return None
    hosts: list[NodeView] = []
    refused: list[tuple[int, Reason, NodeView]] = []
    for name in idle.snap.state.nodes:
        view = idle.snap.view(name)
        why = idle.chain.reject(req, view)
        if why is None and idle.chain.reserve(req, view) is None:
            why = Reason("gpus", f"node {name} has no GPUs that suit {req.need.describe()}")
        if why is None:
            hosts.append(view)
        else:
            refused.append((_STAGE.get(why.code, len(_STAGES)), why, view))
    if not hosts:
        return Reason(CODE, _worker(req, refused))
    return Reason(CODE, _gang(idle, req, elastic, hosts, found))


def _worker(req: Request, refused: list[tuple[int, Reason, NodeView]]) -> str:
    """Why no node takes even one worker, said of the nodes that came closest (those whose first
    no came latest in the chain), qualified by what the others lacked."""
    need = req.need
    furthest = max(stage for stage, _, _ in refused)
    nodes = [view for stage, _, view in refused if stage == furthest]
    code = _STAGES[furthest] if furthest < len(_STAGES) else ""
    passed_over = {_STAGES[stage] for stage, _, _ in refused if stage < furthest}
    # What the nodes passed over lacked, where that matters for the figure given: a node without
    # suitable GPUs may have more CPU, but it has no more suitable GPUs.
    quals = []
    if "labels" in passed_over:
        quals.append("matching its node_selector")
    if code in ("cpu", "memory") and need.kind != "cpu" and passed_over - {"labels", "cpu"}:
        quals.append("with suitable GPUs")
    if code == "memory" and "cpu" in passed_over:
        quals.append("with enough CPU")
    node = "node" + (" " + " and ".join(quals) if quals else "")
    on_node = f" on a {node}" if quals else ""
    models = " or ".join(sorted(need.models))
    of = f"{models} " if models else ""
    if code == "labels":
        seen = []
        for k, _ in req.selector:
            values = _listed(view.labels[k] for view in nodes if k in view.labels)
            seen.append(f"nodes have {k}: {values}" if values else f"no node has a {k} label")
        return f"no node matches node_selector {_selector(req)} ({'; '.join(seen)})"
    if code == "gpu-model":
        if not need.models:
            return f"needs GPUs; no {node} has any"
        have = _listed(g.model for view in nodes for g in view.gpus)
        return f"no {node} has GPU model {models} (models: {have or 'none'})"
    if code == "gpu-memory":
        most = max(g.memory_mib for view in nodes for g in view.gpus if need.model_ok(g.model))
        return (
            f"needs GPUs of at least {need.min_gpu_memory} MiB; the largest {of}GPU{on_node} has {most} MiB"
        )
    if code == "mig-profile":
        sliced = _listed(g.model for view in nodes for g in view.gpus if g.mig)
        offered = f"in MIG mode: {sliced}, offering {_profiles(nodes)}" if sliced else "none is in MIG mode"
        return f"no {node} has {of}GPUs that offer MIG profile {need.mig} ({offered})"
    if code == "mig-mode":
        return (
            f"every {of}GPU{on_node} is in MIG mode, which serves MIG instances only; "
            f"ask for a MIG profile instead ({_profiles(nodes)})"
        )
    if code == "gpu-count":
        most = max(sum(1 for g in view.gpus if suits(need, g)) for view in nodes)
        return f"needs {need.gpus} {of}GPUs per worker; the largest {node} has {most}"
    if code == "cpu":
        most = max(view.cpu_free for view in nodes)
        return f"needs {need.cpu / 1000:g} CPUs per worker; the largest {node} has {most / 1000:g}"
    if code == "memory":
        most = max(view.mem_free for view in nodes)
        return f"needs {need.memory} MiB of memory per worker; the largest {node} has {most} MiB"
    example = next(why for stage, why, _ in refused if stage == furthest)
    return f"no node can host one worker ({need.describe()}): {example.message}"


def _gang(
    idle: _Idle, req: Request, elastic: bool, hosts: list[NodeView], searched: tuple[Reason, ...]
) -> str:
    """Why the gang does not fit whole where its topology asks, though single workers do."""
    n, need = req.replicas, req.need
    least = "at least " if elastic else ""
    gang_of = f"{least}{n} worker{'s' if n > 1 else ''} of {need.describe()}{' each' if n > 1 else ''}"
    widest = levels(req)[-1]
    if widest == "island":
        sizes = [len(grp) for view in hosts for k, grp in islands(_suited(need, view)).items() if k >= 0]
        if not sizes:
            return f"needs {gang_of} in one NVLink island; no node that could host one has NVLink"
        if need.kind == "whole" and max(sizes) < n * need.gpus:
            gpus = f"{least}{n} × {need.gpus} = {n * need.gpus}" if n > 1 else str(need.gpus)
            return f"needs {gpus} GPUs in one NVLink island; the largest has {max(sizes)}"
        best = max(
            _count(idle, req, (view.name,), k)
            for view in hosts
            for k in islands(_suited(need, view))
            if k >= 0
        )
        if best < n:
            return f"needs {gang_of} in one NVLink island; the most one island holds is {best}"
    elif widest == "node":
        best = max(_count(idle, req, (view.name,)) for view in hosts)
        if best < n:
            return f"needs {gang_of} on one node; the most one node holds is {best}"
    elif widest in ("rack", "block"):
        keys = path_labels(widest, idle.label_keys)
        label = keys[-1]
        domains: dict[tuple[str, ...], list[str]] = {}
        for view in hosts:  # a rack by its block and its name, as the search reads it
            if label in view.labels:
                domains.setdefault(tuple(view.labels.get(k, "") for k in keys), []).append(view.name)
        if not domains:
            return f"needs {gang_of} in one {widest}, but no node that could host one has a {label} label"
        best = max(_count(idle, req, names) for names in domains.values())
        if best < n:
            return f"needs {gang_of} in one {widest} ({label} label); the most one {widest} holds is {best}"
    elif req.pack == "spread" and req.required:
        if len(hosts) < n:
            return f"needs {gang_of} on distinct nodes; only {len(hosts)} nodes can host one"
    else:
        most = _count(idle, req, [view.name for view in hosts])
        if most < n:
            return f"needs {gang_of}; all nodes together hold at most {most}"
    # The figures say it would fit, but the search found no place: say what the search says.
    return f"no room for {gang_of} as its topology asks: {searched[0].message}"


def _count(idle: _Idle, req: Request, names: Iterable[str], island: int | None = None) -> int:
    """How many workers of ``req`` the chain puts on ``names`` (within ``island``), at most the
    gang: taken worker by worker as the search does, then given back."""
    attempt = gang.Attempt(idle.snap, req)
    try:
        for name in names:
            while len(attempt.slots) < req.replicas:
                pick = idle.chain.best(idle.snap, req, (name,), island)
                if pick is None:
                    break
                attempt.take(pick.node, pick.gpus)
        return len(attempt.slots)
    finally:
        attempt.undo()


def _suited(need: Need, view: NodeView) -> list[GpuView]:
    return [g for g in view.gpus if suits(need, g)]


def _listed(items: Iterable[str], most: int = 8) -> str:
    """Distinct ``items`` in the order first seen, at most ``most`` of them."""
    seen = list(dict.fromkeys(items))
    return ", ".join(seen[:most]) + (f" and {len(seen) - most} more" if len(seen) > most else "")


def _selector(req: Request) -> str:
    return ", ".join(f"{k}={v}" for k, v in req.selector)


def _profiles(nodes: list[NodeView]) -> str:
    sliced = dict.fromkeys(g.model for view in nodes for g in view.gpus if g.mig)
    return _listed((p for model in sliced for p in mig.profiles(model)), most=12) or "none"
