"""Tiresias's discretized two-dimensional least-attained-service scheduler (2D-LAS; Gu et al.,
"Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI 2019) as one decision role
of the simulator, a baseline for the Philly replay beside corral and FIFO.

What it does each cycle, in the paper's terms:

- Attained service is two-dimensional: GPUs x seconds run so far (the job's size times the time
  it has run, over all its attempts). Nothing about a job's future is read: no runtime estimate
  (the Philly replay submits Tiresias's jobs without one), no remaining work.
- Two queues (K = 2), one threshold. A job enters the high queue; once its attained service
  reaches ``threshold_gpu_s`` it drops to the low queue (demotion). A job that has waited in
  the low queue ``promote_knob`` times as long as it has run goes back to the high queue with
  its count started afresh (the paper's starvation guard, STARVELIMIT = PROMOTE_KNOB x the
  time it ran). As in the authors' simulator, the waiting that counts is the waiting after the
  job first ran (or since it last ran after a promotion), and a promotion resets both counts.
- The high queue goes first, FIFO within each queue (by submission); within a queue, the jobs
  running keep their GPUs ahead of those waiting, so a job is stopped only for a job of the
  higher queue. The walk over that order starts every waiting job that fits in what the jobs
  before it left (a job that does not fit is skipped, not waited for), and stops every running
  job of the low queue whose GPUs a job before it took, save a stop the fold would refuse
  (corral's rule of never twice between the same two jobs, which binds every policy of the
  replay). A stop is a checkpoint-and-stop through corral's own preemption
  (``PreemptionRequested``, the job's grace period as deadline), the same physics as corral's
  preemptor's; a job that cannot checkpoint is not preemptible, under every policy, and keeps
  its GPUs.
- Placement is consolidated: each worker goes where it needs to stop the fewest GPUs of running
  jobs (those it stops the latest in the order), then on the node it fills best (best fit), so
  a gang lands on as few nodes as its workers allow. The paper consolidates only "skewed"
  models (a few large tensors) and spreads the others; the Philly trace says nothing of
  models, so every job is treated as skewed.

The numbers. K = 2 queues, the threshold at 3,600 GPU-seconds (one GPU-hour) and PROMOTE_KNOB
= 8: the paper evaluates with two queues and reports its results insensitive to the exact
threshold and knob within wide ranges; its authors' simulator documents two queues with a
3,600 threshold as the example setting (``simulator/README.md`` of SymbioticLab/Tiresias, the
threshold in GPU-seconds for ``dlas-gpu``), and the same three settings (2, 3,600, 8) are what
other implementations cite as the paper's (Voda's ``TiresiasThresholdsSec``,
``TiresiasPromoteKnob``). The paper's own text was not at hand to check them against.

In corral's log. A queue is a priority: ``HIGH`` for the high queue, ``LOW`` for the low one;
demotions and promotions are ``JobPriorityChanged`` facts, so the fold's one preemption rule
(a job of the same corral queue with a lower priority) lets exactly Tiresias's stops through.
The role also does what admission does for it (accept or reject, requeue after a stop, admit),
and places, so each cycle is: accept, requeue, move between queues, admit and place, stop.

How much service a job has had is this role's own projection of the log: the time a job's
attempt started (its phase's start while it runs) and the time it was stopped (the fold's
``preempted_at``), kept between cycles in ``Service``. Each cycle also says when the next job would
cross a threshold by time alone (``Cycle.wake_at``), and the simulator decides again then, at
its next decision tick, as the authors' simulator schedules an event for the crossing.

Pure: ``decide`` reads the state, ``now`` and what it remembered, and returns events and what
it remembers next; ties break by submission and node name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from corral.events.base import Event, Reason
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, PreemptionRequested, Victim, WorkerSlot
from corral.events.jobs import (
    Admission,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
)
from corral.projections import indexes, preemption, quota
from corral.projections.quota import Ledger
from corral.projections.state import JobState, State
from corral.services.admission.validate import priority_value, validate

HIGH = 1  # the high queue's priority (Q1 in the paper)
LOW = 0  # the low queue's priority (Q2)
THRESHOLD_GPU_S = 3600.0
PROMOTE_KNOB = 8.0

_RUNNING = frozenset({"placed", "starting", "running"})
_STOPPED = frozenset({"preempted", "interrupted"})


@dataclass(frozen=True)
class TiresiasConfig:
    threshold_gpu_s: float = THRESHOLD_GPU_S
    promote_knob: float = PROMOTE_KNOB  # 0: no promotion


# -- attained service ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """What a job has had since it arrived or was last promoted: GPU-seconds and seconds run,
    seconds waited after it had run, and since when it runs or waits now."""

    gpu_s: float = 0.0
    run_s: float = 0.0
    waited_s: float = 0.0
    running_since: float | None = None
    waiting_since: float | None = None  # only once it has run: the wait that counts for promotion

    def attained(self, gpus: float, now: float) -> float:
        """GPU-seconds of service at ``now``: the 2D attained service."""
        return self.gpu_s + (gpus * (now - self.running_since) if self.running_since is not None else 0.0)

    def ran(self, now: float) -> float:
        return self.run_s + (now - self.running_since if self.running_since is not None else 0.0)

    def waited(self, now: float) -> float:
        return self.waited_s + (now - self.waiting_since if self.waiting_since is not None else 0.0)


def observe(service: Service, job: JobState, gpus: float, now: float) -> Service:
    """``service`` brought up to what the state says of ``job``: an attempt that started runs
    from its phase's start; one that was stopped ran until its preemption, and its wait starts."""
    if job.phase in _RUNNING:
        if service.running_since is not None:
            return service
        start = job.phase_since
        waited = service.waited_s
        if service.waiting_since is not None:
            waited += max(0.0, start - service.waiting_since)
        return replace(service, waited_s=waited, running_since=start, waiting_since=None)
    if service.running_since is None:
        return service
    end = job.preempted_at[-1] if job.preempted_at else now
    ran = max(0.0, end - service.running_since)
    return Service(
        gpu_s=service.gpu_s + gpus * ran,
        run_s=service.run_s + ran,
        waited_s=service.waited_s,
        running_since=None,
        waiting_since=end,
    )


