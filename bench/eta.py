"""How good are corral's start-time estimates? ``python -m bench.eta`` (``--jobs 2000`` on a slow
machine).

Replays the Philly slice under corral's policy (``services/sim/philly.py``: 64 nodes of 8 GPUs,
decisions once a simulated minute). With ``--estimates learned`` (the default) no job carries a
runtime estimate, as most users give none: every reader uses the one the fold learned from the
jobs that finished (``projections/runtimes.py``); ``given`` tells each job its true duration.

At the end of each simulated minute in which jobs arrived (before the services decide on them),
it forecasts the start of the jobs just submitted, and every 10 simulated minutes (``--again``)
that of every waiting job (``services/sim/eta.py``: the simulator run forward from a copy of the
state, no later arrivals (``--future M``: the submissions of the last M minutes come again,
``--repeat``: every M minutes to the horizon), jobs ending at their estimates times how far
off the estimate of one of the jobs that finished so far was (``Errors``; ``--no-calibrate``:
as they are), a running job for as much longer as the runs of its class that ran as long went
on (``--no-attained``: its estimate less what it ran; ``--statistic``: jobs run for the mean,
median or upper quartile of their class's runs known at the forecast, not the fold's estimate;
``--censored``: a class's running jobs count among its runs), at most ``--horizon`` hours ahead,
deciding at most every ``--resolution`` of the time simulated (0: every simulated minute); a
forecast of the jobs just submitted stops once they have started), and afterwards compares each
forecast with the start the job actually got in the same run. Forecasts run in ``--workers``
processes beside the replay (each reads an encoded copy of the state at its point, and the
replay never reads a forecast), so the figures are the same for any number of them and the run
takes about the replay's time plus the forecasts' divided among the processes. Arrivals are
moved half a second on, so none falls on a decision tick and every job's first forecast is made
before any decision about it. Printed:

- the share of jobs whose forecast at submission is within the band of their actual wait
  (±20 %, or 5 minutes when the wait is under 25 minutes), by wait-length bucket; goal ≥ 80 %;
- the same for every forecast made while a job waited (every 10 minutes);
- the anchor, in the same run: the naive estimate, the sum of the runtime estimates of the jobs
  ahead in the job's queue (as ``squeue --start`` is often read), counting only jobs already
  accepted (one submitted in the same minute is behind, not ahead);
- with ``--band``, the share of jobs whose actual start fell between the early and late
  forecasts made at submission (three forecasts each: three times the cost);
- runtime estimates at submission against the actual runtime, in the same band, and the spread
  of their errors (quartiles of estimate / actual);
- which way the forecasts at submission outside the band miss (too soon, too late, beyond the
  horizon), by wait-length bucket, and the median forecast wait over the actual wait;
- the elapsed wall time (and, on stderr every minute, how far the run is).

``--dump FILE`` writes one JSON line per job (team, GPUs, submission, forecast, naive and actual
start, estimate, runtime): where the misses are.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import msgspec

from corral.events.jobs import JobSpec
from corral.projections import runtimes
from corral.projections.queueing import UNKNOWN_RUNTIME_S
from corral.projections.state import State
from corral.services.sim import eta, philly
from corral.services.sim.driver import WAITING, SimConfig, SimJob, Simulation
from corral.services.sim.traces import philly as trace

EVERY_S = 600.0
PROGRESS_S = 60.0  # how often a long run says on stderr how far it is
BUCKETS = ((0.0, 1500.0, "< 25 min"), (1500.0, 7200.0, "25 min-2 h"), (7200.0, 28800.0, "2-8 h"))
BUCKETS += ((28800.0, math.inf, ">= 8 h"),)


def within(predicted: float, actual: float) -> bool:
    """The issue's band: ±20 % of the actual value, or 5 minutes when it is under 25 minutes."""
    if math.isinf(predicted):
        return False
    off = abs(predicted - actual)
    return off <= 0.2 * actual or (actual < 1500.0 and off <= 300.0)


class Pending:
    """A forecast asked for: its starts once done (``start``)."""

    def __init__(self, done: Future[tuple[dict[str, float], float]]) -> None:
        self._done = done

    def start(self, job_id: str) -> float:
        return self._done.result()[0].get(job_id, math.inf)


def _forecast(
    blob: bytes, now: float, config: SimConfig, ask: dict[str, Any]
) -> tuple[dict[str, float], float]:
    """One forecast from an encoded state: its starts and the seconds it took."""
    t = time.perf_counter()
    state = msgspec.msgpack.decode(blob, type=State)
    return eta.forecast(state, now, config, **ask).starts, time.perf_counter() - t


