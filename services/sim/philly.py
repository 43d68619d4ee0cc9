"""The time-dynamic Philly experiment: weeks of real arrivals and departures through corral's
services, on the simulator, against FIFO and Tiresias on the same slice.

The slice. Microsoft's Philly trace (``services/sim/traces/philly.py``) sorted by arrival; the
``jobs`` (default 20,000) that arrive first from ``start`` on (default 2017-10-23 00:00 UTC: a
contiguous window of about 24 days, 13 of the 15 virtual clusters active, 85 jobs of more
than 8 GPUs). Every virtual cluster is a team: one tenant and, under corral, one queue.

The cluster. ``nodes`` (default 64) HGX H100 nodes of 8 GPUs on one NVSwitch (512 GPUs): the
slice asks for about 500 GPUs on average over its window (GPU-seconds over the window's length),
so the cluster is loaded near its capacity, with bursts well above it.

The jobs. A job of ``g`` GPUs is one worker of ``g`` GPUs when ``g <= 8``; a larger job is a gang
of ``g / d`` workers of ``d`` GPUs, ``d`` the largest divisor of ``g`` not above 8 (16 GPUs: two
8-GPU workers; 12: two of 6), placed whole or not at all. Each worker asks 4 CPUs and 16 GiB per
GPU (never the binding constraint on these nodes). The runtime estimate is the trace's duration
(what a user who knows their job would say). A share of the jobs (``checkpointable``, default
75 %, drawn with a fixed seed per job) can checkpoint: the simulated agents write a checkpoint
every 30 minutes of running and on preemption (30 s to save, 60 s of grace), and these jobs are
preemptible. The others cannot checkpoint and are not preemptible, as their owners would ask:
stopping one throws away all it did. Every job is in one priority class, ``normal`` (0), whose
anti-thrash guards are five minutes of running before a job may be preempted and at most three
preemptions in a job's life.

The three policies, the same fold and simulated agents in all:

- ``corral``: one queue per team, all in one cohort so idle quota is lent. Each team's
  entitlement is its share of the slice's GPU-hours (at least one GPU each, largest
  remainders, summing to the cluster), which is also its fair-share weight; its queue's
  nominal quota is half of it (``pool``, ``POOL``; rounded down), and the rest is the
  cohort's own quota, a pool every team borrows from: a guaranteed share plus a burst pool,
  as platform teams set up Kueue cohorts. (With the whole entitlement as nominal, a team of
  many short jobs and few GPU-hours, three of which hold most of the slice's jobs, could burst
  only into quota others left idle, and waited behind other teams' week-long jobs running
  within their nominal. While jobs that may not be preempted could borrow, half pooled was
  best over the 20,000 jobs: a quarter and three quarters gave 5.68 and 5.66 h of average JCT
  against a half's 5.41 h. Since they stay within their team's nominal, a quarter pooled
  gives 6.20 h, Jain's index 0.958, against a half's 6.57 h and 0.969: ``--pool 0.25``.) A
  job that cannot checkpoint and asks for more than its team's nominal could never run as one
  that may not be preempted: its owner lets it be preempted, at the cost of what it did (19
  of the 20,000 with half pooled).
  Shortest first with aging within a queue (``shortest-first``:
  highest response ratio next, from the runtime estimates), fair share across queues, the
  placer's reservation and backfill, the preemptor reclaiming nominal quota from borrowers,
  and Kueue's fair-sharing preemption among borrowers (``FAIR_SHARING``): a team that held
  little of the pool lately takes it back from one that held much. "Lately" is the fair-share
  half-life (``HALF_LIFE_S``, six hours, set as an admin would with ``corral queue
  fair-share``): with the default day, a team of many short jobs that had borrowed much the
  day before counted as a heavy user through a burst hours later and waited while others kept
  the pool; over the 6,000-job slice six hours cut corral's average JCT from 4.38 to 4.35 h and
  its average wait from 0.24 to 0.17 h, and raised Jain's index from 0.996 to 0.999, but the
  p99 wait of the team of wide, week-long jobs grew from 37 to 43 h (one hour and three gave
  the same JCT within 0.01 h, one hour with more preemptions; over the 20,000 jobs one hour and
  ten minutes gave 5.81 and 5.86 h of average JCT against six hours' 5.41, and Jain's index
  0.917 and 0.928 against 0.923). The short-job lane
  (``SHORT_JOB_GPU_S``, one GPU-hour, set as an admin would with ``corral queue fair-share
  --short-jobs 1h``): among jobs that borrow equally far, one of at most a GPU-hour goes before
  fair-share order. Over 20,000 jobs it cut corral's average JCT from 5.97 to 5.81 h with
  owners' estimates checked against their job classes' history, and to 5.47 h with them checked
  against each team's record of its estimates (here exact, so every record holds); half a
  GPU-hour and two GPU-hours gave 5.73 and 5.81 h against one GPU-hour's 5.41 h (with
  shortest-first reading the time a job has left).
- ``fifo``: one strict-FIFO queue for everyone with the whole cluster as its quota (no fair
  share), and no preemptor. The placer is the same.
- ``tiresias``: Tiresias's discretized 2D-LAS (``tiresias.py``) in place of corral's services:
  one queue for everyone, two priority levels by attained GPU-time (one GPU-hour the
  threshold, PROMOTE_KNOB 8), FIFO within each, the lower level's checkpointable jobs stopped
  (the same 30 s save and 60 s grace) for the higher's, consolidated placement. Its jobs carry
  no runtime estimate: Tiresias schedules without knowing durations.

Both run on the simulator (``driver.py``) with the services deciding once a minute of simulated
time (``cycle_s``, 60 s: a scheduler on a one-minute cycle; 0 decides at every event, as the
live services do, and takes about twice as long to simulate: over the 20,000 jobs, ``corral sim
--trace philly --policies corral,tiresias --cycle 0``, corral 5.53 h of average JCT (0.92 h of
average wait, Jain's index 0.950) and Tiresias 5.11 h (Jain 0.934), 0.21 and 0.12 h below their
one-minute figures, 0.42 h apart against 0.51), and finished
jobs let go by the fold at once (a retention period of 0, ``RETENTION``), which changes no
decision: what is reported comes from the simulator's own figures per job, not the state.

What is reported, per team and overall: jobs, average and p99 wait (submission to first
start) and JCT (submission to end), the p99 wait of the team that waits longest, preemptions
(in all, and the most of any one job) and GPU-hours lost to them (held but not kept),
GPU utilisation (GPU-seconds held over capacity, from the first to the last arrival of the slice,
while the trace offers load), and Jain's fairness index of GPU share against entitlement: over
the same window, each team's GPU-seconds held divided by its entitlement, the weighted max-min
fair share of the cluster (weights: the nominal quotas) given the GPUs it asked for at each
moment (held plus waiting); Jain's index of those ratios over the teams that were entitled to
anything, 1.0 when every team got exactly its entitlement.

Over 20,000 jobs corral's index is 0.923 and Tiresias's 0.919, and one team makes most of the
gap to 1: vc-ed69ec, 802 one-GPU jobs (median 23 minutes) and an entitlement of 4 GPUs, holds
1.93 times its entitlement under corral; with it at 1.0 and every other team as it was, the
index would be 0.964 (0.987 with vc-0e4a51, 579 short jobs at 1.57, at 1.0 too). While the
cluster is contended, a team's entitlement is its weighted part however many jobs it asks for,
so a team whose bursts are rarely kept waiting (vc-ed69ec's jobs wait 0.43 h on average) holds
more than that while others wait: only making it wait longer lowers the ratio. It is not the
short-job lane: closing the lane to a queue holding more than twice its weighted part of the
cohort's quota, now and lately, left vc-ed69ec at 1.93 and the index at 0.920, with average JCT
6.01 h against 5.41.

A borrowing limit (Kueue's ``borrowingLimit``; ``borrow``, ``corral sim --borrow-limit M``:
each team's queue borrows at most M times its entitlement) buys the index with wait. Over the
20,000 jobs (corral alone, one run each; average JCT h / Jain / preemptions): no limit 5.41 /
0.923 / 3,933; M = 3: 5.80 / 0.910 / 3,907 (vc-e13805, 107 jobs, fell to 0.48 of its
entitlement); M = 2: 6.08 / 0.951 / 4,233 (vc-ed69ec at 1.57); M = 1.5: 6.16 / 0.972 / 3,743;
M = 1: 7.61 / 0.989 / 3,382. Most of the added JCT is the teams of many short jobs, whose
bursts the limit caps while the cluster has room (vc-6214e9, 6,791 jobs, averaged 1.81 h of
wait at M = 2 against 0.74 h). So no limit is set by default: on this slice an index of 0.95
costs at least 0.67 h of average JCT, and Tiresias, with no quotas at all, has 0.919.

Where Tiresias's average JCT (5.23 h against corral's 5.41) comes from, per team (average JCT
h, corral / Tiresias, one run each): vc-6214e9's 6,791 short jobs 2.81 / 2.39 and vc-2869ce's
102 wide, long jobs 64.33 / 43.33 make most of the gap (0.14 and 0.11 h of the 0.18 averaged
over all jobs), then vc-6c71a0 3.60 / 3.42 and vc-b436b2 4.72 / 3.92; corral is ahead on
vc-103959 (7.79 / 11.06), vc-7f04ca (31.09 / 33.24) and vc-0e4a51 (22.00 / 23.16). vc-2869ce
holds 0.82 of its entitlement under corral, its jobs waiting 27.6 h on average for room for
their gangs (5.8 h for admission, then 21.8 h admitted while the placer found no free nodes),
where Tiresias starts every job at once and stops it later (up to 66 times). Two ways to give
those gangs room sooner cost more JCT than they saved: reservations for more than the first job
that does not fit (DESIGN.md, the placer), and placing jobs that cannot be preempted beside each
other, so that more nodes could be cleared for a gang: as the last tie-break, vc-2869ce waited
23.8 h and the average JCT was 5.76 h (Jain 0.916); outranking the CPU balance, 25.3 h and
5.57 h (Jain 0.917). Fair sharing is part of what keeps the gangs waiting (a node's GPUs are held
by several teams, and a gang may stop only the jobs of teams whose share stays above its own),
but letting an admitted job of 8 or more GPUs stop smaller borrowers whatever the shares cut
vc-2869ce's wait after admission to 15.3 h while vc-6214e9's short jobs waited 1.99 h for
admission against 0.62: average JCT 5.98 h, Jain 0.923. Each way of giving the gangs room took it
from the short jobs' turnover, which the average JCT follows.

The figures above were measured before fair-sharing preemption followed Kueue's tournament
(borrowers re-ranked by share after every victim, each judged against the share just before
it) and before the victim search looked for the shortest set the fold allows. With those, the
same run (``corral sim --trace philly --policies corral``) gives 5.63 h of average JCT, Jain's
index 0.923, 3,636 preemptions and 76.4 GPU-hours lost, against 5.41 h, 0.923, 3,933 and 79.8
before. Undoing one of the changes at a time gave 5.63 to 5.90 h, none of them 5.41: which
victims a cycle takes moves the whole replay's average by a few tenths of an hour, more than
any one of those rules does by itself.

Then jobs that may not be preempted stopped borrowing (``Ledger.may_borrow``) and a preemption
stopped taking a queue into its nominal (``preemption.below_nominal``). With half pooled, the
same run gives 6.57 h of average JCT, Jain's index 0.969, 3,612 preemptions and 485.7
GPU-hours lost (76.4 before; the large jobs that cannot checkpoint are now preemptible and lose
all they did when stopped, which the figure was not split by); with a quarter pooled
(``--pool 0.25``), 6.20 h, 0.958, 3,044 and 494.9. A quarter of the jobs cannot checkpoint
and now wait for room within their team's own quota; that is
what the average JCT pays for every team's nominal being one it can always take back, and for
the index: vc-ed69ec, whose short jobs borrowed most, holds 1.40 of its entitlement (1.93
before).

Then the placer took admitted jobs in the order admission admitted them (each queue's
shortest-first order, fair share across queues), fair sharing counted what the taking queue
holds now where more than its history, and the victim search spared victims fair sharing did
not need. With half pooled the same run gives 6.49 h, Jain's index 0.975, 2,566 preemptions
and 483.7 GPU-hours lost; the p99 wait of vc-2869ce's wide jobs grew from 201.7 to 237.0 h.

Then the preemptor moved preemptible jobs to give an admitted job waiting on scattered GPUs its
room (consolidation, DESIGN.md: the preemptor). The same run gives 6.19 h of average JCT (1.47 h
of average wait), Jain's index 0.975, 2,654 preemptions and 520.4 GPU-hours lost; 190 of those
preemptions were the jobs of 89 moves, all of them jobs that checkpoint. The worst team's p99
wait is vc-2869ce's, 230.7 h (its average wait 17.5 h). A first version that could plan a move
while another was under way moved 445 jobs in 182 moves: 6.36 h, 3,110 preemptions, 586.9
GPU-hours lost, vc-2869ce's p99 wait 154.6 h.

Where the remaining wait is (a run with each job's admission time kept, at 6.14 h of average
JCT): the jobs of at most one GPU-hour, 16,000 of the 20,000, wait 0.7–0.8 h on average in the
three teams that have most of them, nearly all of it for quota (queued, the cohort full), which
makes 0.6 h of the 1.45 h of average wait. Tiresias starts them at once by stopping jobs that
have run longest, whatever their team's quota. Tried, one run each, not kept: such jobs in a
priority class of their own (1, above ``normal``) that may stop lower-priority borrowers and
the queue's own longer jobs, 6.11 h (Jain 0.966, 3,822 preemptions); with that, the whole
entitlement pooled (``--pool 1``, every job that cannot checkpoint then preemptible) 6.01 h but
Jain 0.903 and 16,876 GPU-hours lost; each queue's jobs stopping its own newer ones of their
priority (``within_queue`` ``lower-or-newer-equal-priority``) 6.75 h and 7,213 preemptions
(6.55 h once holds let pass the jobs the held job may stop): in a shortest-first queue the newer
jobs are the short ones. Quota guarantees are what the rest of the gap to Tiresias buys.

Then admission stopped counting against its lookahead the jobs its room rules out at a look
(DESIGN.md, admission): 6.40 h of average JCT (vc-6214e9's short jobs wait 1.58 h against 0.85,
preemptible jobs the scan used to miss now borrowing the pool), Jain's index 0.972, 2,520
preemptions, 587.0 GPU-hours lost; the worst team's p99 wait 187.9 h (vc-2869ce).

Tried, not kept: Tiresias's own rule inside corral's quotas. A job of the short-job lane
counted as the least-served queue for fair-sharing preemption, and took only other queues'
borrowed jobs that had had more than a GPU-hour of service and were not short themselves (the
jobs Tiresias's least-attained-service would stop for it): 5.50 h of average JCT (vc-6214e9's
short jobs waited 0.60 h against 1.43), 4,329 preemptions, 410 GPU-hours lost, but Jain's index
0.938 (vc-ed69ec's short jobs took 1.85 of its entitlement, vc-ee9e8c's long ones fell to 0.82)
and still 0.27 h above Tiresias, spread over nine teams. Without the condition on the victims
(any borrower, youngest first), 5.70 h and 0.931: the short jobs stopped each other. Nor, at
the 5.74 h below, Tiresias's rule inside each queue (a job of the short-job lane stopping a job
of its own queue and priority with more than four times its estimate left, as shortest
remaining time first would): 5.79 h, Jain 0.953, 3,607 preemptions, 616.8 GPU-hours lost;
the short jobs wait for the pool other queues hold, not behind their own queue's long jobs.

Where the idle GPUs were (an observer summing, over the replay, the smaller of the idle GPUs and
the GPUs waiting jobs asked for): 16,773 GPU-hours stood idle while jobs waited, 8,313 of them
while admitted jobs waited for a place, 6,125 while jobs that may not be preempted waited for
their team's guaranteed half with the pool idle under them. So the pool is now every team's in
part, by weight (``CohortSpec.share_own_quota``): such jobs may hold their team's entitlement.
The same run gives 5.74 h of average JCT (1.13 h of average wait), Jain's index 0.952, 3,059
preemptions (at most 3 a job), 723.0 GPU-hours lost and 91.7 % utilisation; the worst team's
p99 wait 216.3 h (vc-2869ce). (Jobs that cannot checkpoint and ask for more than their team's
guaranteed half are still made preemptible, as before.)

Then a job preempted as often as its class allows (three times here) stopped borrowing unless
it could not run otherwise (``Ledger.may_borrow``): such a loan could be taken back only when
the job ended, and the lender's jobs within their nominal waited for it. The same run gives
6.06 h of average JCT (1.00 h of average wait), Jain's index 0.983, 2,493 preemptions, 703.4
GPU-hours lost and 92.2 % utilisation; the worst team's p99 wait 133.2 h (vc-0e4a51), against
5.70 h, 0.953, 2,865, 576.6, 92.0 % and 239.1 h (vc-2869ce) the run before.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.events.base import Event
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    FairShareSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
    RetentionSpec,
)
from corral.services.agent import inventory
from corral.services.preemptor.decide import PreemptorConfig
from corral.services.sim import tiresias
from corral.services.sim.driver import JobStats, SimConfig, SimJob, Simulation
from corral.services.sim.plot import line_chart
from corral.services.sim.traces import philly

START = "2017-10-23"
JOBS = 20_000
NODES = 64
GPUS_PER_NODE = 8
CHECKPOINTABLE = 0.75
POOL = 0.5
BORROW: float | None = None  # a team borrows as much as is idle: no borrowing limit
SEED = 0
COHORT = "philly"
FIFO_QUEUE = "fifo"
TIRESIAS_QUEUE = "tiresias"
# The trace says what a job asked for and how long it ran, not what it ran: each trains a model,
# as admission needs a job to run something.
COMMAND = ("python", "train.py")
POLICIES = ("corral", "fifo", "tiresias")
# Nothing reads a finished job's state: the fold lets it go at the next record.
RETENTION = ApplyRetention(retention=RetentionSpec(finished_s=0.0))
CYCLE_S = 60.0
# The one priority class. Its anti-thrash guards: a job runs five minutes before it may be
# preempted, so a job is never stopped in the instant it was placed (a victim placed again at
# once is not preempted again at once), and it is preempted at most three times.
NORMAL = PriorityClassSpec("normal", 0, min_runtime_s=300.0, max_preemptions=3)
# Tiresias's jobs enter its high queue; its own rules, not a guard, say when they may be stopped.
TIRESIAS_CLASS = PriorityClassSpec("tiresias", tiresias.HIGH)
# corral's queues share the cohort's idle quota by Kueue's fair-sharing preemption, with Kueue's
# default strategies: a queue that borrows little may take back capacity from one that has long
# held more than its nominal, whatever the two jobs' priorities (they are all ``normal`` here).
FAIR_SHARING = PreemptionPolicy(fair_sharing=("less-than-or-equal-to-final-share", "less-than-initial-share"))
# How fast corral forgets what a team held, for fair-share order and fair-sharing preemption.
HALF_LIFE_S = 6 * 3600.0
# corral's short-job lane: jobs of at most one GPU-hour (Tiresias's threshold between its two
# queues) go before fair-share order among jobs that borrow equally far.
SHORT_JOB_GPU_S = 3600.0


# -- the slice ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceJob:
    id: str
    team: str
    arrival: float
    duration: float
    gpus: int


def parse_start(text: str) -> float:
    """``2017-10-23`` or ``2017-10-23 06:00`` (UTC) as unix seconds."""
    for fmt in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            continue
    raise ValueError(f"start {text!r}: use YYYY-MM-DD or YYYY-MM-DD HH:MM")


def load_slice(path: str | Path, start: str = START, jobs: int = JOBS) -> list[TraceJob]:
    """The first ``jobs`` jobs arriving from ``start`` on, in arrival order."""
    t0 = parse_start(start)
    out: list[TraceJob] = []
    for j in philly.read(path):
        if j.arrival < t0:
            continue
        out.append(TraceJob(f"p{len(out):06d}", f"vc-{j.team}", j.arrival, max(1.0, j.duration), j.gpus))
        if len(out) >= jobs:
            break
    return out


def gang_shape(gpus: int) -> tuple[int, int]:
    """(workers, GPUs per worker) for a job of ``gpus`` GPUs on 8-GPU nodes."""
    if gpus <= GPUS_PER_NODE:
        return 1, gpus
    per = max(d for d in range(1, GPUS_PER_NODE + 1) if gpus % d == 0)
    return gpus // per, per


def nominal_quotas(trace: Sequence[TraceJob], total: int) -> dict[str, int]:
    """Each team's share of ``total`` GPUs in proportion to its GPU-hours in the slice: one GPU
    each first, the rest by largest remainder (ties by name)."""
    work: dict[str, float] = {}
    for j in trace:
        work[j.team] = work.get(j.team, 0.0) + j.gpus * j.duration
    teams = sorted(work)
    if total < len(teams):
        raise ValueError(f"{total} GPUs cannot give each of {len(teams)} teams one")
    rest = total - len(teams)
    whole_work = sum(work.values())
    exact = {t: rest * work[t] / whole_work for t in teams}
    out = {t: 1 + int(exact[t]) for t in teams}
    left = total - sum(out.values())
    for t in sorted(teams, key=lambda t: (-(exact[t] - int(exact[t])), t))[:left]:
        out[t] += 1
    return out


@dataclass(frozen=True)
class Experiment:
    """Everything both policies share: the slice, the cluster and the entitlements."""

    trace: tuple[TraceJob, ...]
    nodes: int
    checkpointable: float = CHECKPOINTABLE
    seed: int = SEED
    cycle_s: float = CYCLE_S
    # The share of each team's entitlement corral's setup holds in the cohort rather than in the
    # team's queue (``POOL``): a pool any team may borrow from and fair sharing divides.
    pool: float = POOL
    # How much each team's queue may borrow, in times its entitlement (None: as much as is idle,
    # ``BORROW``): Kueue's borrowing limit, an operator's lever between fairness and wait.
    borrow: float | None = BORROW

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def quotas(self) -> dict[str, int]:
        return nominal_quotas(self.trace, self.gpus)

    @property
    def guaranteed(self) -> dict[str, int]:
        """Each team's nominal quota under corral: its entitlement less the pooled share."""
        return {t: math.floor(n * (1.0 - self.pool)) for t, n in self.quotas.items()}

    def borrowing_limit(self, entitled: int) -> int | None:
        """How many GPUs a team entitled to ``entitled`` may borrow from the cohort: ``borrow``
        times that, rounded down (None: no limit; 0: none)."""
        if self.borrow is None:
            return None
        return math.floor(self.borrow * entitled)

    @property
    def window(self) -> tuple[float, float]:
        return self.trace[0].arrival, self.trace[-1].arrival

    def cluster(self) -> list[tuple[str, Any]]:
        return inventory.cluster(self.nodes, "h100-8x")

    def jobs(self, policy: str) -> list[SimJob]:
        rng = random.Random(self.seed)
        guaranteed = self.guaranteed
        out = []
        for j in self.trace:
            workers, per = gang_shape(j.gpus)
            saves = rng.random() < self.checkpointable
            spec = JobSpec(
                queue={"fifo": FIFO_QUEUE, "tiresias": TIRESIAS_QUEUE}.get(policy, j.team),
                name=j.id,
                priority_class=TIRESIAS_CLASS.name if policy == "tiresias" else "normal",
                replicas=workers,
                resources=Resources(gpus=per, cpu_milli=4000 * per, memory_mib=16_384 * per),
                checkpointable=saves,
                # Under corral a job that may not be preempted stays within its team's nominal
                # quota (``Ledger.may_borrow``): one larger than that could never run, so its
                # owner lets it be preempted, at the cost of what it did.
                preemptible=saves or (policy == "corral" and j.gpus > guaranteed.get(j.team, 0)),
                grace_seconds=60.0,
                # Tiresias schedules without knowing how long a job runs: it is told nothing.
                runtime_estimate_s=None if policy == "tiresias" else j.duration,
                command=COMMAND,
            )
            out.append(SimJob(j.id, j.team, spec, j.arrival, j.duration))
        return out

    def setup(self, policy: str) -> list[Event]:
        if policy == "fifo":
            everyone = QueueSpec(FIFO_QUEUE, quotas={"*": Quota(nominal=self.gpus)}, strategy="strict-fifo")
            return [RETENTION, ApplyQueue(queue=everyone)]
        if policy == "tiresias":
            everyone = QueueSpec(TIRESIAS_QUEUE, quotas={"*": Quota(nominal=self.gpus)})
            return [RETENTION, ApplyPriorityClass(priority_class=TIRESIAS_CLASS), ApplyQueue(queue=everyone)]
        guaranteed = self.guaranteed
        pooled = self.gpus - sum(guaranteed.values())
        cohort_quotas = {"*": Quota(nominal=pooled)} if pooled else {}
        out: list[Event] = [
            RETENTION,
            ApplyFairShare(
                fair_share=FairShareSpec(half_life_s=HALF_LIFE_S, short_job_gpu_s=SHORT_JOB_GPU_S)
            ),
            ApplyPriorityClass(priority_class=NORMAL),
            # The pool is every team's in part, by weight: a team's jobs that may not be
            # preempted may hold their entitlement, not only their guaranteed half.
            ApplyCohort(cohort=CohortSpec(COHORT, quotas=cohort_quotas, share_own_quota=True)),
        ]
        for team, entitled in sorted(self.quotas.items()):
            spec = QueueSpec(
                team,
                cohort=COHORT,
                quotas={"*": Quota(nominal=guaranteed[team], borrowing_limit=self.borrowing_limit(entitled))},
                weight=float(entitled),
                tenants=(team,),
                strategy="shortest-first",
                preemption=FAIR_SHARING,
            )
            out.append(ApplyQueue(queue=spec))
        return out

    def config(self, policy: str) -> SimConfig:
        if policy == "fifo":
            return SimConfig(preemptor=None, cycle_s=self.cycle_s)
        if policy == "corral":
            return SimConfig(preemptor=PreemptorConfig(shrink=False), cycle_s=self.cycle_s)
        if policy == "tiresias":
            return SimConfig(scheduler=tiresias.Tiresias, cycle_s=self.cycle_s)
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


