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
- a job's output is the output of the workers the fold placed for it only, on its run's
  subjects, stored from its submission to the next submission of its id (``OutputScope``): not
  what any agent wrote on its id's subjects, nor an earlier job of its id's output;
- a job the fold let go is answered from ``let_go`` (the read service's SQLite view): the
  newest of its id the asker may see, after any the state still holds; where the view no
  longer keeps some of the asker's own jobs let go, "no job" says so (how many, let go up to
  which position), from the asker's own count alone: nothing of another tenant's;
- a waiting job's row carries ``eta``, its forecast start from the asker's own forecasts (the
  forecast role's bucket, ``runtime/forecasts.py``: a key per tenant), or None;
- every answer carries ``seq``, the log position it reflects; a question that cannot be answered
  gets ``error``, never an exception;
- ``verdict`` tells what became of the asker's own request stored at ``after`` (the position the
  intake answered with), and only of its own: a refusal is looked up by that position and the
  asker's own request subject, a submit's outcome on the job that request made.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from corral.events import codec, subjects
from corral.events.base import Int
from corral.projections.index import JobEvent
from corral.projections.lifecycle import FINAL, WAITING
from corral.projections.state import JobState, NodeState, State
from corral.projections.visibility import sees_job, sees_queue
from corral.services.query import present
from corral.services.query.explain import anyone_stoppable, explain, notes_for
from corral.services.query.queues import queue_rows
from corral.services.runtime.forecasts import TenantForecast

QUESTIONS = ("jobs", "explain", "queues", "rejections", "nodes", "verdict", "gpus", "output")
# Every request's: past a tenant's three, the admin's (their ``job`` names the node, the queue,
# the cohort or what the change is of).
VERDICT_VERBS = tuple(codec.ADMIN_VERBS)
MAX_WAIT = 60.0  # seconds one question may ask the read service to wait for its answer to settle
MAX_LET_GO = 1000  # jobs let go that one answer lists, the newest: an answer must fit in a message
# What one page of ``jobs`` holds at most, encoded: an answer must fit in a NATS message (1 MiB by
# default), and a cluster of thousands of jobs lists them page by page, by job id.
JOBS_PAGE_BYTES = 512 * 1024
LET_GO_BYTES = 384 * 1024  # and the jobs let go that the first page adds, as stored
GPUS_PAGE_BYTES = 512 * 1024  # what one page of ``gpus`` or ``nodes`` holds at most, encoded
REJECTIONS_BYTES = 512 * 1024  # and the answer of refusals, the newest kept

History = Mapping[str, Sequence[JobEvent]]  # job id -> the records that concern it, oldest first
Forecasts = Mapping[str, TenantForecast]  # tenant -> its jobs' forecast starts


class LetGo(Protocol):
    """The jobs the fold let go, as they stood then (``view.JobView`` keeps them in SQLite)."""

    def jobs(self, asker: str, limit: int, budget: int) -> tuple[list[dict[str, Any]], int]: ...

    def explain(self, job_id: str, asker: str) -> dict[str, Any] | None: ...

    def submitted(self, job_id: str, seq: int, asker: str) -> dict[str, Any] | None: ...

    def output_scope(self, job_id: str, asker: str) -> OutputScope | None: ...

    def request(self, seq: int) -> tuple[str, str] | None: ...

    def requests_known_from(self) -> int: ...

    def dropped(self, asker: str) -> tuple[int, int] | None: ...


class OutputScope(NamedTuple):
    """Whose output is a job's: its run's subjects (a job id is free again once its job was let
    go, while the stream keeps a week: the run, the log position of its submission, tells the
    jobs of one id apart), of the workers the fold placed for it, ``(node, attempt, rank)``,
    over all its attempts, stored from the job's submission to the next submission of its id.
    A message on any other node's, attempt's or rank's subject was written by an agent the job
    never ran on, and one stored before its submission on a run that was not yet its own: never
    shown."""

    workers: frozenset[tuple[str, int, int]]
    run: int  # the job's submission's log position (``JobState.submitted_seq``)
    since: float  # the job's submission, in log time (the stream's clock)
    until: float = math.inf  # the next job of its id's submission

    def shows(self, node: str, attempt: int, rank: int, stored: float) -> bool:
        return (node, attempt, rank) in self.workers and self.since <= stored < self.until


