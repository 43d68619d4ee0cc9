"""The fold's steps on one job or node: the lifecycle's moves with what they do to quota, and
the refusal a handler raises when a record does not hold. Every handler module of the fold
(``fold_requests``, ``fold_admission``, ``fold_preemption``, ``fold_nodes``) is written with these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from corral.projections import claims, gpu_time, indexes, quota, retention, runtimes
from corral.projections.lifecycle import (
    FINAL,
    HOLDS_QUOTA,
    TRANSITIONS,
    TRIGGERS,
    IllegalTransition,
    Phase,
    Trigger,
)
from corral.projections.state import (
    JobState,
    NodeState,
    State,
)

MAX_PREEMPTION_TIMES = 32  # the most per-hour cap a priority class may set (preemptions and shrinks)


class Refused(Exception):
    """Raised by a handler to record a rejection of the current record."""

    def __init__(
        self, code: str, message: str, job_id: str = "", voided: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.job_id = job_id
        self.voided = voided


class Ctx(msgspec.Struct, gc=False):
    """Where the record being folded came from (a Struct: one is made per record)."""

    seq: int
    subject: str
    time: float
    tenant: str | None
    trace: str | None = None  # W3C traceparent the writer sent: a job's trace starts at its submit


Handler = Callable[[State, Ctx, Any], None]


def find_job(state: State, job_id: str) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise Refused("unknown", f"no job {job_id}", job_id)
    return job


def find_node(state: State, name: str) -> NodeState:
    node = state.nodes.get(name)
    if node is None:
        raise Refused("unknown", f"no node {name}")
    return node


def _moves() -> dict[Trigger, dict[Phase, tuple[Phase, int]]]:
    moves: dict[Trigger, dict[Phase, tuple[Phase, int]]] = {trigger: {} for trigger in TRIGGERS}
    for (before, trigger), after in TRANSITIONS.items():
        moves[trigger][before] = (after, (after in HOLDS_QUOTA) - (before in HOLDS_QUOTA))
    return moves


# trigger -> phase -> (next phase, 1 if the move takes quota, -1 if it gives it back, else 0):
# the lifecycle's transition table, looked up by trigger first (no key to build per move), with
# what each move does to the quota the job holds.
MOVES = _moves()

# Ends that put a job's run on its owner's record when it overran their estimate (a success
# goes on it whatever it ran, by ``runtimes.learn``; a rejected job never ran).
_UNWELL = FINAL - {"succeeded", "rejected"}


def move(state: State, job: JobState, trigger: Trigger, ctx: Ctx) -> None:
    before = job.phase
    try:
        job.phase, quota_change = MOVES[trigger][before]
    except KeyError:
        raise IllegalTransition(before, trigger) from None
    indexes.moved(state, job, before)
    if before == "running":
        job.ran_s += ctx.time - job.phase_since
    job.phase_since = ctx.time
    job.updated_seq = ctx.seq
    if quota_change:
        quota.count_holding(state, job, quota_change)
    if job.phase in _UNWELL:
        runtimes.ended_unwell(state, job)
    if job.phase in FINAL:
        _ended(state, job)


def move_twice(state: State, job: JobState, first: Trigger, then: Trigger, ctx: Ctx) -> None:
    """``_move`` by ``first``, then by ``then``, storing the job's time and sequence once."""
    before = job.phase
    try:
        middle, first_change = MOVES[first][before]
    except KeyError:
        raise IllegalTransition(before, first) from None
    step = MOVES[then].get(middle)
    if step is None:  # the first move stands, as two moves would leave it
        move(state, job, first, ctx)
        raise IllegalTransition(middle, then)
    job.phase, then_change = step
    indexes.moved(state, job, before)
    if before == "running":
        job.ran_s += ctx.time - job.phase_since
    job.phase_since = ctx.time
    job.updated_seq = ctx.seq
    if first_change:
        quota.count_holding(state, job, first_change)
    if then_change:
        quota.count_holding(state, job, then_change)
    if job.phase in _UNWELL:
        runtimes.ended_unwell(state, job)
    if job.phase in FINAL:
        _ended(state, job)


def _ended(state: State, job: JobState) -> None:
    """``job`` reached its end: the jobs stopped for it stop naming it (a beneficiary that ended
    counts for none, as it will once let go: the placer no longer keeps a moved job's place for
    it, nor does a move wait on its victims), it stops naming the one it was stopped for (whose
    ``victims`` so stay the live ones), it keeps no place a shutdown or a move left it (a job
    ended has none held, ``State.places_held``), and, holding no GPUs, it counts as finished."""
    if job.preempted_for:
        indexes.name(state, job, "")
    if job.kept_place is not None:
        indexes.keep_place(state, job, None)
    if job.moved_to is not None:
        indexes.move_to(state, job, None)
    jobs = state.jobs
    for v in job.victims:
        victim = jobs.get(v)
        if victim is not None and victim.preempted_for == job.id:
            indexes.name(state, victim, "")
    if job.held is None:  # ``retention.note``'s test, without the call
        retention.note(state, job)


def stop_holding(state: State, job: JobState, ctx: Ctx) -> None:
    """A job that left the running phases gives its GPUs back once its last worker is gone."""
    if job.held is not None and not job.live:
        release(state, job, ctx)


def release(state: State, job: JobState, ctx: Ctx) -> None:
    """Give back every GPU the job holds: its queue stops holding GPU time for them."""
    held = job.held
    claims.release(state, job)
    gpu_time.track(state, job, ctx.time)
    if held is not None:
        retention.note(state, job)


def voided(job_id: str, message: str) -> Refused:
    return Refused("void", message, job_id)


def void_items(kind: str, items: list[tuple[str, str]]) -> Refused:
    """The refusal of a batch decision's voided items (job id, why); its other items stand."""
    text = "; ".join(f"{job_id}: {why}" for job_id, why in items)
    return Refused("void", f"{kind} void: {text}", voided=tuple(items))