def queue_of(priority: int, service: Service, gpus: float, now: float, config: TiresiasConfig) -> int:
    """The queue (``HIGH`` or ``LOW``) a job in queue ``priority`` belongs in at ``now``:
    demoted once its attained service reaches the threshold, promoted once it has waited
    PROMOTE_KNOB times as long as it ran."""
    if priority >= HIGH:
        return LOW if service.attained(gpus, now) >= config.threshold_gpu_s else HIGH
    waiting = service.running_since is None
    ran = service.ran(now)
    if config.promote_knob > 0 and waiting and ran > 0 and service.waited(now) >= config.promote_knob * ran:
        return HIGH
    return LOW


# -- the walk ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A job the walk orders: ``queue`` (HIGH or LOW), its FIFO position, ``workers`` of
    ``gpus`` each, and where it runs now (node, GPUs there) if it holds GPUs and may be stopped."""

    id: str
    queue: int
    position: tuple[int, str]
    workers: int
    gpus: int
    running_on: tuple[tuple[str, int], ...] = ()

    @property
    def running(self) -> bool:
        return bool(self.running_on)


@dataclass
class Plan:
    """``start``: waiting jobs to place now, one node per worker; ``stop``: running jobs to stop,
    each with the job it is stopped for; ``held``: waiting jobs the walk kept room for that wait
    for stops to end."""

    start: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stop: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)


def order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The high queue first; in each queue the running jobs, then the waiting ones, FIFO."""
    return sorted(candidates, key=lambda c: (-c.queue, not c.running, c.position))