class Ask(msgspec.Struct, frozen=True):
    """What a question may carry: the job it is about, and the log position the answer should
    reflect at least (so a client reads its own writes), and for ``jobs`` whether to list the
    jobs the fold let go too. Other fields are ignored."""

    job: str = ""  # for the verdict on an admin's request: the node, queue or cohort it is about
    after: Int = 0
    all: bool = False  # ``jobs``: also the jobs the fold let go (the newest, MAX_LET_GO at most)
    verb: str = ""  # ``verdict``: the verb of the request stored at ``after``
    until: str = ""  # ``explain``: a phase to wait for (or any final one), with ``wait``
    wait: float = 0.0  # seconds the answer may wait to settle (a verdict, ``until``), at most MAX_WAIT
    # Integers on the wire fit in 64 bits, as everywhere (``events.base.Int``).
    rank: Int = -1  # ``output``: one worker's (-1: every worker's)
    tail: Int = -1  # ``output``: only the last this many lines (-1: all kept)
    cursor: Int = 0  # ``output``: the output stream's sequence the asker has read up to
    page_after: Int = 0  # ``jobs``: the page of jobs submitted after this log position (``next``)
    node_after: str = ""  # ``gpus``, ``nodes``: the page of nodes named after this one (``next``)

    def patience(self) -> float:
        """``wait`` bounded to 0..MAX_WAIT (anything else, NaN included, is 0)."""
        if self.wait > MAX_WAIT:
            return MAX_WAIT
        return self.wait if self.wait > 0 else 0.0


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


def no_job(state: State, asker: str, job_id: str, let_go: LetGo | None) -> dict[str, Any]:
    """The answer about a job the asker may not see. Where the view of the jobs let go no
    longer keeps some of the asker's own (the admin's: anyone's), the job may be one of them:
    said so, and that the log has it. What is told is the asker's own count alone, so an
    id another tenant used reads exactly as one never used."""
    dropped = let_go.dropped(asker) if let_go is not None else None
    if dropped is None:
        return refusal(state, f"no job {job_id}")
    jobs, through = dropped
    whose = "jobs" if asker == subjects.ADMIN else "of your jobs"
    # 0: the tenant's own count is no longer kept, only how far the jobs no longer kept reach.
    lost = f"no longer keeps {jobs} {whose}" if jobs else f"may no longer keep some {whose}"
    return refusal(
        state,
        f"no job {job_id} among those the read service keeps: it {lost} "
        f"let go from the cluster's state at seq {through} or before; if {job_id} is one, it is "
        "older than the read service keeps, and the log has it",
    )


def refusal(
    state: State, message: str, *, busy: bool = False, retry_s: float | None = None
) -> dict[str, Any]:
    """An answer that is no answer. ``busy``: nothing was wrong with the question, the service
    has too many of the asker's waiting, or the asker used its share of the service's time;
    asked again later (after ``retry_s``, where it is known), it is answered."""
    if busy:
        told: dict[str, Any] = {"seq": state.seq, "error": message, "busy": True}
        if retry_s is not None:
            # Up to the millisecond, not to the nearest: a wait under half of one said 0.0, and
            # a client asked again at once, to be told busy again.
            told["retry_s"] = math.ceil(retry_s * 1000) / 1000
        return told
    return {"seq": state.seq, "error": message}


def _node_pages(state: State, ask: Ask, row_of: Callable[[NodeState], dict[str, Any]]) -> dict[str, Any]:
    """The rows of the nodes named after ``ask.node_after``, a page of at most
    ``GPUS_PAGE_BYTES`` (at least one row), with ``next`` when more follow: a thousand 8-GPU
    nodes are more than a message carries."""
    names = sorted(n for n in state.nodes if n > ask.node_after)
    rows: list[dict[str, Any]] = []
    size = 0
    for i, name in enumerate(names):
        row = row_of(state.nodes[name])
        size += len(_encode_row(row)) + 1
        if rows and size > GPUS_PAGE_BYTES:
            return {"seq": state.seq, "nodes": rows, "next": names[i - 1]}
        rows.append(row)
    return {"seq": state.seq, "nodes": rows}


