"""Runtime estimates learned from the jobs that finished, for jobs whose owner gave none.

Most people do not say how long their job runs, and those who do are often wrong; yet the
placer's backfill, the head-of-queue reservation and hold, the shortest-first order and every
start-time estimate need a runtime. Like Helios's QSSF (Hu et al., SC'21), which found that a
user's jobs of the same name and size run alike, the fold keeps, per class of similar jobs, the
running times of the latest ``HISTORY`` that succeeded, and a new job's estimate is the median of
the most specific class with at least ``MIN_SAMPLES`` of them:

1. the same tenant, name (or command, when it has no name) and GPUs;
2. the same tenant and GPUs;
3. the same tenant;
4. the same queue.

The median, not the mean: run times are heavy-tailed, and on the Philly trace the median of the
last 20 of the same team and size came within the band (±20 %, or 5 minutes under 25 minutes)
of half the jobs, the mean of a third (``bench/eta.py`` measures it in a run). Replayed over
20,000 jobs in arrival order (history: the jobs ended before each arrival), the median came
within the band for 47–51 % whatever the window (5 to 100) and class (team and GPUs, team;
GPUs alone 39–41 %); the 40th percentile 49–53 %, the latest run alone 44–46 %, the geometric
mean 44–47 %: nothing the trace holds (team, GPUs, arrival) tells much more. Tiresias and
Lucid learn from the same history; Tiresias without it (least attained service), Lucid with a
model over more features than a log holds.

A job's estimate (``of``) is its owner's ``runtime_estimate_s`` when given, else the one learned
when it was submitted (``JobState.learned_s``; None while no class has enough history). Fixed
at submission, so that every reader of a job agrees on it whatever was folded since. What a
job ran for is the log time it spent running over all its attempts (``JobState.ran_s``).

Bounded: at most ``MAX_CLASSES`` classes are kept, the one updated longest ago let go first, so
unique names cost nothing for ever. Pure: the fold calls ``learn`` and ``estimate``.
"""

from __future__ import annotations

import statistics

from corral.events.jobs import JobSpec, Resources
from corral.projections import quota
from corral.projections.state import WHOLE, JobState, State

HISTORY = 20
MIN_SAMPLES = 3
MAX_CLASSES = 10_000


# Each job's classes are asked for twice (at its submission and at its success), and most jobs
# share theirs with many others: formatted once per distinct (tenant, name, command, ask,
# workers, queue). Names and commands come from tenants: at most ``_MAX_KNOWN`` are kept, none
# that holds more than ``_MAX_KEPT`` characters in all, and a full cache starts again,
# so that classes that stopped coming (a command's arguments change run to run) do not keep out
# the ones that come now.
_MAX_KNOWN = 4096
_MAX_KEPT = 1024
_known: dict[tuple[str, str, tuple[str, ...], Resources, int, str], tuple[str, ...]] = {}


def classes(tenant: str, spec: JobSpec) -> tuple[str, ...]:
    """The classes a job belongs to, most specific first (as history keys)."""
    known = (tenant, spec.name, spec.command, spec.resources, spec.replicas, spec.queue)
    found = _known.get(known)
    if found is None:
        found = _classes(tenant, spec)
        kept = sum(map(len, found)) + sum(map(len, spec.command)) + sum(map(len, spec.resources.gpu_models))
        if kept <= _MAX_KEPT:  # what the entry holds: its key and its classes
            if len(_known) >= _MAX_KNOWN:
                _known.clear()
            _known[known] = found
    return found


def _classes(tenant: str, spec: JobSpec) -> tuple[str, ...]:
    gpus = f"{quota.worker_milli(spec.resources) * spec.replicas / WHOLE:g}"
    what = spec.name or " ".join(spec.command)
    if what:
        return (f"t={tenant} n={what} g={gpus}", f"t={tenant} g={gpus}", f"t={tenant}", f"q={spec.queue}")
    return (f"t={tenant} g={gpus}", f"t={tenant}", f"q={spec.queue}")


def learned(state: State, tenant: str, spec: JobSpec) -> float | None:
    """The median of the most specific class with enough history; None when none has, or when
    the owner gave an estimate (theirs stands)."""
    if spec.runtime_estimate_s is not None:
        return None
    history = state.runtimes
    for key in classes(tenant, spec):
        ran = history.get(key)
        if ran is not None and len(ran) >= MIN_SAMPLES:
            return float(statistics.median(ran))
    return None


def of(job: JobState) -> float | None:
    """A job's runtime estimate: its owner's, else the one learned at its submission."""
    est = job.spec.runtime_estimate_s
    return job.learned_s if est is None else est


def learn(state: State, job: JobState) -> None:
    """Count a job that succeeded, having run ``job.ran_s``, in each of its classes."""
    history = state.runtimes
    for key in classes(job.tenant, job.spec):
        ran = history.pop(key, None)  # re-inserted last: the dict's order is the order of updates
        if ran is None:
            ran = []
        ran.append(job.ran_s)
        if len(ran) > HISTORY:
            del ran[0]
        history[key] = ran
    while len(history) > MAX_CLASSES:
        del history[next(iter(history))]