def plan(
    candidates: Iterable[Candidate],
    room: Mapping[str, int],
    free: Mapping[str, int],
    leaving: Mapping[str, int] | None = None,
    may_stop: Callable[[str, str], bool] | None = None,
) -> Plan:
    """Walk the candidates in Tiresias's order over the GPUs they may share.

    ``room``: per node, the GPUs the candidates may have between them (all usable GPUs less
    those of jobs nobody may stop); ``free``: per node, the GPUs idle now; ``leaving``: per
    node, the GPUs of jobs being stopped already (in ``room``, not yet idle). A running
    candidate keeps its GPUs if what the jobs before it took leaves them; else it is stopped,
    for the first job that took GPUs of running jobs on one of its nodes that ``may_stop(it,
    that job)`` allows (the fold's rule, ``preemption.not_again``: never twice between the same
    two jobs while neither's priority changed; a stop it would refuse, asked again every cycle,
    would be all the role ever did). If none may stop it, it keeps its GPUs, and the jobs that
    took them wait for them to free. A waiting candidate takes room for each worker where it
    stops the fewest GPUs of running jobs, then where the jobs it stops come latest in the
    order, then where it fits best, then by node name; it starts now if all it took was idle,
    else it waits for the stops (holding the room)."""
    walk = order(candidates)
    room = dict(room)
    idle = dict(free)
    soon = {n: idle.get(n, 0) + (leaving or {}).get(n, 0) for n in room}  # idle once the stops end
    last: dict[str, int] = {}  # node -> where in the walk the last running candidate on it is
    for i, c in enumerate(walk):
        for node, _ in c.running_on:
            last[node] = i
    claimant: dict[str, str] = {}  # node -> the first job that took GPUs of running jobs there
    most = max(room.values(), default=0)  # the most room on one node: most waiting jobs skip here
    out = Plan()
    for c in walk:
        if c.running:
            short = [node for node, n in c.running_on if room.get(node, 0) < n and node in claimant]
            takers = (claimant[node] for node in short)
            taker = next((t for t in takers if may_stop is None or may_stop(c.id, t)), None)
            if taker is not None:
                out.stop[c.id] = taker
                continue
            # Kept: short only of GPUs gone bad (nobody's to take), or of GPUs taken by jobs it
            # may not be stopped for, which then wait for them (their room here goes below 0).
            for node, n in c.running_on:
                room[node] = room.get(node, 0) - n
            most = max(room.values(), default=0)
            continue
        if c.gpus > most:
            continue
        nodes = _fit(c, room, soon, last)
        if nodes is None:
            continue
        waits = False
        for node in nodes:
            room[node] -= c.gpus
            now_idle, later = min(c.gpus, idle.get(node, 0)), min(c.gpus, soon[node])
            idle[node] = idle.get(node, 0) - now_idle
            soon[node] -= later
            waits = waits or now_idle < c.gpus
            if later < c.gpus:
                claimant.setdefault(node, c.id)
        if waits:
            out.held.append(c.id)
        else:
            out.start[c.id] = nodes
        most = max(room.values(), default=0)
    return out


def _fit(
    c: Candidate, room: Mapping[str, int], soon: Mapping[str, int], last: Mapping[str, int]
) -> tuple[str, ...] | None:
    """One node per worker, chosen one worker at a time on what the earlier ones left; None if
    the gang does not fit whole."""
    if c.workers == 1:  # the common case, without copying the cluster
        best = _best(c.gpus, room, soon, last)
        return None if best is None else (best,)
    room_left, soon_left = dict(room), dict(soon)
    nodes: list[str] = []
    for _ in range(c.workers):
        best = _best(c.gpus, room_left, soon_left, last)
        if best is None:
            return None
        nodes.append(best)
        room_left[best] -= c.gpus
        soon_left[best] = max(0, soon_left.get(best, 0) - c.gpus)
    return tuple(nodes)


def _best(need: int, room: Mapping[str, int], soon: Mapping[str, int], last: Mapping[str, int]) -> str | None:
    """The node for one worker of ``need`` GPUs (see ``plan``)."""
    best: tuple[int, int, int, str] | None = None
    for n, r in room.items():
        if r >= need:
            stops = max(0, need - soon.get(n, 0))
            key = (stops, -last.get(n, -1) if stops else 0, r - need, n)
            if best is None or key < best:
                best = key
    return None if best is None else best[3]


# -- one cycle ---------------------------------------------------------------------------------------


@dataclass
class Cycle:
    """What one cycle decided, each live job's service as the role remembers it next, and the
    first time after ``now`` at which a job would change queues by the passing of time alone
    (None: none would)."""

    events: list[Event]
    services: dict[str, Service]
    wake_at: float | None = None


