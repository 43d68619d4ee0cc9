"""Back in place: a job whose place is held for it goes on those very GPUs, as far as they still
take it, not wherever the search would put it.

A place is held for a job a planned shutdown of its node stopped (``JobState.kept_place``, while
``queueing.keeps_place``) and for one a consolidation moved (``JobState.moved_to``, while it
checkpoints, is stopped or is admitted again, and its move still names a beneficiary): a resumed
job finds its node's local checkpoint and cache and its NVLink island again, and a move's layout
(the one ``projections.moves`` checked) is the one that happens. The placer places such a job
by this rule at its turn, and the preemptor's simulation foresees it by the same rule, so that
the GPUs the preemptor counts as taken (or as free for a beneficiary) are the ones the placer
takes.

Until its turn, what of its place is free is its own: the placer, and the preemptor's simulation
with it, takes that part out of the snapshot before anything else (``hold_places``, over the
jobs the fold keeps a place for, ``held_places``) and gives it back to that job alone, at its
turn. Counted free, it would go to a job whose turn comes first (a beneficiary searched for
before it), or make the preemptor stop nobody for a job the placer gives no room.

Each worker of the place stays where the chain still takes its node for the job (health, cordon,
drain, labels, models, room) and its GPUs are ones the chain's reserves could give it. A worker
that cannot stay (its GPUs taken meanwhile or unhealthy, its node turned away) is searched for
beside the ones that do, as a grown job's added ranks are (``gang.place_beside``), so that one
lost GPU does not move the whole gang. If nothing stays, or those ranks find no room, the rule
places nothing and the caller searches for the whole gang as for any job.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import msgspec

from corral.events.decisions import GpuClaim, Placement, WorkerSlot
from corral.events.jobs import Resources
from corral.projections import indexes, queueing
from corral.projections.lifecycle import Phase
from corral.projections.placement import gang
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.plugins.model import suits
from corral.projections.placement.snapshot import NodeView, Snapshot
from corral.projections.state import WHOLE, JobState, State

# A moved job whose new place is held for it: stopping, or admitted again. (Requeued and not
# admitted, it waits for quota, and GPUs held for it would stand idle.)
MOVING: tuple[Phase, ...] = ("checkpointing", "preempted", "admitted")


def held_place(job: JobState, admitted: bool = False) -> Placement | None:
    """The place held for ``job`` as it stands: the one a planned shutdown left it, else the one
    its move names while the move still names a beneficiary (the fold lets a moved job go when
    its beneficiary ends); None if it has none. With ``admitted``, as it will be once admitted
    (a queued job the preemptor simulates as admission would admit it)."""
    if job.kept_place is not None and (admitted or queueing.keeps_place(job)):
        return job.kept_place
    if job.moved_to is not None and job.preempted_for and (admitted or job.phase in MOVING):
        return job.moved_to
    return None


def held_places(state: State) -> list[tuple[JobState, Placement]]:
    """Every job with a place held for it now (``held_place``) and that place: those a planned
    shutdown left one first, in submission order (the placer places them before anyone), then
    the moved ones, in submission order. Read from the jobs the fold keeps a place for
    (``State.places_held``), not from every job waiting."""
    kept: list[tuple[JobState, Placement]] = []
    moved: list[tuple[JobState, Placement]] = []
    for job in indexes.places_held(state):
        place = held_place(job)
        if place is not None:
            (kept if queueing.keeps_place(job) else moved).append((job, place))
    kept.sort(key=lambda jp: (jp[0].submitted_seq, jp[0].id))
    moved.sort(key=lambda jp: (jp[0].submitted_seq, jp[0].id))
    return kept + moved


# (node, resources, claims) of one worker's share of a place, as taken from a snapshot
Held = list[tuple[str, Resources, tuple[GpuClaim, ...]]]


def hold_places(snap: Snapshot, places: list[tuple[JobState, Placement]]) -> dict[str, Held]:
    """For each job and the place held for it (``held_places``), in order: the workers of that
    place that are free now, taken from ``snap`` so that no other job gets them, by job (none
    for a job nothing of whose place is free). A worker whose place was taken meanwhile is not
    held: it is searched for at the job's turn (``back_in_place``). Each is given back to its
    job alone, at its turn (``give_back``)."""
    nodes = snap.state.nodes
    out: dict[str, Held] = {}
    for job, place in places:
        res = job.spec.resources
        part: Held = []
        for w in place.workers:
            if w.node in nodes and free(snap, w.node, res, w.gpus):
                snap.take(w.node, res, w.gpus)
                part.append((w.node, res, w.gpus))
        if part:
            out[job.id] = part
    return out


def give_back(snap: Snapshot, part: Held) -> None:
    """What ``hold_places`` took for a job, back into ``snap`` for it at its turn."""
    for node, res, claimed in part:
        snap.give_back(node, res, claimed)


def take_again(snap: Snapshot, part: Held) -> None:
    """What ``give_back`` gave back for a job its turn did not place: held for it again."""
    for node, res, claimed in part:
        snap.take(node, res, claimed)


def free(snap: Snapshot, node: str, res: Resources, gpus: tuple[GpuClaim, ...]) -> bool:
    """Whether one worker's share (``res``, ``gpus``) is free on ``node`` as ``snap`` sees it: a
    ready node, its CPU and memory, and each GPU's share unheld (``unheld``)."""
    v = snap.view(node)
    if not v.ready or v.cpu_free < res.cpu_milli or v.mem_free < res.memory_mib or v.workers_free < 1:
        return False
    return all(unheld(v, c) for c in gpus)


