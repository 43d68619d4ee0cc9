"""Gang placement: all of a job's workers in one go, or none of them.

For each topology level the job allows (``plugins/topology.py``), narrowest first, the search
tries candidate domains: one NVLink island or one node for the whole gang, or one rack or block
whose free GPUs can hold it (the tightest such domain first), or the whole cluster. Inside a
domain the workers are placed one by one through the chain (filters, reserve, scores), each
taking its share of the snapshot so the next worker sees what is left. If a worker finds no room
the domain's takes are given back and the next domain is tried. Nothing is ever half placed.

Candidate nodes come from the snapshot's index: nodes with enough free whole GPUs, tightest
first (bin packing) or emptiest first (spreading); nodes with a partly used GPU before idle ones
for fractions; nodes with MIG GPUs for MIG slices; every ready node for CPU-only workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from corral.events.base import Reason
from corral.events.decisions import GpuClaim, Placement, WorkerSlot
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.plugins.topology import Level, islands, levels, path_labels, whole_free
from corral.projections.placement.snapshot import Snapshot

MAX_DOMAINS = 32  # domains tried per level before giving up: bounds the cost of a hopeless gang


@dataclass
class Attempt:
    """What one job has taken from the snapshot so far (given back if the gang does not fit)."""

    snap: Snapshot
    req: Request
    slots: list[WorkerSlot] = field(default_factory=list)

    def take(self, node: str, gpus: tuple[GpuClaim, ...]) -> None:
        self.snap.take(node, self.req.res, gpus)
        self.slots.append(WorkerSlot(len(self.slots), node, gpus))

    def undo(self) -> None:
        for w in reversed(self.slots):
            self.snap.give_back(w.node, self.req.res, w.gpus)
        self.slots.clear()


def candidates(snap: Snapshot, req: Request, per_node: int = 1, most_first: bool = False) -> Iterator[str]:
    """Nodes that might take ``per_node`` workers of ``req``, best first for the packing."""
    need = req.need
    if need.kind == "whole":
        models = [m for m in snap.models() if need.model_ok(m)]
        yield from snap.by_free_whole(models, need.gpus * per_node, most_first)
    elif need.kind == "fraction":
        yield from snap.partial
        models = [m for m in snap.models() if need.model_ok(m)]
        partial = snap.partial
        for name in snap.by_free_whole(models, 1, most_first):
            if name not in partial:
                yield name
    elif need.kind == "mig":
        yield from snap.sliced
    else:
        yield from snap.ready


def place(
    chain: Chain, snap: Snapshot, req: Request, label_keys: dict[str, str]
) -> Placement | tuple[Reason, ...]:
    """Place the whole gang of ``req`` on ``snap`` (taking what it uses) or say why not."""
    if req.replicas <= 0:
        return (Reason("shape", "the gang has no workers"),)
    for level in levels(req):
        slots = _at_level(chain, snap, req, level, label_keys)
        if slots is not None:
            return Placement(req.job_id, req.attempt, tuple(slots))
    return _why_not(chain, snap, req)


def place_beside(
    chain: Chain, snap: Snapshot, req: Request, label_keys: dict[str, str], held: Placement
) -> Placement | tuple[Reason, ...]:
    """Place the workers ``req`` asks for (the ranks admission added to a running elastic job)
    where a required topology keeps them with the job's running workers ``held``: the same
    NVLink island, node, rack or block; spread, nodes other than theirs (if required, else as
    far as it can). Else as ``place``. Searched alone, the added ranks went to the tightest fit,
    another block or island than the running ones, or beside them where they were to spread."""
    if req.pack == "spread" and held.workers:
        slots = _anywhere(chain, snap, req, avoid=frozenset(w.node for w in held.workers))
        if slots is None:
            return _why_not(chain, snap, req)
        return Placement(req.job_id, req.attempt, tuple(slots))
    (level,) = levels(req)[:1]  # a required topology has its one level; none has "cluster"
    if not req.required or level == "cluster" or not held.workers:
        return place(chain, snap, req, label_keys)
    first = held.workers[0]
    if level in ("island", "node"):
        node = snap.view(first.node)
        island: int | None = None
        if level == "island" and first.gpus:
            gpu = first.gpus[0].gpu
            island = next(
                (k for k, grp in islands(node.gpus).items() if any(g.index == gpu for g in grp)), None
            )
        slots = (
            None
            if chain.reject(req, node) is not None
            else _fill(chain, snap, req, [first.node] * req.replicas, island)
        )
        if slots is None:
            where = f"NVLink island of node {first.node}" if level == "island" else f"node {first.node}"
            return (
                Reason(
                    "topology", f"no room for {req.replicas} more workers on the {where} its workers run on"
                ),
            )
        return Placement(req.job_id, req.attempt, tuple(slots))
    keys = path_labels(level, label_keys)
    tags = snap.view(first.node).labels
    if keys[-1] not in tags:
        return place(chain, snap, req, label_keys)
    # The domain's whole path: the rack of that name in the running workers' block, no other.
    selector = tuple(sorted({*req.selector, *((k, tags[k]) for k in keys if k in tags)}))
    return place(chain, snap, dataclasses.replace(req, selector=selector), label_keys)


def _at_level(
    chain: Chain, snap: Snapshot, req: Request, level: Level, label_keys: dict[str, str]
) -> list[WorkerSlot] | None:
    if level == "cluster":
        return _anywhere(chain, snap, req)
    if level in ("island", "node"):
        tried = 0
        for name in candidates(snap, req, per_node=req.replicas):
            if name in req.avoid:
                continue
            node = snap.view(name)
            if chain.reject(req, node) is not None:
                continue
            tried += 1
            if tried > MAX_DOMAINS:
                break
            groups: Iterable[int | None] = [None]
            if level == "island":
                free = whole_free(req, node) if req.need.kind == "whole" else node.gpus
                groups = [
                    k
                    for k, grp in sorted(islands(free).items(), key=lambda kv: (len(kv[1]), kv[0]))
                    if k >= 0 and (req.need.kind != "whole" or len(grp) >= req.need.gpus * req.replicas)
                ]
            for island in groups:
                slots = _fill(chain, snap, req, [name] * req.replicas, island)
                if slots is not None:
                    return slots
        return None
    return _in_domains(chain, snap, req, level, label_keys)


def _fill(
    chain: Chain, snap: Snapshot, req: Request, order: list[str], island: int | None
) -> list[WorkerSlot] | None:
    """Put worker ``i`` on ``order[i]`` (same node repeated for a one-node gang)."""
    attempt = Attempt(snap, req)
    for name in order:
        pick = chain.best(snap, req, (name,), island)
        if pick is None:
            attempt.undo()
            return None
        attempt.take(pick.node, pick.gpus)
    return attempt.slots


def _anywhere(
    chain: Chain, snap: Snapshot, req: Request, avoid: frozenset[str] = frozenset()
) -> list[WorkerSlot] | None:
    """Workers one by one on the best node each; ``spread`` keeps them on distinct nodes (if
    required, else as far as it can), none of them ``avoid`` (the nodes a growing job's running
    workers are on)."""
    spread = req.pack == "spread"
    passes = (True,) if (spread and req.required) else ((True, False) if spread else (False,))
    for distinct in passes:
        attempt = Attempt(snap, req)
        for _ in range(req.replicas):
            used = avoid | frozenset(w.node for w in attempt.slots) if distinct else frozenset()
            pick = chain.best(snap, req, candidates(snap, req, most_first=spread), exclude=used)
            if pick is None:
                attempt.undo()
                break
            attempt.take(pick.node, pick.gpus)
        else:
            return attempt.slots
    return None


def _in_domains(
    chain: Chain, snap: Snapshot, req: Request, level: Level, label_keys: dict[str, str]
) -> list[WorkerSlot] | None:
    """One rack or block for the whole gang: the tightest domain that can hold it first."""
    # Room is counted from the index (dynamic filters not yet): a domain that turns out smaller
    # is passed over when its workers do not all fit. Not the nodes a node selector turns down:
    # counted, racks of a pool the job does not run in looked roomy, and past MAX_DOMAINS of
    # them the one rack that could hold the gang was never tried.
    domain_of = snap.domains(path_labels(level, label_keys))
    if req.selector or req.avoid:
        domain_of = {
            n: d
            for n, d in domain_of.items()
            if n not in req.avoid and (not req.selector or chain.statically_fits(req, snap, n))
        }
    models = [m for m in snap.models() if req.need.model_ok(m)]
    if req.need.kind == "whole" and len(models) == 1:
        members, room = _room_by_buckets(snap, req, models[0], domain_of)
    else:
        members, room = _room(snap, req, models, domain_of)
    # The domain that holds the fewest workers (the gang at least), and of those the one with the
    # fewest GPUs free: a rack of two 3-GPU nodes holds two 2-GPU workers as a rack of one 4-GPU
    # node does, but would leave a GPU stranded on each node.
    count = snap.free_whole_count
    whole = req.need.kind == "whole"

    def spare(key: Domain) -> int:
        return sum(count(n, m) for n in members[key] for m in models) if whole else 0

    fitting = sorted((k for k in members if room[k] >= req.replicas), key=lambda k: (room[k], spare(k), k))
    for key in fitting[:MAX_DOMAINS]:
        if whole:
            slots = _best_fit(chain, snap, req, members[key])
        else:  # the roomiest nodes first: fewer nodes, closer ranks
            order = sorted(members[key], key=lambda n: -len(whole_free(req, snap.view(n))))
            slots = _first_fit(chain, snap, req, order)
        if slots is not None:
            return slots
    return None


# Every candidate node is visited for every gang that asks for a domain: the loops read what they
# need once (a gang of 8-GPU workers at 1,250 nodes spent most of its search here).
Domain = tuple[str, ...]  # a rack or block by its path of label values (``Snapshot.domains``)
_Rooms = tuple[dict[Domain, list[str]], dict[Domain, int]]


def _room(snap: Snapshot, req: Request, models: list[str], domain_of: dict[str, Domain]) -> _Rooms:
    """Each domain's candidate nodes, in the order ``candidates`` gives them, and how many
    workers of ``req`` they hold (any shape, any number of models)."""
    members: dict[Domain, list[str]] = {}
    room: dict[Domain, int] = {}
    whole, per = req.need.kind == "whole", req.need.gpus
    count = snap.free_whole_count
    for name in candidates(snap, req):
        key = domain_of.get(name)
        if key is None:
            continue
        nodes = members.get(key)
        if nodes is None:
            nodes = members[key] = []
        nodes.append(name)
        if whole:
            free = count(name, models[0]) if len(models) == 1 else sum(count(name, m) for m in models)
            room[key] = room.get(key, 0) + free // per
        else:
            room[key] = room.get(key, 0) + req.replicas  # not counted ahead: tried in turn
    return members, room


def _room_by_buckets(snap: Snapshot, req: Request, model: str, domain_of: dict[str, Domain]) -> _Rooms:
    """``_room`` for whole GPUs of one model: the index's buckets are the candidates, in the
    same order, and a bucket's place is its nodes' free count: no generator, no look-ups."""
    members: dict[Domain, list[str]] = {}
    room: dict[Domain, int] = {}
    per = req.need.gpus
    buckets = snap.buckets(model)
    for n in range(per, len(buckets)):
        workers = n // per
        for name in buckets[n]:
            key = domain_of.get(name)
            if key is None:
                continue
            nodes = members.get(key)
            if nodes is None:
                nodes = members[key] = []
                room[key] = 0
            nodes.append(name)
            room[key] += workers
    return members, room


def _best_fit(chain: Chain, snap: Snapshot, req: Request, nodes: list[str]) -> list[WorkerSlot] | None:
    """Whole-GPU workers on the roomiest nodes of a domain first (fewer nodes, closer ranks),
    except that once one node can take all the workers left, the tightest such node takes them
    (Kueue's BestFit): for seven workers on nodes free for 3, 3, 2 and 1, the last one goes to
    the node of 1, and the node of 2 stays whole. Each node is filled as far as it takes workers."""
    per = req.need.gpus
    room = {n: len(whole_free(req, snap.view(n))) // per for n in nodes}
    left = sorted(nodes, key=lambda n: -room[n])
    attempt = Attempt(snap, req)
    while len(attempt.slots) < req.replicas:
        wanted = req.replicas - len(attempt.slots)
        holding = [n for n in left if room[n] >= wanted]
        if holding:
            name: str | None = min(holding, key=lambda n: room[n])
        else:
            name = next((n for n in left if room[n] > 0), None)
        if name is None:
            attempt.undo()
            return None
        left.remove(name)
        for _ in range(min(wanted, room[name])):
            pick = chain.best(snap, req, (name,))
            if pick is None:  # its CPU, memory or a filter: the next node takes the rest
                break
            attempt.take(pick.node, pick.gpus)
    return attempt.slots


def _first_fit(chain: Chain, snap: Snapshot, req: Request, order: list[str]) -> list[WorkerSlot] | None:
    """Each worker on the first node of ``order`` that still takes one."""
    attempt = Attempt(snap, req)
    for _ in range(req.replicas):
        for name in order:
            pick = chain.best(snap, req, (name,))
            if pick is not None:
                attempt.take(pick.node, pick.gpus)
                break
        else:
            attempt.undo()
            return None
    return attempt.slots


def _why_not(chain: Chain, snap: Snapshot, req: Request) -> tuple[Reason, ...]:
    reasons = chain.diagnose(snap, req)
    # Every node could take one worker, but not the whole gang at once in the domain it asked for.
    widest = levels(req)[-1]  # a preferred domain's last is the cluster: no one domain to name
    where = f"in one {widest}" if widest != "cluster" else "at once"
    if req.pack == "spread" and req.required:
        where = "on distinct nodes"
    gang = f"no room for all {req.replicas} workers ({req.need.describe()} each) {where}"
    if not reasons:
        return (Reason("gang", gang, True),)
    if req.replicas == 1:
        return reasons
    # Some nodes said no (cordoned, busy): said alone, that read as if the others together could
    # hold the gang, where it waits for one domain (or enough nodes at once) that can. Freeing
    # GPUs helps it as it helps them.
    return (*reasons, Reason("gang", gang, any(r.preemption_helps for r in reasons)))
