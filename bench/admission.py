"""Admission cycle over a deep backlog: ``python -m bench.admission``.

100,000 queued jobs across 200 queues in 20 team cohorts (under 2 organisations), on a cluster
whose quota is mostly held by running jobs, as in steady state: a full ``decide`` cycle orders
every queue, admits what fits and explains the rest. Prints the median of several runs per
scenario (goal: under 100 ms for the full cycle) and admission decisions per second.

Scenarios:
  saturated  quota nearly all held; few admissions, every queue walked, every reason new
  steady     the same after one cycle's reasons were folded: most reasons unchanged
  draining   quota free; the cycle admits up to its cap (1000) and explains the rest
  submitted  the same backlog still to be validated and accepted in the cycle
  nodes      saturated, on a cluster of 1,250 8-GPU nodes (10,000 GPUs): every pending job is
             also asked whether some node could host it (``Inventory``), a verdict per job shape
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from corral.events.jobs import Admission, JobSpec, PendingReasonChanged, Resources
from corral.events.queues import CohortSpec, PriorityClassSpec, QueueSpec, Quota
from corral.projections import indexes
from corral.projections.lifecycle import Phase
from corral.projections.state import GpuState, JobState, NodeState, State
from corral.services.admission.decide import decide
from corral.services.agent.inventory import a100_8x_nvlink, h100_8x_nvswitch

QUEUES = 200
COHORTS = 20
ORGS = 2
PENDING = 100_000
MODELS = ("H100-80GB", "A100-80GB")
TRAIN = ("python", "train.py")  # what each job runs (admission refuses a job with nothing to run)


def build(pending: int, held_fraction: float, phase: Phase, seed: int = 7) -> State:
    rng = random.Random(seed)
    s = State()
    for o in range(ORGS):
        s.cohorts[f"org-{o}"] = CohortSpec(f"org-{o}", quotas={"*": Quota(16)})
    for c in range(COHORTS):
        s.cohorts[f"team-{c}"] = CohortSpec(f"team-{c}", parent=f"org-{c % ORGS}")
    for q in range(QUEUES):
        quotas = {
            "*": Quota(16, borrowing_limit=16, lending_limit=8),
            MODELS[q % 2]: Quota(8, borrowing_limit=8),
        }
        strategy = "strict-fifo" if q % 10 == 0 else "best-effort-fifo"
        name = f"q-{q}"
        s.queues[name] = QueueSpec(
            name, cohort=f"team-{q % COHORTS}", quotas=quotas, weight=1.0 + q % 3, strategy=strategy
        )
    for name, value in (("low", -10), ("high", 100)):
        s.priority_classes[name] = PriorityClassSpec(name, value)
    seq = 0
    # Running jobs holding ``held_fraction`` of each queue's nominal "*" quota, 1 GPU each.
    for q in range(QUEUES):
        for i in range(int(16 * held_fraction)):
            seq += 1
            jid = f"r-{q}-{i}"
            spec = JobSpec(queue=f"q-{q}", resources=Resources(gpus=1), command=TRAIN)
            s.jobs[jid] = JobState(
                id=jid, tenant="t", spec=spec, submitted_seq=seq, submitted_at=seq, phase="running",
                admission=Admission(jid, 0, 1, {"*": 1}), phase_since=seq,
            )  # fmt: skip
    prios = {"low": -10, "normal": 0, "high": 100}
    for i in range(pending):
        seq += 1
        q = rng.randrange(QUEUES)
        r = rng.random()
        if r < 0.6:
            res = Resources(gpus=rng.choice((1, 2, 4, 8)))
        elif r < 0.8:
            res = Resources(gpus=rng.choice((1, 8)), gpu_models=(MODELS[q % 2],))
        elif r < 0.9:
            res = Resources(gpus=1, gpu_milli=rng.choice((250, 500)))
        else:
            res = Resources(gpus=8)
        replicas = rng.choice((1, 1, 1, 2, 4))
        lo = 1 if r > 0.95 else None
        pc = rng.choice(("low", "normal", "normal", "high"))
        spec = JobSpec(
            queue=f"q-{q}",
            priority_class=pc,
            replicas=replicas,
            min_replicas=lo,
            resources=res,
            command=TRAIN,
        )
        jid = f"j-{i}"
        s.jobs[jid] = JobState(
            id=jid, tenant="t", spec=spec, submitted_seq=seq, submitted_at=seq, phase=phase,
            priority=prios[pc] if phase == "queued" else 0, phase_since=seq,
        )  # fmt: skip
    s.seq = seq
    s.time = float(seq)
    return indexes.rebuild(s)  # built by hand: the indexes the fold would have kept


def with_nodes(state: State, count: int = 1250) -> State:
    """Register ``count`` nodes, half 8×H100, half 8×A100, as their agents would."""
    for i in range(count):
        name = f"node-{i:04d}"
        inv = (h100_8x_nvswitch if i % 2 else a100_8x_nvlink)(name)
        state.nodes[name] = NodeState(name=name, inventory=inv, gpus=[GpuState(info=g) for g in inv.gpus])
    return state


def settle(state: State) -> State:
    """Give the jobs the reasons one cycle would give them, as folding its events would: later
    cycles then find most reasons unchanged, as in a running system."""
    for e in decide(state, state.time):
        if isinstance(e, PendingReasonChanged):
            state.jobs[e.job_id].reasons = e.reasons
    return state


def run(name: str, state: State, runs: int) -> None:
    times = []
    cpu = []  # CPU time too: on a shared machine the wall clock also counts others' work
    out = []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = decide(state, state.time)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med = statistics.median(times)
    kinds: dict[str, int] = {}
    for e in out:
        kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
    admitted = sum(len(e.admissions) for e in out if hasattr(e, "admissions"))
    pending = indexes.count(state, "queued", "submitted")
    print(
        f"{name:10s} median {med * 1000:6.1f} ms (cpu {statistics.median(cpu) * 1000:6.1f} ms)  "
        f"min {min(times) * 1000:6.1f} ms  "
        f"({runs} runs; {pending:,} pending; {admitted} admitted; "
        f"{pending / med:,.0f} jobs decided/s)  events: {kinds}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pending", type=int, default=PENDING)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"admission cycle: {args.pending:,} pending jobs, {QUEUES} queues, {COHORTS} cohorts, {ORGS} orgs")
    run("saturated", build(args.pending, 0.9, "queued"), args.runs)
    run("steady", settle(build(args.pending, 0.9, "queued")), args.runs)
    run("draining", build(args.pending, 0.0, "queued"), args.runs)
    run("submitted", build(args.pending, 0.9, "submitted"), max(3, args.runs // 2))
    run("nodes", with_nodes(build(args.pending, 0.9, "queued")), args.runs)


if __name__ == "__main__":
    main()
