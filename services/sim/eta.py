"""When will a waiting job start? corral's own answer: run the simulator forward from a copy of
the state with the same decision functions, so the estimate is exactly what corral would do if
nothing else changed.

What it assumes (``ASSUMPTION``): no job is submitted after ``now``; every job ends at its
runtime estimate (its owner's, else the one learned from history: ``projections/runtimes.py``),
a running one counted from when it started running; a job that has already run past its
estimate runs as long again as it has run (run times are heavy-tailed: the longer a job has
run, the longer it is likely to go on); a job with no estimate at all runs
``queueing.UNKNOWN_RUNTIME_S``; no node fails; a job being preempted stops by its deadline.
One forward run gives every waiting job's start at once.

How sure (``band``): the same forecast with every runtime scaled by ``EARLY`` and by ``LATE``;
the learned estimates' errors are that wide or wider for about half the jobs on the Philly
trace (``bench/eta.py`` prints the spread it measures). Later submissions that go first (a
shorter job, a queue further below its fair share, a higher priority) can only make a start
later than forecast, never earlier: the band does not cover them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from corral.projections import runtimes
from corral.projections.queueing import UNKNOWN_RUNTIME_S
from corral.projections.state import JobState, State
from corral.services.sim.driver import WAITING, SimConfig, Simulation

ASSUMPTION = (
    "assumes no job is submitted after now and every job runs for its runtime estimate "
    "(its owner's, else learned from similar jobs that finished)"
)
EARLY, LATE = 0.5, 2.0
# How far ahead a forecast simulates: a deep backlog would otherwise cost a simulation of every
# job in it, each time. A start further away is "not within the horizon" (``inf``): a week's
# forecast is a guess whatever it costs, as everything submitted meanwhile moves it.
HORIZON_S = 2 * 86400.0


@dataclass(frozen=True)
class Forecast:
    """Starts forecast at ``at`` for the jobs waiting then (``inf``: not within the horizon)."""

    at: float
    starts: dict[str, float]

    def wait(self, job: JobState) -> float:
        """From the job's submission to its forecast start."""
        return self.starts.get(job.id, math.inf) - job.submitted_at


def runtime(job: JobState, now: float, scale: float = 1.0) -> float:
    """How much longer ``job`` runs (holding GPUs), or how long it runs once started (waiting)."""
    est = runtimes.of(job)
    est = (UNKNOWN_RUNTIME_S if est is None else est) * scale
    if job.phase in WAITING:
        return est
    ran = job.ran_s + (max(0.0, now - job.phase_since) if job.phase == "running" else 0.0)
    return est - ran if ran < est else max(1.0, ran)


def forecast(
    state: State,
    now: float,
    config: SimConfig | None = None,
    *,
    scale: float = 1.0,
    horizon_s: float | None = HORIZON_S,
    jobs: Iterable[str] | None = None,
) -> Forecast:
    """Every waiting job's start (or only those of ``jobs``), by one forward simulation from a
    copy of ``state`` (``state`` itself is not changed), at most ``horizon_s`` ahead (None: until
    every one has started)."""
    sim = Simulation.resume(state, now, config or SimConfig(), lambda j: runtime(j, now, scale))
    waiting = set(sim.until_started or ())
    if jobs is not None:
        # The simulation stops once these have started: jobs behind them cost nothing.
        waiting &= set(jobs)
        sim.until_started = set(waiting)
    sim.run(until=None if horizon_s is None else now + horizon_s)
    starts = {}
    for job_id in waiting:
        first = sim.stats[job_id].first_start
        starts[job_id] = math.inf if first is None else first
    return Forecast(now, starts)


def band(
    state: State,
    now: float,
    config: SimConfig | None = None,
    jobs: Iterable[str] | None = None,
    horizon_s: float | None = HORIZON_S,
) -> dict[str, tuple[float, float, float]]:
    """Per waiting job: (early, forecast, late) starts (see the module docstring)."""
    asked = None if jobs is None else list(jobs)
    mid = forecast(state, now, config, horizon_s=horizon_s, jobs=asked)
    early = forecast(state, now, config, scale=EARLY, horizon_s=horizon_s, jobs=asked)
    late = forecast(state, now, config, scale=LATE, horizon_s=horizon_s, jobs=asked)
    ids = list(mid.starts)
    out = {}
    for job_id in ids:
        s = mid.starts[job_id]
        lo, hi = early.starts.get(job_id, s), late.starts.get(job_id, s)
        out[job_id] = (min(lo, s), s, max(hi, s))
    return out
