"""GPU time each queue held, decayed: what fair share orders queues by.

What counts is what ran, not what a tenant estimated: a queue holds GPU time from the moment a
placement of one of its jobs takes GPUs to the moment they are given back, every attempt (a
preempted, interrupted or requeued attempt counts for as long as its workers held GPUs), in
the milli-GPU quota charges (``quota.worker_milli`` per worker held, on the quota key of the
admission the workers were placed under), so that shares compare with quota.

A GPU-second held ``t`` seconds ago weighs ``2 ** (-t / h)``, ``h`` the half-life the admin set
(``ApplyFairShare``; 24 h if never set). Per queue and key the fold keeps ``GpuTime``: the
decayed sum ``U`` as it stood at log time ``t0``, and the milli-GPU ``r`` held since. At every
change of what the queue holds, at log time ``t``:

    U <- U * d + r * h / ln 2 * (1 - d),    d = 2 ** (-(t - t0) / h),    t0 <- t

and then ``r`` changes. Reading at ``now`` is the same formula, stored nowhere. A change of the
half-life brings every ``U`` to that log time at the old rate and scales it by new / old, so
that what it reads as (below) does not jump; it decays at the new one from then on. ``U`` is in
milli-GPU-seconds; ``recent`` divides it by ``h / ln 2`` (what holding one milli-GPU for ever
adds up to), so that holding ``g`` GPUs for ever counts as ``g``.

Log time is the stream time of the record being folded (``Ctx.time``), as for every other time
the fold keeps; a record stamped earlier than the last change counts no time at all.
"""

from __future__ import annotations

import math

from corral.events.queues import FairShareSpec
from corral.projections import quota
from corral.projections.state import GpuTime, JobState, State

LN2 = math.log(2)


def decayed(value: float, holding: float, elapsed: float, half_life_s: float) -> float:
    """``value`` milli-GPU-seconds ``elapsed`` seconds on, ``holding`` milli-GPU held all along."""
    if elapsed <= 0.0:
        return value
    k = LN2 / half_life_s  # 0 for an infinite half-life: nothing is forgotten
    if k == 0.0:
        return value + holding * elapsed
    # (1 - d) / k, computed without the cancellation of 1 - d when k * elapsed is tiny.
    return value * math.exp(-k * elapsed) - holding * math.expm1(-k * elapsed) / k


def at(g: GpuTime, now: float, half_life_s: float) -> float:
    """The decayed GPU time of ``g`` at log time ``now``, in milli-GPU-seconds."""
    return decayed(g.decayed, g.holding, now - g.at, half_life_s)


def recent(g: GpuTime, now: float, half_life_s: float) -> float:
    """The decayed GPU time at ``now`` as milli-GPU held: holding ``m`` for ever counts as ``m``."""
    return at(g, now, half_life_s) * LN2 / half_life_s


def _bring(g: GpuTime, now: float, half_life_s: float) -> None:
    if now > g.at:
        g.decayed = at(g, now, half_life_s)
        g.at = now


def track(state: State, job: JobState, now: float) -> None:
    """Bring ``job``'s part of its queue's GPU time in line with the GPUs it holds now: the fold
    calls it at log time ``now`` after every change of ``job.held``."""
    held = job.held
    key = job.held_key
    milli = 0
    if held is not None:
        if not key:  # a placement taking GPUs: they count on its admission's key
            adm = job.admission
            if adm is not None and len(adm.gpus) == 1:  # as ``quota.count_holding`` charges
                (key,) = adm.gpus
        if key:
            milli = quota.worker_milli(job.spec.resources, key) * len(held.workers)
    was = job.held_milli
    if milli == was:
        if held is None:
            job.held_key = ""
        return
    # Only a job that holds or held GPUs gets here, so only queues that ever ran have entries.
    per_key = state.gpu_time.get(job.spec.queue)
    if per_key is None:
        per_key = state.gpu_time[job.spec.queue] = {}
    g = per_key.get(key)
    if g is None:
        g = per_key[key] = GpuTime(at=now)
    elif now > g.at:  # ``_bring``, spelled out: this runs at every placement and release
        elapsed = now - g.at
        k = LN2 / state.fair_share.half_life_s
        if k == 0.0:
            g.decayed = g.decayed + g.holding * elapsed
        else:
            g.decayed = g.decayed * math.exp(-k * elapsed) - g.holding * math.expm1(-k * elapsed) / k
        g.at = now
    g.holding += milli - was
    job.held_milli = milli
    job.held_key = key if milli else ""


def apply_settings(state: State, spec: FairShareSpec, now: float) -> None:
    """New fair-share settings from log time ``now``: what was held until then decays at the old
    half-life, and at the new one from then on. What a queue held lately (``recent``) reads the
    same across the change: each ``U`` is scaled by new half-life / old. Kept as it was, ``U``
    read by the new ``h / ln 2`` made every queue's history jump by old / new against what it
    holds now (24 times from a day to an hour), for hours, in fair-share order and fair-sharing
    preemption alike."""
    old = state.fair_share.half_life_s
    scale = spec.half_life_s / old
    for per_key in state.gpu_time.values():
        for g in per_key.values():
            _bring(g, now, old)
            g.decayed *= scale
    state.fair_share = spec
