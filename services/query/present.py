"""What the CLI shows of a State: rows for tables and plain data for ``-o json``."""

from __future__ import annotations

from collections.abc import Callable
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


def node_gpus(node: NodeState, state: State, visible: Callable[[JobState], bool]) -> dict[str, Any]:
    """A node's health and each of its GPUs with what holds it: the jobs ``visible`` says the
    asker may see by id and queue, the others' share only as ``others_milli``."""
    gpus = []
    for g in node.gpus:
        holders, others = [], 0
        for job_id, milli in sorted(g.holders.items()):
            job = state.jobs.get(job_id)
            if job is not None and visible(job):
                holders.append({"job": job_id, "queue": job.spec.queue, "milli": milli})
            else:
                others += milli
        gpus.append(
            {
                "index": g.info.index,
                "model": g.info.model,
                "healthy": g.healthy,
                "signal": g.signal,
                "mig": g.info.mig,
                "used_milli": g.used_milli,
                "holders": holders,
                "others_milli": others,
            }
        )
    return {
        "name": node.name,
        "condition": node.condition,
        "cordoned": node.cordoned,
        "draining": node.draining,
        "profile": node.inventory.labels.get("profile", ""),
        "gpus": gpus,
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
