"""No starvation: a reservation for the first job that does not fit, and backfill around it.

The head of the placement order that finds no room (for lack of free capacity, not for a
constraint no node meets) gets a reservation: the GPUs it would get once running work ends. The
placer projects the future from the state alone: every job holding GPUs is expected to end at
``phase_since + runtime_estimate_s`` (``grace_seconds`` for one that is checkpointing; never, if
it has no estimate), and holders are released earliest end first on a scratch snapshot until the
head's gang fits. The reservation starts when the last of those releases happens.

Jobs after the head may use the reserved GPUs that are free now only if they will not delay the
head: their own runtime estimate ends before the reservation starts, or they are preemptible and
of a lower priority than the head (the preemptor can take the GPUs back: every preemption policy
lets a job stop lower-priority work it is owed). A preemptible job of the head's own priority
does not qualify: it may be one the head's queue's policy cannot stop (a job of its own queue,
or one within its queue's nominal), and it would then keep the GPUs for as long as it runs,
while the head, admitted, keeps its quota idle. Everyone else sees those GPUs, and the CPU and memory the head
needs beside them, as taken. Nothing is stored between cycles: the reservation is derived again
from the state every cycle, so every replica of the placer agrees on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from corral.events.base import Reason
from corral.events.decisions import GpuClaim, Placement
from corral.events.jobs import Resources
from corral.projections import indexes, mig, queueing
from corral.projections.holds import expected_end
from corral.projections.index import expected_text
from corral.projections.placement import gang
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.snapshot import NodeView, Snapshot
from corral.projections.state import JobState, State
from corral.projections.visibility import job_named


@dataclass
class Reservation:
    """GPUs held for ``job_id`` from ``start``; ``now_free`` is the part that is free today."""

    job_id: str
    start: float
    placement: Placement
    res: Resources
    now_free: tuple[tuple[str, Resources, tuple[GpuClaim, ...]], ...]
    priority: int = 0  # the reserved job's
    tenant: str | None = None  # the reserved job's (None: not known, named to nobody)

    def admits(self, job: JobState, req: Request, now: float) -> bool:
        """May ``job`` use the reserved GPUs? Only if it cannot delay the reserved job: it ends
        before the reservation starts, or it is preemptible and of a lower priority, which every
        preemption policy lets the reserved job stop."""
        if req.preemptible and job.priority < self.priority:
            return True
        est = req.runtime_estimate_s
        return est is not None and now + est <= self.start

    def hide(self, snap: Snapshot) -> None:
        for node, res, gpus in self.now_free:
            snap.take(node, res, gpus)

    def unhide(self, snap: Snapshot) -> None:
        for node, res, gpus in self.now_free:
            snap.give_back(node, res, gpus)

    def gpus(self) -> int:
        return sum(len(w.gpus) for w in self.placement.workers)

    def when(self) -> str:
        # An absolute log time, not "in N seconds": the reason stays the same from cycle to cycle
        # while the projection does, so it is not announced again every cycle.
        if math.isinf(self.start):
            return "when jobs without a runtime estimate end"
        return f"at {expected_text(self.start)}"

    def reason(self) -> Reason:
        nodes = sorted({w.node for w in self.placement.workers})
        where = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        return Reason(
            queueing.RESERVED if math.isfinite(self.start) else queueing.RESERVED_UNTIMED,
            f"holds a reservation on {self.gpus()} GPU{'s' if self.gpus() != 1 else ''} of {where}, "
            f"free {self.when()}",
            True,
        )

    def blocking(self, reader: str) -> Reason:
        """Why a job of tenant ``reader`` the reservation keeps off the free GPUs waits."""
        held_for = job_named(self.job_id, self.tenant, reader)
        return Reason(
            queueing.RESERVATION,
            f"the free GPUs that fit are reserved for {held_for} (free {self.when()}); a job may use them "
            "only if its runtime estimate ends before then or it is preemptible",
            True,
            # The admin's explain names it from here; an answer to a tenant who may not see that
            # job leaves it out, as the message does.
            reserved_for=self.job_id,
        )


def reserve(
    state: State,
    snap: Snapshot,
    chain: Chain,
    req: Request,
    now: float,
    label_keys: dict[str, str],
    placed: list[tuple[Placement, Request]],
    priority: int = 0,
    tenant: str | None = None,
) -> Reservation | None:
    """Project when and where ``req`` would fit; None if it never would on this cluster.

    ``snap`` is the cycle's snapshot and ``placed`` what the cycle has placed so far: those jobs
    hold their GPUs in the projection too, until their own estimated end."""
    holders = [(expected_end(j, now), j.id, j.held, j.spec.resources) for j in indexes.holding(state)]
    for p, r in placed:
        est = r.runtime_estimate_s
        holders.append((math.inf if est is None else now + est, p.job_id, p, r.res))
    holders.sort(key=lambda t: (t[0], t[1]))
    future = Snapshot(state)
    for p, r in placed:
        for w in p.workers:
            future.take(w.node, r.res, w.gpus)
    i = 0
    while i < len(holders):
        end = holders[i][0]
        while i < len(holders) and holders[i][0] == end:
            _, _, held, res = holders[i]
            assert held is not None
            future.release(held, res)
            i += 1
        if not _might_fit(future, req):
            continue
        result = gang.place(chain, future, req, label_keys)
        if isinstance(result, Placement):
            free = _free_now(snap, result, req.res)
            return Reservation(req.job_id, end, result, req.res, free, priority, tenant)
    return None


def _might_fit(snap: Snapshot, req: Request) -> bool:
    """A cheap count before a full search: enough free whole GPUs of an acceptable model."""
    need = req.need
    if need.kind != "whole":
        return True
    total = 0
    for model in snap.models():
        if need.model_ok(model):
            total += sum(snap.free_whole_count(n, model) for n in snap.ready)
    return total >= need.gpus * req.replicas


def _free_now(
    snap: Snapshot, placement: Placement, res: Resources
) -> tuple[tuple[str, Resources, tuple[GpuClaim, ...]], ...]:
    """The part of a projected placement that is free in the cycle's snapshot now: what later
    jobs must not take. Worked out by taking it worker by worker (so two workers on one node do
    not count the same free CPU twice), then given back: ``hide`` takes it when it matters."""
    out = []
    for w in placement.workers:
        node = snap.view(w.node)
        gpus = tuple(c for c in w.gpus if _is_free(node, c))
        cpu = min(res.cpu_milli, max(0, node.cpu_free))
        mem = min(res.memory_mib, max(0, node.mem_free))
        if gpus or cpu or mem:
            part = msgspec.structs.replace(res, cpu_milli=cpu, memory_mib=mem)
            snap.take(w.node, part, gpus)
            out.append((w.node, part, gpus))
    for node_name, part, gpus in reversed(out):
        snap.give_back(node_name, part, gpus)
    return tuple(out)


def _is_free(node: NodeView, c: GpuClaim) -> bool:
    g = node.gpus[c.gpu]
    if c.mig is not None:
        return mig.fits(g.model, c.mig.profile, c.mig.start, g.mig_used)
    if c.milli >= 1000:
        return g.whole_free
    return g.free >= c.milli
