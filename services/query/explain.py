"""``corral explain JOB``: a job's history and, if it waits, why, in an operator's words.

``explain(job, history)`` is the one presentation, used by the CLI reading the log itself and by
the read service answering a tenant (``view.py``: for a job the state still holds, and for one
the fold let go, as it stood then). A tenant sees only its own jobs; another tenant's job is
"no such job". The admin, who sees every job, is also told the other side of its preemptions
(``other_sides``), which its owner's texts leave unnamed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from corral.events import subjects
from corral.events.base import Reason
from corral.projections import indexes, preemption, queueing, quota
from corral.projections.index import JobEvent
from corral.projections.lifecycle import HOLDS_GPUS
from corral.projections.shape import workers_text
from corral.projections.state import JobState, State
from corral.projections.visibility import job_told
from corral.services.query import present


def explain(
    job: JobState,
    history: Sequence[JobEvent],
    eta: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    stoppable: bool = True,
    jobs: Mapping[str, JobState] | None = None,
    reader: str | None = None,
) -> dict[str, Any]:
    """A job's row (with its forecast start, ``eta``, when it waits), why it waits, its history
    and what of it was refused, and the text a person reads; ``notes``: lines from the state
    around it (``notes_for`` the asker); ``stoppable``: whether any running job could be stopped
    for it (``anyone_stoppable``), which a reason that freed GPUs would help leaves open;
    ``reader`` (the job's owner if None) and the state's ``jobs``: which other jobs its reasons
    may name as data (``visibility.job_told``; none where ``jobs`` is not given)."""
    row = {**present.job_row(job), "eta": eta}
    reasons = [_reason(r, jobs or {}, job.tenant if reader is None else reader) for r in job.reasons]
    events = [
        {"seq": e.seq, "time": e.time, "type": e.type, "subject": e.subject, "summary": e.summary}
        for e in history
    ]
    refused = []
    for e in history:
        if e.refused:
            code, _, message = e.refused.partition(": ")
            refused.append({"seq": e.seq, "code": code, "message": message})
    lines = [
        f"job {job.id} of {job.tenant} in queue {job.spec.queue}: {job.phase} (attempt {job.attempt})",
        f"  wants {present.wants_text(row)} ({_workers(job)}), priority {job.priority}; "
        f"{row['running_workers']} running",
    ]
    if row["nodes"]:
        lines.append(f"  placed on {row['nodes']}")
    elif row["was_on"]:
        lines.append(f"  {present.nodes_text(row)}")  # ended, or stopped: on no node now
    if job.checkpoint is not None:
        lines.append(f"  last checkpoint: step {job.checkpoint.step} at {job.checkpoint.location}")
    for r in job.reasons:
        hint = ""
        if r.preemption_helps:
            hint = " (preemption could help)" if stoppable else " (no running job may be stopped for it)"
        lines.append(f"  why: [{r.code}] {r.message}{hint}")
    lines.extend(f"  {note}" for note in notes)
    if eta is not None:
        lines.append(f"  estimated start: {present.eta_text(eta)}")
        lines.append(f"    forecast at {present.clock(eta['forecast_at'])}; {eta['assumption']}")
    lines.append("  history:")
    for e in history:
        refused_note = f"  (refused: {e.refused})" if e.refused else ""
        lines.append(f"    {e.seq:>6}  {_when(e.time)}  {e.summary}{refused_note}")
    return {
        "job": row,
        "reasons": reasons,
        "history": events,
        "refused": refused,
        "text": "\n".join(map(present.one_line, lines)),
    }


def _reason(r: Reason, jobs: Mapping[str, JobState], reader: str) -> dict[str, Any]:
    told: dict[str, Any] = {"code": r.code, "message": r.message, "preemption_helps": r.preemption_helps}
    reserved_for = None if r.reserved_for is None else job_told(jobs, r.reserved_for, reader)
    if reserved_for is not None:
        told["reserved_for"] = reserved_for
    return told


def anyone_stoppable(state: State, job: JobState) -> bool:
    """Whether a reason of ``job``'s that freed GPUs would help may say preemption could: some
    job holding GPUs in a phase a preemption stops (placed, starting or running) that may be
    preempted is of its queue and a priority its ``within_queue`` lets it stop (a lower one,
    or its own where the job was submitted later and the policy says so), or of another queue
    of its cohort tree that holds quota the job's side lent (``Ledger.borrows_from``: what it
    may take back, borrow over or share; a queue within its nominal loses nothing to another
    queue), or asks for no GPU (``preemption.rides``) where the job asks for some; or, for an
    admitted job the free GPUs would hold but for how they are scattered, is of its priority or
    a lower one (a consolidation moves it, ``services/preemptor/consolidation.py``). Not the preemptor's
    search, which weighs quota, guards and room too: where this is false, no rule stops or
    moves anyone for the job, as when only jobs of its priority or higher hold the GPUs. Asked
    only of a job with such a reason: it walks the jobs holding GPUs."""
    if not any(r.preemption_helps for r in job.reasons):
        return True
    tree = set(preemption.tree_queues(state, job.spec.queue))
    queue, priority = job.spec.queue, job.priority
    policy = preemption.policy_of(state, job)
    rides = preemption.rides(job)
    ledger: quota.Ledger | None = None  # the quota the preemption rule reads, once asked
    moves: bool | None = None  # whether a consolidation could make room for it, once asked

    def lent(other: JobState) -> bool:
        nonlocal ledger
        if ledger is None:
            ledger = preemption.planning_ledger(state)
        key = preemption.charged_key(ledger, other)
        return key is not None and ledger.borrows_from(other.spec.queue, queue, key)

    def may(other: JobState) -> bool:
        nonlocal moves
        if other.id == job.id or not preemption.preemptible(state, other):
            return False
        if preemption.rides(other) and not rides:
            return True
        if other.spec.queue == queue:
            later = other.submitted_seq > job.submitted_seq
            if preemption.may_stop_within(policy, other.priority, priority) and (
                other.priority < priority or later
            ):
                return True
        elif other.spec.queue in tree and lent(other):
            return True
        if other.priority > priority:
            return False
        if moves is None:
            moves = job.phase == "admitted" and _scattered_room(state, job)
        return moves

    return any(may(other) for other in indexes.jobs_in(state, "placed", "starting", "running"))


def _scattered_room(state: State, job: JobState) -> bool:
    """Whether the free GPUs of the nodes new work may land on add up to what ``job``'s gang
    asks (as ``consolidation.room_anywhere`` counts them, CPU and memory left out): where not,
    moving work frees no room for it. A job of MIG slices, or of no GPU, may have room made."""
    res = job.spec.resources
    if res.mig is not None or res.gpus <= 0:
        return True
    replicas = job.admission.replicas if job.admission is not None else job.spec.replicas
    need = quota.worker_milli(res) * replicas
    for node in state.nodes.values():
        if node.schedulable:
            need -= sum(g.free_milli for g in node.gpus if g.healthy and not g.mig)
            if need <= 0:
                return True
    return False


def notes_for(state: State, job: JobState, asker: str) -> list[str]:
    """The lines from the state around ``job`` that ``asker`` (who sees the job) is told:
    ``node_notes`` and ``kept_place_notes`` for anyone, ``other_sides`` for the admin alone."""
    notes = node_notes(state, job) + kept_place_notes(job)
    return notes + other_sides(state, job) if asker == subjects.ADMIN else notes


def kept_place_notes(job: JobState) -> list[str]:
    """Where a job a planned shutdown of its node interrupted comes back to, while the placer
    holds that place for it (``queueing.keeps_place``): its reasons say it was interrupted, or
    admitted, and nothing of why it goes before jobs that waited longer or rank higher."""
    place = job.kept_place
    if place is None or not queueing.keeps_place(job):
        return []
    gpus: dict[str, set[int]] = {}
    for w in place.workers:
        gpus.setdefault(w.node, set()).update(c.gpu for c in w.gpus)
    if not gpus:  # each worker had a GPU that left its node: it keeps its turn, not its place
        return ["back from a planned shutdown of its node (corral stopped): it is placed first"]
    where = ", ".join(
        f"{name} (GPUs {', '.join(map(str, sorted(on)))})" if on else name
        for name, on in sorted(gpus.items())
    )
    nodes = "node" if len(gpus) == 1 else "nodes"
    return [
        f"keeps its place on {nodes} {where} from before a planned shutdown (corral stopped): "
        "held from every other job, it is placed first"
    ]


def node_notes(state: State, job: JobState) -> list[str]:
    """What is wrong with the nodes a placed job is on that nothing about the job says yet: a
    node whose agent went silent shows the job running as before, until the health monitor calls
    the node lost and the job moves. A job that ended, or was stopped, keeps its placement but
    is on no node: nothing is said of where it ran."""
    if job.placement is None or job.phase not in HOLDS_GPUS:
        return []
    out = []
    for name in sorted({w.node for w in job.placement.workers}):
        node = state.nodes.get(name)
        if node is None:
            out.append(f"node {name}: no longer known to the cluster")
        elif node.condition == "suspect":
            out.append(
                f"node {name} is suspect: its agent missed heartbeats, so what runs there is not "
                "known; the job moves if the node is called lost"
            )
        elif node.condition != "ready" or node.shut_down:
            out.append(f"node {name} is {node.standing}")
    return out


def other_sides(state: State, job: JobState) -> list[str]:
    """For the admin alone: the other side of each preemption a job's texts speak of. Those texts
    are its owner's, so they say "another tenant's job"; the admin, who sees every job, is told
    which, whose and in which queue: whom the job was stopped (or shrunk, or moved) for, whom
    the fold stopped, shrank or moved for its own room, and whom the free GPUs it waits for are
    reserved for."""

    def whose(job_id: str, as_of: int | None = None) -> str:
        other = state.jobs.get(job_id)
        # ``stopped_for`` outlives the jobs it names: a job of the id submitted after ``as_of``
        # (the beneficiary's priority_seq then) is a later one, perhaps another tenant's.
        if other is None or (as_of is not None and other.submitted_seq > as_of):
            return job_id
        return f"{job_id} ({other.tenant}, queue {other.spec.queue})"

    # A consolidation stops a job only to run it elsewhere: it was moved, not preempted.
    moves = set(job.moved_for)
    stopped_for = list(dict.fromkeys(whose(e[0], e[1]) for e in job.stopped_for if e not in moves))
    moved_for = list(dict.fromkeys(whose(e[0], e[1]) for e in job.stopped_for if e in moves))
    lines = [f"preempted for: {', '.join(stopped_for)}"] if stopped_for else []
    if moved_for:
        lines.append(f"moved to make room for: {', '.join(moved_for)}")
    if job.preempted_for and not any(b == job.preempted_for for b, _, _ in job.stopped_for):
        lines.append(f"shrunk for: {whose(job.preempted_for)}")
    if job.victims:
        lines.append(f"stopped, shrunk or moved for it: {', '.join(map(whose, job.victims))}")
    held = _reserved_for(state, job)
    if held:
        lines.append(f"the free GPUs that fit are reserved for: {', '.join(map(whose, held))}")
    return lines


def _reserved_for(state: State, job: JobState) -> list[str]:
    """The job ``job``'s reason says the free GPUs it waits for are reserved for (its message
    names it only to that job's owner). A reason recorded before reasons said which is read as
    it was then: every other admitted job whose reason says it holds a reservation, which may
    name jobs it does not wait behind (such a reason outlives the cycle that wrote it)."""
    waits = [r for r in job.reasons if r.code == queueing.RESERVATION]
    said = sorted({r.reserved_for for r in waits if r.reserved_for is not None})
    if said or not waits:
        return said
    return sorted(j.id for j in indexes.jobs_in(state, "admitted") if _reserved(j) and j.id != job.id)


def _reserved(job: JobState) -> bool:
    """Whether a job's reason says the placer holds a reservation for it."""
    return bool(job.reasons) and job.reasons[0].code in (queueing.RESERVED, queueing.RESERVED_UNTIMED)


def _workers(job: JobState) -> str:
    most, least = job.spec.replicas, job.spec.min_replicas
    if least is not None and least != most:
        admitted = f", admitted at {job.admission.replicas}" if job.admission is not None else ""
        return f"{least} to {most} workers, elastic{admitted}"
    return workers_text(most)


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S") if t else "-"
