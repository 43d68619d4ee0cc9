"""When will a waiting job start? corral's own answer: run the simulator forward from a copy of
the state with the same decision functions, so the estimate is exactly what corral would do if
nothing else changed.

What it assumes (``ASSUMPTION``): no job is submitted after ``now``; every job ends at its
runtime estimate (its owner's, else the one learned from history: ``projections/runtimes.py``),
a running one counted from when it started running; a running job with no estimate of its
owner's that has run past its learned estimate goes on for as much longer as the runs of its
class that ran as long as it has did (``remaining``: short of it, the job is taken to be one of
the batch its estimate is of, and ends at it); where too few ran as long, it runs as long again
as it has run (run times are heavy-tailed: the longer a job has run,
the longer it is likely to go on); a job with no estimate at all runs
``queueing.UNKNOWN_RUNTIME_S``; no node fails; a job being preempted stops by its deadline.
A waiting job can be run at least as long as the like jobs of its team submitted within
``batch_s`` of it that run now have run (``alike``: a team's jobs come in batches that run
alike), but is not by default (``BATCH_S``): the jobs running at any moment are the long ones,
and over the whole Philly slice the floor made a busy team's line of short jobs forecast hours
too late (DESIGN.md). One forward run gives every waiting job's start at once.
It decides as often as the live services at first and more seldom the further ahead it looks
(``RESOLUTION``: at most every 5 % of the time it has simulated), so a start n hours ahead is
known to within about n * 3 minutes: the services see what ended meanwhile all at once, not one
by one as the live ones do (a job placed then runs from when its GPUs were freed), and the
forecast of a long wait, which deciding every minute would make cost most of all forecasting,
costs a few tens of decisions.
Later submissions can be assumed (``holding``: every team that submitted lately keeps holding
what it holds, its running jobs followed by like ones as they end; ``HOLD_S``), but are not by
default: with learned estimates they did not bring more forecasts into the band (DESIGN.md).
``statistic`` and ``censored`` run jobs for another statistic of their class's runs, with its
running jobs among them (``bench/eta.py`` measures them; none did better than the fold's
estimate on the Philly slice).

How sure (``band``): the same forecast with every runtime scaled by ``EARLY`` and by ``LATE``.
Calibrated (``Calibration``): the estimates' errors are measured on the jobs that finished last
(actual runtime against the estimate the job had), and the forecast runs each job for its
estimate times one of them (``Errors``: of the jobs estimated most alike, its own tenant's once
enough of them finished, else everyone's), the band scales that by the spread of all the errors
(``bench/eta.py`` prints the spread it measures). Later submissions
that go first (a shorter job, a queue further below its fair share, a higher priority) can only
make a start later than forecast, never earlier: the band does not cover them.
"""

from __future__ import annotations

import bisect
import math
import statistics
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from corral.events.jobs import JobSpec
from corral.projections import runtimes
from corral.projections.queueing import UNKNOWN_RUNTIME_S
from corral.projections.state import JobState, State
from corral.services.sim.driver import WAITING, SimConfig, SimJob, Simulation