def decide(
    state: State, now: float, services: Mapping[str, Service], config: TiresiasConfig = TiresiasConfig()
) -> Cycle:
    """One cycle of the role."""
    ledger = Ledger(state)
    events: list[Event] = []
    remembered: dict[str, Service] = {}
    live: list[JobState] = []  # accepted, not over, in submission order
    attempt: dict[str, int] = {}
    for job in sorted(indexes.unfinished(state), key=lambda j: (j.submitted_seq, j.id)):
        # 1. Accept or reject what was submitted, as admission would.
        if job.phase == "submitted":
            why = validate(state, job, ledger)
            if why is not None:
                events.append(JobRejected(job_id=job.id, request_seq=job.submitted_seq, reason=why))
                continue
            prio = priority_value(state, job.spec.priority_class) or 0
            events.append(JobAccepted(job_id=job.id, priority=prio))
            job = msgspec.structs.replace(job, phase="queued", priority=prio)
        # 2. A stopped job goes back to the queue, resuming from its checkpoint.
        elif job.phase in _STOPPED:
            resume = job.checkpoint.location if job.checkpoint is not None else None
            why = Reason("requeued", f"stopped; back in queue {job.spec.queue} for attempt {job.attempt + 1}")
            events.append(JobRequeued(job_id=job.id, attempt=job.attempt, reason=why, resume_from=resume))
            job = msgspec.structs.replace(job, phase="queued", attempt=job.attempt + 1, admission=None)
        gpus = _gpus(job)
        remembered[job.id] = observe(services.get(job.id, Service()), job, gpus, now)
        attempt[job.id] = job.attempt
        live.append(job)

    # 3. Move jobs between the queues.
    level: dict[str, int] = {}
    for job in live:
        svc = remembered[job.id]
        was = HIGH if job.priority >= HIGH else LOW
        now_in = queue_of(was, svc, _gpus(job), now, config)
        level[job.id] = now_in
        if now_in == was:
            continue
        if now_in == LOW:
            why = Reason(
                "attained-service",
                f"{svc.attained(_gpus(job), now):.0f} GPU-seconds of service reached the "
                f"{config.threshold_gpu_s:.0f} of the high queue: down to the low queue",
            )
        else:
            why = Reason(
                "starving",
                f"waited {svc.waited(now):.0f}s, {config.promote_knob:g} times the "
                f"{svc.ran(now):.0f}s it ran: back to the high queue",
            )
            remembered[job.id] = Service()  # its service counts afresh
        events.append(JobPriorityChanged(job_id=job.id, priority=now_in, reason=why))
    wake_at = min(
        (t for job in live if (t := _crossing(job, level[job.id], remembered[job.id], now, config))),
        default=None,
    )

    # 4. Walk the order: who starts, who is stopped.
    room, free = _capacity(state)
    leaving: dict[str, int] = {}
    candidates = []
    for job in live:
        per, workers = _shape(job)
        if job.phase == "checkpointing":
            for node, n in _held(job):
                leaving[node] = leaving.get(node, 0) + n
        elif job.phase in _RUNNING:
            on = _held(job)
            if not job.spec.preemptible:
                for node, n in on:  # nobody may stop it: its GPUs are not in the walk
                    room[node] = room.get(node, 0) - n
                continue
            candidates.append(Candidate(job.id, level[job.id], (job.submitted_seq, job.id), workers, per, on))
        elif job.phase in ("queued", "admitted") and per > 0:
            candidates.append(Candidate(job.id, level[job.id], (job.submitted_seq, job.id), workers, per))
    by_id = {job.id: job for job in live}

    def may_stop(victim: str, beneficiary: str) -> bool:
        return preemption.not_again(by_id[victim], by_id[beneficiary]) is None

    walked = plan(candidates, room, free, leaving, may_stop)

    # 5. Admit and place what starts, on the lowest free GPUs of its nodes.
    admissions, placements = [], []
    taken: dict[str, list[int]] = {node: list(ids) for node, ids in _idle_gpus(state).items()}
    for job_id, nodes in walked.start.items():
        job = by_id[job_id]
        per, workers = _shape(job)
        if job.phase == "queued":
            admissions.append(_admission(state, job, attempt[job_id]))
        slots = []
        for rank, node in enumerate(nodes):
            ids, taken[node] = taken[node][:per], taken[node][per:]
            slots.append(WorkerSlot(rank, node, tuple(GpuClaim(i) for i in ids)))
        placements.append(Placement(job_id, attempt[job_id], tuple(slots)))
    if admissions:
        events.append(JobsAdmitted(based_on=state.seq, now=now, admissions=tuple(admissions)))
    if placements:
        events.append(JobsPlaced(based_on=state.seq, now=now, placements=tuple(placements)))

    # 6. Stop, per job stopped for, with the longest grace of its victims.
    victims: dict[str, list[JobState]] = {}
    for job_id, beneficiary in walked.stop.items():
        victims.setdefault(beneficiary, []).append(by_id[job_id])
    for beneficiary, jobs in victims.items():
        deadline = now + max(j.spec.grace_seconds for j in jobs)
        events.append(
            PreemptionRequested(
                based_on=state.seq,
                now=now,
                beneficiary=beneficiary,
                victims=tuple(Victim(j.id, j.attempt) for j in jobs),
                deadline=deadline,
            )
        )
    return Cycle(events, remembered, wake_at)


