"""What ``corral replay --verify`` found, in an operator's words and as data.

``Report`` and its ``Divergence``s are what a verification returns (``verify.py`` builds them);
this module says each logged or re-run decision the way a person reads it (``items``,
``summary``: which job was admitted, placed, preempted, with what) and prints the report for a
terminal (``format_report``) or for a program (``as_dict``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from corral.events import routing
from corral.events.base import Decision, Event, Reason
from corral.events.decisions import (
    JobsPlaced,
    JobsUnschedulable,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
)
from corral.events.jobs import (
    Admission,
    AdmissionWithdrawn,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
)
from corral.projections import quota
from corral.projections.quota import key_name
from corral.projections.rules import RULES

_body_encoder = msgspec.json.Encoder()


class Divergence(msgspec.Struct, kw_only=True):
    """One logged decision cycle that the code does not reproduce.

    ``kind``: ``differs`` (the code now decides otherwise), ``foreign`` (written by someone other
    than the role's service), ``unverifiable`` (no usable ``based_on``, or not a readable event),
    ``error`` (the role's ``decide`` raised on it).
    """

    seq: int  # the first logged event that differs (else the first of the cycle)
    role: str
    based_on: int | None
    now: float | None
    kind: str
    seqs: list[int]
    producers: list[str]
    logged: list[str]  # the cycle's events as logged, one line each
    decided: list[str]  # what the code decides now, one line each
    changes: list[str]  # the difference, job by job
    rules: list[int] = []  # the fold's rules its events were written under, where not this build's


class Report(msgspec.Struct, kw_only=True):
    """What a verification found: ``notes`` say what it assumed and what it explained away."""

    records: int
    first_seq: int
    last_seq: int
    decisions: dict[str, int]  # cycles re-run, per role
    events: int  # logged decision events compared
    divergences: list[Divergence]
    notes: list[str]

    @property
    def clean(self) -> bool:
        return not self.divergences


VERBS = {
    "admitted": ("admitted", "admits it"),
    "placed": ("placed", "places it"),
    "unschedulable": ("reported unschedulable", "reports it unschedulable"),
    "preemption": ("given a preemption", "asks a preemption for it"),
    "grown": ("grown", "grows it"),
    "shrink": ("given a shrink", "asks a shrink for it"),
    "accepted": ("accepted", "accepts it"),
    "rejected": ("rejected", "rejects it"),
    "requeued": ("requeued", "requeues it"),
    "withdrawn": ("withdrawn", "withdraws its admission"),
    "pending": ("given a pending reason", "gives it a pending reason"),
}


def items(body: Event, now: float) -> list[tuple[str, str, str]]:
    """(what, job, detail) for each job an event decides something about."""
    match body:
        case JobsAdmitted():
            return [("admitted", a.job_id, admission(a)) for a in body.admissions] + [
                ("grown", a.job_id, admission(a)) for a in body.growths
            ]
        case JobsPlaced():
            return [("placed", p.job_id, placement(p)) for p in body.placements]
        case JobsUnschedulable():
            return [("unschedulable", u.job_id, reasons(u.reasons, u.attempt)) for u in body.jobs]
        case PreemptionRequested():
            victims = ", ".join(
                f"{v.job_id}" + (f" (attempt {v.attempt})" if v.attempt else "") for v in body.victims
            )
            return [
                (
                    "preemption",
                    body.beneficiary,
                    f"victims {victims or 'none'}, deadline now+{body.deadline - now:g}s",
                )
            ]
        case ShrinkRequested():
            return [
                (
                    "shrink",
                    body.beneficiary,
                    f"{body.job_id} to {body.replicas} workers, deadline now+{body.deadline - now:g}s",
                )
            ]
        case JobAccepted():
            return [("accepted", body.job_id, f"priority {body.priority}")]
        case JobPriorityChanged():
            return [("priority", body.job_id, f"{body.priority}, {reasons((body.reason,))}")]
        case JobRejected():
            return [("rejected", body.job_id, reasons((body.reason,)))]
        case AdmissionWithdrawn():
            return [("withdrawn", body.job_id, f"attempt {body.attempt}, {reasons((body.reason,))}")]
        case JobRequeued():
            resume = f", resume from {body.resume_from}" if body.resume_from else ""
            return [("requeued", body.job_id, f"attempt {body.attempt}, {reasons((body.reason,))}{resume}")]
        case PendingReasonChanged():
            return [("pending", body.job_id, reasons(body.reasons))]
    return [(type(body).__name__, "", _body_encoder.encode(body).decode())]


def counts(c: Counter[str]) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(c.items())) or "nothing"


def placement(p: Placement) -> str:
    workers = []
    for pos, w in enumerate(p.workers):
        claims = []
        for c in w.gpus:
            if c.mig is not None:
                claims.append(f"{c.gpu}:{c.mig.profile}@{c.mig.start}")
            elif c.milli != 1000:
                claims.append(f"{c.gpu}:{c.milli}m")
            else:
                claims.append(str(c.gpu))
        rank = f"r{w.rank}=" if w.rank != pos else ""
        workers.append(f"{rank}{w.node}[{','.join(claims)}]")
    return " ".join(workers) + (f" (attempt {p.attempt})" if p.attempt else "")


def admission(a: Admission) -> str:
    held = ", ".join(
        f"{n} {'GPU' if k == quota.ANY and n == 1 else key_name(k)}" for k, n in sorted(a.gpus.items())
    )
    text = f"{a.replicas} worker{'s' if a.replicas != 1 else ''}" + (f" holding {held}" if held else "")
    return text + (f" (attempt {a.attempt})" if a.attempt else "")


def reasons(reasons: Sequence[Reason], attempt: int = 0) -> str:
    text = " | ".join(f"{r.code}: {r.message}" for r in reasons) or "no reason"
    return text + (f" (attempt {attempt})" if attempt else "")


def summary(body: Event) -> str:
    """One line for one decision event: its type and what it carries."""
    name = type(body).__name__
    match body:
        case JobsAdmitted():
            ids = job_list(a.job_id for a in body.admissions)
            return f"{name}: {len(body.admissions)} admission(s) {ids}"
        case JobsPlaced():
            ids = job_list(p.job_id for p in body.placements)
            return f"{name}: {len(body.placements)} placement(s) {ids}"
        case JobsUnschedulable():
            return f"{name}: {len(body.jobs)} job(s) {job_list(u.job_id for u in body.jobs)}"
        case PreemptionRequested():
            return f"{name}: for {body.beneficiary}, {len(body.victims)} victim(s)"
    jobs = routing.job_ids(body)
    return f"{name}: {', '.join(jobs)}" if jobs else name


def summaries(entries: Sequence[tuple[int | None, Event]]) -> list[str]:
    """One line per batch decision, one per type for the job facts (a cycle may accept
    thousands of jobs), in order of first appearance; with their seqs when logged."""
    lines: dict[object, tuple[list[int], list[Event]]] = {}
    for seq, body in entries:
        group: object = id(body) if isinstance(body, Decision) else type(body)
        seqs, bodies = lines.setdefault(group, ([], []))
        if seq is not None:
            seqs.append(seq)
        bodies.append(body)
    out = []
    for seqs, bodies in lines.values():
        where = ""
        if seqs:
            where = f"seq {seqs[0]} " if len(seqs) == 1 else f"seqs {min(seqs)}..{max(seqs)} "
        if len(bodies) == 1:
            out.append(where + summary(bodies[0]))
        else:
            jobs = [j for b in bodies for j in routing.job_ids(b)]
            out.append(f"{where}{type(bodies[0]).__name__} ×{len(bodies)}: {job_list(jobs)}")
    return out


def job_list(ids: Any, limit: int = 6) -> str:
    ids = list(ids)
    shown = ", ".join(ids[:limit]) + (f", … {len(ids) - limit} more" if len(ids) > limit else "")
    return f"[{shown}]"


def seconds(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".")


def as_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-able data, with ``clean`` spelled out."""
    data: dict[str, Any] = msgspec.to_builtins(report)
    data["clean"] = report.clean
    return data


MAX_CHANGES = 20  # per divergence, in the text form


def format_report(report: Report) -> str:
    total = sum(report.decisions.values())
    per_role = ", ".join(f"{role} {n}" for role, n in report.decisions.items()) or "none"
    n = len(report.divergences)
    verdict = "clean" if report.clean else f"{n} divergence{'s' if n != 1 else ''}"
    lines = [
        f"verified {total} decisions ({per_role}), {report.events} logged events, "
        f"in {report.records} records (seq {report.first_seq}..{report.last_seq}): {verdict}"
    ]
    lines += [f"note: {note}" for note in report.notes]
    for d in report.divergences:
        based = f"based on seq {d.based_on}" if d.based_on is not None else "based on an unknown seq"
        now = f", now {seconds(d.now)} ({_utc(d.now)})" if d.now is not None else ""
        lines.append("")
        lines.append(f"seq {d.seq}: {d.role} decision {based}{now} [{d.kind}]")
        if d.producers:
            # 0: sealed before envelopes carried their rules (not "rules 0", which never was).
            said = ", ".join(str(r) if r else "not recorded" for r in d.rules)
            under = f", under rules {said} (this build's {RULES})" if d.rules else ""
            lines.append(f"  written by: {', '.join(d.producers)}{under}")
        for i, text in enumerate(d.logged):
            lines.append(f"  {'logged:' if i == 0 else '':<8} {text}")
        if d.kind in ("differs", "foreign"):
            for i, text in enumerate(d.decided or ["nothing"]):
                lines.append(f"  {'now:' if i == 0 else '':<8} {text}")
        for text in d.changes[:MAX_CHANGES]:
            lines.append(f"  - {text}")
        if len(d.changes) > MAX_CHANGES:
            lines.append(f"  - … and {len(d.changes) - MAX_CHANGES} more (all of them in -o json)")
    return "\n".join(lines)


def _utc(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return "not a time"