# -- fairness --------------------------------------------------------------------------------------


def water_fill(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity``: nobody gets more than it asks for, and what
    is left over is shared in proportion to the weights of those who want more."""
    out = dict.fromkeys(demand, 0.0)
    wanting = sorted((t for t, d in demand.items() if d > 0 and weight.get(t, 0) > 0), key=lambda t: t)
    left = capacity
    while wanting and left > 1e-9:
        total_w = sum(weight[t] for t in wanting)
        # The team that is satisfied first at the common level takes its demand; repeat.
        level = left / total_w
        done = [t for t in wanting if demand[t] - out[t] <= level * weight[t]]
        if not done:
            for t in wanting:
                out[t] += level * weight[t]
            break
        for t in done:
            left -= demand[t] - out[t]
            out[t] = demand[t]
        wanting = [t for t in wanting if t not in done]
    return out


class Fairness:
    """Integrates, over a window, each team's GPUs held and its entitlement (an ``Observer``)."""

    def __init__(self, capacity: float, weights: Mapping[str, float], window: tuple[float, float]) -> None:
        self.capacity = capacity
        self.weights = dict(weights)
        self.lo, self.hi = window
        self.held: dict[str, float] = dict.fromkeys(weights, 0.0)
        self.entitled: dict[str, float] = dict.fromkeys(weights, 0.0)
        self.busy = 0.0  # GPU-seconds held by anyone in the window
        self._cache: tuple[tuple[tuple[str, float], ...], dict[str, float]] | None = None

    def __call__(self, t0: float, t1: float, held: Mapping[str, float], demand: Mapping[str, float]) -> None:
        a, b = max(t0, self.lo), min(t1, self.hi)
        if b <= a:
            return
        dt_ = b - a
        for team, g in held.items():
            if g:
                self.held[team] = self.held.get(team, 0.0) + g * dt_
                self.busy += g * dt_
        key = tuple(sorted((t, d) for t, d in demand.items() if d > 0))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, water_fill(self.capacity, dict(key), self.weights))
        for team, e in self._cache[1].items():
            self.entitled[team] = self.entitled.get(team, 0.0) + e * dt_

    def ratios(self) -> dict[str, float]:
        return {t: self.held.get(t, 0.0) / e for t, e in sorted(self.entitled.items()) if e > 0}

    def jain(self) -> float:
        xs = list(self.ratios().values())
        if not xs:
            return float("nan")
        return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))

    def utilisation(self) -> float:
        span = self.hi - self.lo
        return self.busy / (self.capacity * span) if span > 0 else float("nan")


