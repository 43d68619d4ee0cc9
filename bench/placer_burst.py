"""What a burst costs the placer: ``python -m bench.placer_burst``.

The end-to-end benchmark (``bench.e2e``) sees the placer decide over bursts of about 600 admitted
jobs on 1,250 8×H100 nodes (10,000 GPUs), and the cycle's CPU time sets submit→placed p99. This
builds such a state through the fold, as the services would leave it: four team queues of one
cohort (each may use the whole cluster), ``--busy`` of the GPUs held by running jobs of the e2e
mix that earlier placer cycles placed, then ``--burst`` jobs of the mix admitted at once (80 % one
GPU, 15 % eight GPUs on one NVLink island, 5 % gangs of four 8-GPU workers in one rack). It prints
the median CPU time of one placer cycle over the burst, per job, and what the cycle placed; and,
as the anchor, the same cycle with every waiting job's diagnosis walking all nodes afresh (as the
placer did before it kept each node's reason within a cycle), which must decide the same.

``--profile`` prints cProfile's top functions of one cycle instead of timing. CPU time, not wall
time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import random
import statistics
import time
from collections.abc import Callable

from bench.cycle import World
from bench.e2e.client import TEAMS, spec
from corral.events import subjects
from corral.events.base import Event
from corral.events.decisions import JobsPlaced
from corral.events.jobs import Admission, JobAccepted, JobsAdmitted, SubmitJob
from corral.events.nodes import NodeRegistered, WorkerStarted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections.placement.framework import Chain
from corral.projections.state import State
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide

NODES = 1250
WIDTHS = (6, 9, 10, 8, 10, 8, 8, 8)
RUNTIME = (5.0, 30.0)  # seconds, as bench.e2e's default


class Burst:
    """A cluster built through the fold, and the jobs of the mix submitted into it."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.w = World()
        self.rng = random.Random(seed)
        self.n = 0
        w = self.w
        for name, inv in cluster(nodes, "h100-8x"):
            w.event(NodeRegistered(node=name, inventory=inv))
        admin = subjects.ADMIN
        w.request(admin, ApplyPriorityClass(priority_class=PriorityClassSpec("normal", 0)))
        w.request(admin, ApplyCohort(cohort=CohortSpec("teams")))
        for t in TEAMS:
            quotas = {"*": Quota(nodes * 8)}
            w.request(admin, ApplyQueue(queue=QueueSpec(t, cohort="teams", tenants=(t,), quotas=quotas)))

    @property
    def state(self) -> State:
        return self.w.state

    def admit(self, count: int) -> None:
        """Submit, accept and admit ``count`` jobs of the mix (quota is never short here)."""
        w, ids = self.w, []
        for _ in range(count):
            self.n += 1
            t = TEAMS[self.n % len(TEAMS)]
            job_id = f"a-{self.n:07d}"
            w.request(t, SubmitJob(request_id=job_id, job=spec(self.rng, t, RUNTIME, mix=True)))
            w.event(JobAccepted(job_id=job_id, priority=0))
            ids.append(job_id)
        jobs = w.state.jobs
        adms = tuple(
            Admission(j, 0, jobs[j].spec.replicas, {"*": jobs[j].spec.replicas * jobs[j].spec.resources.gpus})
            for j in ids
        )
        w.event(JobsAdmitted(based_on=w.seq, now=w.now, admissions=adms))

    def place(self) -> int:
        """One placer cycle, folded, and every placed worker started; the GPUs it placed."""
        w = self.w
        gpus = 0
        for e in decide(w.state, w.now):
            w.event(e)
            if isinstance(e, JobsPlaced):
                for p in e.placements:
                    for s in p.workers:
                        w.event(WorkerStarted(node=s.node, job_id=p.job_id, attempt=p.attempt, rank=s.rank))
                        gpus += len(s.gpus)
        w.now += 1.0
        return gpus


def build(nodes: int, busy: float, burst: int, seed: int = 11) -> State:
    b = Burst(nodes, seed)
    target = int(busy * nodes * 8)
    held = 0
    while held < target:
        b.admit(min(burst, max(1, (target - held) // 4)))
        got = b.place()
        if not got:
            break
        held += got
    b.admit(burst)
    return b.state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=NODES)
    ap.add_argument("--burst", type=int, default=600, help="admitted jobs the cycle decides over")
    ap.add_argument("--busy", type=float, nargs="+", default=[0.0, 0.5, 0.9], help="share of GPUs held")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one cycle instead of timing")
    args = ap.parse_args()
    print(f"{args.nodes} nodes, a burst of {args.burst} admitted jobs of the e2e mix; CPU per placer cycle")
    head = ("busy", "build s", "cycle ms", "ms/job", "walk ms", "ratio", "placed", "waiting")
    print("".join(f"{h:>{w}}" for h, w in zip(head, WIDTHS, strict=True)))
    for busy in args.busy:
        c0 = time.process_time()
        state = build(args.nodes, busy, args.burst)
        built = time.process_time() - c0
        now = state.time
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            decide(state, now)
            prof.disable()
            print(f"-- busy {busy}")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            continue
        one = functools.partial(decide, state, now)
        cycle, events = cpu_ms(one, args.runs)
        walk, walked = cpu_ms(functools.partial(walking, one), min(args.runs, 3))
        if walked != events:
            raise SystemExit("the cycle decided differently with every diagnosis walked afresh")
        placed = sum(len(e.placements) for e in events if isinstance(e, JobsPlaced))
        row = (f"{busy:.2f}", f"{built:.1f}", f"{cycle:.1f}", f"{cycle / args.burst:.3f}", f"{walk:.1f}")
        row += (f"{walk / cycle:.1f}x", str(placed), str(args.burst - placed))
        print("".join(f"{c:>{w}}" for c, w in zip(row, WIDTHS, strict=True)))


def cpu_ms(f: Callable[[], list[Event]], runs: int) -> tuple[float, list[Event]]:
    """Median CPU ms of ``f`` over ``runs`` calls, and what it returned."""
    times, out = [], []
    for _ in range(runs):
        c = time.process_time()
        out = f()
        times.append((time.process_time() - c) * 1000)
    return statistics.median(times), out


def walking(f: Callable[[], list[Event]]) -> list[Event]:
    """``f`` with every diagnosis walking every node afresh, as the placer did before it kept
    nodes' reasons within a cycle: the anchor, and the check that both decide the same."""
    kept = Chain.diagnose
    Chain.diagnose = Chain.diagnose_walk  # type: ignore[method-assign]
    try:
        return f()
    finally:
        Chain.diagnose = kept  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