def unheld(node: NodeView, c: GpuClaim) -> bool:
    """Whether claim ``c``'s share of its GPU on ``node`` is free to hold for a job: a GPU of the
    node, healthy, not in MIG mode, with that share unused (a whole one held by nobody). A MIG
    slice is never held for a job (a MIG worker is searched for). What ``free`` and ``gives``
    both ask of each GPU."""
    if c.mig is not None or not 0 <= c.gpu < len(node.gpus):
        return False
    g = node.gpus[c.gpu]
    return g.healthy and not g.mig and g.free >= c.milli and not (c.milli >= WHOLE and g.holders)


class Hidden(Protocol):
    """GPUs the search for the ranks that cannot stay may not be given (the placer's
    reservation, for a job that could delay the job it is for)."""

    def hide(self, snap: Snapshot) -> None: ...

    def unhide(self, snap: Snapshot) -> None: ...


def back_in_place(
    chain: Chain,
    snap: Snapshot,
    req: Request,
    place: Placement,
    label_keys: dict[str, str],
    hidden: Hidden | None = None,
) -> Placement | None:
    """``req``'s gang on the very GPUs of ``place`` where each worker may still go, and the ranks
    that may not go back searched for beside them (``hidden`` out of their reach), all taken
    from ``snap``; or None, nothing taken. A required topology keeps the ranks searched for in the
    staying workers' domain (``gang.place_beside``)."""
    nodes = snap.state.nodes
    staying: list[WorkerSlot] = []
    for w in sorted(place.workers, key=lambda w: w.rank):
        if w.rank < req.replicas and w.node in nodes and stays(chain, snap, req, w):
            snap.take(w.node, req.res, w.gpus)
            staying.append(w)
    if not staying:
        return None
    kept = Placement(req.job_id, req.attempt, tuple(staying))
    ranks = {w.rank for w in staying}
    missing = [r for r in range(req.replicas) if r not in ranks]
    added: tuple[WorkerSlot, ...] = ()
    if missing:
        rest = dataclasses.replace(req, replicas=len(missing))
        if hidden is not None:
            hidden.hide(snap)
        found = gang.place_beside(chain, snap, rest, label_keys, kept)
        if hidden is not None:
            hidden.unhide(snap)
        if not isinstance(found, Placement):
            snap.release(kept, req.res)
            return None
        added = tuple(msgspec.structs.replace(w, rank=r) for w, r in zip(found.workers, missing, strict=True))
    return Placement(req.job_id, req.attempt, tuple(sorted((*staying, *added), key=lambda w: w.rank)))


def stays(chain: Chain, snap: Snapshot, req: Request, w: WorkerSlot) -> bool:
    """Whether worker ``w`` of a held place may go back there now: the chain still takes its node
    for ``req`` and its GPUs are a share the chain's reserves could give it (``gives``)."""
    if w.node in req.avoid:
        return False
    node = snap.view(w.node)
    return chain.reject(req, node) is None and gives(req, node, w.gpus)


def gives(req: Request, node: NodeView, gpus: tuple[GpuClaim, ...]) -> bool:
    """Whether ``gpus`` on ``node`` are a share the chain's reserves could give one worker of
    ``req`` now: as many GPUs as it asks, each of the share it asks, suitable (model, memory,
    mode) and unheld (``unheld``)."""
    need = req.need
    if need.kind == "mig" or len(gpus) != need.gpus or len({c.gpu for c in gpus}) != len(gpus):
        return False
    return all(c.milli == need.milli and unheld(node, c) and suits(need, node.gpus[c.gpu]) for c in gpus)
