"""The discrete-event driver: corral's own decision functions and its one fold on a simulated
clock, with no NATS, for replaying traces far faster than real time.

The simulated clock jumps from one event time to the next. At each time ``t``:

1. the world's events due at ``t`` are folded: arrivals (a ``SubmitJob`` request of the job's
   tenant) and what the node agents report (workers exiting, checkpoints written);
2. the decision services decide on the folded state with ``now = t``: admission, placer and
   preemptor, the same pure ``decide`` functions with the same configs as the live services, in
   that order, pass after pass (or one other scheduler in their place, ``SimConfig.scheduler``,
   for a baseline such as Tiresias). Each proposal is folded at once with ``apply_event`` on its
   routing subject, as the fold reads it from the live log. A service decides again whenever
   the state has moved past what it last decided on, its own proposals included (a live service
   does so on its next cycle); the passes end when one of them proposes nothing: the state is
   quiet at ``t``;
3. the node agents act on what the fold accepted: the workers of a placed gang start
   (``WorkerStarted``, at ``t``), the victims of a preemption begin to checkpoint and stop;
4. steps 2 and 3 repeat until neither the services nor the agents have anything to add.

What is skipped, and why that changes no decision. Step 2 is skipped when no job waits for a
decision (nothing submitted, queued, admitted or stopped: every service's answer is empty),
and when all that happened since the services were quiet is periodic checkpoints and workers
starting. A checkpoint changes no quota, GPU or phase. Workers start at the time of their
placement, so the job's phase moves from placed to running while the time it counts from stays
the same: the GPU time its queue holds (counted from the placement), the work a preemption would
lose (none), its expected end and the time it has run for the anti-thrash guards are what they
were. Decisions are taken at event
times only: a live service also re-decides on a timer, so a condition that turns true by the
mere passing of time (an anti-thrash guard expiring) is seen here at the next event, there
within a second. With ``cycle_s`` the services decide only at multiples of it, as services that
cycle on a slow timer would. With ``resolution`` (a forecast's) they decide more seldom the
further the simulation has run, and a job placed at such a decision runs from when its GPUs were
freed since the decision before: the services are late, not the GPUs (``SimConfig.resolution``).
Finished jobs leave the state as they do live: the fold lets them go once the retention period
the setup's ``ApplyRetention`` sets has passed in simulated time (one hour if it sets none; a
trace replay sets 0, as nothing reads a finished job's state).

The node agents, as the simulator plays them (``AgentModel``), keep the contract of the live
agents (``services/agent``): start what the fold placed, report exits and checkpoints, and
checkpoint within the grace period when preempted. No node or GPU fails.

- all workers of a placed gang start at once, at the time of the placement;
- a job needs ``work_s`` seconds of running in all; when an attempt has done the rest, each of
  its workers exits with code 0;
- a checkpointable job writes a checkpoint every ``checkpoint_interval_s`` seconds of running
  (``CheckpointCompleted``; ``step`` is the number of seconds of work it holds);
- asked to checkpoint by a preemption, a checkpointable job stops making progress and saves
  what it has, which takes ``checkpoint_save_s``; if that ends by the grace deadline it then
  exits (``stopped``); if not, it is killed at the deadline with nothing new saved. A job that
  cannot checkpoint is stopped at once;
- the next attempt resumes from the last checkpoint written: it has only the rest to do. So a
  preemption costs a checkpointable job the save time, or the work since its last periodic
  checkpoint when it could not save in time; it costs a job that cannot checkpoint all it did.

What is measured per job (``JobStats``): submission, first start, end, GPU-seconds held, and
GPU-seconds lost: held by an attempt but not kept (``held - GPUs x (work the attempt saved or
finished)``). Observers see, between consecutive event times, the GPUs each tenant holds and
asks for (``Observer``).

Everything is deterministic: no wall clock, no randomness; events due at the same time are
taken in the order they were scheduled; ties within the services are broken as they break them.
"""

from __future__ import annotations

