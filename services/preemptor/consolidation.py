"""Consolidation: room for an admitted job that waits only because the free GPUs are
scattered over the nodes, made by moving preemptible work elsewhere (KAI's consolidation action).

The preemptor asks ``find`` for a beneficiary no stop may be made for (``decide.plan``: once a
cycle, and only while no stop or move is under way, ``projections.moves.move_under_way``, and
none was proposed before it in the cycle: a move's layout is judged on the nodes as they stand,
where GPUs being freed for another job, or about to be taken by one, look free). The search is
the victim search's (``victims``: removal by doubling and halving, fill-back) over whole jobs the
rule lets move (``projections.moves``), then each removed job placed again by the placer's own
search; the result is checked by the fold's arithmetic (``victims.commit``) like any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.events.decisions import Placement
from corral.projections import moves, quota
from corral.projections.state import State
from corral.services.preemptor.victims import (
    Found,
    Pool,
    Simulation,
    Target,
    Unit,
    _fill_back,
    _found,
    _remove,
    _restore_all,
    admitted_target,
    gpus_held,
    unmove,
)

CONSOLIDATION_NODES = 8  # nodes a consolidation looks at one by one, the cheapest first


def find(sim: Simulation, pool: Pool, target: Target, most: int) -> Found | None:
    """Room for an admitted job no victim may be stopped for, by moving at most ``most``
    preemptible jobs the rule does not refuse whatever the layout (``projections.moves.refuses``:
    none of a higher priority; of its own queue or of queues that borrow too, if it borrows)
    (``consolidate``): one node's jobs at a time, where the least work must move first
    (``by_least_moved``), then all of them in that order."""
    if most <= 0 or not room_anywhere(sim, target):
        return None
    b = target.job
    units = [
        Unit(h, None, False)
        for holders in pool.by_queue.values()
        for h in holders
        if h.job.id != b.id and moves.refuses(sim.rules, h.job, b) is None
    ]
    if not units:
        return None
    # A worker's room is made on one node; a gang's workers may need room on several.
    groups = by_least_moved(sim.state, units, target.req.res.gpus)
    for order in [*groups[:CONSOLIDATION_NODES], [u for group in groups for u in group]]:
        found = consolidate(sim, target, order, most)
        if found is not None:
            return found
    return None


def room_anywhere(sim: Simulation, target: Target) -> bool:
    """Whether the free GPU of the ready nodes (healthy, not in MIG mode: of any model, for a
    moved job that takes several models may leave GPUs of the job's for another's), CPU and
    memory add up to the gang's, counted as if the free parts of shared GPUs, and of nodes,
    pooled: a move frees none of them, so where not even that holds, no consolidation makes
    room. The searches it would run are then not run: a gang of 1,024 slivers of a GPU costs
    seconds of them a cycle on a full cluster."""
    req = target.req
    res, n = req.res, req.replicas
    gpu = 0 if res.mig is not None else quota.worker_milli(res) * n
    cpu, mem = res.cpu_milli * n, res.memory_mib * n
    for name in sim.snap.ready:
        view = sim.snap.view(name)
        cpu -= view.cpu_free
        mem -= view.mem_free
        if gpu > 0:
            for g in view.gpus:
                if g.healthy and not g.mig:
                    gpu -= g.free
        if gpu <= 0 and cpu <= 0 and mem <= 0:
            return True
    return False


def consolidate(sim: Simulation, target: Target, units: Sequence[Unit], most: int) -> Found | None:
    """Room for an admitted ``target`` the free GPUs would hold but for how they are scattered
    (KAI's consolidation): the fewest of ``units`` (whole jobs) whose removal lets its gang fit, at
    most ``most``, each on a node the gang is then placed on, such that once it is placed each of
    them fits again elsewhere (``projections.moves.misplaced``), each placed by the placer's own
    search in turn; the beneficiary and
    the moved jobs placed on the snapshot. None (and the snapshot as it was) if there is no such
    set, or if a job would go back where it was."""
    removed = _remove(sim, target, units, lambda: sim.fits(target), lambda: True)
    if removed is None:
        return None
    removed = _fill_back(sim, removed, lambda: sim.fits(target))
    placed = sim.place(target) if len(removed) <= most else None
    if placed is None:
        _restore_all(sim, removed)
        return None
    moved: list[tuple[Target, Placement]] = []
    # The largest first: the small ones fit in what the large ones leave.
    for u, _ in sorted(removed, key=lambda r: (-gpus_held(sim.state, r[0].job), r[0].job.id)):
        mover = admitted_target(sim.state, sim.ledger, u.job)
        again = sim.place(mover)
        if again is None or moves.misplaced(u.job, again, placed) is not None:
            if again is not None:
                sim.unplace(mover, again)
            unmove(sim, moved)
            sim.unplace(target, placed)
            _restore_all(sim, removed)
            return None
        moved.append((mover, again))
    found = _found(removed, placed)
    found.moves = moved
    return found


def by_least_moved(state: State, units: list[Unit], gpus: int) -> list[list[Unit]]:
    """``units`` (whole jobs) grouped by the node each runs on (its first), for a consolidation:
    first the node where the fewest GPUs of work must move for one worker of ``gpus`` GPUs to
    fit there, taking its smallest jobs first (of those, where that work has done the least since
    its last checkpoint), then by node name; nodes where no moves make room for one worker last;
    within a node the smallest jobs first. Small jobs are the easiest to place again elsewhere."""
    groups: dict[str, list[Unit]] = {}
    for u in units:
        held = u.job.held
        groups.setdefault(held.workers[0].node if held is not None and held.workers else "", []).append(u)
    size = {u.job.id: gpus_held(state, u.job) for u in units}
    for group in groups.values():
        group.sort(key=lambda u: (size[u.job.id], u.holder.lost, u.job.id))

    def cost(node: str) -> tuple[float, float, str]:
        n = state.nodes.get(node)
        if n is None:
            return (math.inf, math.inf, node)
        free = sum(1 for g in n.gpus if g.healthy and not g.holders)
        moved = lost = 0.0
        for u in groups[node]:
            if free >= gpus:
                break
            free += sum(1 for g in n.gpus if g.healthy and g.holders.keys() == {u.job.id})
            moved += size[u.job.id]
            lost += u.holder.lost
        return (moved, lost, node) if free >= gpus else (math.inf, math.inf, node)

    return [groups[node] for node in sorted(groups, key=cost)]