# -- one run and its figures -------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (``p`` in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, math.ceil(p / 100 * len(ordered)) - 1)
    return ordered[k]


@dataclass
class Figures:
    jobs: int
    finished: int
    avg_wait_s: float
    p99_wait_s: float
    avg_jct_s: float
    p99_jct_s: float
    preemptions: int
    max_preemptions: int  # of any one job
    gpu_hours_lost: float

    @classmethod
    def of(cls, stats: Iterable[JobStats]) -> Figures:
        stats = list(stats)
        waits = [w for s in stats if (w := s.wait) is not None]
        jcts = [c for s in stats if (c := s.jct) is not None]
        return cls(
            jobs=len(stats),
            finished=len(jcts),
            avg_wait_s=sum(waits) / len(waits) if waits else float("nan"),
            p99_wait_s=percentile(waits, 99),
            avg_jct_s=sum(jcts) / len(jcts) if jcts else float("nan"),
            p99_jct_s=percentile(jcts, 99),
            preemptions=sum(s.preemptions for s in stats),
            max_preemptions=max((s.preemptions for s in stats), default=0),
            gpu_hours_lost=sum(s.lost_gpu_s for s in stats) / 3600,
        )


@dataclass
class Outcome:
    """One policy's run on the slice."""

    policy: str
    overall: Figures
    teams: dict[str, Figures]
    utilisation: float
    jain: float
    share: dict[str, float]  # per team: GPU-seconds held / entitlement
    simulated_s: float
    wall_s: float
    cpu_s: float
    decide_calls: int
    waits: list[float] = field(default_factory=list)
    jcts: list[float] = field(default_factory=list)

    @property
    def worst_team(self) -> tuple[str, float]:
        """The team whose p99 wait is the longest, and that wait (nan: no team waited)."""
        waited = [(t, f.p99_wait_s) for t, f in sorted(self.teams.items()) if f.p99_wait_s == f.p99_wait_s]
        if not waited:
            return "-", float("nan")
        return max(waited, key=lambda tw: tw[1])

    @property
    def speed(self) -> float:
        """Simulated seconds per wall-clock second."""
        return self.simulated_s / self.wall_s if self.wall_s > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": vars(self.overall),
            "teams": {t: vars(f) for t, f in sorted(self.teams.items())},
            "utilisation": self.utilisation,
            "jain": self.jain,
            "worst_team_p99_wait": {"team": self.worst_team[0], "p99_wait_s": self.worst_team[1]},
            "share_of_entitlement": self.share,
            "simulated_s": self.simulated_s,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "sim_s_per_wall_s": self.speed,
            "decide_calls": self.decide_calls,
        }