def _jobs_page(state: State, asker: str, after: int, etas: Forecasts) -> tuple[list[dict[str, Any]], int]:
    """The rows of the jobs ``asker`` sees submitted after log position ``after``, in the order
    they were submitted, as many as ``JOBS_PAGE_BYTES`` holds (at least one); and the position to
    ask the next page after (0 at the end)."""
    rows: list[dict[str, Any]] = []
    size = 0
    last = 0
    # A tenant's own jobs, from the fold's index of them (a walk of every tenant's jobs made each
    # page cost the whole cluster, charged to the asker's share); the admin's: all of them. Both
    # are in submission order (the fold adds a job to each as it is submitted, and checks the
    # tenants' order, ``indexes.check``), so a page starts where ``after`` falls: sorting them
    # made every page of a tenant of 40,000 jobs cost all of them.
    ids = list(state.jobs if asker == subjects.ADMIN else state.jobs_by_tenant.get(asker, {}))
    jobs = state.jobs
    start = bisect.bisect_right(ids, after, key=lambda i: jobs[i].submitted_seq)
    for i in itertools.islice(ids, start, None):
        job = jobs[i]
        if not sees_job(asker, job):
            continue
        row = {**present.job_row(job), "eta": eta_of(job, etas)}
        size += len(_encode_row(row)) + 1
        if rows and size > JOBS_PAGE_BYTES:
            return rows, last
        rows.append(row)
        last = job.submitted_seq
    return rows, 0


_encode_row = msgspec.json.Encoder().encode


def _rejections(state: State, asker: str) -> dict[str, Any]:
    """The refusals kept that the asker may see (its own requests'; the admin's: all), oldest
    first: the newest of them that ``REJECTIONS_BYTES`` holds, encoded, and how many older ones
    were left out. A refusal's message is bounded in characters, not bytes: tenants' requests
    of ids in four-byte characters made the admin's answer more than a NATS message carries."""
    own = f"{subjects.IN}.{asker}."
    rows: list[dict[str, Any]] = []
    size = left_out = 0
    for r in reversed(state.rejections):
        if asker != subjects.ADMIN and not r.subject.startswith(own):
            continue
        if left_out:
            left_out += 1
            continue
        row = {"seq": r.seq, "subject": r.subject, "code": r.code, "message": r.message, "job_id": r.job_id}
        size += len(_encode_row(row)) + 1
        if size > REJECTIONS_BYTES:
            left_out = 1
            continue
        rows.append(row)
    rows.reverse()
    told: dict[str, Any] = {"seq": state.seq, "rejections": rows}
    if left_out:
        told["left_out"] = left_out
    return told


def verdict(state: State, asker: str, ask: Ask, let_go: LetGo | None = None) -> dict[str, Any] | None:
    """What became of ``asker``'s ``ask.verb`` request stored at ``ask.after`` about job ``ask.job``:
    ``refused`` (by the fold: no such job, a duplicate id, ...), ``rejected`` (a submit admission
    will never run, with why), ``accepted`` (a submit now waiting or further), ``applied`` (a
    cancel or resize the fold took); None while it is not known yet (the log not folded that far,
    or a submit admission has not judged)."""
    if state.seq < ask.after or ask.after <= 0:
        return None
    # The state keeps the newest rejections only, and of each tenant's its newest: once one of
    # the asker's at or past the request was let go (its own flood of bad requests pushes them
    # out, others' do not), a refusal of it may have been, and "applied" would be a guess.
    lost = max(state.rejections_lost.get(asker, 0), state.rejections_lost_floor)
    forgotten = lost >= ask.after
    unknown = {
        "seq": state.seq,
        "verdict": "unknown",
        "reason": f"too many requests were refused since seq {ask.after} to tell whether it was",
    }
    own = f"{subjects.IN}.{asker}.{ask.verb}"
    duplicate = False
    for r in reversed(state.rejections):  # newest last: stop once past the request
        if r.seq < ask.after:
            break
        if r.seq == ask.after and r.subject == own:
            if r.code == "duplicate" and ask.verb == "submit":
                duplicate = True  # the same id twice is one job: its verdict is the first's
                break
            job_verb = ask.verb in ("cancel", "resize")
            reason = f"no such job {ask.job}" if r.code == "unknown" and job_verb else r.message
            return {"seq": state.seq, "verdict": "refused", "code": r.code, "reason": reason}
    if ask.verb != "submit":
        return _taken(state, asker, ask, let_go, unknown if forgotten else None)
    job = state.jobs.get(ask.job)
    row: dict[str, Any] | None = None
    code = "rejected"
    if job is not None and sees_job(asker, job) and (duplicate or job.submitted_seq == ask.after):
        if job.phase == "submitted":
            return None
        row = present.job_row(job)
        code = job.reasons[0].code if job.reasons else code
    elif let_go is not None:
        row = let_go.submitted(ask.job, ask.after, asker)
    if row is None:
        if forgotten:
            return unknown
        dropped = let_go.dropped(asker) if let_go is not None else None
        if dropped is not None and ask.after <= dropped[1]:  # its job may be among those dropped
            return {
                "seq": state.seq,
                "verdict": "unknown",
                "reason": f"jobs let go at seq {dropped[1]} or before are no longer kept to tell",
            }
        reason = f"no submit of job {ask.job} by {asker} at seq {ask.after}"
        return {"seq": state.seq, "verdict": "refused", "code": "unknown", "reason": reason}
    told = {"seq": state.seq, "job": row, "duplicate": duplicate}
    if row["phase"] == "rejected":
        return {**told, "verdict": "rejected", "code": code, "reason": row["reason"]}
    return {**told, "verdict": "accepted"}


