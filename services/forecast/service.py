"""The forecast role's shell: fold the log, forecast every waiting job's start when the state
moved, write each tenant's forecasts into the bucket ``corral_forecasts``, and answer what-if
questions on ``corral.read.<tenant>.whatif``.

It runs under a lease like the assignments service (``corral serve forecast``; ``corral up`` runs
one): one replica writes the bucket, the others fold and stand by. What-if questions are answered
by every replica (a queue group: each question once), since each holds the folded state. It
appends nothing to the log.

The simulation runs in a worker thread on a copy of the state, and no cycle waits for it, so
the loop goes on folding, renewing the lease and answering while it runs (the simulation, in
Python, gives the interpreter's lock up every few milliseconds); one forecast at a time, the
next from the state folded by then. The loop encodes the state once per log position
(``_Frozen``), for the forecast and every what-if asked there; each decodes its own copy in its
thread. A decode is one call that holds the interpreter's lock throughout (0.33 s at 36,000
jobs), so each question still costs the loop a pause that long: what bounds a tenant's cost is
how many of its questions run at once and how much simulation it has used lately.

Invariants:

- a tenant's key holds only that tenant's jobs (``decide.values``), and a tenant with none
  waiting has no key (purged, also by the replica that takes the lease);
- a what-if answer goes only into the asker's own inbox (``_INBOX.corral.<asker>.``), as the read
  service's do; a question naming any other reply subject is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import nats.errors

from corral.events.base import Event
from corral.events.log import EventLog
from corral.events.nats_client import heard
from corral.projections.state import State
from corral.services.forecast.decide import ROLE as ROLE
from corral.services.forecast.decide import WHATIF, Spent, due, rest_after, values, waiting, whatif_answer
from corral.services.runtime import identities
from corral.services.runtime.answers import as_of
from corral.services.runtime.forecasts import ForecastStore, encode
from corral.services.runtime.lease import Lease
from corral.services.runtime.shell import Service
from corral.services.sim import eta
from corral.services.sim.driver import SimConfig

log = logging.getLogger("corral.forecast")

_encode = msgspec.json.Encoder().encode


# What-if questions answered at once, in all and per asker: each copies the state and simulates
# in a thread beside the services, so a tenant asking in a loop must not slow the cluster; one
# more is answered at once that the role is busy (``Busy``), and may be asked again.
MAX_WHATIFS = 4
MAX_WHATIFS_PER_ASKER = 2
# ... and the simulation they use over time (``runtime.spent.Spent``): an asker keeps up a twentieth of
# a core, after 20 s at once (one question's whole budget, ``whatif.BUDGET_S``); all askers
# together a quarter of one, after 40 s. One asker's questions on a deep backlog held a core of
# ``corral up`` and made everyone's submits 25 times slower.
WHATIF_SHARE, WHATIF_MOST_S = 0.05, 20.0
WHATIF_SHARE_ALL, WHATIF_MOST_ALL_S = 0.25, 40.0

# Forecasts decide at most every 10 simulated seconds, not at every simulated event: a start is
# told to the minute, and a forecast of a deep backlog costs far fewer decisions so.
FORECAST = SimConfig(cycle_s=10.0)


def _decide_nothing(state: State, now: float) -> list[Event]:
    return []  # what it writes goes to the bucket, not the log: ``ForecastService.cycle``


_thaw = msgspec.msgpack.Decoder(State).decode


class _Frozen:
    """The state encoded at the log position it was folded to: what a copy is decoded from."""

    def __init__(self) -> None:
        self.seq = -1
        self.data = b""

    def at(self, state: State) -> bytes:
        """``state``'s encoding, made anew only if the log moved since the last one."""
        if state.seq != self.seq or not self.data:
            self.data, self.seq = msgspec.msgpack.encode(state), state.seq
        return self.data

    def let_go(self) -> None:
        """Nothing decodes from it now: not held between forecasts (it is as large as the
        state)."""
        self.data, self.seq = b"", -1