def run_policy(exp: Experiment, policy: str, finished: Callable[[int], object] | None = None) -> Outcome:
    """One policy on the slice. ``finished`` is told, now and then, how many jobs are over."""
    fairness = Fairness(exp.gpus, {t: float(n) for t, n in exp.quotas.items()}, exp.window)
    started, cpu = time.perf_counter(), time.process_time()
    sim = Simulation(
        exp.cluster(), exp.setup(policy), exp.jobs(policy), exp.config(policy), observers=[fairness]
    )
    if finished is not None:
        sim.observers.append(_Counter(sim, finished))
    sim.run()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    if finished is not None:
        finished(len(sim.jobs))
    stats = list(sim.stats.values())
    by_team: dict[str, list[JobStats]] = {}
    for s in stats:
        by_team.setdefault(s.tenant, []).append(s)
    return Outcome(
        policy=policy,
        overall=Figures.of(stats),
        teams={t: Figures.of(v) for t, v in sorted(by_team.items())},
        utilisation=fairness.utilisation(),
        jain=fairness.jain(),
        share=fairness.ratios(),
        simulated_s=sim.now - exp.trace[0].arrival,
        wall_s=wall,
        cpu_s=cpu,
        decide_calls=sim.decide_calls,
        waits=[w for s in stats if (w := s.wait) is not None],
        jcts=[c for s in stats if (c := s.jct) is not None],
    )


