"""``corral explain JOB``: a job's history and, if it waits, why, in an operator's words.

Built from the log alone: every record that names the job, in order, and the folded state of the
job at the end. A tenant sees only its own jobs; another tenant's job is "no such job".
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from events import codec, routing, subjects
from events.base import Event
from events.codec import DecodeError
from events.log import Record
from projections.fold import fold
from services import present


def _body(r: Record) -> Event | None:
    try:
        return codec.decode_body(r.subject, r.data).body
    except DecodeError:
        return None


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S") if t else "-"


def explain(records: list[Record], job_id: str, tenant: str | None) -> dict[str, Any] | None:
    state = fold(records)
    job = state.jobs.get(job_id)
    if job is None or (tenant not in (None, job.tenant, subjects.ADMIN)):
        return None
    history: list[dict[str, Any]] = []
    for r in records:
        body = _body(r)
        if body is not None and job_id in routing.job_ids(body):
            history.append({"seq": r.seq, "time": r.time, "type": type(body).__name__, "subject": r.subject})
    refused = [x for x in state.rejections if x.job_id == job_id]
    row = present.job_row(job)
    lines = [
        f"job {job.id} of {job.tenant} in queue {job.spec.queue}: {job.phase} (attempt {job.attempt})",
        f"  wants {job.spec.replicas} worker(s) × {row['per_worker']}, priority {job.priority}",
    ]
    if job.placement is not None:
        lines.append(f"  placed on {row['nodes']}")
    if job.checkpoint is not None:
        lines.append(f"  last checkpoint: step {job.checkpoint.step} at {job.checkpoint.location}")
    for reason in job.reasons:
        hint = " (preemption could help)" if reason.preemption_helps else ""
        lines.append(f"  why: [{reason.code}] {reason.message}{hint}")
    lines.append("  history:")
    lines += [f"    {h['seq']:>6}  {_when(h['time'])}  {h['type']}" for h in history]
    lines += [f"    {x.seq:>6}  refused [{x.code}] {x.message}" for x in refused]
    return {
        "job": row,
        "reasons": [
            {"code": r.code, "message": r.message, "preemption_helps": r.preemption_helps}
            for r in job.reasons
        ],
        "history": history,
        "refused": [{"seq": x.seq, "code": x.code, "message": x.message} for x in refused],
        "text": "\n".join(lines),
    }
