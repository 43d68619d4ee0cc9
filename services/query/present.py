"""What the CLI shows of a State: rows for tables and plain data for ``-o json``."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from corral.projections.lifecycle import HOLDS_GPUS
from corral.projections.shape import NO_GPU, Shape
from corral.projections.state import WHOLE, JobState, NodeState, State

_BREAKS = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` as one line of a table or of ``explain``, its line breaks written as JSON's
    escapes (``\\u000a``). Much of what a line shows is text tenants wrote (a cancel's reason, a
    MIG profile or a mount target that a refusal quotes): a break in it would start a line of
    the tenant's making, a forged row of the admin's ``corral jobs``. (The CLI's screen escapes
    every other control character; these it must keep, between lines.)"""
    return _BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def gpu_request(job: JobState) -> str:
    return Shape.of(job.spec.resources).gpus_short()


def gpus(milli: int) -> int | float:
    """Milli-GPU as a number of GPUs for ``-o json``: ``16``, ``2.5``, ``0.125``."""
    return milli // WHOLE if milli % WHOLE == 0 else milli / WHOLE


def job_row(job: JobState) -> dict[str, Any]:
    """A job as ``corral jobs`` lists it. Numbers stay numbers (``-o json``); ``workers`` is the
    most it asks for, ``min_workers`` the least an elastic job runs with (``workers`` for any
    other), ``running_workers`` how many run now; the table writes them with ``workers_text``.
    ``nodes``: where it holds GPUs now; ``was_on``: where its attempt was placed, once it holds
    them no more (it ended, or was stopped), so that no view shows it on a node it has left. A
    job cancelled, failed or stopped holds its GPUs until its last worker is gone (``held``):
    it is on its nodes until then, as the nodes' GPUs say."""
    where = job.placement or job.held  # a requeued job's workers of its last attempt: held alone
    placed = sorted({w.node for w in where.workers}) if where else []
    here = job.phase in HOLDS_GPUS or job.held is not None
    shape = Shape.of(job.spec.resources)
    return {
        "id": job.id,
        "tenant": job.tenant,
        "queue": job.spec.queue,
        "phase": job.phase,
        "attempt": job.attempt,
        "workers": job.spec.replicas,
        "min_workers": job.spec.min_replicas or job.spec.replicas,
        "running_workers": len(job.live),
        "per_worker": shape.gpus_short(),
        "gpus_per_worker": 0 if shape.kind in ("mig", "cpu") else gpus(shape.gpu_milli),
        "mig": (shape.mig or "") if shape.kind == "mig" else "",
        "nodes": ",".join(placed) if here else "",
        "was_on": "" if here else ",".join(placed),
        "reason": "; ".join(r.message for r in job.reasons),
    }


def wants_text(row: Mapping[str, Any]) -> str:
    """What a job asks in all, the one way every view writes it: ``8 GPU`` for one worker,
    ``4×8 GPU`` for a gang of four workers of 8 GPUs each (its ``per_worker`` alone read as the
    whole job's), ``2..4×8 GPU`` for an elastic one, ``2×MIG 3g.40gb``, ``no GPU``."""
    per = str(row.get("per_worker", ""))
    most = row.get("workers", 0)
    least = row.get("min_workers") or most
    if per == NO_GPU or (most == least == 1):
        return per
    return f"{least}..{most}×{per}" if least != most else f"{most}×{per}"


def nodes_text(row: Mapping[str, Any]) -> str:
    """Where a job is, the one way every view writes it: its nodes while it holds GPUs there,
    ``was on node-01`` once it left them (a job that ended is on no node)."""
    if row.get("nodes"):
        return str(row["nodes"])
    return f"was on {row['was_on']}" if row.get("was_on") else ""


def workers_text(row: dict[str, Any]) -> str:
    """``3 of 4`` (running of most); an elastic job's range, ``3 of 2..4``."""
    most, least = row.get("workers", 0), row.get("min_workers", row.get("workers", 0))
    asked = f"{least}..{most}" if least != most else f"{most}"
    return f"{row.get('running_workers', 0)} of {asked}"


def free_milli(node: NodeState) -> int:
    """What of ``node``'s GPUs work could be placed on now, in milli-GPU (``free_by_gpu``)."""
    return sum(free_by_gpu(node))


def free_by_gpu(node: NodeState) -> list[int]:
    """Each of ``node``'s GPUs' milli-GPU work could be placed on now: none on a node that takes
    no new work (silent, shut down, cordoned or draining: its ``standing`` says which), else the
    unheld share of a healthy GPU that takes new claims (not one still held in the MIG mode it
    left). The one count of free GPUs: ``corral nodes`` shows it and the metrics'
    ``corral.node.gpus.free`` adds it up, so an operator comparing the two reads one number."""
    if not node.schedulable:
        return [0] * len(node.gpus)
    return [g.free_milli if g.healthy and not g.held_in_other_mode else 0 for g in node.gpus]