class _Counter:
    """An observer that counts the jobs over, at most every ``EVERY_S`` of wall time: counting
    walks every job, and the simulation advances its clock many thousand times a second."""

    EVERY_S = 0.25

    def __init__(self, sim: Simulation, finished: Callable[[int], object]) -> None:
        self.sim, self.finished, self.next = sim, finished, 0.0

    def __call__(self, t0: float, t1: float, held: Mapping[str, float], demand: Mapping[str, float]) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + self.EVERY_S
            self.finished(sum(1 for s in self.sim.stats.values() if s.finished is not None))


# In a worker process of ``run``: the jobs over so far of each policy, shared with the parent.
_over: Any = None


def _share(over: Any) -> None:
    global _over
    _over = over


def _run(args: tuple[Experiment, str, int]) -> Outcome:
    exp, policy, i = args

    def finished(n: int) -> None:
        _over[i] = n

    return run_policy(exp, policy, finished if _over is not None else None)


def run(
    exp: Experiment,
    policies: Sequence[str] = POLICIES,
    parallel: bool = True,
    progress: Callable[[int], object] | None = None,
) -> list[Outcome]:
    """Every policy on the same slice; in parallel processes when there are CPUs for it.
    ``progress`` is told how many more jobs are over, summed over the policies (``len(policies)
    * len(exp.trace)`` in all)."""
    import os

    if not (parallel and len(policies) > 1 and (os.cpu_count() or 1) > 1):
        outcomes = []
        for p in policies:
            seen = [0]

            def finished(n: int, seen: list[int] = seen) -> None:
                assert progress is not None
                progress(n - seen[0])
                seen[0] = n

            outcomes.append(run_policy(exp, p, finished if progress is not None else None))
        return outcomes

    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    over = multiprocessing.get_context().Array("q", len(policies), lock=False) if progress else None
    with ProcessPoolExecutor(
        max_workers=min(len(policies), os.cpu_count() or 1), initializer=_share, initargs=(over,)
    ) as pool:
        futures = [pool.submit(_run, (exp, p, i)) for i, p in enumerate(policies)]
        told, pending = 0, set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            if progress is not None and over is not None:
                now = sum(over)
                progress(now - told)
                told = now
        return [f.result() for f in futures]


