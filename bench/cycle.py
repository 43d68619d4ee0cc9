"""What finished jobs cost a cycle: ``python -m bench.cycle`` (``--finished 0 250000`` by default).

A cluster of 1,250 8×H100 nodes (10,000 GPUs) nearly all held by running jobs of 200 queues, with
100,000 jobs queued behind quota and a few admitted jobs waiting for GPUs, is built through the
fold (every job submitted, accepted, admitted, placed and started as the services would), then
``--finished`` jobs more that ran and succeeded before it. For each count it prints the median
CPU time of one admission, placer and preemptor cycle on that state, and of folding one GPU
turning unhealthy and healthy again (a GPU nobody holds). Finished jobs are read by no decision:
the figures should not grow with them.

CPU time, not wall time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from corral.events import routing, subjects
from corral.events.base import Event
from corral.events.codec import ADMIN_VERBS
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.events.jobs import Admission, JobAccepted, JobsAdmitted, JobSpec, Resources, SubmitJob
from corral.events.nodes import GpuHealthChanged, NodeRegistered, WorkerExited, WorkerStarted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections.fold import apply_event
from corral.projections.state import State
from corral.services.admission.decide import decide as admission_decide
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide as placer_decide
from corral.services.preemptor.decide import decide as preemptor_decide

NODES = 1250
QUEUES = 200
COHORTS = 20
QUEUED = 100_000
ADMITTED = 50
TRAIN = ("python", "train.py")  # what each job runs (admission refuses a job with nothing to run)
_VERBS = {t: verb for verb, t in ADMIN_VERBS.items()}


class World:
    """Folds what clients and services would append, one record at a time."""

    def __init__(self) -> None:
        self.state = State()
        self.seq = 0
        self.now = 1000.0

    def request(self, tenant: str, body: Event) -> None:
        self._fold(subjects.request(tenant, _VERBS[type(body)]), body, tenant)

    def event(self, body: Event) -> None:
        self._fold(routing.subject_of(body), body, None)

    def _fold(self, subject: str, body: Event, tenant: str | None) -> None:
        self.seq += 1
        before = self.state.rejected_total
        apply_event(self.state, self.seq, subject, body, self.now, tenant)
        if self.state.rejected_total != before:
            raise SystemExit(f"the fold refused {type(body).__name__}: {self.state.rejections[-1].message}")


def _queue(i: int) -> str:
    return f"q-{i}"


def build(finished: int, seed: int = 7) -> State:
    rng = random.Random(seed)
    w = World()
    for name, inv in cluster(NODES, "h100-8x"):
        w.event(NodeRegistered(node=name, inventory=inv))
    admin = subjects.ADMIN
    w.request(admin, ApplyCohort(cohort=CohortSpec("org", quotas={})))
    for c in range(COHORTS):
        w.request(admin, ApplyCohort(cohort=CohortSpec(f"team-{c}", parent="org")))
    for q in range(QUEUES):
        quotas = {"*": Quota(48, borrowing_limit=16, lending_limit=8)}
        strategy = "strict-fifo" if q % 10 == 0 else "best-effort-fifo"
        spec = QueueSpec(
            _queue(q), cohort=f"team-{q % COHORTS}", quotas=quotas, weight=1.0 + q % 3, strategy=strategy
        )
        w.request(admin, ApplyQueue(queue=spec))
    prios = {"low": -10, "normal": 0, "high": 100}
    for name, value in prios.items():
        w.request(
            admin,
            ApplyPriorityClass(priority_class=PriorityClassSpec(name, value, preemptible=name != "high")),
        )
    nodes = list(w.state.nodes)
    free = {name: list(range(8)) for name in nodes}  # GPUs no placement of this build holds
    n = 0

    def run(specs: list[JobSpec], finish: bool) -> None:
        """Submit, accept, admit, place (on the first free GPUs) and start ``specs``; if
        ``finish``, their workers then exit 0 and the jobs succeed."""
        nonlocal n
        ids = []
        for spec in specs:
            n += 1
            job_id = f"{'done' if finish else 'run'}-{n}"
            ids.append(job_id)
            w.request("t", SubmitJob(request_id=job_id, job=spec))
            w.event(JobAccepted(job_id=job_id, priority=prios[spec.priority_class]))
        jobs = w.state.jobs
        adms = tuple(Admission(j, 0, 1, {"*": jobs[j].spec.resources.gpus}) for j in ids)
        w.event(JobsAdmitted(based_on=w.seq, now=w.now, admissions=adms))
        placements = []
        for j in ids:
            k = jobs[j].spec.resources.gpus
            name = next(name for name in nodes if len(free[name]) >= k)
            taken, free[name] = free[name][:k], free[name][k:]
            placements.append(Placement(j, 0, (WorkerSlot(0, name, tuple(GpuClaim(i) for i in taken)),)))
        w.event(JobsPlaced(based_on=w.seq, now=w.now, placements=tuple(placements)))
        for p in placements:
            w.event(WorkerStarted(node=p.workers[0].node, job_id=p.job_id, attempt=0, rank=0))
        if finish:
            for p in placements:
                slot = p.workers[0]
                w.event(WorkerExited(node=slot.node, job_id=p.job_id, attempt=0, rank=0, code=0))
                free[slot.node] = sorted(free[slot.node] + [c.gpu for c in slot.gpus])
        w.now += 60.0

    def spec(q: int, gpus: int, prio: str, estimate: float | None = None) -> JobSpec:
        res = Resources(gpus=gpus, cpu_milli=1000 * gpus, memory_mib=8192 * gpus)
        return JobSpec(
            queue=_queue(q), priority_class=prio, resources=res, runtime_estimate_s=estimate, command=TRAIN
        )

    # Finished jobs first: they ran, in batches, on the cluster that the running ones hold now.
    batch = 2000
    for start in range(0, finished, batch):
        run([spec((start + i) % QUEUES, 1, "normal") for i in range(min(batch, finished - start))], True)
    # Running: each queue holds 46 of its nominal 48 GPUs (five 8-GPU jobs, six of 1 GPU), some
    # of them preemptible.
    for q in range(QUEUES):
        sizes = [8] * 5 + [1] * 6
        run(
            [
                spec(q, k, "low" if i % 3 == 0 else "normal", rng.uniform(600, 36000))
                for i, k in enumerate(sizes)
            ],
            False,
        )
    # Admitted, waiting for GPUs: 8-GPU jobs, borrowing; 800 GPUs are free.
    for i in range(ADMITTED):
        n += 1
        job_id = f"adm-{n}"
        res = Resources(gpus=8, cpu_milli=8000, memory_mib=65536)
        js = JobSpec(queue=_queue(i % QUEUES), resources=res, command=TRAIN)
        w.request("t", SubmitJob(request_id=job_id, job=js))
        w.event(JobAccepted(job_id=job_id, priority=0))
        w.event(JobsAdmitted(based_on=w.seq, now=w.now, admissions=(Admission(job_id, 0, 1, {"*": 8}),)))
    # Queued behind quota, as bench.admission's backlog: sizes, models, gangs, priorities.
    for _ in range(QUEUED):
        n += 1
        q = rng.randrange(QUEUES)
        res = Resources(gpus=rng.choice((1, 2, 4, 8)))
        prio = rng.choice(("low", "normal", "normal", "high"))
        lo = 1 if rng.random() > 0.95 else None
        js = JobSpec(
            queue=_queue(q),
            priority_class=prio,
            replicas=rng.choice((1, 1, 1, 2, 4)),
            min_replicas=lo,
            resources=res,
            command=TRAIN,
        )
        w.request("t", SubmitJob(request_id=f"wait-{n}", job=js))
        w.event(JobAccepted(job_id=f"wait-{n}", priority=prios[prio]))
    return w.state


def cpu_ms(f: Callable[[], object], runs: int) -> tuple[float, object]:
    times = []
    out: object = None
    for _ in range(runs):
        c0 = time.process_time()
        out = f()
        times.append((time.process_time() - c0) * 1000)
    return statistics.median(times), out


def health_flip(state: State, seq: list[int]) -> None:
    """Fold one GPU turning bad and good again; GPU 7 of the last node, which nobody holds."""
    node = list(state.nodes)[-1]
    for healthy in (False, True):
        seq[0] += 1
        body = GpuHealthChanged(node=node, gpu=7, healthy=healthy, signal="" if healthy else "xid 79")
        apply_event(state, seq[0], routing.subject_of(body), body, state.time)


def measure(state: State, runs: int) -> tuple[float, float, float, float]:
    """Median CPU ms of an admission, a placer and a preemptor cycle, and of a GPU health flip."""
    now = state.time
    # The last node has a GPU free, so flipping its health interrupts no job.
    assert not state.nodes[list(state.nodes)[-1]].gpus[7].holders
    adm, _ = cpu_ms(lambda: admission_decide(state, now), runs)
    plc, _ = cpu_ms(lambda: placer_decide(state, now), runs)
    pre, _ = cpu_ms(lambda: preemptor_decide(state, now), runs)
    seq = [state.seq]
    flip, _ = cpu_ms(lambda: health_flip(state, seq), runs)
    return adm, plc, pre, flip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--finished", type=int, nargs="+", default=[0, 250_000])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{NODES} nodes, {QUEUED:,} queued, {ADMITTED} admitted; CPU ms per cycle, median of {args.runs}")
    head = ("finished", "jobs", "build s", "admission", "placer", "preemptor", "gpu health")
    print(" ".join(f"{h:>10}" for h in head))
    for finished in args.finished:
        c0 = time.process_time()
        state = build(finished)
        built = time.process_time() - c0
        figures = measure(state, args.runs)
        row = [f"{finished:,}", f"{len(state.jobs):,}", f"{built:.1f}", *(f"{f:.1f}" for f in figures)]
        print(" ".join(f"{c:>10}" for c in row))


if __name__ == "__main__":
    main()
