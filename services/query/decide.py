"""The read service's answers: what one asker may see of the folded state. Pure: no IO, no clock.

``answer(state, history, asker, question, ask)`` turns the state (and each job's history, as
``projections.index`` tells it) into plain JSON-able data. The asker is the name the question's
subject carries, ``corral.read.<asker>.<question>``, which NATS permissions allow only the identity
of that name to publish on; nothing in the payload changes who asks.

Invariants:

- a tenant sees only its own jobs, only the queues open to it (no tenant list, or one naming it),
  and only the rejections of its own requests; ``admin`` sees everything;
- a job of another tenant is answered exactly as a job that does not exist;
- a job id is looked up, never matched: wildcards, dots and anything else in it find nothing;
- every answer carries ``seq``, the log position it reflects; a question that cannot be answered
  gets ``error``, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from corral.events import codec, subjects
from corral.events.log import Record
from corral.events.queues import QueueSpec
from corral.projections.index import JobEvent, job_events
from corral.projections.state import JobState, Rejection, State
from corral.services.query import present
from corral.services.query.explain import explain
from corral.services.query.queues import queue_rows

QUESTIONS = ("jobs", "explain", "queues", "rejections", "nodes")

History = Mapping[str, Sequence[JobEvent]]  # job id -> the records that concern it, oldest first


def add_history(
    history: dict[str, list[JobEvent]],
    state: State,
    batch: Sequence[Record],
    refusals: Mapping[int, Rejection],
) -> None:
    """Add to each job's history what ``batch`` (just folded into ``state``, ``refusals`` the
    records of it the fold refused) says about it. A refused submit of an id nobody holds joins
    no history: there is no job to show it with."""
    for e in job_events(state, batch, refusals):
        if e.job_id in state.jobs:
            history.setdefault(e.job_id, []).append(e)


class Ask(msgspec.Struct, frozen=True):
    """What a question may carry: the job it is about, and the log position the answer should
    reflect at least (so a client reads its own writes). Other fields are ignored."""

    job: str = ""
    after: int = 0


class BadAsk(ValueError):
    """A payload that is neither a JSON object of ``Ask`` fields nor a bare job id."""


_decode_ask = msgspec.json.Decoder(Ask).decode


def parse_ask(data: bytes) -> Ask:
    """A JSON object (``{"job": "j-1", "after": 42}``), or the bare job id as text, or nothing."""
    text = data.strip()
    if not text:
        return Ask()
    if text.startswith(b"{"):
        try:
            return _decode_ask(text)
        except codec.UNREADABLE as e:
            raise BadAsk(f"unreadable question: {e}") from None
    return Ask(job=text.decode("utf-8", errors="replace"))


def sees_job(asker: str, job: JobState) -> bool:
    return asker in (subjects.ADMIN, job.tenant)


def sees_queue(asker: str, queue: QueueSpec) -> bool:
    return asker == subjects.ADMIN or not queue.tenants or asker in queue.tenants


def refusal(state: State, message: str) -> dict[str, Any]:
    return {"seq": state.seq, "error": message}


def answer(state: State, history: History, asker: str, question: str, ask: Ask) -> dict[str, Any]:
    if question == "jobs":
        rows = [present.job_row(j) for j in state.jobs.values() if sees_job(asker, j)]
        return {"seq": state.seq, "jobs": rows}
    if question == "explain":
        job = state.jobs.get(ask.job)
        if job is None or not sees_job(asker, job):
            return refusal(state, f"no job {ask.job}")
        return {"seq": state.seq, **explain(job, history.get(job.id, ()))}
    if question == "queues":
        open_ = {name for name, q in state.queues.items() if sees_queue(asker, q)}
        return {"seq": state.seq, "queues": [r for r in queue_rows(state) if r["queue"] in open_]}
    if question == "rejections":
        own = f"{subjects.IN}.{asker}."
        rows = [
            {"seq": r.seq, "subject": r.subject, "code": r.code, "message": r.message, "job_id": r.job_id}
            for r in state.rejections
            if asker == subjects.ADMIN or r.subject.startswith(own)
        ]
        return {"seq": state.seq, "rejections": rows}
    if question == "nodes":
        # Capacity and health are the cluster's, not any tenant's: everyone may see them.
        nodes = sorted(state.nodes.values(), key=lambda n: n.name)
        return {"seq": state.seq, "nodes": [present.node_row(n) for n in nodes]}
    return refusal(state, f"no question {question!r}; ask one of {', '.join(QUESTIONS)}")