class ForecastService(Service):
    def __init__(
        self,
        log_: EventLog,
        store: ForecastStore,
        *,
        lease: Lease | None = None,
        clock: Callable[[], float] | None = None,
        tick: float = 1.0,
        **options: Any,
    ) -> None:
        if clock is not None:
            options["clock"] = clock
        super().__init__(ROLE, _decide_nothing, log_, tick=tick, lease=lease, **options)
        self.store = store
        self.last_seq = -1
        self.last_at: float | None = None  # None: forecast at the next cycle (also after taking the lease)
        self.rest_until = -math.inf  # no forecast before (``decide.rest_after``)
        # Tenants whose key holds a forecast: those written since taking the lease, and the
        # bucket's keys when it was taken (``_listed``), so that a tenant with none waiting any
        # more has its key purged, whoever wrote it.
        self.tenants: set[str] = set()
        self._listed = False
        self.forecasts = 0
        self.calibration = eta.Calibration()
        self._counted: set[str] = set()  # succeeded jobs already in the calibration
        self.whatifs = 0
        self.whatifs_refused = 0  # answered at once that the role was busy
        self._answering: set[asyncio.Task[None]] = set()
        # Set once the server has the what-if subscription (after ``caught_up``): ``corral up``
        # says it is ready only then, else a what-if asked at once found nobody to answer it.
        self.answering = asyncio.Event()
        self._asking: dict[str, int] = {}  # asker -> questions of theirs being answered
        self._running: asyncio.Task[None] | None = None  # the forecast under way
        self._stopping = threading.Event()  # tells a forecast's thread to give up
        self._frozen = _Frozen()
        self._spent = Spent(WHATIF_SHARE, WHATIF_MOST_S, WHATIF_SHARE_ALL, WHATIF_MOST_ALL_S)

    async def cycle(self) -> int:
        """Start a forecast when one is due and none is running; it writes when done. The cycle
        never waits for it: the loop goes on folding and renewing the lease meanwhile, however
        long a deep backlog takes to forecast."""
        now = self.now()
        if not self.supervision.may_decide(now):
            return 0
        if self.lease is not None and not await self.lease.hold():
            self.last_at = None  # whoever takes the lease over writes at once (its rest over)
            self._listed = False  # and reads the bucket's keys again when it does
            return 0
        if self._running is not None and not self._running.done():
            return 0
        state = self.state
        if not due(self.last_seq, self.last_at, state.seq, now, self.rest_until):
            return 0
        for job_id, estimate, ran, tenant in eta.finished(state, self._counted):
            self.calibration.saw(estimate, ran, tenant)
            self._counted.add(job_id)
        self._counted &= set(state.jobs_by_phase.get("succeeded", ()))  # the fold let the others go
        self.last_seq, self.last_at = state.seq, now
        try:
            frozen = self._frozen.at(state)
        except Exception as e:  # noqa: BLE001 - supervised as every service's cycle is
            await self._failed(e, now)
            return 0
        self._running = asyncio.create_task(self._forecast(frozen, now))
        self._running.add_done_callback(lambda _: self._let_go_if_idle())
        return 0

    def _band(self, frozen: bytes, now: float) -> tuple[State, dict[str, tuple[float, float, float]]]:
        began = time.thread_time()
        try:
            copy = _thaw(frozen)
            bands = eta.band(
                copy, now, FORECAST, waiting(copy), eta.HORIZON_S, self.calibration, self._stopping.is_set
            )
        finally:
            # Its own CPU, not the time it took: threads beside it (what-ifs, the loop) are not
            # its cost. The clock is the one ``cycle`` reads.
            self.rest_until = rest_after(self.now(), time.thread_time() - began)
        return copy, bands

    async def _forecast(self, frozen: bytes, now: float) -> None:
        try:
            copy, bands = await asyncio.to_thread(self._band, frozen, now)
            if not self._listed:  # the keys another writer, or this one before, left
                try:
                    self.tenants |= await self.store.tenants()
                    self._listed = True
                except Exception as e:  # noqa: BLE001 - the forecasts go out all the same
                    log.warning("forecast: the bucket's keys not listed, will retry: %s", e)
            written = values(copy, bands, now, self.tenants)
        except eta.Cancelled:
            return  # stopping
        except Exception as e:  # noqa: BLE001 - supervised as every service's cycle is
            await self._failed(e, now)
            return
        self.supervision.succeeded()
        self.forecasts += 1
        if self.lease is not None and not self.lease.held:
            return  # another replica writes now
        results = await asyncio.gather(
            *(
                self.store.put(tenant, encode(v)) if v.jobs else self.store.remove(tenant)
                for tenant, v in written.items()
            ),
            return_exceptions=True,
        )
        kept = set()
        for (tenant, v), result in zip(written.items(), results, strict=True):
            if isinstance(result, BaseException):
                log.warning("%s: forecast not written, will retry: %s", tenant, result)
                self.last_at = None
                kept.add(tenant)
            elif v.jobs:
                kept.add(tenant)
        self.tenants = kept

    # -- what-if ----------------------------------------------------------------------------------

    async def _on_whatif(self, msg: Any) -> None:
        parsed = identities.parse_read(msg.subject)
        if parsed is None or parsed[1] != WHATIF:
            return
        asker = parsed[0]
        if not msg.reply.startswith(identities.inbox_prefix(asker) + "."):
            log.debug("dropped a what-if of %s whose answer would go to %r", asker, msg.reply)
            return
        mine = self._asking.get(asker, 0)
        if mine >= MAX_WHATIFS_PER_ASKER or len(self._answering) >= MAX_WHATIFS:
            self.whatifs_refused += 1
            why = (
                f"busy: {mine} what-if questions of yours are being answered; ask again once they are"
                if mine >= MAX_WHATIFS_PER_ASKER
                else f"busy: {len(self._answering)} what-if questions are being answered; ask again shortly"
            )
            await self._reply(msg.reply, {"seq": self.state.seq, "error": why, "busy": True})
            return
        wait = self._spent.wait_s(asker, time.monotonic())
        if wait > 0.0:
            self.whatifs_refused += 1
            why = f"busy: what-if questions used their share of the role's time; ask again in {wait:.0f} s"
            told = {"seq": self.state.seq, "error": why, "busy": True, "retry_s": round(wait, 3)}
            await self._reply(msg.reply, told)
            return
        self._asking[asker] = mine + 1
        task = asyncio.create_task(self._answer(msg.reply, asker, msg.data))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        task.add_done_callback(lambda _: self._answered(asker))

    def _answered(self, asker: str) -> None:
        left = self._asking.get(asker, 0) - 1
        if left > 0:
            self._asking[asker] = left
        else:
            self._asking.pop(asker, None)
        self._let_go_if_idle()

    def _let_go_if_idle(self) -> None:
        """Let the state's encoding go once no forecast runs and no what-if is answered: told by
        the end of each (a done callback), as a forecast still writing the bucket is not done,
        and a what-if ended meanwhile would otherwise leave it held till the next question."""
        if (self._running is None or self._running.done()) and not self._answering:
            self._frozen.let_go()

    async def _answer(self, reply: str, asker: str, data: bytes) -> None:
        now = self.now()
        used = [0.0]

        def answer(frozen: bytes, errors: eta.Errors | None) -> dict[str, Any]:
            began = time.thread_time()
            try:
                return whatif_answer(_thaw(frozen), asker, data, now, errors)
            finally:
                used[0] = time.thread_time() - began

        try:
            frozen, errors = self._frozen.at(self.state), self.calibration.errors()
            told = await asyncio.to_thread(answer, frozen, errors)
        except Exception as e:  # noqa: BLE001 - one bad question must not take the role down
            log.exception("what-if of %s failed", asker)
            told = {"seq": self.state.seq, "error": f"what-if failed: {type(e).__name__}"}
        finally:
            self._spent.charge(asker, used[0], time.monotonic())
        self.whatifs += 1
        await self._reply(reply, told)

    async def _reply(self, reply: str, told: dict[str, Any]) -> None:
        nc = getattr(self.log, "nc", None)
        if nc is None:
            return
        # A what-if runs on what was folded: while the log cannot be read on, it says as of
        # when, as the read service's answers do.
        stalled = getattr(self.log, "stalled", None)
        stall = stalled() if stalled is not None else None
        body = _encode(as_of(told, stall))
        if len(body) > nc.max_payload:
            too_big = {"seq": told.get("seq"), "error": "the answer is more than NATS carries"}
            body = _encode(as_of(too_big, stall))
        try:
            await nc.publish(reply, body)
        except nats.errors.Error as e:
            log.warning("could not answer on %s: %s", reply, e)

    async def run(self, stop: asyncio.Event) -> None:
        """Fold, forecast and answer until ``stop`` is set. What-if questions are taken once the
        log has been folded to where it stood at start."""
        nc = getattr(self.log, "nc", None)
        sub = None

        async def listen() -> None:
            nonlocal sub
            await self.caught_up.wait()
            if nc is not None:
                subject = identities.read_subject("*", WHATIF)
                sub = await nc.subscribe(subject, queue=ROLE, cb=self._on_whatif)
                # Never raises: nothing awaits this task before the role stops, and ``corral
                # up`` would wait for ``answering`` for ever.
                await heard(nc, "what-if")
            self.answering.set()

        listening = asyncio.create_task(listen())
        # Whether the stream has a leader, for answers to say when they may be stale (``_reply``).
        watch = getattr(self.log, "watch_leader", None)
        leader = asyncio.create_task(watch(), name="forecast-stream-leader") if watch is not None else None
        try:
            await super().run(stop)
        finally:
            self._stopping.set()
            listening.cancel()
            if leader is not None:
                leader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await leader
            if sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
            running = [self._running] if self._running is not None else []
            for task in [*self._answering, *running]:
                task.cancel()
            await asyncio.gather(listening, *self._answering, *running, return_exceptions=True)


def service(log_: EventLog, store: ForecastStore, **options: Any) -> ForecastService:
    """The service on ``log_`` writing to ``store``; ``options`` go to ``Service`` (clock, tick,
    snapshots, lease, status)."""
    return ForecastService(log_, store, **options)