def _crossing(job: JobState, level: int, svc: Service, now: float, config: TiresiasConfig) -> float | None:
    """When ``job`` would leave its queue if nothing else happened: a running job of the high
    queue when its service reaches the threshold, a waiting one of the low queue when it has
    waited long enough; None if never."""
    gpus = _gpus(job)
    if level == HIGH and svc.running_since is not None and gpus > 0:
        at = svc.running_since + (config.threshold_gpu_s - svc.gpu_s) / gpus
    elif level == LOW and svc.running_since is None and config.promote_knob > 0 and svc.ran(now) > 0:
        at = now + config.promote_knob * svc.ran(now) - svc.waited(now)
    else:
        return None
    return at if at > now else None


def _shape(job: JobState) -> tuple[int, int]:
    """(whole GPUs per worker, workers)."""
    return job.spec.resources.gpus, job.spec.replicas


def _gpus(job: JobState) -> float:
    per, workers = _shape(job)
    return float(per * workers)


def _held(job: JobState) -> tuple[tuple[str, int], ...]:
    placement = job.held or job.placement
    per_node: dict[str, int] = {}
    for w in placement.workers if placement is not None else ():
        per_node[w.node] = per_node.get(w.node, 0) + len(w.gpus)
    return tuple(sorted(per_node.items()))


def _capacity(state: State) -> tuple[dict[str, int], dict[str, int]]:
    """Per schedulable node: its healthy GPUs, and those of them idle now."""
    room: dict[str, int] = {}
    free: dict[str, int] = {}
    for name, node in state.nodes.items():
        if not node.schedulable:
            continue
        healthy = [g for g in node.gpus if g.healthy]
        room[name] = len(healthy)
        free[name] = sum(1 for g in healthy if g.idle and g.used_milli == 0)
    return room, free


def _idle_gpus(state: State) -> dict[str, list[int]]:
    return {
        name: [g.info.index for g in node.gpus if g.healthy and g.idle and g.used_milli == 0]
        for name, node in state.nodes.items()
        if node.schedulable
    }


def _admission(state: State, job: JobState, attempt: int) -> Admission:
    qspec = state.queues[job.spec.queue]
    demands = quota.worker_demands(qspec, job.spec.resources)
    if not demands:
        return Admission(job_id=job.id, attempt=attempt, replicas=job.spec.replicas)
    key, per_worker = demands[0]
    gpus = quota.admission_gpus(key, per_worker * job.spec.replicas)
    return Admission(job_id=job.id, attempt=attempt, replicas=job.spec.replicas, gpus=gpus)


class Tiresias:
    """The role as the simulator runs it: ``decide`` and what it remembers between cycles."""

    def __init__(self, config: TiresiasConfig | None = None) -> None:
        self.config = config or TiresiasConfig()
        self.services: dict[str, Service] = {}
        self.wake_at: float | None = None  # when to decide again though nothing else happens

    def __call__(self, state: State, now: float) -> Sequence[Event]:
        cycle = decide(state, now, self.services, self.config)
        self.services, self.wake_at = cycle.services, cycle.wake_at
        return cycle.events