ASSUMPTION = (
    "assumes no job is submitted after now and every job runs for its runtime estimate "
    "(its owner's, else learned from similar jobs that finished) times how far off the estimate "
    "of one of the jobs estimated about as long that finished lately was, once enough did; a "
    "running job one of those that ran longer than it has so far, and past nearly all of them "
    "for as much longer as similar jobs that ran as long did"
)
EARLY, LATE = 0.5, 2.0
# How far ahead a forecast simulates: a deep backlog would otherwise cost a simulation of every
# job in it, each time. A start further away is "not within the horizon" (``inf``): a week's
# forecast is a guess whatever it costs, as everything submitted meanwhile moves it (a week's
# horizon brought 2 of 954 more sampled Philly jobs into the band: DESIGN.md).
HORIZON_S = 2 * 86400.0
CALIBRATE_FROM = 500  # the latest jobs that finished whose estimates' errors calibrate forecasts
MIN_CALIBRATION = 20  # fewer than that, and the uncalibrated scales stand
NEAREST = 100  # finished jobs estimated most alike whose errors a job runs by (``Errors.near``)
# A tenant's own errors run its jobs once this many of its jobs finished, each job by those of
# the fifth of them estimated most alike (as ``NEAREST`` of ``CALIBRATE_FROM``), at least
# ``MIN_CALIBRATION``: fewer, and a job estimated at an hour would run by the errors of jobs
# estimated at seconds.
MIN_OWN = 50
MAX_TENANTS = 1024  # tenants whose own errors are kept: those that had a job finish latest
MIN_LONGER = 3  # runs of a class longer than a running job has run, to say how much longer it goes
# A waiting job runs at least as long as the like jobs of its team submitted within this of it
# that run now have run (``alike``): None, not (measured on the Philly slice, see DESIGN.md;
# ``bench.eta --batch 480`` for an 8-hour window).
BATCH_S: float | None = None
# Later submissions assumed by default (``holding``): None, none (measured, see DESIGN.md).
HOLD_S: float | None = None
# How finely a forecast decides (``SimConfig.resolution``): at most every this fraction of the
# time it has simulated, so a start n hours ahead is known to about n * 3 minutes, well inside
# the ±20 % a forecast is judged by, and a day's backlog costs tens of decisions, not a thousand.
RESOLUTION = 0.05


def finished(state: State, seen: set[str]) -> list[tuple[str, float, float, str]]:
    """The jobs that succeeded since ``seen`` (ids already counted), with the runtime estimate
    each had, what it ran for and its tenant: what calibrates the forecasts (``Calibration``)."""
    out = []
    for job_id in state.jobs_by_phase.get("succeeded", ()):
        if job_id in seen:
            continue
        job = state.jobs[job_id]
        est = runtimes.of(job)
        if est is not None:
            out.append((job_id, est, job.ran_s, job.tenant))
    return out


def _runs() -> deque[tuple[float, float]]:
    return deque(maxlen=CALIBRATE_FROM)