def node_row(
    node: NodeState, state: State | None = None, visible: Callable[[JobState], bool] | None = None
) -> dict[str, Any]:
    """A node as ``corral nodes`` lists it: its condition as the scheduler reads it (cordoned
    and draining over ready), each unhealthy GPU with its signal, its MIG instances and whose:
    the job's id where ``visible`` (given with the ``state`` holding the jobs) lets the asker see
    it, else empty (everyone's, without). ``free``: the GPUs work could be placed on now
    (``free_milli``: 0 on a node that takes none, whose condition says why); ``idle``: its healthy
    GPUs nobody holds, whether or not it takes work."""

    def holder(job_id: str | None) -> str | None:
        if visible is None or state is None or not job_id:
            return job_id
        job = state.jobs.get(job_id)
        return job_id if job is not None and visible(job) else ""

    models = sorted({g.info.model for g in node.gpus})
    return {
        "name": node.name,
        "condition": node.standing,
        "cordoned": node.cordoned,
        "draining": node.draining,
        "why": _node_why(node),
        "model": ",".join(models) or "-",
        "gpus": len(node.gpus),
        "free": gpus(free_milli(node)),
        "idle": sum(1 for g in node.gpus if g.idle and g.healthy),
        "gpus_used": gpus(sum(g.used_milli for g in node.gpus)),
        "unhealthy": [{"gpu": i, "signal": g.signal} for i, g in enumerate(node.gpus) if not g.healthy],
        "mig_gpus": sum(1 for g in node.gpus if g.info.mig),
        "mig_instances": [
            {"gpu": i, "profile": inst.profile, "job": holder(inst.job_id)}
            for i, g in enumerate(node.gpus)
            for _, inst in sorted(g.mig.items())
        ],
        "profile": node.inventory.labels.get("profile", ""),
    }


# Why a node that is not ready is not: its agent's silence, as the health monitor reads it.
_SILENT = {
    "suspect": "its agent missed heartbeats: nothing new goes here, and what runs here is not known",
    "lost": "its agent went silent: its jobs went back to their queues; nothing goes here until it is heard",
}


_SHUT_DOWN = (
    "its agent shut it down: its jobs went back to their queues; nothing goes here until the agent is back"
)


def _node_why(node: NodeState) -> str:
    """Why ``node`` takes no new work: its agent's silence or shutdown, and its cordon's reason."""
    if node.condition != "ready":
        away = _SILENT.get(node.condition, "")
    else:
        away = _SHUT_DOWN if node.shut_down else ""
    if not away:
        return node.cordon_reason
    return f"{away}; {node.cordon_reason}" if node.cordon_reason else away


def node_gpus(node: NodeState, state: State, visible: Callable[[JobState], bool]) -> dict[str, Any]:
    """A node's health and each of its GPUs with what holds it: the jobs ``visible`` says the
    asker may see by id and queue, the others' share only as ``others_milli``; ``free_milli``:
    what work could be placed on now (``free_by_gpu``, what ``corral nodes`` counts)."""
    gpus = []
    for g, free in zip(node.gpus, free_by_gpu(node), strict=True):
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
                "free_milli": free,
            }
        )
    return {
        "name": node.name,
        "condition": node.standing,
        "cordoned": node.cordoned,
        "draining": node.draining,
        "profile": node.inventory.labels.get("profile", ""),
        "gpus": gpus,
    }


def health_text(row: dict[str, Any]) -> str:
    """``ok``, or each unhealthy GPU with its signal: ``gpu 3 xid:79``."""
    bad = row.get("unhealthy") or []
    return ", ".join(f"gpu {u['gpu']} {u['signal']}".rstrip() for u in bad) or "ok"


def mig_text(row: dict[str, Any]) -> str:
    """``-`` without MIG; else the MIG GPUs and the instances carved from them, by profile:
    ``8 GPUs: 2×3g.40gb, 1g.10gb``."""
    if not row.get("mig_gpus"):
        return "-"
    counts: dict[str, int] = {}
    for inst in row.get("mig_instances") or []:
        counts[inst["profile"]] = counts.get(inst["profile"], 0) + 1
    used = ", ".join(f"{n}×{p}" if n > 1 else p for p, n in sorted(counts.items())) or "none in use"
    return f"{row['mig_gpus']} GPUs: {used}"


def phases_text(phases: dict[str, int]) -> str:
    """``15 succeeded, 1 cancelled``: a summary's jobs by phase, as a person reads them."""
    return ", ".join(f"{n} {phase}" for phase, n in phases.items()) or "no jobs"


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
    """A forecast start as a person reads it: in how long (given ``now``), else when, and
    between when and when (its band)."""
    start, early, late = eta["start"], eta["early"], eta["late"]
    if start is None:
        return f"not within {eta['horizon_s'] / 3600:g} h of the forecast at {clock(eta['forecast_at'])}"
    if now is not None:
        point, lo, hi = span(start - now), span(early - now), _later(late, now)
        if point == "now":
            return "now"
        if lo == hi == point:  # a band that reads as its start says nothing more
            return f"in {point}"
        return f"in {point} (between {lo} and {hi})"
    lo = clock(early) if early is not None else "?"
    hi = clock(late) if late is not None else "beyond the horizon"
    if lo == hi == clock(start):  # as above: a start that cannot move (a back-off's end)
        return clock(start)
    return f"{clock(start)} (between {lo} and {hi})"


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


def stale_text(seq: int, since: float, why: str) -> str:
    """What an answer of a read service that cannot read the log on says of itself: since when,
    why, and how far it is current."""
    return f"the log cannot be read since {clock(since)} ({why}); this answer is as of position {seq}"


def clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
