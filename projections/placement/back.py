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
from corral.projections import queueing
from corral.projections.lifecycle import Phase
from corral.projections.placement import gang
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.plugins.model import suits
from corral.projections.placement.snapshot import NodeView, Snapshot
from corral.projections.state import WHOLE, JobState

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
    mode), healthy and with that share free (a whole one held by nobody). A MIG slice is never
    held for a job, and a MIG worker is searched for."""
    need = req.need
    if need.kind == "mig" or len(gpus) != need.gpus or len({c.gpu for c in gpus}) != len(gpus):
        return False
    for c in gpus:
        if c.mig is not None or c.milli != need.milli or not 0 <= c.gpu < len(node.gpus):
            return False
        g = node.gpus[c.gpu]
        if not suits(need, g) or not g.healthy or g.free < c.milli or (c.milli >= WHOLE and g.holders):
            return False
    return True