# -- the report ------------------------------------------------------------------------------------


def _h(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds / 3600:.2f}"


def table(exp: Experiment, outcomes: Sequence[Outcome]) -> str:
    first = dt.datetime.fromtimestamp(exp.window[0], dt.UTC).strftime("%Y-%m-%d %H:%M")
    days = (exp.window[1] - exp.window[0]) / 86400
    lines = [
        f"Philly slice: {len(exp.trace)} jobs from {first} UTC over {days:.1f} days; "
        f"{exp.nodes} nodes x {GPUS_PER_NODE} GPUs = {exp.gpus} GPUs; {len(exp.quotas)} teams; "
        f"decisions {f'every {exp.cycle_s:g} s' if exp.cycle_s > 0 else 'at every event'}"
        + (
            ""
            if exp.borrow is None
            else f"; corral's queues borrow at most {exp.borrow:g} x their entitlement"
        ),
        "",
        f"{'policy':<9}{'avg wait h':>11}{'p99 wait h':>11}{'avg JCT h':>11}{'p99 JCT h':>11}"
        f"{'worst team p99 wait h':>22}{'util %':>8}{'Jain':>7}{'preempt':>9}{'max/job':>8}"
        f"{'GPU-h lost':>11}{'sim s/wall s':>14}",
    ]
    lines.append("-" * len(lines[-1]))
    for o in outcomes:
        f = o.overall
        lines.append(
            f"{o.policy:<9}{_h(f.avg_wait_s):>11}{_h(f.p99_wait_s):>11}{_h(f.avg_jct_s):>11}"
            f"{_h(f.p99_jct_s):>11}{_h(o.worst_team[1]):>22}{100 * o.utilisation:>8.1f}{o.jain:>7.3f}"
            f"{f.preemptions:>9}{f.max_preemptions:>8}{f.gpu_hours_lost:>11.1f}{o.speed:>14.0f}"
        )
    lines += ["", "per team (hours; share = GPU time held / entitlement):"]
    head = f"{'team':<10}{'quota':>6}{'jobs':>6}"
    for o in outcomes:
        head += f" | {o.policy + ' wait':>11}{'p99 wait':>9}{'avg JCT':>9}{'share':>7}"
    lines.append(head)
    lines.append("-" * len(head))
    quotas = exp.quotas
    teams = sorted({t for o in outcomes for t in o.teams}, key=lambda t: (-quotas.get(t, 0), t))
    for t in teams:
        jobs = next((o.teams[t].jobs for o in outcomes if t in o.teams), 0)
        row = f"{t:<10}{quotas.get(t, 0):>6}{jobs:>6}"
        for o in outcomes:
            fig = o.teams.get(t)
            share = o.share.get(t, float("nan"))
            if fig is None:
                row += f" | {'-':>11}{'-':>9}{'-':>9}{'-':>7}"
            else:
                row += (
                    f" | {_h(fig.avg_wait_s):>11}{_h(fig.p99_wait_s):>9}{_h(fig.avg_jct_s):>9}{share:>7.2f}"
                )
        lines.append(row)
    worst = [f"{o.policy} {o.worst_team[0]} {_h(o.worst_team[1])} h" for o in outcomes if o.teams]
    lines += ["", "worst team's p99 wait: " + "; ".join(worst)]
    return "\n".join(lines)


