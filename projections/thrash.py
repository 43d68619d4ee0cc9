"""Anti-thrash guards: whether a job may be preempted at ``now``, by its priority class.

A job preempted again and again makes no progress and keeps the cluster busy checkpointing and
restarting. Four guards, each off unless the job's ``PriorityClassSpec`` sets it:

- ``min_runtime_s``: the job has run at least this long in its current attempt (a job that is
  placed or starting has run for 0 s, so a guarded class is never preempted before it runs);
- ``cooldown_s``: at least this long since the job was last preempted (or shrunk);
- ``max_preemptions_per_hour``: fewer than this many preemptions of the job in the last hour;
- ``max_preemptions``: fewer than this many preemptions of the job in its whole life (a job
  stopped that often runs to its end: it bounds the work any one job can lose); not for a job
  that asks for no GPU, which must always make room for GPU work in the end.

Preemption times come from the state: ``JobState.preempted_at`` (the log times of the job's
preemptions, and of the preemptor's shrinks of an elastic job: the guards that pass with time
count them, the lifetime cap does not, as the job runs on) where it records them. A state that
only counts them (``JobState.preemptions``) is read as if every past preemption happened when
the job's current phase began: none can have happened later, so with that reading the guards
block at least as often as with exact times.

Pure: the answer depends only on the job, its class and ``now``.
"""

from __future__ import annotations

import math

from corral.events.base import Reason
from corral.events.queues import PriorityClassSpec
from corral.projections.shape import gpu_less
from corral.projections.state import JobState

HOUR = 3600.0


def preemption_times(job: JobState) -> tuple[float, ...]:
    """The log times of the job's past preemptions, oldest first."""
    recorded: tuple[float, ...] | None = getattr(job, "preempted_at", None)
    if recorded is not None:
        return recorded
    return (job.phase_since,) * job.preemptions


def runtime(job: JobState, now: float) -> float:
    """How long the job's current attempt has been running (all ranks started)."""
    return max(0.0, now - job.phase_since) if job.phase == "running" else 0.0


def capped(job: JobState, pc: PriorityClassSpec | None) -> bool:
    """Whether ``job`` has been preempted as many times as its class allows in its life. Never
    one that asks for no GPU (``preemption.rides``): it holds no quota and must leave the CPU
    and memory it takes to the GPU work that needs them, however often (the guards that pass
    with time still protect it); a cap would make it, and every node it fills, unstoppable."""
    return (
        pc is not None
        and pc.max_preemptions is not None
        and job.preemptions >= pc.max_preemptions
        and not gpu_less(job.spec.resources)
    )


def lifts_at(job: JobState, pc: PriorityClassSpec | None, now: float) -> float:
    """The earliest log time at or after ``now`` at which ``guard`` may stop protecting ``job``
    by the passing of time alone (its minimum runtime reached, its cooldown over, a preemption
    leaving the last hour); ``now`` if it is not protected, infinity if only a lifetime cap or
    something other than time protects it."""
    if pc is None or guard(job, pc, now) is None:
        return now
    if capped(job, pc):
        return math.inf
    at = now
    if pc.min_runtime_s > 0:
        if job.phase != "running":
            return math.inf  # its runtime starts counting when it runs: a record, not time
        at = max(at, job.phase_since + pc.min_runtime_s)
    times = preemption_times(job)
    if pc.cooldown_s > 0 and times:
        at = max(at, times[-1] + pc.cooldown_s)
    cap = pc.max_preemptions_per_hour
    if cap is not None:
        if cap <= 0:
            return math.inf  # none an hour: no time lifts it (and no time in the hour to wait out)
        recent = [t for t in times if now - t < HOUR]
        if len(recent) >= cap:
            at = max(at, recent[len(recent) - cap] + HOUR)
    return at


def guard(job: JobState, pc: PriorityClassSpec | None, now: float) -> Reason | None:
    """Why ``job`` may not be preempted at ``now``, or None if it may."""
    if pc is None:
        return None
    if pc.min_runtime_s > 0:
        ran = runtime(job, now)
        if ran < pc.min_runtime_s:
            return Reason(
                "min-runtime",
                f"job {job.id} has run {ran:.0f}s of the {pc.min_runtime_s:.0f}s class {pc.name} "
                "guarantees before it may be preempted",
            )
    times = preemption_times(job)
    if pc.cooldown_s > 0 and times:
        since = now - times[-1]
        if since < pc.cooldown_s:
            return Reason(
                "cooldown",
                f"job {job.id} was preempted or shrunk {since:.0f}s ago; class {pc.name} waits "
                f"{pc.cooldown_s:.0f}s between preemptions",
            )
    if capped(job, pc):
        return Reason(
            "preemption-cap",
            f"job {job.id} has been preempted {job.preemptions} of the {pc.max_preemptions} times class "
            f"{pc.name} allows",
        )
    cap = pc.max_preemptions_per_hour
    if cap is not None:
        recent = sum(1 for t in times if now - t < HOUR)
        if recent >= cap:
            return Reason(
                "preemption-cap",
                f"job {job.id} was preempted or shrunk {recent} times in the last hour; "
                f"class {pc.name} allows {cap}",
            )
    return None