def _taken(
    state: State, asker: str, ask: Ask, let_go: LetGo | None, unknown: dict[str, Any] | None
) -> dict[str, Any]:
    """The verdict of a request other than a submit that the fold did not refuse (as far as the
    refusals kept tell: ``unknown`` when they may no longer): ``applied`` if the fold took one of
    the asker's of ``ask.verb`` at ``ask.after`` (about ``ask.job``, for a cancel or resize);
    else ``refused``, whether there was none there or its refusal was let go, unless the
    position is older than the view keeps requests for (or no view was given)."""
    applied = {"seq": state.seq, "verdict": "applied"}
    if let_go is None:
        return unknown or applied
    taken = let_go.request(ask.after)
    own = f"{subjects.IN}.{asker}.{ask.verb}"
    if (
        taken is not None
        and taken[0] == own
        and (ask.verb not in ("cancel", "resize") or taken[1] == ask.job)
    ):
        return applied
    if ask.after < let_go.requests_known_from():
        return unknown or {
            "seq": state.seq,
            "verdict": "unknown",
            "reason": f"requests before seq {let_go.requests_known_from()} are no longer kept to tell",
        }
    reason = f"no {ask.verb} of {ask.job} by {asker} at seq {ask.after} was applied"
    if unknown is not None:
        reason += f" (why is no longer kept: {unknown['reason']})"
    return {"seq": state.seq, "verdict": "refused", "code": "unknown", "reason": reason}


def settled(state: State, asker: str, question: str, ask: Ask, let_go: LetGo | None = None) -> bool:
    """Whether the answer to ``question`` is as final as the asker asked: the log folded to
    ``after``, a verdict known, the job of an ``explain ... until`` in that phase or a final one
    (or not to be found)."""
    if state.seq < ask.after:
        return False
    if question == "verdict":
        return verdict(state, asker, ask, let_go) is not None
    if question == "explain" and ask.until:
        job = state.jobs.get(ask.job)
        return job is None or not sees_job(asker, job) or job.phase == ask.until or job.phase in FINAL
    return True


def job_workers(job: JobState, placed: Mapping[str, frozenset[tuple[str, int, int]]]) -> OutputScope:
    """The output scope of a job the state holds, ``placed`` the workers the fold placed for each
    (``view.JobView.placed``)."""
    return OutputScope(placed.get(job.id, frozenset()), job.submitted_seq, job.submitted_at)


def output_scope(
    state: State,
    asker: str,
    ask: Ask,
    placed: Mapping[str, frozenset[tuple[str, int, int]]],
    let_go: LetGo | None = None,
) -> OutputScope | dict[str, Any]:
    """Whose output ``asker`` may read as job ``ask.job``'s (``OutputScope``), or why it may
    not (a refusal). Another tenant's job, like one that never was, is "no job", and the newest
    job of the id the asker may see is the one read, as ``explain`` does: the output stream is
    filtered by the id, so an id that is not a plain token (a wildcard) is never looked up."""
    if ask.rank < -1 or ask.tail < -1 or ask.cursor < 0:
        return refusal(state, "output: rank, tail and cursor are 0 or more")
    if not subjects.is_token(ask.job):
        return refusal(state, f"no job {ask.job[:64]!r}")
    job = state.jobs.get(ask.job)
    if job is not None and sees_job(asker, job):
        return job_workers(job, placed)
    scope = let_go.output_scope(ask.job, asker) if let_go is not None else None
    if scope is not None:
        return scope
    return no_job(state, asker, ask.job, let_go)