class Forecaster:
    """Forecasts, in ``workers`` processes beside the replay (1: in it, one after the other).
    A forecast reads a copy of the state and the replay never reads a forecast, so they may run
    in any order and at once: what is measured is the same whatever ``workers`` is."""

    def __init__(self, config: SimConfig, workers: int) -> None:
        self.config, self.busy_s = config, 0.0
        self._pool = None
        if workers > 1:
            # fork: the workers start with the modules already imported, this one included
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx)
        self._inflight: deque[Future[tuple[dict[str, float], float]]] = deque()
        self._most = 4 * workers  # encoded states waiting for a worker, at most

    def submit(self, blob: bytes, now: float, ask: dict[str, Any]) -> Pending:
        done: Future[tuple[dict[str, float], float]]
        if self._pool is None:
            done = Future()
            done.set_result(_forecast(blob, now, self.config, ask))
        else:
            done = self._pool.submit(_forecast, blob, now, self.config, ask)
        done.add_done_callback(self._count)
        self._inflight.append(done)
        while len(self._inflight) > self._most or (self._inflight and self._inflight[0].done()):
            self._inflight.popleft().result()  # a failed forecast fails the run, here
        return Pending(done)

    def _count(self, done: Future[tuple[dict[str, float], float]]) -> None:
        if done.exception() is None:
            self.busy_s += done.result()[1]

    def __enter__(self) -> Forecaster:
        return self

    def __exit__(self, *exc: object) -> None:
        while self._inflight:
            if exc[0] is None:
                self._inflight.popleft().result()
            else:
                self._inflight.popleft().cancel()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.eta")
    ap.add_argument("--jobs", type=int, default=philly.JOBS)
    ap.add_argument("--nodes", type=int, default=philly.NODES)
    ap.add_argument("--start", default=philly.START)
    ap.add_argument("--estimates", choices=("learned", "given"), default="learned")
    ap.add_argument(
        "--pool", type=float, default=philly.POOL, help="share of each team's entitlement held in the cohort"
    )
    ap.add_argument("--trace", default=None, help="philly.csv (default: the shared traces)")
    ap.add_argument(
        "--horizon", type=float, default=eta.HORIZON_S / 3600, help="hours a forecast looks ahead"
    )
    ap.add_argument(
        "--again",
        type=float,
        default=EVERY_S / 60,
        help="minutes between forecasts of waiting jobs (0: none)",
    )
    ap.add_argument(
        "--scale", type=float, default=1.0, help="forecast with every runtime estimate times this"
    )
    ap.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each job for its estimate times how far off that of a job that finished so far was",
    )
    ap.add_argument(
        "--band", action="store_true", help="also forecast early and late at submission (3x the cost)"
    )
    ap.add_argument(
        "--future",
        type=float,
        default=0.0,
        help="minutes: forecasts assume the jobs submitted in that many last minutes come again (0: none)",
    )
    ap.add_argument(
        "--attained",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="running jobs go on for what their class's history expects given how long they ran",
    )
    ap.add_argument(
        "--repeat",
        action="store_true",
        help="with --future: the last M minutes' submissions come again every M minutes, to the horizon",
    )
    ap.add_argument(
        "--statistic",
        choices=sorted([eta.LEARNED, *eta.STATISTICS]),
        default=eta.LEARNED,
        help="what forecasts take of a class's runs for a job's runtime (learned: the fold's estimate)",
    )
    ap.add_argument(
        "--censored",
        action="store_true",
        help="a class's running jobs count in its runs, at what they are expected to run in all",
    )
    ap.add_argument(
        "--hold",
        type=float,
        default=0.0 if eta.HOLD_S is None else eta.HOLD_S / 60,
        help="minutes: forecasts assume every team that submitted in that many last minutes keeps "
        "holding what it holds (0: no later submissions)",
    )
    ap.add_argument(
        "--batch",
        type=float,
        default=0.0 if eta.BATCH_S is None else eta.BATCH_S / 60,
        help="minutes: a waiting job runs at least as long as its team's like jobs submitted that close "
        "to it that run now (0: not)",
    )
    ap.add_argument(
        "--resolution",
        type=float,
        default=eta.RESOLUTION,
        help="forecasts decide at most every this fraction of the time they simulated (0: every cycle)",
    )
    ap.add_argument(
        "--sample",
        type=int,
        default=1,
        help="forecast the jobs submitted at every K-th submission time only (the replay and the "
        "calibration are the same; the figures are of those jobs)",
    )
    ap.add_argument("--dump", default=None, help="write one JSON line per job (forecast, naive, actual) here")
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that forecast beside the replay (1: the replay's own; the figures are the same)",
    )
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be at least 1, not {args.workers}")
    if args.sample < 1:
        ap.error(f"--sample must be at least 1, not {args.sample}")
    if not 0.0 <= args.pool < 1.0:
        ap.error(f"--pool must be a share from 0 up to 1, not {args.pool}")
    if not 0.0 <= args.resolution < math.inf:
        ap.error(f"--resolution must be a fraction of 0 or more, not {args.resolution}")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    sliced = philly.load_slice(trace.find(args.trace), args.start, args.jobs)
    exp = philly.Experiment(tuple(sliced), args.nodes, pool=args.pool)
    jobs = [
        replace(
            j,
            arrival=j.arrival + 0.5,
            spec=j.spec
            if args.estimates == "given"
            else msgspec.structs.replace(j.spec, runtime_estimate_s=None),
        )
        for j in exp.jobs("corral")
    ]
    print(
        run(
            exp,
            jobs,
            args.estimates,
            args.horizon * 3600,
            args.again * 60,
            args.scale,
            calibrate=args.calibrate,
            band=args.band,
            future_s=args.future * 60,
            attained=args.attained,
            workers=args.workers,
            repeat=args.repeat,
            dump=args.dump,
            statistic=args.statistic,
            censored=args.censored,
            hold_s=args.hold * 60 or None,
            batch_s=args.batch * 60 or None,
            resolution=args.resolution,
            sample=args.sample,
        )
    )
    print(f"elapsed {time.perf_counter() - t0:.0f} s")