def to_json(exp: Experiment, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {
        "slice": {
            "jobs": len(exp.trace),
            "first_arrival": exp.window[0],
            "last_arrival": exp.window[1],
            "nodes": exp.nodes,
            "gpus": exp.gpus,
            "quotas": exp.quotas,
            "checkpointable": exp.checkpointable,
            "cycle_s": exp.cycle_s,
        },
        "policies": {o.policy: o.to_json() for o in outcomes},
    }


def plot(outcomes: Sequence[Outcome], path: str | Path) -> Path:
    """Cumulative distributions of wait and JCT per policy, on a log scale of seconds."""
    series: dict[str, list[tuple[float, float]]] = {}
    for o in outcomes:
        for what, values in (("JCT", o.jcts), ("wait", o.waits)):
            series[f"{o.policy} {what}"] = _cdf(values)
    return line_chart(
        series,
        path,
        (0, 7),
        (0, 100),
        title="Philly slice: wait and JCT",
        x_label="log10 seconds",
        y_label="% of jobs",
        ticks=(7, 10),
    )


def _cdf(values: Sequence[float], points: int = 141) -> list[tuple[float, float]]:
    if not values:
        return []
    ordered = sorted(values)
    n = len(ordered)
    out = []
    import bisect

    for i in range(points):
        x = 7 * i / (points - 1)
        out.append((x, 100 * bisect.bisect_right(ordered, 10**x) / n))
    return out