def output_ended(state: State, job_id: str) -> bool:
    """Whether the job's workers will print no more: it is final, or let go (so final)."""
    job = state.jobs.get(job_id)
    return job is None or job.phase in FINAL


def eta_of(job: JobState, forecasts: Forecasts) -> dict[str, Any] | None:
    """A waiting job's forecast start and how sure it is, from its tenant's forecast; None when
    it does not wait or has none yet."""
    told = forecasts.get(job.tenant)
    if job.phase not in WAITING or told is None:
        return None
    e = told.jobs.get(job.id)
    if e is None:
        return None
    return {
        "start": e.start,
        "early": e.early,
        "late": e.late,
        "forecast_at": told.at,
        "horizon_s": told.horizon_s,
        "assumption": told.assumption,
    }


def tenants_to_read(state: State, asker: str, question: str, ask: Ask) -> list[str]:
    """Whose forecasts an answer to ``question`` needs: none, the asker's own, or (the admin's
    ``jobs``) those of every tenant with a job waiting."""
    if question not in ("jobs", "explain"):
        return []
    if asker != subjects.ADMIN:
        return [asker]
    if question == "explain":
        job = state.jobs.get(ask.job)
        return [] if job is None else [job.tenant]
    return sorted({state.jobs[j].tenant for phase in WAITING for j in state.jobs_by_phase.get(phase, ())})


def answer(
    state: State,
    history: History,
    asker: str,
    question: str,
    ask: Ask,
    let_go: LetGo | None = None,
    forecasts: Forecasts | None = None,
) -> dict[str, Any]:
    etas: Forecasts = forecasts or {}
    if question == "jobs":
        rows, next_at = _jobs_page(state, asker, ask.page_after, etas)
        page: dict[str, Any] = {"seq": state.seq, "jobs": rows}
        if next_at:
            page["next"] = next_at
        if not ask.all or let_go is None or ask.page_after:
            return page
        older, more = let_go.jobs(asker, MAX_LET_GO, LET_GO_BYTES)  # with the first page
        return {**page, "jobs": older + rows, "more_let_go": more}
    if question == "explain":
        job = state.jobs.get(ask.job)
        if job is not None and sees_job(asker, job):
            notes = notes_for(state, job, asker)
            stoppable = anyone_stoppable(state, job)
            return {
                "seq": state.seq,
                **explain(
                    job, history.get(job.id, ()), eta_of(job, etas), notes, stoppable, state.jobs, asker
                ),
            }
        kept = let_go.explain(ask.job, asker) if let_go is not None else None
        if kept is None:
            return no_job(state, asker, ask.job, let_go)
        return {"seq": state.seq, **kept}
    if question == "queues":
        open_ = {name for name, q in state.queues.items() if sees_queue(asker, q)}
        return {"seq": state.seq, "queues": [r for r in queue_rows(state) if r["queue"] in open_]}
    if question == "rejections":
        return _rejections(state, asker)
    if question == "nodes":
        # Capacity and health are the cluster's, not any tenant's: everyone may see them.
        return _node_pages(state, ask, lambda n: present.node_row(n, state, lambda j: sees_job(asker, j)))
    if question == "verdict":
        if ask.verb not in VERDICT_VERBS:
            return refusal(state, f"verdict: verb {ask.verb[:64]!r}; one of {', '.join(VERDICT_VERBS)}")
        told = verdict(state, asker, ask, let_go)
        return told if told is not None else {"seq": state.seq, "verdict": "pending"}
    if question == "gpus":
        # Every GPU of every node, and who holds it: the asker's own jobs by name and queue,
        # anyone else's only as GPU taken (the dashboard's grid).
        return _node_pages(state, ask, lambda n: present.node_gpus(n, state, lambda j: sees_job(asker, j)))
    return refusal(state, f"no question {question!r}; ask one of {', '.join(QUESTIONS)}")
