"""What the dashboard shows, built from the read service's answers. Pure: no IO, no clock.

``build(asker, gpus, queues, jobs)`` turns the answers to ``gpus``, ``queues`` and ``jobs``
(``services/query/decide.py``), all asked as one identity, into the board the page draws: each
node's health and its GPUs as cells split among the jobs that hold them, coloured by queue; the
queues' quota; the jobs that wait, with their reasons and forecast starts, and those that hold
GPUs. ``timeline``
turns the answer to ``explain`` into a job's attempts, each with its placements, starts, exits,
checkpoints and preemptions.

Invariants:

- the board shows only what the answers hold: the read service decides what an identity sees,
  so a tenant's board names no other tenant's job or closed queue (their GPUs are ``other``);
- a queue's colour is its position among the queues the asker sees, the same in every cell,
  every legend swatch and every table row of one board;
- reasons are the read service's words, the ones ``corral explain`` prints.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from corral.projections.lifecycle import FINAL, HOLDS_GPUS
from corral.services.query import present

MILLI = 1000  # milli-GPU in one GPU
OTHER = "#9aa0a6"  # GPU taken by jobs the asker may not see
UNKNOWN_QUEUE = "#6b7280"  # a job of a queue the queues' answer does not list (deleted since)
_GOLDEN_ANGLE = 137.508  # successive hues as far apart as they can be, however many queues

Answer = Mapping[str, Any]


class Unanswered(ValueError):
    """The read service answered with an error, not the data the board needs; ``retry_s``: it
    was busy (the asker past its share of the service's time), and says when to ask again."""

    def __init__(self, message: str, retry_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_s = retry_s


def unanswered(answer: Answer) -> Unanswered:
    """The error of an answer that carries one, with when to ask again if it was busy."""
    retry_s = answer.get("retry_s")
    if answer.get("busy") is True and isinstance(retry_s, (int, float)) and 0.0 < retry_s < 3600.0:
        return Unanswered(str(answer["error"]), float(retry_s))
    return Unanswered(str(answer["error"]))


def _rows(answer: Answer, key: str) -> Sequence[Mapping[str, Any]]:
    if "error" in answer:
        raise unanswered(answer)
    rows: Sequence[Mapping[str, Any]] = answer[key]
    return rows


def queue_colours(queues: Sequence[str]) -> dict[str, str]:
    """Each queue's colour, by its position in sorted order."""
    return {q: f"hsl({(i * _GOLDEN_ANGLE) % 360:.0f}, 60%, 52%)" for i, q in enumerate(sorted(set(queues)))}


def job_tint(job: str) -> int:
    """A job's shade within its queue's colour (0..4), so neighbouring jobs of one queue differ."""
    return zlib.crc32(job.encode()) % 5


def build(asker: str, gpus: Answer, queues: Answer, jobs: Answer) -> dict[str, Any]:
    node_rows, queue_rows, job_rows = _rows(gpus, "nodes"), _rows(queues, "queues"), _rows(jobs, "jobs")
    colours = queue_colours([q["queue"] for q in queue_rows])
    return {
        "asker": asker,
        "seq": max(int(gpus["seq"]), int(queues["seq"]), int(jobs["seq"])),
        "nodes": [_node(n, colours) for n in node_rows],
        "queues": [_queue(q, colours) for q in queue_rows],
        "waiting": [_job(j, colours) for j in job_rows if waiting(j["phase"])],
        "running": [_job(j, colours) for j in job_rows if j["phase"] in HOLDS_GPUS],
        "finished": sum(1 for j in job_rows if j["phase"] in FINAL),
    }


def waiting(phase: str) -> bool:
    """A job not finished and holding no GPUs: queued, admitted and not placed, or between
    attempts (preempted, interrupted)."""
    return phase not in FINAL and phase not in HOLDS_GPUS


def node_health(node: Mapping[str, Any]) -> str:
    """The one word a person reads first: what stops work landing on the node, if anything."""
    if node["condition"] != "ready":
        return str(node["condition"])  # suspect, lost, shut down (or a cordon's word)
    if node["draining"]:
        return "draining"
    if node["cordoned"]:
        return "cordoned"
    if any(not g["healthy"] for g in node["gpus"]):
        return "degraded"
    return "ready"


def _node(node: Mapping[str, Any], colours: Mapping[str, str]) -> dict[str, Any]:
    health = node_health(node)
    return {
        "name": node["name"],
        "health": health,
        "profile": node["profile"],
        "gpus": [_gpu(node["name"], health, g, colours) for g in node["gpus"]],
    }


def _gpu(node: str, health: str, gpu: Mapping[str, Any], colours: Mapping[str, str]) -> dict[str, Any]:
    """A GPU cell: the share each job holds, then the others' share, then what is free (the read
    service's ``free_milli``, what ``corral nodes`` counts), then what nobody holds and no work
    may go on: the GPUs of a node that takes none (``health`` says why), an unhealthy one."""
    segments = [
        {
            "job": h["job"],
            "queue": h["queue"],
            "colour": colours.get(h["queue"], UNKNOWN_QUEUE),
            "tint": job_tint(h["job"]),
            "share": h["milli"] / MILLI,
        }
        for h in gpu["holders"]
    ]
    if gpu["others_milli"]:
        segments.append(
            {"job": "", "queue": "", "colour": OTHER, "tint": 0, "share": gpu["others_milli"] / MILLI}
        )
    idle = max(0, MILLI - gpu["used_milli"])
    free = min(idle, gpu["free_milli"])
    title = f"{node} GPU {gpu['index']} ({gpu['model']}{', MIG' if gpu['mig'] else ''})"
    if not gpu["healthy"]:
        title += f": unhealthy{' (' + gpu['signal'] + ')' if gpu['signal'] else ''}"
    held = ", ".join(f"{s['job']} ({s['queue']}, {s['share']:g})" for s in segments if s["job"])
    if held:
        title += f"; held by {held}"
    if gpu["others_milli"]:
        title += f"; {gpu['others_milli'] / MILLI:g} by others' jobs"
    unavailable = ""
    if idle > free:
        unavailable = (
            f"node {health}"
            if health not in ("ready", "degraded")
            else ("GPU unhealthy" if not gpu["healthy"] else "GPU held in the MIG mode it left")
        )
        title += f"; {(idle - free) / MILLI:g} idle, not available: {unavailable}"
    return {
        "id": f"{node}/{gpu['index']}",
        "index": gpu["index"],
        "healthy": gpu["healthy"],
        "signal": gpu["signal"],
        "segments": segments,
        "free": free / MILLI,
        "unavailable": (idle - free) / MILLI,
        "unavailable_why": unavailable,
        "title": title,
    }


def _queue(q: Mapping[str, Any], colours: Mapping[str, str]) -> dict[str, Any]:
    fields = ("queue", "cohort", "gpu", "nominal", "used", "borrowed", "lent", "pending", "admitted")
    return {**{f: q[f] for f in fields}, "colour": colours[q["queue"]]}


def _job(j: Mapping[str, Any], colours: Mapping[str, str]) -> dict[str, Any]:
    fields = ("id", "tenant", "queue", "phase", "attempt", "workers", "per_worker", "nodes", "reason")
    row = {**{f: j[f] for f in fields}, "wants": present.wants_text(j), "where": present.nodes_text(j)}
    row["colour"] = colours.get(j["queue"], UNKNOWN_QUEUE)
    return {**row, "eta": j.get("eta")}  # a waiting job's forecast start, when there is one


# -- a job's timeline -------------------------------------------------------------------------

# What each record is, on a job's timeline, by the event type ``explain`` names.
KINDS = {
    "SubmitJob": "submitted",
    "JobAccepted": "accepted",
    "JobRejected": "rejected",
    "JobsAdmitted": "admitted",
    "AdmissionWithdrawn": "withdrawn",
    "PendingReasonChanged": "waiting",
    "JobsUnschedulable": "waiting",
    "JobsPlaced": "placed",
    "WorkerStarted": "started",
    "WorkerExited": "exited",
    "CheckpointCompleted": "checkpoint",
    "PreemptionRequested": "preempted",
    "ShrinkRequested": "shrink",
    "JobRequeued": "requeued",
    "CancelJob": "cancel",
    "ResizeJob": "resize",
    "JobPriorityChanged": "priority",
}


def timeline(job_id: str, explained: Answer) -> dict[str, Any]:
    """The job's attempts in order, each with the records of it: an attempt ends where the job
    is requeued (after a preemption, a failure or a lost node) and the next begins. A record the
    fold refused is kept, marked, and moves nothing. A preemption the job asked for (it was the
    beneficiary) is ``preempting``, one it suffered ``preempted``; a consolidation's stop, which
    runs it on elsewhere, ``moved``."""
    if "error" in explained:
        raise unanswered(explained)
    attempts: list[dict[str, Any]] = [{"attempt": 0, "events": []}]
    for e in explained["history"]:
        kind = KINDS.get(e["type"], "other")
        if kind in ("preempted", "shrink") and "on its behalf" in e["summary"]:
            kind = "preempting"
        elif kind == "preempted" and "move elsewhere" in e["summary"]:  # ``index.summarize``'s
            kind = "moved"
        event = {
            "seq": e["seq"],
            "time": e["time"],
            "kind": kind,
            "summary": e["summary"],
            "refused": _refusal(explained, e["seq"]),
        }
        attempts[-1]["events"].append(event)
        if kind == "requeued" and not event["refused"]:
            attempts.append({"attempt": attempts[-1]["attempt"] + 1, "events": []})
    for a in attempts:
        times = [e["time"] for e in a["events"] if e["time"]]
        a["start"], a["end"] = (min(times), max(times)) if times else (0.0, 0.0)
    if not attempts[-1]["events"]:
        attempts[-1]["start"] = attempts[-1]["end"] = attempts[-2]["end"] if len(attempts) > 1 else 0.0
    for a in attempts:
        a["rows"] = _runs(a["events"])
    row = explained["job"]
    return {
        "id": job_id,
        "job": {**row, "wants": present.wants_text(row), "where": present.nodes_text(row)},
        "reasons": list(explained["reasons"]),
        "attempts": attempts,
        "seq": explained["seq"],
        "counts": {k: sum(1 for a in attempts for e in a["events"] if e["kind"] == k) for k in _COUNTED},
    }


_COUNTED = ("placed", "preempted", "checkpoint", "requeued")


def _runs(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The lines a person reads: a run of checkpoints (a job saves every few minutes for hours)
    is one line saying how many and the last; every other record is a line of its own."""
    rows: list[dict[str, Any]] = []
    for e in events:
        last = rows[-1] if rows else None
        if (
            e["kind"] == "checkpoint"
            and not e["refused"]
            and last is not None
            and last["kind"] == "checkpoint"
        ):
            last.update(seq=e["seq"], time=e["time"], count=last["count"] + 1)
            last["summary"] = f"{last['count']} checkpoints, the last {e['summary']}"
            continue
        rows.append({**e, "count": 1})
    return rows


def _refusal(explained: Answer, seq: int) -> str:
    for r in explained.get("refused", ()):
        if r["seq"] == seq:
            return f"{r['code']}: {r['message']}"
    return ""
