"""The trace and span ids of a job's life and of a node's, derived from the log alone.

Every service folds the same log, so each can add its spans to one job's trace without a word
to the others: the trace is the one its submit request carried (``traceparent``, which the fold
keeps on the job), or else one derived from the job's id and the log position of its submit
(ids are reused once a job is let go; positions are not). Each span id is derived too: the
job's own span from the job, an attempt's from its number, a worker's from attempt and rank, a
decision's from the log sequence of the record that made it. So a span can name as its parent,
or link to, a span another service emits, before or after it does.

Pure: hashing only, no OpenTelemetry here (the fold and the node views stay free of it).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple


def _id(bits: int, *parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1  # zero is the invalid id


def parse(traceparent: str) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C ``traceparent``, or None if it is not one."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace_id, span_id) if trace_id and span_id else None


def traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


class JobTrace(NamedTuple):
    """Where a job's spans go: its trace, the span its submit was sent under (0: none, the
    job's span is the trace's root) and the job's own span, parent of its attempts."""

    trace_id: int
    submit_span: int
    job_span: int
    job_id: str

    def attempt_span(self, attempt: int) -> int:
        return _id(64, self.trace_id, self.job_id, "attempt", attempt)

    def worker_span(self, attempt: int, rank: int) -> int:
        """A worker's run: its job's own spans hang under it (``TRACEPARENT``)."""
        return _id(64, self.trace_id, self.job_id, "worker", attempt, rank)

    def start_span(self, attempt: int, node: str) -> int:
        """One node's part of starting a gang: its ranks launched behind the barrier."""
        return _id(64, self.trace_id, self.job_id, "start", attempt, node)

    def record_span(self, seq: int) -> int:
        """The span of the decision or report stored at log sequence ``seq``."""
        return _id(64, self.trace_id, self.job_id, "record", seq)

    @property
    def traceparent(self) -> str:
        """The job's own span, as a W3C ``traceparent``: what events about it carry."""
        return traceparent(self.trace_id, self.job_span)


def job_trace(job_id: str, submitted_seq: int, submitted_under: str = "") -> JobTrace:
    """The trace of the job ``job_id`` submitted at log sequence ``submitted_seq``, under the
    client's ``traceparent`` (``submitted_under``) if it sent one."""
    sent = parse(submitted_under) if submitted_under else None
    if sent is not None:
        trace_id, submit_span = sent
    else:
        trace_id, submit_span = _id(128, "corral-job", job_id, submitted_seq), 0
    return JobTrace(trace_id, submit_span, _id(64, trace_id, job_id, "job"), job_id)


def from_traceparent(job_id: str, job_traceparent: str) -> JobTrace | None:
    """The job's trace from its own span's ``traceparent`` (``JobTrace.traceparent``, as the
    node views carry it), for a reader that does not fold the log."""
    got = parse(job_traceparent)
    if got is None:
        return None
    return JobTrace(got[0], 0, got[1], job_id)


class NodeTrace(NamedTuple):
    """A node's trace: its health and cordons, which the jobs they interrupted link to."""

    trace_id: int
    node_span: int

    def record_span(self, seq: int) -> int:
        return _id(64, self.trace_id, "record", seq)


def node_trace(node: str) -> NodeTrace:
    trace_id = _id(128, "corral-node", node)
    return NodeTrace(trace_id, _id(64, trace_id, "node"))