import heapq
import math
import time as wallclock
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from corral.events import codec, routing, subjects
from corral.events.base import Event
from corral.events.decisions import JobsPlaced, PreemptionRequested, ShrinkRequested, WorkerSlot
from corral.events.jobs import JobRejected, JobSpec, SubmitJob
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    NodeInventory,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from corral.projections import indexes, quota
from corral.projections.fold import apply_event
from corral.projections.lifecycle import FINAL
from corral.projections.lifecycle import WAITING as WAITING
from corral.projections.placement.stack import PlacerConfig
from corral.projections.state import WHOLE, JobState, State
from corral.services.admission.decide import AdmissionConfig
from corral.services.admission.decide import decide as admission_decide
from corral.services.admission.decide import wake as admission_wake
from corral.services.placer.decide import decide as placer_decide
from corral.services.preemptor.decide import PreemptorConfig
from corral.services.preemptor.decide import decide as preemptor_decide
from corral.services.preemptor.decide import wake as preemptor_wake

_VERBS: dict[type[Event], str] = {t: verb for verb, t in codec.ADMIN_VERBS.items()}
# Reports that change no service's answer at the time they are made (see the module docstring).
_NO_NEWS = (CheckpointCompleted, WorkerStarted)
_FINAL = indexes.ordered(FINAL)


class SimError(Exception):
    """The simulation cannot go on (the services do not settle, or the fold refused what the
    simulated world reported): a corral bug, not a property of the workload."""


@dataclass(frozen=True)
class SimJob:
    """One job of a workload: submitted by ``tenant`` at ``arrival``; needs ``work_s`` seconds
    of running to finish."""

    id: str
    tenant: str
    spec: JobSpec
    arrival: float
    work_s: float


@dataclass(frozen=True)
class AgentModel:
    """How the simulated node agents run workers (see the module docstring)."""

    checkpoint_interval_s: float = 1800.0
    checkpoint_save_s: float = 30.0


@dataclass(frozen=True)
class SimConfig:
    """The services' configs (the live defaults unless changed) and the agents' model.
    ``preemptor`` None runs no preemptor at all. How an elastic job's speed follows its size is
    the job's own, so the simulated agents run a gang's work at one pace from start to end:
    elastic jobs do not grow here (admission's ``grow`` is off), and one the preemptor shrinks
    for a beneficiary (as it does live) stops its leaving ranks (in the time a stop to save a
    checkpoint takes, within the shrink's deadline) and runs on, its work ending when it would
    have."""

    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig(grow=False))
    placer: PlacerConfig = field(default_factory=PlacerConfig)
    preemptor: PreemptorConfig | None = field(default_factory=PreemptorConfig)
    agents: AgentModel = field(default_factory=AgentModel)
    # Decide at most every ``cycle_s`` simulated seconds, at multiples of it (0: at every event
    # time), as a live service that cycles on a timer.
    cycle_s: float = 0.0
    # A forecast's resolution: the services decide at most every this fraction of the time
    # simulated so far (0.05: every 3 minutes an hour ahead, every hour 20 hours ahead), and
    # never more often than ``cycle_s``; 0: every cycle. A start many hours ahead is not known
    # to the minute, and deciding each minute of a day's backlog made the long forecasts cost
    # most of all forecasting (``eta.RESOLUTION``). A job placed at such a decision runs from
    # when the GPUs it got were freed since the one before (``Simulation._since``), and one that
    # ends before the decision it was placed at frees its GPUs for another decision at once: the
    # services decided late, the GPUs did not stand idle.
    resolution: float = 0.0
    max_rounds: int = 64  # passes of the services at one time before they are deemed not to settle
    # Another scheduler in place of admission, placer and preemptor: a factory of one role that
    # decides all of it (accept, requeue, admit, place, preempt) through the same fold, for a
    # baseline such as Tiresias (``tiresias.py``). A factory, as such a role remembers things
    # between its cycles and each run needs its own.
    scheduler: Callable[[], Decide] | None = None


@dataclass
class JobStats:
    id: str
    tenant: str
    queue: str
    gpus: float
    submitted: float
    work_s: float
    first_start: float | None = None
    finished: float | None = None
    phase: str = "submitted"
    held_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    attempts: int = 0

    @property
    def wait(self) -> float | None:
        """Submission to first start."""
        return None if self.first_start is None else self.first_start - self.submitted

    @property
    def jct(self) -> float | None:
        """Job completion time: submission to the end of its last worker."""
        return None if self.finished is None else self.finished - self.submitted


