"""What a deep backlog costs the preemptor's cycle: ``python -m bench.preemptor_idle``
(``--queued 10000 100000`` by default).

Two states, each built through the fold (every job submitted, accepted, admitted, placed and
started as the services would), for each ``--queued`` count:

- ``backlog``: as ``bench.e2e`` leaves it in its idle window: 1,250 8×H100 nodes, four team
  queues, and one tenant's queue with a quota of 8 GPUs that its running jobs hold, behind which
  the queued one-GPU jobs wait, each with its own runtime estimate. No preemption can help any
  of them: the cycle should find that once, not per job. ``--running N``: the team queues also
  run N one-GPU jobs (what every cycle that searches reads, however deep the backlog).
- ``mixed``: ``bench.cycle``'s cluster (200 queues nearly full, 50 admitted jobs waiting for
  GPUs) with the queued jobs spread over the queues in sizes, gangs and priorities.

For each it prints the median CPU time of one preemptor cycle (``decide``) judging the backlog
form by form (``PreemptorConfig.by_form``, the default), of one judging it job by job (the
anchor, measured in the same run), their ratio, and whether the two proposed the same.

CPU time, not wall time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import random
import time

from bench import cycle
from corral.events import subjects
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.events.jobs import Admission, JobAccepted, JobsAdmitted, JobSpec, Resources, SubmitJob
from corral.events.nodes import NodeRegistered, WorkerStarted
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, QueueSpec, Quota
from corral.projections.state import State
from corral.services.agent.inventory import cluster
from corral.services.preemptor.decide import PreemptorConfig, decide

NODES = 1250
TEAMS = 4
BACKLOG = "backlog"
BACKLOG_GPUS = 8


def backlog(queued: int, running: int = 0, seed: int = 7) -> State:
    rng = random.Random(seed)
    w = cycle.World()
    for name, inv in cluster(NODES, "h100-8x"):
        w.event(NodeRegistered(node=name, inventory=inv))
    admin = subjects.ADMIN
    w.request(admin, ApplyCohort(cohort=CohortSpec("teams")))
    w.request(admin, ApplyCohort(cohort=CohortSpec("held")))
    for t in range(TEAMS):
        quotas = {"*": Quota(NODES * 8 // TEAMS)}
        w.request(admin, ApplyQueue(queue=QueueSpec(f"team-{t}", cohort="teams", quotas=quotas)))
    quotas = {"*": Quota(BACKLOG_GPUS, borrowing_limit=0, lending_limit=0)}
    w.request(admin, ApplyQueue(queue=QueueSpec(BACKLOG, cohort="held", quotas=quotas)))
    nodes = list(w.state.nodes)
    n = 0

    def submit(queue: str) -> str:
        nonlocal n
        n += 1
        job_id = f"{queue}-{n}"
        spec = JobSpec(
            queue=queue,
            resources=Resources(gpus=1),
            runtime_estimate_s=round(rng.uniform(5, 60), 1),
            command=("python", "train.py"),
        )
        w.request("t", SubmitJob(request_id=job_id, job=spec))
        w.event(JobAccepted(job_id=job_id, priority=0))
        return job_id

    # Running: the backlog queue's quota, then the teams' jobs, one GPU each.
    started = [submit(BACKLOG) for _ in range(BACKLOG_GPUS)]
    started += [submit(f"team-{i % TEAMS}") for i in range(min(running, (NODES - 1) * 8))]
    adms = tuple(Admission(j, 0, 1, {"*": 1}) for j in started)
    w.event(JobsAdmitted(based_on=w.seq, now=w.now, admissions=adms))
    placements = [
        Placement(j, 0, (WorkerSlot(0, nodes[i // 8], (GpuClaim(i % 8),)),)) for i, j in enumerate(started)
    ]
    w.event(JobsPlaced(based_on=w.seq, now=w.now, placements=tuple(placements)))
    for p in placements:
        w.event(WorkerStarted(node=p.workers[0].node, job_id=p.job_id, attempt=0, rank=0))
    for _ in range(queued):
        submit(BACKLOG)
    return w.state


def mixed(queued: int, running: int = 0) -> State:
    cycle.QUEUED = queued  # read as it builds
    return cycle.build(0)


def cpu_ms(state: State, config: PreemptorConfig, runs: int) -> tuple[float, list[object]]:
    times = []
    out: list[object] = []
    for _ in range(runs):
        c0 = time.process_time()
        out = list(decide(state, state.time, config))
        times.append((time.process_time() - c0) * 1000)
    times.sort()
    return times[len(times) // 2], out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queued", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--states", nargs="+", choices=("backlog", "mixed"), default=["backlog", "mixed"])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--running", type=int, default=0, help="backlog: the teams' running one-GPU jobs")
    args = ap.parse_args()
    builders = {"backlog": backlog, "mixed": mixed}
    print(f"CPU ms per preemptor cycle, median of {args.runs}; backlog: {args.running:,} team jobs running")
    head = ("state", "queued", "build s", "by form", "job by job", "ratio", "same", "proposed")
    print(" ".join(f"{h:>10}" for h in head))
    for name in args.states:
        for queued in args.queued:
            c0 = time.process_time()
            state = builders[name](queued, args.running)
            built = time.process_time() - c0
            fast, fast_out = cpu_ms(state, PreemptorConfig(), args.runs)
            slow, slow_out = cpu_ms(state, PreemptorConfig(by_form=False), args.runs)
            row = (
                name,
                f"{queued:,}",
                f"{built:.1f}",
                f"{fast:.2f}",
                f"{slow:.2f}",
                f"{slow / fast:.0f}x" if fast > 0 else "-",
                "yes" if fast_out == slow_out else "NO",
                str(len(fast_out)),
            )
            print(" ".join(f"{c:>10}" for c in row))


if __name__ == "__main__":
    main()
