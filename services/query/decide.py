"""The read service's answers: what one asker may see of the folded state. Pure: no IO, no clock.

``answer(state, history, asker, question, ask)`` turns the state (and each job's history, as
``projections.index`` tells it) into plain JSON-able data. The asker is the name the question's
subject carries, ``corral.read.<asker>.<question>``, which NATS permissions allow only the identity
of that name to publish on; nothing in the payload changes who asks.

Invariants:

- a tenant sees only its own jobs, only the queues open to it (no tenant list, or one naming it),
  and only the rejections of its own requests; ``admin`` sees everything;
- a job of another tenant is answered exactly as a job that does not exist; on a GPU it shares
  (``gpus``) it is only milli-GPU taken, with no id or queue;
- a job id is looked up, never matched: wildcards, dots and anything else in it find nothing;
- a job the fold let go is answered from ``let_go`` (the read service's SQLite view): the
  newest of its id the asker may see, after any the state still holds;
- every answer carries ``seq``, the log position it reflects; a question that cannot be answered
  gets ``error``, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from corral.events import codec, subjects
from corral.events.queues import QueueSpec
from corral.projections.index import JobEvent
from corral.projections.state import JobState, State
from corral.services.query import present
from corral.services.query.explain import explain
from corral.services.query.queues import queue_rows

QUESTIONS = ("jobs", "explain", "queues", "rejections", "nodes", "gpus")
MAX_LET_GO = 1000  # jobs let go that one answer lists, the newest: an answer must fit in a message

History = Mapping[str, Sequence[JobEvent]]  # job id -> the records that concern it, oldest first


class LetGo(Protocol):
    """The jobs the fold let go, as they stood then (``view.JobView`` keeps them in SQLite)."""

    def jobs(self, asker: str, limit: int) -> tuple[list[dict[str, Any]], int]: ...

    def explain(self, job_id: str, asker: str) -> dict[str, Any] | None: ...


class Ask(msgspec.Struct, frozen=True):
    """What a question may carry: the job it is about, and the log position the answer should
    reflect at least (so a client reads its own writes), and for ``jobs`` whether to list the
    jobs the fold let go too. Other fields are ignored."""

    job: str = ""
    after: int = 0
    all: bool = False  # ``jobs``: also the jobs the fold let go (the newest MAX_LET_GO of them)


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


def answer(
    state: State, history: History, asker: str, question: str, ask: Ask, let_go: LetGo | None = None
) -> dict[str, Any]:
    if question == "jobs":
        rows = [present.job_row(j) for j in state.jobs.values() if sees_job(asker, j)]
        if not ask.all or let_go is None:
            return {"seq": state.seq, "jobs": rows}
        older, more = let_go.jobs(asker, MAX_LET_GO)
        return {"seq": state.seq, "jobs": older + rows, "more_let_go": more}
    if question == "explain":
        job = state.jobs.get(ask.job)
        if job is not None and sees_job(asker, job):
            return {"seq": state.seq, **explain(job, history.get(job.id, ()))}
        kept = let_go.explain(ask.job, asker) if let_go is not None else None
        if kept is None:
            return refusal(state, f"no job {ask.job}")
        return {"seq": state.seq, **kept}
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
    if question == "gpus":
        # Every GPU of every node, and who holds it: the asker's own jobs by name and queue,
        # anyone else's only as GPU taken (the dashboard's grid).
        nodes = sorted(state.nodes.values(), key=lambda n: n.name)
        rows = [present.node_gpus(n, state, lambda j: sees_job(asker, j)) for n in nodes]
        return {"seq": state.seq, "nodes": rows}
    return refusal(state, f"no question {question!r}; ask one of {', '.join(QUESTIONS)}")