@dataclass(frozen=True)
class SimRecord:
    """One event the simulation folded, and who wrote it: ``world`` (arrivals, nodes, queues),
    ``agent`` (the simulated node agents) or a service role."""

    seq: int
    subject: str
    body: Event
    time: float
    tenant: str | None
    source: str


# (from, to, GPUs each tenant holds, GPUs each tenant asks for: held plus waiting) over [from, to)
Observer = Callable[[float, float, Mapping[str, float], Mapping[str, float]], None]
Decide = Callable[[State, float], Sequence[Event]]


@dataclass
class _Run:
    """An attempt the agents are running."""

    attempt: int
    ranks: tuple[tuple[int, str], ...]  # (rank, node)
    started: float
    progress0: float  # seconds of work done when it started (from the checkpoint it resumed)
    token: int
    stopping: bool = False
    frozen: float | None = None  # progress when asked to checkpoint: it makes none after
    gpus: tuple[tuple[str, int], ...] = ()  # (node, GPU index) it holds
    share: float = 0.0  # the GPUs its ranks hold (fractions and MIG slices by their share)


_DECIDE, _FINISH, _CHECKPOINT, _SAVED, _KILL, _WAKE, _SHRUNK = range(7)


class Simulation:
    def __init__(
        self,
        nodes: Sequence[tuple[str, NodeInventory]],
        setup: Sequence[Event],
        jobs: Iterable[SimJob],
        config: SimConfig | None = None,
        *,
        record: bool = False,
        observers: Sequence[Observer] = (),
    ) -> None:
        """``setup``: admin requests (priority classes, cohorts, queues), folded after the nodes
        register, before the first arrival."""
        self.config = config or SimConfig()
        self.state = State()
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        self.by_id = {j.id: j for j in self.jobs}
        if len(self.by_id) != len(self.jobs):
            raise SimError("job ids must be unique")
        self.stats: dict[str, JobStats] = {}
        self.records: list[SimRecord] | None = [] if record else None
        self.observers = list(observers)
        self.now = self.jobs[0].arrival if self.jobs else 0.0
        self.origin = self.now  # where ``resolution`` counts the time simulated from
        self._decided: float | None = None  # when the services last decided
        self._decisions = 0  # decisions taken (``_settle``)
        # Per GPU (node, index): when it was last freed, as the job on it ran (``resolution``:
        # before the fold time the services saw it), and how many decisions had been taken then.
        self._freed: dict[tuple[str, int], tuple[float, int]] = {}
        self._catch_up = False  # a job ended before the time it was placed at: decide at once
        self.cycles = 0  # decision passes run
        self.decide_calls = 0
        self.wall_s = 0.0
        self._seq = 0
        self._next = 0  # next arrival
        self._heap: list[tuple[float, int, int, str, int]] = []  # (time, order, kind, job, token)
        self._order = 0
        self._tokens = 0
        self._runs: dict[str, _Run] = {}
        self._saved: dict[str, float] = {}  # seconds of work in each job's last checkpoint
        self._waiting: set[str] = set()
        self._dirty = False  # something a decision may depend on happened since the last one
        self._seen: dict[str, int] = {}
        self._started: list[str] = []
        self._stopping: list[str] = []
        self._shrinking: list[str] = []
        self._tick: float | None = None  # the decision time scheduled, if any
        self._wake: float | None = None  # the latest time the scheduler asked to decide again
        self.held: dict[str, float] = {}
        self.demand: dict[str, float] = {}
        cfg = self.config
        roles: list[tuple[str, Decide]] = [
            ("admission", lambda s, now: admission_decide(s, now, cfg.admission)),
            ("placer", lambda s, now: placer_decide(s, now, cfg.placer)),
        ]
        if cfg.scheduler is not None:
            roles = [("scheduler", cfg.scheduler())]
        elif cfg.preemptor is not None:
            pre = cfg.preemptor
            roles.append(("preemptor", lambda s, now: preemptor_decide(s, now, pre)))
        self.roles = roles
        # Stop once every one of these jobs has started (``resume``: a forecast of starts).
        self.until_started: set[str] | None = None
        # Stop once the host's clock (``perf_counter``) passes this, with ``cut`` set: a
        # what-if's simulation is bounded in time, whatever backlog it meets.
        self.deadline: float | None = None
        self.cut = False
        for name, inv in nodes:
            self._fold(NodeRegistered(node=name, inventory=inv), self.now, None, "world")
        for req in setup:
            self._fold(req, self.now, subjects.ADMIN, "world")

    @classmethod
    def resume(
        cls, state: State, now: float, config: SimConfig, work: Callable[[JobState], float]
    ) -> Simulation:
        """A simulation that goes on from a copy of ``state`` (a live one, or another
        simulation's) at ``now``, with no arrivals. What the state does not say, the agents
        are told: a job holding GPUs runs ``work(job)`` more seconds from ``now``; a waiting
        job needs ``work(job)`` seconds in all; a job being preempted stops by its deadline.
        It runs until every job waiting at ``now`` has started (``until_started``)."""
        sim = cls([], [], [], config)
        copy = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)
        sim.state, sim.now, sim._seq = copy, max(now, state.time), state.seq
        sim.origin = sim.now
        sim.until_started = set()
        for job in copy.jobs.values():
            if job.phase in FINAL and job.held is None:
                continue
            sj = SimJob(job.id, job.tenant, job.spec, job.submitted_at, max(0.0, work(job)))
            sim.by_id[job.id] = sj
            st = sim.stats[job.id] = JobStats(
                job.id, job.tenant, job.spec.queue, _gpus(job.spec), job.submitted_at, sj.work_s
            )
            sim.demand[job.tenant] = sim.demand.get(job.tenant, 0.0) + st.gpus
            if job.phase in WAITING:
                sim._waiting.add(job.id)
                sim.until_started.add(job.id)
            else:
                st.first_start = job.phase_since
                sim._resume_holder(job)
        sim._dirty = True
        sim._push(sim.now, _WAKE, "", 0)
        return sim

    def arrive(self, jobs: Sequence[SimJob]) -> None:
        """Have ``jobs`` arrive, later than now, in a simulation that had no more arrivals (one
        ``resume`` made): a forecast's assumption about what is submitted after now."""
        if self._next < len(self.jobs):
            raise SimError("arrivals added to a simulation that still has its own")
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        self._next = 0
        self.by_id.update((j.id, j) for j in self.jobs)

    def _resume_holder(self, job: JobState) -> None:
        """Take over a job that holds GPUs: start the ranks not started yet, end it as told."""
        now, placement = self.now, job.held or job.placement
        if placement is None:
            return
        workers = [w for w in placement.workers if w.rank in job.live or job.phase in ("placed", "starting")]
        if job.phase in ("placed", "starting"):
            for w in workers:
                if w.rank not in job.started:
                    ev = WorkerStarted(node=w.node, job_id=job.id, attempt=job.attempt, rank=w.rank)
                    self._fold(ev, now, None, "agent")
        self._tokens += 1
        ranks = tuple((w.rank, w.node) for w in workers)
        share = _share(job.spec, len(workers))
        run = _Run(placement.attempt, ranks, now, 0.0, self._tokens, gpus=_claims(workers), share=share)
        self._runs[job.id] = run
        self.held[job.tenant] = self.held.get(job.tenant, 0.0) + share
        if job.phase == "checkpointing" or job.phase in FINAL:
            # Asked to stop at ``phase_since``: its save counts from then, not from each
            # forecast anew (which kept its end "in 30 s" until its deadline).
            self._preempted(job.id, run, now, max(now, job.preempt_deadline), asked=job.phase_since)
        else:
            self._push(now + self.by_id[job.id].work_s, _FINISH, job.id, run.token)
            if job.leaving:  # a shrink under way: its leaving ranks are on their way out
                self._shrink_soon(job, run, now)

    # -- folding ----------------------------------------------------------------------------------

    def _fold(self, body: Event, now: float, tenant: str | None, source: str) -> None:
        self._seq += 1
        if tenant is not None:
            subject = subjects.request(tenant, _VERBS[type(body)])
        else:
            subject = routing.subject_of(body)
        state = self.state
        before = state.rejected_total
        apply_event(state, self._seq, subject, body, now, tenant)
        if self.records is not None:
            self.records.append(SimRecord(self._seq, subject, body, now, tenant, source))
        if source in ("world", "agent") and state.rejected_total != before:
            r = state.rejections[-1]
            raise SimError(f"the fold refused what the simulated world reported at seq {r.seq}: {r.message}")
        jobs = state.jobs
        for job_id in routing.job_ids(body):
            job = jobs.get(job_id)
            if job is not None and job.phase in WAITING:
                self._waiting.add(job_id)
            else:
                self._waiting.discard(job_id)
        if not isinstance(body, _NO_NEWS):
            self._dirty = True
        if isinstance(body, JobRejected):
            self._rejected(body.job_id)

    def _rejected(self, job_id: str) -> None:
        """A job that will never run asks for nothing any more."""
        st = self.stats.get(job_id)
        if st is not None and st.phase != "rejected":
            st.phase = "rejected"
            self.demand[st.tenant] -= st.gpus

    # -- the clock ----------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, job_id: str, token: int) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, kind, job_id, token))

    def _next_time(self) -> float | None:
        nxt = self.jobs[self._next].arrival if self._next < len(self.jobs) else None
        if self._heap and (nxt is None or self._heap[0][0] < nxt):
            return self._heap[0][0]
        return nxt

    def run(self, until: float | None = None) -> Simulation:
        """Run until every job is over and nothing is scheduled (or past ``until``)."""
        started = wallclock.perf_counter()
        try:
            deadline = self.deadline
            while (t := self._next_time()) is not None and (until is None or t <= until):
                self._advance(t)
                self._step(t)
                if self.until_started is not None and not self.until_started:
                    break
                if deadline is not None and wallclock.perf_counter() >= deadline:
                    self.cut = True
                    break
        finally:
            self.wall_s += wallclock.perf_counter() - started
        return self

    def _advance(self, t: float) -> None:
        if t > self.now:
            for observe in self.observers:
                observe(self.now, t, self.held, self.demand)
            self.now = t

    def _step(self, t: float) -> None:
        jobs = self.jobs
        while self._next < len(jobs) and jobs[self._next].arrival <= t:
            self._arrive(jobs[self._next], t)
            self._next += 1
        heap = self._heap
        while heap and heap[0][0] <= t:
            _, _, kind, job_id, token = heapq.heappop(heap)
            if kind == _DECIDE:
                self._tick = None
                continue
            if kind == _WAKE:  # the services' answer may change by the passing of time alone
                self._dirty = True
                self._seen.clear()  # so each decides again, on the same state, at the later time
                continue
            run = self._runs.get(job_id)
            if run is None or run.token != token:
                continue  # the attempt it was for is over
            if kind == _FINISH:
                self._finish(job_id, run, t)
            elif kind == _CHECKPOINT:
                self._checkpoint(job_id, run, t)
            elif kind == _SAVED:
                self._save_and_stop(job_id, run, t)
            elif kind == _SHRUNK:
                self._shrunk(job_id, run, t)
            else:
                self._exit(job_id, run, t, stopped=True)
        if self._dirty and self._waiting:
            tick = self._next_decision(t)
            if tick > t and not self._catch_up:  # not yet: the services decide at their next tick
                if self._tick is None:
                    self._tick = tick
                    self._push(tick, _DECIDE, "", 0)
                return
        self._catch_up = False
        self._settle(t)

    # -- one time step ----------------------------------------------------------------------------

    def _next_decision(self, t: float) -> float:
        """When the services decide on what happened by ``t``: at once with no cycle, else at
        the next multiple of ``cycle_s``, and no sooner than ``resolution`` allows."""
        cfg = self.config
        tick = t
        if cfg.resolution > 0 and self._decided is not None:
            tick = max(tick, self._decided + cfg.resolution * (self._decided - self.origin))
        if cfg.cycle_s > 0:
            tick = math.ceil(tick / cfg.cycle_s) * cfg.cycle_s
        return tick

    def _settle(self, now: float) -> None:
        while True:
            if self._dirty and self._waiting:
                self._decided = now
                self._decisions += 1
                self._decide(now)
            self._dirty = False
            if not self._react(now):
                return

    def _decide(self, now: float) -> None:
        state = self.state
        seen = self._seen
        for _ in range(self.config.max_rounds):
            self.cycles += 1
            moved = False
            for role, decide in self.roles:
                if seen.get(role) == state.seq:
                    continue
                self.decide_calls += 1
                # It decides again once the state moves past what it decided on, its own
                # proposals included (a live service does, on its next cycle).
                seen[role] = state.seq
                events = decide(state, now)
                for ev in events:
                    self._fold(ev, now, None, role)
                    if isinstance(ev, JobsPlaced):
                        self._started.extend(p.job_id for p in ev.placements)
                    elif isinstance(ev, PreemptionRequested):
                        self._stopping.extend(v.job_id for v in ev.victims)
                    elif isinstance(ev, ShrinkRequested):
                        self._shrinking.append(ev.job_id)
                moved = moved or bool(events)
            if not moved:
                self._wake_scheduler(now)
                return
        raise SimError(f"the services did not settle at t={now} after {self.config.max_rounds} passes")

    def _wake_scheduler(self, now: float) -> None:
        """Admission's answer may change by the passing of time alone (``admission.decide.wake``:
        a placement timeout, a back-off ending), and so may the preemptor's (its ``wake``: an
        anti-thrash guard lifting off the job a beneficiary waits to stop) and a scheduler's in
        place of corral's services (``SimConfig.scheduler``, its ``wake_at``: Tiresias's jobs
        crossing a queue's threshold): a live one decides on a timer, so the simulation decides
        then too."""
        if self.config.scheduler is None:
            soonest = admission_wake(self.state, now, self.config.admission)
            if self.config.preemptor is not None:
                soonest = min(soonest, preemptor_wake(self.state, now))
            at: float | None = None if math.isinf(soonest) else soonest
        else:
            at = getattr(self.roles[0][1], "wake_at", None)
        if at is not None and at > now and at != self._wake:
            self._wake = at
            self._push(at, _WAKE, "", 0)

    def _react(self, now: float) -> bool:
        """The node agents act on what the fold accepted; True if they reported anything."""
        started, self._started = self._started, []
        stopping, self._stopping = self._stopping, []
        shrinking, self._shrinking = self._shrinking, []
        acted = False
        jobs = self.state.jobs
        for job_id in started:
            job = jobs.get(job_id)
            if job is None or job.phase != "placed" or job.placement is None:
                continue  # voided, or preempted before it started
            self._start(job_id, job.attempt, job.placement.workers, now)
            acted = True
        for job_id in stopping:
            job = jobs.get(job_id)
            run = self._runs.get(job_id)
            if job is None or job.phase != "checkpointing" or run is None or run.stopping:
                continue
            self._preempted(job_id, run, now, max(now, job.preempt_deadline))
            acted = True
        for job_id in shrinking:
            job = jobs.get(job_id)
            run = self._runs.get(job_id)
            if job is not None and run is not None and not run.stopping and job.leaving:
                self._shrink_soon(job, run, now)
        return acted

    def _shrink_soon(self, job: JobState, run: _Run, now: float) -> None:
        """A shrunk job's leaving ranks take what a stop takes to exit, within its deadline."""
        at = min(now + self.config.agents.checkpoint_save_s, max(now, job.preempt_deadline))
        self._push(at, _SHRUNK, job.id, run.token)

    # -- the world and the agents ------------------------------------------------------------------

    def _arrive(self, job: SimJob, now: float) -> None:
        gpus = _gpus(job.spec)
        self.stats[job.id] = JobStats(job.id, job.tenant, job.spec.queue, gpus, now, job.work_s)
        self.demand[job.tenant] = self.demand.get(job.tenant, 0.0) + gpus
        self._fold(SubmitJob(request_id=job.id, job=job.spec), now, job.tenant, "world")

    def _start(self, job_id: str, attempt: int, workers: Sequence[WorkerSlot], now: float) -> None:
        job = self.by_id[job_id]
        ranks = tuple((w.rank, w.node) for w in workers)
        for rank, node in ranks:
            self._fold(
                WorkerStarted(node=node, job_id=job_id, attempt=attempt, rank=rank), now, None, "agent"
            )
        self._tokens += 1
        progress0 = self._saved.get(job_id, 0.0)
        st = self.stats[job_id]
        started = self._since(workers, now, st.submitted) if self.config.resolution > 0 else now
        share = _share(job.spec, len(workers))
        run = _Run(attempt, ranks, started, progress0, self._tokens, gpus=_claims(workers), share=share)
        self._runs[job_id] = run
        if st.first_start is None:
            st.first_start = started
        if self.until_started is not None:
            self.until_started.discard(job_id)
        st.attempts += 1
        self.held[job.tenant] = self.held.get(job.tenant, 0.0) + share
        left = max(0.0, job.work_s - progress0)
        self._push(max(now, started + left), _FINISH, job_id, run.token)
        self._next_checkpoint(job_id, run)

    def _since(self, workers: Sequence[WorkerSlot], now: float, submitted: float) -> float:
        """When a job placed at ``now`` by a decision of a coarse ``resolution`` starts: when the
        last of its GPUs freed since the decision before this one was (the services would have
        placed it then, deciding at every event; those already free then did not hold it
        back), never before its submission; ``now`` if none of them was freed since (why it was
        not placed then is not known)."""
        last = self._decisions - 1  # a GPU freed after that decision, before this one
        at = -math.inf
        for w in workers:
            for claim in w.gpus:
                freed = self._freed.get((w.node, claim.gpu))
                if freed is not None and freed[1] >= last:
                    at = max(at, freed[0])
        return now if at == -math.inf else min(max(at, submitted), now)

    def _next_checkpoint(self, job_id: str, run: _Run) -> None:
        job = self.by_id[job_id]
        every = self.config.agents.checkpoint_interval_s
        if not job.spec.checkpointable or every <= 0:
            return
        done = self._saved.get(job_id, 0.0)
        at = run.started + (done - run.progress0) + every  # running time at which it is written
        if done + every < job.work_s:
            self._push(max(at, self.now), _CHECKPOINT, job_id, run.token)

    def _progress(self, job_id: str, run: _Run, now: float) -> float:
        if run.frozen is not None:
            return run.frozen
        return min(self.by_id[job_id].work_s, run.progress0 + (now - run.started))

    def _write_checkpoint(self, job_id: str, run: _Run, progress: float, now: float) -> None:
        step = int(progress)
        node = run.ranks[0][1]
        location = f"sim://{job_id}/{run.attempt}/{step}"
        self._fold(
            CheckpointCompleted(node=node, job_id=job_id, attempt=run.attempt, location=location, step=step),
            now,
            None,
            "agent",
        )
        self._saved[job_id] = progress

    def _checkpoint(self, job_id: str, run: _Run, now: float) -> None:
        self._write_checkpoint(job_id, run, self._progress(job_id, run, now), now)
        self._next_checkpoint(job_id, run)

    def _finish(self, job_id: str, run: _Run, now: float) -> None:
        self._exit(job_id, run, now, stopped=False)

    def _preempted(
        self, job_id: str, run: _Run, now: float, deadline: float, asked: float | None = None
    ) -> None:
        """``job_id`` is asked to stop by ``deadline``: it saves a checkpoint in the time the
        agents take for one (``asked``: when it was asked, for a job taken over while stopping;
        default now), or stops at once if it cannot. One taken over still there after that save
        took longer than the agents are taken to: it is gone by its deadline at the latest."""
        job = self.by_id[job_id]
        run.stopping = True
        run.frozen = self._progress(job_id, run, now)
        self._tokens += 1
        run.token = self._tokens  # what was scheduled for the attempt no longer happens
        saved = (now if asked is None else asked) + self.config.agents.checkpoint_save_s
        if not job.spec.checkpointable:
            self._exit(job_id, run, now, stopped=True)
        elif now <= saved <= deadline:
            self._push(saved, _SAVED, job_id, run.token)
        else:
            self._push(deadline, _KILL, job_id, run.token)

    def _shrunk(self, job_id: str, run: _Run, now: float) -> None:
        """The leaving ranks of a job the fold shrank exit; the rest run on."""
        job = self.state.jobs.get(job_id)
        if job is None or job.placement is None or job.attempt != run.attempt:
            return
        leaving = set(job.leaving)
        gone = [w for w in job.placement.workers if w.rank in leaving]
        attempt = run.attempt
        for w in gone:
            ended = WorkerExited(
                node=w.node, job_id=job_id, attempt=attempt, rank=w.rank, code=0, stopped=True
            )
            self._fold(ended, now, None, "agent")
        freed = set(_claims(gone))
        for gpu in freed:
            self._freed[gpu] = (now, self._decisions)
        run.ranks = tuple(r for r in run.ranks if r[0] not in leaving)
        run.gpus = tuple(g for g in run.gpus if g not in freed)
        sim_job = self.by_id[job_id]
        gpus = _share(sim_job.spec, len(gone))
        self.stats[job_id].held_gpu_s += gpus * (now - run.started)  # the rest's when the run ends
        run.share -= gpus
        self.held[sim_job.tenant] -= gpus

    def _save_and_stop(self, job_id: str, run: _Run, now: float) -> None:
        assert run.frozen is not None
        self._write_checkpoint(job_id, run, run.frozen, now)
        self._exit(job_id, run, now, stopped=True)

    def _exit(self, job_id: str, run: _Run, now: float, *, stopped: bool) -> None:
        for rank, node in run.ranks:
            self._fold(
                WorkerExited(
                    node=node, job_id=job_id, attempt=run.attempt, rank=rank, code=0, stopped=stopped
                ),
                now,
                None,
                "agent",
            )
        del self._runs[job_id]
        job = self.by_id[job_id]
        st = self.stats[job_id]
        # it ran to ``end``: before ``now`` if it started before the decision that placed it
        end = now if stopped else min(now, run.started + max(0.0, job.work_s - run.progress0))
        if end < now and self.config.resolution > 0:
            self._catch_up = True
        for gpu in run.gpus:
            self._freed[gpu] = (end, self._decisions)
        held = run.share * (end - run.started)
        kept = (job.work_s if not stopped else self._saved.get(job_id, 0.0)) - run.progress0
        st.held_gpu_s += held
        st.lost_gpu_s += max(0.0, held - run.share * max(0.0, kept))
        self.held[job.tenant] -= run.share
        phase = self.state.jobs[job_id].phase
        st.phase = phase
        if stopped:
            st.preemptions += 1
            if not job.spec.checkpointable:
                self._saved.pop(job_id, None)
        elif phase in FINAL:
            st.finished = end
            self.demand[job.tenant] -= st.gpus
        elif job.spec.restart_policy == "always":
            # A job that always restarts (a service) is restarted whatever its exit, as live:
            # its next attempt runs its work again, from the start.
            self._saved.pop(job_id, None)
        else:
            raise SimError(f"job {job_id} finished its work at t={now} but the fold has it {phase}")

    # -- results ------------------------------------------------------------------------------------

    def unfinished(self) -> list[str]:
        return [j for j, st in self.stats.items() if st.finished is None]

    def log(self) -> list[Record]:
        """The recorded events as the live log would hold them (``record=True``): requests bare on
        their tenant's subject, service events sealed in their envelope. Folding these records
        with ``projections.fold.fold`` gives the simulation's state."""
        if self.records is None:
            raise SimError("the simulation was not recorded; pass record=True")
        out = []
        for r in self.records:
            if r.tenant is not None:
                data = codec.encode(r.body)
            else:
                env = codec.seal(r.body, event_id=f"{r.source}:{r.seq}", time=r.time, producer=r.source)
                data = codec.encode(env)
            out.append(Record(r.seq, r.subject, data, None, r.time))
        return out


def _claims(workers: Sequence[WorkerSlot]) -> tuple[tuple[str, int], ...]:
    return tuple((w.node, c.gpu) for w in workers for c in w.gpus)


def _share(spec: JobSpec, workers: int) -> float:
    """The GPUs ``workers`` of a job hold (fractions and MIG slices by their share)."""
    return quota.worker_milli(spec.resources) * workers / WHOLE


def _gpus(spec: JobSpec) -> float:
    """The GPUs a job holds when all its workers run."""
    return _share(spec, spec.replicas)
