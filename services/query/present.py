"""What the CLI shows of a State: rows for tables and plain data for ``-o json``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from corral.projections.shape import Shape
from corral.projections.state import WHOLE, JobState, NodeState, State


def gpu_request(job: JobState) -> str:
    worker = Shape.of(job.spec.resources)
    if worker.kind == "mig":
        return f"mig {worker.mig}"
    return f"{worker.gpu_milli / WHOLE:g} gpu"


def job_row(job: JobState) -> dict[str, Any]:
    nodes = sorted({w.node for w in job.placement.workers}) if job.placement else []
    return {
        "id": job.id,
        "tenant": job.tenant,
        "queue": job.spec.queue,
        "phase": job.phase,
        "attempt": job.attempt,
        "workers": job.spec.replicas,
        "per_worker": gpu_request(job),
        "nodes": ",".join(nodes),
        "reason": "; ".join(r.message for r in job.reasons),
    }


def node_row(node: NodeState) -> dict[str, Any]:
    models = sorted({g.info.model for g in node.gpus})
    return {
        "name": node.name,
        "condition": "cordoned" if node.cordoned else node.condition,
        "model": ",".join(models) or "-",
        "gpus": len(node.gpus),
        "free": sum(1 for g in node.gpus if g.idle and g.healthy),
        "unhealthy": sum(1 for g in node.gpus if not g.healthy),
        "milli_used": sum(g.used_milli for g in node.gpus),
        "mig": sum(1 for g in node.gpus if g.info.mig),
        "profile": node.inventory.labels.get("profile", ""),
    }


def summary(state: State) -> dict[str, Any]:
    phases = {phase: len(ids) for phase, ids in state.jobs_by_phase.items()}
    gpus = [g for n in state.nodes.values() for g in n.gpus]
    return {
        "seq": state.seq,
        "nodes": len(state.nodes),
        "gpus": len(gpus),
        "gpus_allocated_milli": sum(g.used_milli for g in gpus),
        "jobs": len(state.jobs),
        "phases": dict(sorted(phases.items())),
        "queues": len(state.queues),
        "rejected": state.rejected_total,
        "void": state.void_total,
        "faults": state.faults,
    }


def full(state: State) -> Any:
    """The whole state as plain JSON-able data: what ``corral replay -o json`` prints."""
    return msgspec.to_builtins(state)


def eta_text(eta: dict[str, Any], now: float | None = None) -> str:
    """A forecast start as a person reads it: when (in how long, given ``now``), between when
    and when, and what it assumes."""
    start, early, late = eta["start"], eta["early"], eta["late"]
    if start is None:
        return f"not within {eta['horizon_s'] / 3600:g} h of the forecast at {_clock(eta['forecast_at'])}"
    if now is not None:
        return f"in {span(start - now)} (between {span(early - now)} and {_later(late, now)})"
    lo = _clock(early) if early is not None else "?"
    hi = _clock(late) if late is not None else "later"
    return (
        f"{_clock(start)} (between {lo} and {hi}; forecast at {_clock(eta['forecast_at'])}, "
        f"{eta['assumption']})"
    )


def _later(late: float | None, now: float) -> str:
    return "beyond the horizon" if late is None else span(late - now)


def span(seconds: float) -> str:
    """A duration as a person reads it (none below zero: a start already due is "now")."""
    if seconds < 60:
        return "< 1 min" if seconds > 0 else "now"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