def run(
    exp: philly.Experiment,
    jobs: Sequence[SimJob],
    estimates: str,
    horizon_s: float = eta.HORIZON_S,
    every_s: float = EVERY_S,
    scale: float = 1.0,
    *,
    calibrate: bool = True,
    band: bool = False,
    future_s: float = 0.0,
    attained: bool = True,
    workers: int = 1,
    repeat: bool = False,
    dump: str | None = None,
    statistic: str = eta.LEARNED,
    censored: bool = False,
    hold_s: float | None = eta.HOLD_S,
    batch_s: float | None = eta.BATCH_S,
    resolution: float = eta.RESOLUTION,
    sample: int = 1,
) -> str:
    config = exp.config("corral")
    cycle = config.cycle_s
    sim = Simulation(exp.cluster(), exp.setup("corral"), jobs, config)
    arrivals = {math.floor(j.arrival / cycle) * cycle + cycle for j in jobs}
    again: set[float] = set()
    if every_s > 0:
        first, last = int(jobs[0].arrival // every_s) + 1, int(jobs[-1].arrival // every_s) + 2
        again = {k * every_s for k in range(first, last)}
    points = sorted(arrivals | again)
    seen: dict[str, Pending | None] = {}  # job -> the forecast made at its submission (None: not sampled)
    submissions = 0  # submission times so far, of which every ``sample``-th is forecast
    naive: dict[str, float] = {}
    estimate: dict[str, float] = {}
    later_asked: list[tuple[str, float, Pending]] = []  # (job, forecast at, the forecast)
    band_asked: dict[str, tuple[Pending, Pending]] = {}  # job -> (early, late) forecasts at submission
    calibration = eta.Calibration()
    # every submission, as the log has them, while it may come again in a forecast (--future)
    lately: deque[tuple[str, JobSpec, float, float | None]] = deque()
    unfinished: set[str] = set()  # jobs with an estimate whose error is not known yet
    started_at, told = time.perf_counter(), 0.0
    with Forecaster(config, workers) as forecaster:
        for n, point in enumerate(points):
            if time.perf_counter() - told >= PROGRESS_S:
                told = time.perf_counter()
                print(
                    f"{told - started_at:.0f} s: point {n} of {len(points)}, "
                    f"{len(seen)} jobs forecast, forecasts took {forecaster.busy_s:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            now = point - 1e-3
            sim.run(until=now)
            state = sim.state
            waiting = [j for j in state.jobs.values() if j.phase in WAITING]
            if not waiting:
                continue
            new = [j.id for j in waiting if j.id not in seen]
            if point not in again:
                if not new:
                    continue
                asked: list[str] | None = new  # only they need a forecast: it stops once they start
                submissions += 1
            else:
                asked = None
            sampled = asked is None or submissions % sample == 0
            # in the order they finished, as a forecast role counts them: which are the latest
            # ``CALIBRATE_FROM`` must not hang on the order of a set
            ended = [i for i in unfinished if sim.stats[i].finished is not None]
            for i in sorted(ended, key=lambda i: (sim.stats[i].finished, i)):
                unfinished.discard(i)
                if sim.stats[i].phase == "succeeded":
                    calibration.saw(estimate[i], sim.by_id[i].work_s, sim.by_id[i].tenant)
            lo, hi = calibration.spread() if calibrate else (eta.EARLY, eta.LATE)
            errors = calibration.errors() if calibrate else None
            future: list[SimJob] = []
            if future_s > 0:
                while lately and lately[0][2] < now - future_s:
                    lately.popleft()
                until = now + horizon_s if repeat else None
                total = calibration.total() if calibrate else 1.0
                future = eta.recent(state, now, future_s, scale * total, until, lately)
            blob = msgspec.msgpack.encode(state)  # one copy per point, whatever the forecasts
            ask = dict(
                horizon_s=horizon_s,
                arrivals=future,
                attained=attained,
                statistic=statistic,
                censored=censored,
                hold_s=hold_s,
                batch_s=batch_s,
                resolution=resolution,
                errors=errors,
            )
            fc = forecaster.submit(blob, now, dict(ask, scale=scale, jobs=asked)) if sampled else None
            if band and new and sampled:
                early = forecaster.submit(blob, now, dict(ask, scale=scale * lo, jobs=new))
                late = forecaster.submit(blob, now, dict(ask, scale=scale * hi, jobs=new))
                for i in new:
                    band_asked[i] = (early, late)
            runs = eta.with_running(state, now, state.runtimes, statistic) if censored else state.runtimes
            ahead: dict[str, float] = {}
            for job in sorted(waiting, key=lambda j: j.submitted_seq):
                est = runtimes.of(job)
                if job.id not in seen:
                    seen[job.id] = fc
                    # the forecast's own estimate: what it runs the job for, and what calibrates it
                    mine = eta.expected(job, runs, statistic) if attained else est
                    lately.append((job.tenant, job.spec, job.submitted_at, mine))
                    naive[job.id] = now + ahead.get(job.spec.queue, 0.0)
                    if mine is not None:
                        estimate[job.id] = mine
                        unfinished.add(job.id)
                elif asked is None and fc is not None:
                    later_asked.append((job.id, now, fc))
                if job.phase != "submitted":  # one not accepted yet is ahead of nobody
                    q = job.spec.queue
                    ahead[q] = ahead.get(q, 0.0) + (UNKNOWN_RUNTIME_S if est is None else est)
        at_submit = {i: fc.start(i) for i, fc in seen.items() if fc is not None}
        later = [(i, t, fc.start(i)) for i, t, fc in later_asked]
        bands = {i: (early.start(i), late.start(i)) for i, (early, late) in band_asked.items()}
    forecast_s = forecaster.busy_s  # once the pool is shut down: every result counted
    sim.run()
    stats = sim.stats
    if dump is not None:
        with open(dump, "w") as f:
            for i, at in at_submit.items():
                st = stats[i]
                row = dict(id=i, team=st.tenant, gpus=st.gpus, submitted=st.submitted, start=st.first_start)
                row |= dict(forecast=at, naive=naive[i], estimate=estimate.get(i), work=st.work_s)
                f.write(json.dumps(row) + "\n")
    lines = [
        f"Philly slice: {len(jobs)} jobs, {exp.nodes} x {philly.GPUS_PER_NODE} GPUs, {exp.pool:g} of each "
        f"team's entitlement pooled, estimates {estimates}; "
        f"{len(points)} forecast points, forecasts took {forecast_s:.0f} s in all ({workers} processes)",
        f"horizon {horizon_s / 3600:g} h, deciding at most every {resolution:g} of the time simulated, "
        f"waiting jobs forecast again every {every_s / 60:g} min, "
        + (f"submissions of the last {future_s / 60:g} min assumed to come again; " if future_s else "")
        + ("and again every as many minutes; " if future_s and repeat else "")
        + (
            f"teams that submitted in the last {hold_s / 60:g} min keep holding what they hold; "
            if hold_s is not None
            else ""
        )
        + (
            f"a waiting job runs at least as long as its team's like running jobs "
            f"submitted within {batch_s / 60:g} min of it; "
            if batch_s is not None
            else ""
        )
        + f"runtimes the {statistic} of each class's runs"
        + (" and running jobs" if censored else "")
        + f", scaled by {scale:g} in forecasts"
        + (
            ", each by how far off the estimate of one of the jobs estimated about as long that "
            "finished so far was"
            if calibrate
            else ""
        )
        + (
            "; running jobs end as the runs of their class that ran as long did"
            if attained
            else "; running jobs end at their estimate at submission"
        ),
        f"({eta.ASSUMPTION})",
        "",
        "start forecast within the band of the actual wait (±20 %, or 5 min under 25 min):",
        f"{'actual wait':<14}{'jobs':>7}{'at submit %':>13}{'naive %':>9}"
        f"{'while waiting %':>17}{'forecasts':>11}",
    ]

    def share(ids: Sequence[str], pred: Callable[[str], float]) -> float:
        if not ids:
            return float("nan")
        hits = 0
        for i in ids:
            st = stats[i]
            hits += within(pred(i) - st.submitted, st.first_start - st.submitted)  # type: ignore[operator]
        return 100.0 * hits / len(ids)

    started = [i for i in at_submit if stats[i].first_start is not None]
    for lo, hi, name in (*BUCKETS, (0.0, math.inf, "all")):
        ids = [i for i in started if lo <= stats[i].wait < hi]  # type: ignore[operator]
        again = [(i, s) for i, _, s in later if i in stats and stats[i].first_start is not None]
        again = [(i, s) for i, s in again if lo <= stats[i].wait < hi]  # type: ignore[operator]
        hits = sum(
            within(s - stats[i].submitted, stats[i].first_start - stats[i].submitted)  # type: ignore[operator]
            for i, s in again
        )
        lines.append(
            f"{name:<14}{len(ids):>7}{share(ids, at_submit.__getitem__):>13.1f}"
            f"{share(ids, naive.__getitem__):>9.1f}{100.0 * hits / max(1, len(again)):>17.1f}{len(again):>11}"
        )
    lines += [
        "",
        "forecasts at submission outside the band, and the median forecast wait / actual wait:",
        f"{'actual wait':<14}{'too soon %':>11}{'too late %':>11}"
        f"{'beyond horizon %':>18}{'median ratio':>14}",
    ]
    for lo, hi, name in (*BUCKETS, (0.0, math.inf, "all")):
        ids = [i for i in started if lo <= stats[i].wait < hi]  # type: ignore[operator]
        soon = too_late = beyond = 0
        ratios: list[float] = []
        for i in ids:
            st = stats[i]
            actual, predicted = st.first_start - st.submitted, at_submit[i] - st.submitted  # type: ignore[operator]
            beyond += math.isinf(predicted)
            if not within(predicted, actual) and not math.isinf(predicted):
                soon += predicted < actual
                too_late += predicted > actual
            ratios.append(predicted / max(actual, 1.0))
        ratios.sort()
        n = max(1, len(ids))
        mid = ratios[len(ratios) // 2] if ratios else float("nan")
        lines.append(
            f"{name:<14}{100.0 * soon / n:>11.1f}{100.0 * too_late / n:>11.1f}"
            f"{100.0 * beyond / n:>18.1f}{mid:>14.2f}"
        )
    if bands:
        inside = [i for i in started if i in bands]
        hit = sum(bands[i][0] - 1e-6 <= stats[i].first_start <= bands[i][1] + 1e-6 for i in inside)  # type: ignore[operator]
        lines.append(
            f"actual start between the early and late forecasts at submission: "
            f"{100.0 * hit / max(1, len(inside)):.1f} % of {len(inside)}"
        )
    ok = share(started, at_submit.__getitem__)
    lines.append(
        f"goal: >= 80 % within the band at submission: {ok:.1f} % ({'met' if ok >= 80 else 'NOT met'})"
    )
    lines += ["", "runtime estimate at submission against the actual runtime (same band):"]
    ids = [i for i in estimate]
    hit = sum(within(estimate[i], sim.by_id[i].work_s) for i in ids)
    known = len(ids)
    lines.append(
        f"  {known} of {len(seen)} jobs had an estimate; within the band: {100.0 * hit / max(1, known):.1f} %"
    )
    ratios = sorted(estimate[i] / sim.by_id[i].work_s for i in ids)
    if ratios:
        q = [ratios[int(p * (len(ratios) - 1))] for p in (0.1, 0.25, 0.5, 0.75, 0.9)]
        lines.append(
            "  estimate / actual at the 10th, 25th, 50th, 75th, 90th percentiles: "
            + ", ".join(f"{x:.2f}" for x in q)
        )
    lo, hi = calibration.spread()
    lines.append(
        f"  calibration at the end (latest {len(calibration.seen)} finished): each job run by one of "
        f"their errors, early {lo:.2f} and late {hi:.2f} times it; total actual / total estimated "
        f"{calibration.total():.2f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