@dataclass
class Calibration:
    """How far runtime estimates were off for the jobs that finished last (the latest
    ``CALIBRATE_FROM``): each one's estimate and actual runtime; and the same per tenant
    (``own``, its latest ``CALIBRATE_FROM``), for each tenant's jobs to run by how far its own
    estimates were off."""

    seen: deque[tuple[float, float]] = field(default_factory=_runs)
    own: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    _errors: Errors | None = field(default=None, compare=False, repr=False)  # until the next ``saw``

    @classmethod
    def of(cls, state: State) -> Calibration:
        """From the jobs ``state`` holds that succeeded (a forecast role counts them as they
        succeed, those the fold let go included)."""
        c = cls()
        for _, estimate, ran, tenant in finished(state, set()):
            c.saw(estimate, ran, tenant)
        return c

    def saw(self, estimate: float, actual: float, tenant: str | None = None) -> None:
        """A finished job's estimate and actual runtime, and whose it was. An estimate under a
        second counts as a second, and one that is not a number of seconds (infinite) is not
        counted, so that no tenant's estimates, however absurd, make the errors infinite or
        undefined; and each tenant's jobs run by its own errors once enough of its jobs
        finished (``Errors.own``), so one tenant's absurd estimates move only the forecasts of
        its own jobs and of tenants with too little history of their own. The own errors of
        the ``MAX_TENANTS`` tenants that had a job finish latest are kept."""
        if 0 < estimate < math.inf and actual > 0:
            run = (max(estimate, 1.0), actual)
            self.seen.append(run)
            self._errors = None
            if tenant is not None:
                own = self.own.pop(tenant, None) or _runs()
                own.append(run)
                self.own[tenant] = own  # the latest last
                if len(self.own) > MAX_TENANTS:
                    del self.own[next(iter(self.own))]

    def spread(self) -> tuple[float, float]:
        """(early, late) scales of every runtime run by its error (``errors``): the quartiles
        of everyone's errors over their median; ``EARLY``, ``LATE`` while too few finished."""
        errors = self.errors()
        if errors is None:
            return EARLY, LATE
        r = errors.ratios
        q1, q2, q3 = (r[int(p * (len(r) - 1))] for p in (0.25, 0.5, 0.75))
        return q1 / q2, q3 / q2

    def errors(self) -> Errors | None:
        """Each finished job's actual / estimated runtime, for forecasts to run jobs by
        (``Errors``), with each tenant's own where ``MIN_OWN`` of its jobs finished; None while
        too few jobs finished. Made once until another job is counted."""
        if len(self.seen) < MIN_CALIBRATION:
            return None
        if self._errors is None:
            own = {
                t: Errors.of_runs(runs, max(MIN_CALIBRATION, len(runs) * NEAREST // CALIBRATE_FROM))
                for t, runs in self.own.items()
                if len(runs) >= MIN_OWN
            }
            self._errors = replace(Errors.of_runs(self.seen), own=own)
        return self._errors

    def total(self) -> float:
        """Their total actual runtime over their total estimated (1 while too few): what a
        runtime not run by a job's own error (a later arrival's) is scaled by."""
        if len(self.seen) < MIN_CALIBRATION:
            return 1.0
        return sum(a for _, a in self.seen) / sum(e for e, _ in self.seen)


@dataclass(frozen=True)
class Errors:
    """How far off finished jobs' estimates were (actual / estimate, sorted), for a forecast to
    run each job for its estimate times one of them: the same one for a job in every forecast
    (at the quantile its id hashes to), and for a running job one of those longer than it has
    run. A line of jobs drains through many GPUs at once: the few that run far longer than
    estimated hold a few GPUs while the rest flow past them, so a line waits for the like of
    each job's own error, not every job for the mean one. Where the errors are known by
    estimate (``near``: (log estimate, error), sorted), a job runs by those of the ``NEAREST``
    jobs estimated most alike: a job estimated at ten minutes that ran for hours is twenty times
    off, one estimated at hours cannot be."""

    ratios: tuple[float, ...]
    near: tuple[tuple[float, float], ...] = ()
    own: Mapping[str, Errors] = field(default_factory=dict)  # each tenant's, where enough finished
    nearest: int = NEAREST  # how many of the jobs estimated most alike a job runs by
    _nearest: dict[float, tuple[float, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of_runs(cls, runs: Iterable[tuple[float, float]], nearest: int = NEAREST) -> Errors:
        """From (estimate, actual runtime) pairs."""
        runs = list(runs)
        near = tuple(sorted((math.log(max(e, 1.0)), a / e) for e, a in runs))
        return cls(tuple(sorted(r for _, r in near)), near, nearest=nearest)

    def of(
        self, job_id: str, above: float = 0.0, estimate: float | None = None, tenant: str | None = None
    ) -> float | None:
        """The ratio job ``job_id`` (estimated ``estimate``, of ``tenant``) runs for, among those
        over ``above``: of its tenant's own jobs estimated most alike where enough of them
        finished (``own``) and ``MIN_LONGER`` of those are, else of everyone's estimated most
        alike while ``MIN_LONGER`` of them are, else of all (None: fewer than that of all)."""
        mine = self.own.get(tenant) if tenant is not None else None
        if mine is not None and estimate is not None:
            found = _one_of(mine._alike(estimate), job_id, above)
            if found is not None:
                return found
        alike = self._alike(estimate) if estimate is not None and self.near else None
        for ratios in (alike, self.ratios):
            if ratios is not None and (found := _one_of(ratios, job_id, above)) is not None:
                return found
        return None

    def _alike(self, estimate: float) -> tuple[float, ...]:
        """The errors of the ``nearest`` jobs whose estimates are nearest ``estimate`` (by
        ratio: on a log scale), sorted; many jobs share an estimate, so each is found once."""
        got = self._nearest.get(estimate)
        if got is None:
            near, x = self.near, math.log(max(estimate, 1.0))
            lo = hi = bisect.bisect_left(near, (x, -math.inf))
            while hi - lo < self.nearest and (lo > 0 or hi < len(near)):
                if hi == len(near) or (lo > 0 and x - near[lo - 1][0] <= near[hi][0] - x):
                    lo -= 1
                else:
                    hi += 1
            got = self._nearest[estimate] = tuple(sorted(r for _, r in near[lo:hi]))
        return got


def _one_of(ratios: Sequence[float], job_id: str, above: float) -> float | None:
    """The one of ``ratios`` (sorted) over ``above`` that job ``job_id`` runs by, the same in
    every forecast (at the quantile its id hashes to); None: fewer than ``MIN_LONGER`` are."""
    lo = bisect.bisect_right(ratios, above)
    if len(ratios) - lo < MIN_LONGER:
        return None
    u = zlib.crc32(job_id.encode()) / 2**32
    return ratios[lo + int(u * (len(ratios) - lo))]


@dataclass(frozen=True)
class Forecast:
    """Starts forecast at ``at`` for the jobs waiting then (``inf``: not within the horizon)."""

    at: float
    starts: dict[str, float]

    def wait(self, job: JobState) -> float:
        """From the job's submission to its forecast start."""
        return self.starts.get(job.id, math.inf) - job.submitted_at


LEARNED = "learned"  # a job's runtime is the fold's estimate at its submission (``runtimes.of``)
# What a forecast takes of a class's runs for a job's runtime (``expected``) and for how much
# longer a running one goes on (``remaining``): "median", as the fold's rule but of the runs
# known now; "mean", what a sum of heavy-tailed runtimes (a queue's wait) adds up to, per
# class; "p75", the upper quartile (``LEARNED`` goes on with the median for ``remaining``).
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": lambda xs: float(statistics.median(xs)),
    "mean": lambda xs: float(statistics.fmean(xs)),
    "p75": lambda xs: float(sorted(xs)[(3 * (len(xs) - 1) + 3) // 4]),
}


def runtime(
    job: JobState,
    now: float,
    scale: float = 1.0,
    history: Mapping[str, Sequence[float]] | None = None,
    statistic: str = LEARNED,
    runs: Mapping[str, Sequence[float]] | None = None,
    batch: Mapping[str, float] | None = None,
    errors: Errors | None = None,
) -> float:
    """How much longer ``job`` runs (holding GPUs), or how long it runs once started (waiting).
    Given the learned ``history`` (``State.runtimes``), a job with no estimate of its owner's
    runs for what its class's runs say (``expected``, from ``runs`` when given: ``with_running``;
    once it has run past that, ``remaining``, when enough of its class ran as long), times
    ``scale`` as every estimate. Given ``errors``, a job with an estimate runs for it times its
    error (``Errors.of``), a running one times one above what it has run so far while enough
    are."""
    est = runtimes.of(job) if history is None else expected(job, history if runs is None else runs, statistic)
    waiting = job.phase in WAITING
    ran = 0.0 if waiting else job.ran_s + (max(0.0, now - job.phase_since) if job.phase == "running" else 0.0)
    error = None
    if errors is not None and est is not None and est > 0:
        # one of the errors above what it ran: its estimate, past it, is no measure any more
        error = errors.of(job.id, ran / est, est, job.tenant)
        est *= 1.0 if error is None else error
    est = (UNKNOWN_RUNTIME_S if est is None else est) * scale
    if batch is not None and job.id in batch:
        # what the batch's jobs ran is measured, not estimated: not scaled as estimates are
        est = max(est, batch[job.id])
    if waiting:
        return est
    if error is not None:
        return max(1.0, est - ran)
    if history is not None and job.spec.runtime_estimate_s is None and ran >= est:
        # short of its estimate, a job is taken to be one of its batch, which the estimate is of
        # (``runtimes.LATEST``); past it, one of its class's long runs
        left = remaining(job, ran, history, statistic)
        if left is not None:
            # scaled as estimates are: the median of a heavy tail falls short of it in sum too
            return left * scale
    return est - ran if ran < est else max(1.0, ran)


def expected(job: JobState, history: Mapping[str, Sequence[float]], statistic: str = LEARNED) -> float | None:
    """A job's runtime for a forecast: its owner's estimate, else ``statistic`` of the runs of the
    most specific class with enough history now (``runtimes.classes``), else the one learned at
    its submission. ``LEARNED``: that one (``runtimes.learned``), whatever ended since."""
    if job.spec.runtime_estimate_s is not None:
        return job.spec.runtime_estimate_s
    if statistic == LEARNED:
        return job.learned_s
    of = STATISTICS[statistic]
    for key in runtimes.classes(job.tenant, job.spec):
        ran = history.get(key)
        if ran is not None and len(ran) >= runtimes.MIN_SAMPLES:
            return of(ran)
    return job.learned_s


def with_running(
    state: State, now: float, history: Mapping[str, Sequence[float]], statistic: str = LEARNED
) -> dict[str, list[float]]:
    """Each class's runs, and with them the expected runtime of every job of the class running
    now (what it ran, plus what ``remaining`` expects, or as long again once it outlived its
    class). The history holds only runs that ended, and the short ones of a class end first:
    while its long ones still run, the history alone says the class is shorter than it is."""
    out = {key: list(ran) for key, ran in history.items()}
    for job_id in state.jobs_by_phase.get("running", ()):
        job = state.jobs[job_id]
        ran = job.ran_s + max(0.0, now - job.phase_since)
        left = remaining(job, ran, history, statistic)
        total = ran + (ran if left is None else left)
        for key in runtimes.classes(job.tenant, job.spec):
            out.setdefault(key, []).append(total)
    return out


def remaining(
    job: JobState, ran: float, history: Mapping[str, Sequence[float]], statistic: str = LEARNED
) -> float | None:
    """How much longer a job that has run ``ran`` seconds goes on, given how long the jobs of its
    class ran: ``statistic`` (the median) of what those that ran longer than ``ran`` ran beyond
    it, in the most specific class with at least ``MIN_LONGER`` such (None: none has). A job's
    expected remaining time given its attained service (as Tiresias and Lucid reason), not its
    estimate at submission: in heavy-tailed run times a job that has outlived the short ones of
    its class is one of the long ones, and one still short of the median may well end soon."""
    of = STATISTICS["median" if statistic == LEARNED else statistic]
    for key in runtimes.classes(job.tenant, job.spec):
        longer = [x - ran for x in history.get(key, ()) if x > ran]
        if len(longer) >= MIN_LONGER:
            return of(longer)
    return None


def forecast(
    state: State,
    now: float,
    config: SimConfig | None = None,
    *,
    scale: float = 1.0,
    horizon_s: float | None = HORIZON_S,
    jobs: Iterable[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
    arrivals: Sequence[SimJob] = (),
    attained: bool = True,
    statistic: str = LEARNED,
    censored: bool = False,
    hold_s: float | None = HOLD_S,
    batch_s: float | None = BATCH_S,
    resolution: float = RESOLUTION,
    errors: Errors | None = None,
) -> Forecast:
    """Every waiting job's start (or only those of ``jobs``), by one forward simulation from a
    copy of ``state`` (``state`` itself is not changed), at most ``horizon_s`` ahead (None: until
    every one has started). ``attained``: running jobs go on for what ``remaining`` expects
    given how long they have run (False: for their estimate at submission, less what they ran).
    ``hold_s``: later submissions as ``holding`` says, of the teams that submitted in the last
    ``hold_s`` seconds (None: none); ``batch_s``: a waiting job runs at least what ``alike``
    says of the like jobs submitted within ``batch_s`` of it that run now (None: not);
    ``arrivals``: more submissions after now; ``resolution``: ``SimConfig.resolution``;
    ``errors``: how far off each job's estimate is taken to be (``Errors``; None: not)."""
    until = None if horizon_s is None else now + horizon_s
    sim = resumed(
        state,
        now,
        config,
        scale,
        until,
        attained,
        statistic,
        censored,
        hold_s,
        batch_s,
        arrivals,
        resolution,
        errors,
    )
    waiting = set(sim.until_started or ())
    if jobs is not None:
        # The simulation stops once these have started: jobs behind them cost nothing.
        waiting &= set(jobs)
        sim.until_started = set(waiting)
    if cancelled is not None:
        sim.observers.append(lambda *_: _stop_if(cancelled))
    sim.run(until=None if horizon_s is None else now + horizon_s)
    starts = {}
    for job_id in waiting:
        first = sim.stats[job_id].first_start
        starts[job_id] = math.inf if first is None else first
    return Forecast(now, starts)


def resumed(
    state: State,
    now: float,
    config: SimConfig | None = None,
    scale: float = 1.0,
    until: float | None = None,
    attained: bool = True,
    statistic: str = LEARNED,
    censored: bool = False,
    hold_s: float | None = HOLD_S,
    batch_s: float | None = BATCH_S,
    arrivals: Sequence[SimJob] = (),
    resolution: float = RESOLUTION,
    errors: Errors | None = None,
) -> Simulation:
    """The simulation a forecast runs (and a what-if): a copy of ``state`` at ``now``, every job
    running for what ``runtime`` says (a waiting one at least as long as its batch running now,
    ``alike``, within ``batch_s``; None: not), with the later submissions ``holding`` assumes up
    to ``until`` (none with ``hold_s`` or ``until`` None), and ``arrivals``, deciding as finely as
    ``resolution`` says (``SimConfig.resolution``)."""
    history = state.runtimes if attained else None
    runs = with_running(state, now, state.runtimes, statistic) if history is not None and censored else None
    batch = alike(state, now, batch_s, state.runtimes, statistic) if batch_s is not None else None

    def left(job: JobState) -> float:
        return runtime(job, now, scale, history, statistic, runs, batch, errors)

    sim = Simulation.resume(state, now, replace(config or SimConfig(), resolution=resolution), left)
    if hold_s is not None and until is not None:

        def again(job: JobState) -> float:
            return runtime(
                msgspec.structs.replace(job, phase="queued"),
                now,
                scale,
                history,
                statistic,
                runs,
                batch,
                errors,
            )

        arrivals = [*arrivals, *holding(state, now, hold_s, until, left, again)]
    if arrivals:
        sim.arrive(arrivals)
    return sim


def alike(
    state: State,
    now: float,
    window_s: float,
    history: Mapping[str, Sequence[float]],
    statistic: str = LEARNED,
) -> dict[str, float]:
    """Per waiting job with no estimate of its owner's, what the running jobs of its tenant's
    class submitted within ``window_s`` of it (a batch of like jobs submitted together) are
    expected to run in all: the median of what each ran plus, once it ran past its estimate,
    what ``remaining`` expects of it (short of its estimate, what it ran: its estimate, which
    the waiting job has too, is no measure; nothing more once it outlived its class: what it ran
    is a floor, and as long again overshot on the Philly slice), from the most specific of the
    tenant's classes
    with at least ``MIN_LONGER`` such jobs. A team's jobs come in batches (a sweep, a set of
    runs of one model) that run alike, and the fold's estimate is of the class's latest runs
    that ended: while a batch of long ones still runs, it says the class is as short as it was."""
    running: dict[str, list[tuple[float, float]]] = {}
    for job_id in state.jobs_by_phase.get("running", ()):
        job = state.jobs[job_id]
        ran = job.ran_s + max(0.0, now - job.phase_since)
        est = runtimes.of(job)
        # what a batch-mate still short of its estimate will run is that estimate, not measured
        left = None if est is not None and ran < est else remaining(job, ran, history, statistic)
        for key in runtimes.classes(job.tenant, job.spec)[:-1]:  # the tenant's, not the queue's
            running.setdefault(key, []).append((job.submitted_at, ran + (0.0 if left is None else left)))
    out: dict[str, float] = {}
    if not running:
        return out
    for phase in WAITING:
        for job_id in state.jobs_by_phase.get(phase, ()):
            job = state.jobs[job_id]
            if job.spec.runtime_estimate_s is not None:
                continue
            for key in runtimes.classes(job.tenant, job.spec)[:-1]:
                near = [t for at, t in running.get(key, ()) if abs(at - job.submitted_at) <= window_s]
                if len(near) >= MIN_LONGER:
                    out[job_id] = float(statistics.median(near))
                    break
    return out


def holding(
    state: State,
    now: float,
    window_s: float,
    until: float,
    left: Callable[[JobState], float],
    again: Callable[[JobState], float],
) -> list[SimJob]:
    """Later submissions as "every team that submitted lately keeps holding what it holds": each
    job holding GPUs now of a tenant with a job submitted in the last ``window_s`` (one the state
    still holds: waiting, running, or finished and not let go yet) is followed, when it ends, by
    a like job (its spec, its tenant), and that one by another, up to ``until``: a chain per job,
    the next arriving as the last ends (``left``: how much longer the job runs; ``again``: how
    long a like job runs once started), as if each started at once. The like jobs still wait
    their turn under the same fair share, priorities and quotas as any: a team below its share
    takes freed GPUs before a busy team's next job does. Without them a forecast lends a queue
    every GPU the others free, as if nobody submitted anything after now: a queue's line behind
    a busy cluster drains as fast as the whole cluster runs it."""
    active = {j.tenant for j in state.jobs.values() if now - window_s <= j.submitted_at <= now}
    out: list[SimJob] = []
    # a job being preempted is not followed: it goes back to wait, and is still to run
    holders = [
        state.jobs[i]
        for phase in ("placed", "starting", "running")
        for i in state.jobs_by_phase.get(phase, ())
    ]
    for job in sorted(holders, key=lambda j: j.submitted_seq):
        if job.tenant not in active:
            continue
        at, run, k = now + max(0.0, left(job)), max(1.0, again(job)), 0
        while at < until:
            like = f"{job.id}-again-{k}"
            while like in state.jobs:  # a name the fold would take for a duplicate
                like += "-"
            out.append(SimJob(like, job.tenant, job.spec, at, run))
            at, k = at + run, k + 1
    return sorted(out, key=lambda j: (j.arrival, j.id))


def recent(
    state: State,
    now: float,
    window_s: float,
    scale: float = 1.0,
    until: float | None = None,
    submitted: Iterable[tuple[str, JobSpec, float, float | None]] | None = None,
) -> list[SimJob]:
    """The jobs submitted in the last ``window_s``, submitted again ``window_s`` later (and every
    ``window_s`` after that up to ``until``, when given): arrivals as they came lately, for a
    forecast that does not assume that nobody submits anything after now (in a shortest-first
    queue, later short jobs go first). ``submitted``: (tenant, spec, submitted at, estimate) of
    every job submitted lately, as the log says; else those the state still holds (not those
    it let go, the short jobs among them)."""
    if submitted is None:
        submitted = [(j.tenant, j.spec, j.submitted_at, runtimes.of(j)) for j in state.jobs.values()]
    lately = sorted(
        ((at, tenant, spec, est) for tenant, spec, at, est in submitted if now - window_s <= at < now),
        key=lambda x: x[0],
    )
    out: list[SimJob] = []
    shift = window_s
    while lately:
        for at, tenant, spec, est in lately:
            work = (UNKNOWN_RUNTIME_S if est is None else est) * scale
            again = f"again-{len(out)}"
            while again in state.jobs:  # a name the fold would take for a duplicate
                again += "-"
            out.append(SimJob(again, tenant, spec, at + shift, work))
        shift += window_s
        if until is None or now + shift - window_s >= until:
            break
    return sorted(out, key=lambda j: (j.arrival, j.id))


class Cancelled(Exception):
    """A forecast given up before it was done (``cancelled`` said so)."""


def _stop_if(cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise Cancelled


def band(
    state: State,
    now: float,
    config: SimConfig | None = None,
    jobs: Iterable[str] | None = None,
    horizon_s: float | None = HORIZON_S,
    calibration: Calibration | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """Per waiting job: (early, forecast, late) starts (see the module docstring). ``cancelled``
    is asked as simulated time moves on; when it says so, ``Cancelled`` is raised."""
    asked = None if jobs is None else list(jobs)
    lo, hi = (EARLY, LATE) if calibration is None else calibration.spread()
    errors = None if calibration is None else calibration.errors()

    def at_scale(scale: float) -> Forecast:
        return forecast(
            state,
            now,
            config,
            scale=scale,
            horizon_s=horizon_s,
            jobs=asked,
            cancelled=cancelled,
            errors=errors,
        )

    mid, early, late = at_scale(1.0), at_scale(lo), at_scale(hi)
    ids = list(mid.starts)
    out = {}
    for job_id in ids:
        s = mid.starts[job_id]
        lo, hi = early.starts.get(job_id, s), late.starts.get(job_id, s)
        out[job_id] = (min(lo, s), s, max(hi, s))
    return out
