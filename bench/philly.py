"""The Philly experiment and the simulator's speed: ``python -m bench.philly`` (``--quick``: 2,000
jobs).

Runs corral's policy and FIFO on the same slice of Microsoft's Philly trace (20,000 jobs from
2017-10-23 on, 64 nodes of 8 GPUs, decisions once a simulated minute; ``services/sim/philly.py``
says how the slice, the cluster, the quotas and the jobs are chosen), one policy per process, and
prints:

(a) per policy and per team: average and p99 wait and JCT, GPU utilisation, Jain's index of GPU
    share against entitlement, preemptions and GPU-hours lost; the worst team's p99 wait next to
    FIFO's. Goal: corral's average JCT below FIFO's, Jain's index >= 0.9.
(b) the simulator's speed: simulated seconds (first arrival to last completion) per wall-clock
    second, with the CPU seconds each run used (wall time depends on what else the machine
    runs; the load average is printed first).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from corral.services.sim import philly
from corral.services.sim.traces import philly as trace


def main(argv: list[str] | None = None) -> None:
    load = os.getloadavg()[0]
    version = sys.version.split()[0]
    print(f"python {version}, {os.cpu_count()} CPUs, load average {load:.1f} (wall-clock timings)")
    ap = argparse.ArgumentParser(prog="python -m bench.philly")
    ap.add_argument("--quick", action="store_true", help="2,000 jobs instead of 20,000")
    ap.add_argument("--jobs", type=int, default=philly.JOBS)
    ap.add_argument("--nodes", type=int, default=philly.NODES)
    ap.add_argument("--start", default=philly.START)
    ap.add_argument(
        "--cycle", type=float, default=philly.CYCLE_S, help="seconds between decisions (0: every event)"
    )
    ap.add_argument("--png", type=Path, default=Path(tempfile.gettempdir()) / "philly.png")
    args = ap.parse_args(argv)
    jobs = 2000 if args.quick else args.jobs
    t0 = time.perf_counter()
    sliced = philly.load_slice(trace.find(), args.start, jobs)
    exp = philly.Experiment(tuple(sliced), args.nodes, cycle_s=args.cycle)
    print(f"slice read in {time.perf_counter() - t0:.1f}s\n")
    t0 = time.perf_counter()
    outcomes = philly.run(exp)
    wall = time.perf_counter() - t0
    print("(a) " + philly.table(exp, outcomes))
    by = {o.policy: o for o in outcomes}
    corral, fifo = by.get("corral"), by.get("fifo")
    if corral is not None and fifo is not None:
        better = corral.overall.avg_jct_s < fifo.overall.avg_jct_s
        print(
            f"    goal: average JCT below FIFO's ({corral.overall.avg_jct_s / 3600:.2f} h vs "
            f"{fifo.overall.avg_jct_s / 3600:.2f} h): {'met' if better else 'NOT met'}; "
            f"Jain's index >= 0.9 ({corral.jain:.3f}): {'met' if corral.jain >= 0.9 else 'NOT met'}"
        )
    print(f"    plot: {philly.plot(outcomes, args.png)}")
    print(f"\n(b) simulator speed ({len(exp.trace)} jobs, both policies in parallel: {wall:.0f}s wall)")
    print(f"    {'policy':<8}{'simulated d':>12}{'wall s':>9}{'CPU s':>9}", end="")
    print(f"{'sim s/wall s':>14}{'decide calls':>14}")
    for o in outcomes:
        print(
            f"    {o.policy:<8}{o.simulated_s / 86400:>12.1f}{o.wall_s:>9.1f}{o.cpu_s:>9.1f}"
            f"{o.speed:>14.0f}{o.decide_calls:>14}"
        )


if __name__ == "__main__":
    main()
