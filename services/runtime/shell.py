"""The shape every decision service shares: consume → fold → decide → append.

A service reads the whole log in order, folds each record into its own State with the one fold,
asks its pure ``decide(state, now)`` what to do, and appends what it returns. Decisions are made in
cycles: everything that has arrived is folded first, then ``decide`` runs once for all of it (and on
a timer, so time-based decisions happen on a quiet log too).

- A state that has not moved since a cycle that found nothing to do is not decided on again
  (``decide`` is pure: the same state gets the same answer) until time alone could change the
  answer: the service's ``wake`` says when (a guard expiring), and without one, every ``quiet_s``.
  An idle service with a deep backlog so costs nothing per tick but its lease.

- Appends are pipelined: one cycle's events go out together and the acks are gathered after.
- A service does not decide again until the log has come back to it with its own last appends
  folded, so it never proposes twice from a state that lacks its own proposals.
- A cycle's events are appended all or none, fenced on the role's decision subject
  (``EventLog.append_fenced``: an atomic batch whose first message carries the subject's
  expected last sequence): if another replica wrote there meanwhile, nothing of the cycle is
  stored, whichever subjects its events are on, and the next cycle decides on the newer state.
- Message ids are deterministic (role, the sequence the state was folded to, position), so two
  replicas deciding the same on the same state are stored once.
- With a ``lease`` (``services/runtime/lease.py``), only the replica holding the role's lease decides;
  the others fold the log and stand by, ready to decide the moment they take it over.
- A cycle that raises is supervised (``supervise.py``): logged with the log sequence and the job
  it was on, counted, retried after an exponential back-off, and meanwhile the lease is handed
  over so that a standby decides. With a ``status`` board (``status.py``) each replica posts
  its counts for ``corral status``.
- ``decide`` gets ``now`` from a ``LogClock`` (``clock.py``): never earlier than the log time
  folded, so deadlines the fold stamped in log time are read in log time.
- OpenTelemetry stays here: what the fold accepted becomes spans of the jobs' and nodes' traces
  (``traces.py``), and a cycle that decided something is a span linked to the jobs it moved.
  The spans that are the lease's are handed from holder to holder at a posted log position
  (``traced.py``), so each record's span is emitted once across a handover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from corral.events import codec, routing, subjects
from corral.events.base import Event
from corral.events.log import Append, ConflictError, EventLog, Fence, LogError, Record
from corral.projections import trace_ids
from corral.projections.fold import apply, collector_paused
from corral.projections.rules import RULES
from corral.projections.state import State
from corral.services.runtime import heap, logs, metrics, traces, tracing
from corral.services.runtime.clock import LogClock
from corral.services.runtime.lease import KvLease, Lease
from corral.services.runtime.status import ServiceStatus, StatusBoard
from corral.services.runtime.supervise import Supervision
from corral.services.runtime.traced import EMIT_EVERY_S, RESUME_WITHIN, TracedPosition

log = logging.getLogger("corral.shell")

_DECISIONS = subjects.decision("")  # every role's decision subject: one record per cycle


class _Sealed(msgspec.Struct):
    rules: int = 0


_sealed = msgspec.json.Decoder(_Sealed)

MIN_QUIET_S = 2.0  # the least a quiet state waits for time alone to change its answer
MAX_CYCLE_LINKS = 128  # a cycle that moved thousands of jobs links the first ones: a span stays small

Decide = Callable[[State, float], Sequence[Event]]


class Snapshots(Protocol):
    async def save(self, state: State) -> None: ...

    async def load(self) -> State | None: ...


class Service:
    def __init__(
        self,
        role: str,
        decide: Decide,
        log_: EventLog,
        *,
        clock: Callable[[], float] = time.time,
        tick: float = 1.0,
        snapshots: Snapshots | None = None,
        snapshot_every: int = 50_000,
        on_fold: Callable[[State, list[Record]], None] | None = None,
        lease: Lease | None = None,
        status: StatusBoard | None = None,
        supervision: Supervision | None = None,
        wake: Callable[[State, float], float] | None = None,
        quiet_s: float = 30.0,
        cadence_s: float = 0.0,
    ) -> None:
        """``clock``: the host's clock, which ``now`` never lets fall behind the log's time.
        ``wake``: when, at the earliest, the passing of time alone could change ``decide``'s
        answer on a state (a guard expiring); without it a quiet state is decided on again
        every ``quiet_s`` seconds. ``cadence_s``: decide at most once every that many seconds
        (0: as soon as a record is folded), for a role whose answers are not awaited by the
        millisecond and whose cycle reads much of the State."""
        self.role = role
        self.decide = decide
        self.log = log_
        self.clock = clock
        self.log_clock = LogClock(clock)
        self.supervision = supervision if supervision is not None else Supervision()
        self.status = status
        self.tick = tick
        self.snapshots = snapshots
        self.snapshot_every = snapshot_every
        self.on_fold = on_fold
        self.lease = lease
        self.wake = wake
        self.quiet_s = quiet_s
        self.cadence_s = cadence_s
        self._next_cycle_at = 0.0  # time.monotonic() before which the cadence defers a cycle
        self._deferred = False  # the last cycle was deferred by the cadence
        self.monotonic = time.monotonic  # the cadence's clock: pacing this process, not a decision
        self._quiet_seq = -1  # the state decided on last, when that cycle found nothing to do
        self._quiet_at = 0.0  # ... at what time
        self._quiet_until: float | None = 0.0  # ... and until when the same state gets the same
        # empty answer (None: not asked yet; see ``_quiet``)
        self.skipped = 0  # cycles not decided because the state had not moved
        self.state = State()
        self.producer = f"{role}@{socket.gethostname()}:{os.getpid()}"
        self.decision_subject = subjects.decision(role)
        self._last_decision_seq = 0  # last seq on our decision subject, as folded
        self._awaiting = 0  # our newest appended seq; no deciding before it is folded
        self._snapshot_seq = 0
        self.caught_up = asyncio.Event()
        self.telemetry: metrics.Telemetry | None = None  # the process's, from ``run``
        tracing.setup(role)
        self.traces: traces.JobTraces | None = None
        if role in traces.EMITTERS and tracing.enabled(role):
            self.traces = traces.JobTraces(role, self.producer)
        # Where the lease's spans were traced to (``traced.py``): posted while holding, read
        # while standing by.
        self._traced: TracedPosition | None = None
        if self.traces is not None and isinstance(lease, KvLease) and lease.nc is not None:
            self._traced = TracedPosition(lease.nc, lease.kv, role)
        self._traced_every = (lease.ttl if isinstance(lease, KvLease) else 10.0) / 3
        self._newer_rules_seen: set[int] = set()  # rules newer than RULES found in the log, said once
        self._traced_seen: int | None = None  # the last position a holder posted, as read here
        self._traced_to: int | None = None  # while holding: how far this replica traced
        self._traced_posted = (-1, -1e9)  # (position, monotonic time) of our last post
        self._traced_read_at = self._traced_emitted_at = -1e9

    # -- folding --------------------------------------------------------------------------------

    def fold(self, batch: list[Record]) -> None:
        state = self.state
        spans = self.traces
        with collector_paused():
            for r in batch:
                if spans is None:
                    apply(state, r)
                else:
                    rejected = state.rejected_total
                    apply(state, r)
                    spans.folded(state, r, rejected)
                if r.subject == self.decision_subject:
                    self._last_decision_seq = r.seq
                if r.subject.startswith(_DECISIONS):
                    self._newer_rules(r)
        heap.settle()  # what the batch folded lives long: no full collection walks it
        self.log_clock.saw(state.time)
        if self.on_fold is not None:
            self.on_fold(state, batch)

    def _newer_rules(self, r: Record) -> None:
        """Say, once per rules version, that a cycle in the log was decided under newer rules
        than this build's: in a rolling upgrade, or after a rollback, this replica folds it by
        its own rules, so where the two differ its state (and what it decides on it) is not the
        newer replicas'. It goes on: refusing would leave a rolled-back corral nothing to decide."""
        try:
            rules = _sealed.decode(r.data).rules
        except msgspec.DecodeError:
            return  # the fold records what is wrong with it
        if rules <= RULES or rules in self._newer_rules_seen:
            return
        self._newer_rules_seen.add(rules)
        log.error(
            "%s: %s folds log seq %d, decided under rules %d, by this build's older rules %d: "
            "where they differ its state is not the newer replicas'; upgrade it (corral --version)",
            self.role,
            self.producer,
            r.seq,
            rules,
            RULES,
        )

    def now(self) -> float:
        """The time to decide at: the host's clock, never behind the log time folded."""
        return self.log_clock.now()

    async def restore(self) -> None:
        if self.snapshots is not None:
            loaded = await self.snapshots.load()
            # A snapshot ahead of the log belongs to a stream that was since recreated.
            if loaded is not None and loaded.seq <= await self.log.last_seq():
                self.state = loaded
                self._snapshot_seq = loaded.seq
        if self.traces is not None:
            self.traces.seed(self.state)
            if self._traced is not None:
                # What the lease's holder traced: the lease's spans of records after it are kept
                # from the replay on, for this replica may be the one to emit them (after a
                # restart of the whole corral, those of the records written while it stopped).
                self._traced_seen = await self._read_traced()
                self.traces.resume_after = await self._resumable(self._traced_seen)
        async for batch in self.log.read(self.state.seq + 1):
            self.fold(batch)
        if self.traces is not None:
            self.traces.live = True  # what was folded so far had its spans made when it happened
        # The decision subject's last sequence is not in a snapshot; the expected-sequence check
        # then fails once, and the first fold of our own subject sets it right.
        self.caught_up.set()

    async def _maybe_snapshot(self) -> None:
        if self.snapshots is not None and self.state.seq - self._snapshot_seq >= self.snapshot_every:
            await self._save_snapshot()
            self._snapshot_seq = self.state.seq

    async def _save_snapshot(self) -> None:
        """A snapshot only spares a restart the fold from the start: one that cannot be written
        is logged, and the service goes on (the next restart folds further, that is all)."""
        assert self.snapshots is not None
        try:
            await self.snapshots.save(self.state)
        except Exception as e:  # noqa: BLE001 - the log, not the snapshot, is the truth
            log.error("%s: snapshot at log seq %d not written: %s", self.role, self.state.seq, e, exc_info=e)

    async def _read_traced(self) -> int | None:
        """The traced position posted, if it is one in this log (``traced.py``)."""
        if self._traced is None:
            return None
        try:
            last = await self.log.last_seq()
        except LogError:
            return None  # read again next time
        return await self._traced.read(last)

    async def _resumable(self, posted: int | None) -> int | None:
        """``posted``, if the replay keeps the lease's spans of no more than ``RESUME_WITHIN``
        records after it (or after the snapshot it starts from); else None, said once."""
        if posted is None:
            return None
        try:
            behind = await self.log.last_seq() - max(posted, self.state.seq)
        except LogError:
            return None
        if behind <= RESUME_WITHIN:
            return posted
        log.warning(
            "%s: %s starts %d records past log seq %d, where the lease's spans were traced to: "
            "it traces what it folds from now on, not those",
            self.role,
            self.producer,
            behind,
            posted,
        )
        return None

    async def _hand_spans(self, stopping: bool = False) -> None:
        """The lease's spans (``traced.py``): the holder emits those after the position the
        previous holder traced to, and posts its own; a standby drops what the holder traced."""
        spans = self.traces
        if spans is None:
            return
        if self.lease is None or self._traced is None:
            if self.lease is None or self.lease.held:
                spans.emit_pending(after=-1)
            else:
                spans.pending.clear()
            return
        now = time.monotonic()
        if not self.lease.held:
            self._traced_to = None
            if now - self._traced_read_at >= self._traced_every:
                self._traced_read_at = now
                got = await self._read_traced()
                if got is not None:
                    self._traced_seen = max(got, self._traced_seen or 0)
                    spans.drop_pending(got)
            return
        if self._traced_to is None:  # it has just taken the lease
            got = await self._read_traced()
            known = [p for p in (got, self._traced_seen) if p is not None]
            if known:
                self._traced_to = max(known)
                log.info(
                    "%s: %s resumes the lease's spans after log seq %d, where the previous holder traced to",
                    self.role,
                    self.producer,
                    self._traced_to,
                )
            else:
                self._traced_to = -1
                log.info(
                    "%s: %s finds no traced position posted: it traces what it folded since it started",
                    self.role,
                    self.producer,
                )
        if not stopping and now - self._traced_emitted_at < EMIT_EVERY_S:
            return
        self._traced_emitted_at = now
        upto = self.state.seq
        if spans.emit_pending(after=self._traced_to):
            # Posted only once the collector has them: a holder killed before that leaves
            # them to the next one.
            await asyncio.to_thread(tracing.flush, self.role)
        self._traced_to = max(upto, self._traced_to)
        last, at = self._traced_posted
        if (self._traced_to != last or now - at >= self._traced_every) and await self._traced.post(
            self._traced_to
        ):
            self._traced_posted = (self._traced_to, now)

    # -- deciding -------------------------------------------------------------------------------

    async def cycle(self) -> int:
        """Decide once on the current state and append the result. Returns events appended."""
        self._deferred = False
        if self.state.seq < self._awaiting:
            return 0
        now = self.now()
        if not self.supervision.may_decide(now):
            return 0  # backing off after a failure; a standby holds the lease meanwhile
        if self.lease is not None and not await self.lease.hold():
            self.supervision.decided_elsewhere(self._last_decision_seq)
            return 0  # a standby: another replica decides
        if self.settled(now):
            self.skipped += 1
            return 0  # nothing moved since a cycle that found nothing to do: the answer is the same
        if self.cadence_s:
            if self.monotonic() < self._next_cycle_at:
                self._deferred = True
                return 0  # ``run`` comes back when the cadence allows
            self._next_cycle_at = self.monotonic() + self.cadence_s
        logs.set_seq(self.state.seq)
        began = time.perf_counter()
        appended = await self._decide_and_append(now)
        if self.telemetry is not None:
            self.telemetry.cycle(self.role, time.perf_counter() - began, appended)
        return appended

    def settled(self, now: float) -> bool:
        """Whether ``decide`` would give the empty answer of the last cycle again: nothing was
        folded since it, and time alone cannot have changed the answer yet (``_quiet``). A
        service whose inputs are not all in the log says so itself."""
        if self.state.seq != self._quiet_seq:
            return False
        if self._quiet_until is None:
            self._quiet_until = self._quiet_ends(self._quiet_at)
        return now < self._quiet_until

    async def _decide_and_append(self, now: float) -> int:
        started = time.time()
        try:
            events = list(self.decide(self.state, now))
            appends = [self._append_for(i, body, now) for i, body in enumerate(events)]
        except Exception as e:  # noqa: BLE001 - one bad cycle must not take the service down
            self._cycle_span(started, [], e)
            await self._failed(e, now)
            return 0
        self.supervision.succeeded()
        if not events:
            self._quiet(now)
            return 0  # a cycle that decided nothing is no span: an idle service makes no traces
        self._quiet_seq = -1
        self._cycle_span(started, events)
        try:
            fence = Fence(self.decision_subject, self._last_decision_seq)
            acks = await self.log.append_fenced(appends, fence)
        except ConflictError as e:
            log.info("%s: lost a race on %s; deciding again on the newer state", self.role, e.subject)
            if e.actual is not None and e.actual <= self.state.seq:
                # What was written there is already folded: the fence was only unknown (a
                # snapshot does not keep it), not stale. The next cycle is fenced on it.
                self._last_decision_seq = e.actual
            return 0
        except LogError as e:
            # A failed cycle like any other: counted, seen in ``corral status``, backed off, the
            # lease handed over. (One whose events the server refuses, too large, was retried
            # at once for good while the service looked healthy.)
            await self._failed(LogError(f"appending a cycle of {len(appends)} events failed: {e}"), now)
            return 0
        self._awaiting = max(self._awaiting, *(a.seq for a in acks))
        return len(acks)

    def _quiet(self, now: float) -> None:
        """The cycle at ``now`` found nothing to do: the same state gets the same empty answer
        until something is folded, or until time alone may change it (``_quiet_ends``), so an
        idle service costs nothing but its lease. When is asked only once the state has stayed
        put: on a busy log the next record comes first, and ``wake`` (a walk of the running
        jobs, for the preemptor) after every empty cycle would be for nothing."""
        self._quiet_seq = self.state.seq
        self._quiet_at = now
        self._quiet_until = None

    def _quiet_ends(self, now: float) -> float:
        """Until when a state on which the cycle at ``now`` found nothing to do gets the same
        answer: when time alone may change it (``wake``), at the latest ``quiet_s`` on."""
        until = now + self.quiet_s
        if self.wake is not None:
            # Not sooner than ``MIN_QUIET_S``: with thousands of jobs running, some guard lifts
            # every few milliseconds, and an idle cycle over a deep backlog is not free.
            until = min(until, max(now + MIN_QUIET_S, self.wake(self.state, now)))
        return until

    async def _failed(self, error: Exception, now: float) -> None:
        failure = self.supervision.failed(now, self.state.seq, error)
        on = f" on job {failure.job}" if failure.job else ""
        log.error(
            "%s: cycle failed at log seq %d%s: %s (%d failures, %d in a row; next try in %.1fs)",
            self.role,
            failure.seq,
            on,
            failure.error,
            self.supervision.failures,
            self.supervision.in_a_row,
            self.supervision.retry_at - now,
            exc_info=error,
            extra={"job": failure.job, "seq": failure.seq},
        )
        if self.lease is not None:
            await self.lease.release()  # a standby decides while this one backs off

    async def post_status(self) -> None:
        if self.status is None:
            return
        sup = self.supervision
        leading = self.lease is None or self.lease.held
        await self.status.post(
            ServiceStatus(
                role=self.role,
                replica=self.producer,
                leading=leading and sup.may_decide(self.now()),
                seq=self.state.seq,
                cycles=sup.cycles,
                failures=sup.failures,
                in_a_row=sup.in_a_row,
                retry_at=sup.retry_at,
                last_failure=sup.last,
                at=self.now(),
            )
        )

    def _append_for(self, index: int, body: Event, now: float) -> Append:
        subject = routing.subject_of(body)
        event_id = f"{self.role}:{self.state.seq}:{index}"
        traceparent = self._traceparent(body)
        envelope = codec.seal(
            body, event_id=event_id, time=now, producer=self.producer, traceparent=traceparent, rules=RULES
        )
        headers = {"traceparent": traceparent} if traceparent else None
        return Append(subject, codec.encode(envelope), event_id, headers=headers)

    def _traceparent(self, body: Event) -> str | None:
        """The trace of the first job the event names, for readers of the log: the job's span."""
        for job_id in routing.job_ids(body):
            job = self.state.jobs.get(job_id)
            if job is not None:
                return trace_ids.job_trace(job.id, job.submitted_seq, job.traceparent).traceparent
        return None

    def _cycle_span(self, started: float, events: list[Event], error: Exception | None = None) -> None:
        """A cycle that decided something, or failed: a span linked to each job it moved."""
        if not tracing.enabled(self.role):
            return
        links: dict[str, tracing.LinkTo] = {}
        for body in events:
            for job_id in routing.job_ids(body):
                job = self.state.jobs.get(job_id)
                if job is not None and job_id not in links and len(links) < MAX_CYCLE_LINKS:
                    t = trace_ids.job_trace(job.id, job.submitted_seq, job.traceparent)
                    links[job_id] = tracing.LinkTo(t.trace_id, t.job_span, {"corral.job.id": job_id})
        tracing.emit(
            self.role,
            f"{self.role} cycle",
            trace_id=random.getrandbits(128) or 1,
            span_id=random.getrandbits(64) or 1,
            start=started,
            end=time.time(),
            attributes={
                "corral.based_on": self.state.seq,
                "corral.decisions": len(events),
                "corral.decided": sorted({type(e).__name__ for e in events}),
                "corral.jobs": len({j for e in events for j in routing.job_ids(e)}),
            },
            links=list(links.values()),
            error=f"{type(error).__name__}: {error}" if error is not None else "",
        )

    # -- running --------------------------------------------------------------------------------

    def _wait_s(self) -> float:
        """How long ``run`` waits for the log before another cycle: a tick, or, when the cadence
        deferred the last one, until the cadence allows it."""
        if self._deferred:
            return max(0.0, min(self.tick, self._next_cycle_at - self.monotonic()))
        return self.tick

    async def run(self, stop: asyncio.Event) -> None:
        """Fold and decide until ``stop`` is set; then finish the current cycle and return."""
        logs.set_role(self.role)
        self.telemetry = metrics.current()
        if self.telemetry is not None:
            self.telemetry.watch_service(self)
        await self.restore()
        await self.cycle()
        await self.post_status()
        await self._hand_spans()
        batches = self.log.follow(self.state.seq + 1)
        stopping: asyncio.Future[object] = asyncio.ensure_future(stop.wait())
        nxt: asyncio.Future[object] = asyncio.ensure_future(anext(batches))
        try:
            while not stop.is_set():
                done, _ = await asyncio.wait(
                    {nxt, stopping}, timeout=self._wait_s(), return_when=asyncio.FIRST_COMPLETED
                )
                if nxt in done:
                    self.fold(nxt.result())  # type: ignore[arg-type]
                    nxt = asyncio.ensure_future(anext(batches))
                if stop.is_set():
                    break
                await self.cycle()
                await self.post_status()
                await self._hand_spans()
                await self._maybe_snapshot()
        finally:
            nxt.cancel()
            stopping.cancel()
            await asyncio.gather(nxt, stopping, return_exceptions=True)
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if self.snapshots is not None and self.state.seq > self._snapshot_seq:
                await self._save_snapshot()
            if self.lease is not None:
                if self.lease.held:
                    await self._hand_spans(stopping=True)  # the next holder resumes after it
                await self.lease.release()
            if self.status is not None:
                await self.status.withdraw()
            if self.telemetry is not None:
                self.telemetry.forget_service(self)


def stop_on_signals() -> asyncio.Event:
    """An event set on SIGTERM or SIGINT, so a service drains and closes instead of dying."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
