"""The health monitor's service: heartbeats from core NATS, facts into the log only on change.

It subscribes to ``corral.hb.*`` and records each heartbeat in a ``HeartbeatTracker`` under the
node its subject names (NATS permissions let an agent publish only its own node's subject, so a
payload naming another node is ignored), stamped with this monitor's receive time: an agent's
own clock is never trusted. It folds the log like every service, and tells the tracker every node
fact the fold accepted (registrations, conditions, GPU health, cordons, an admin's cordon
request), so that the tracker's idea of the log is the log's. Once every ``tick``, and at once
after a batch that folded a node fact, ``evaluate`` turns silences and signals into
``NodeConditionChanged``, ``GpuHealthChanged`` and ``NodeCordoned`` on
``corral.ev.node.<node>``, each once. A batch of job records changes nothing it reads: it is not
evaluated on (an evaluation visits every node, and a busy log brings many batches a tick).

The shell is ``services.runtime.shell.Service``: appends are pipelined, and the monitor does not evaluate
again until its own last appends are folded, so it never states a fact twice from a stale view.
Like the decision services it may run as several replicas (``corral serve health``): each
listens to every heartbeat and folds the log, and only the holder of the ``health`` lease
states facts; a standby's tracker is as current, so it takes over where the holder stopped.

A monitor whose process did not run for a while (stopped, a VM paused, starved) has heard
nothing meanwhile: the heartbeats sent then wait unread in its connection, and every node looks
silent for as long as it stood still. An evaluation that comes ``STALL_TICKS`` ticks or more
after the monitor last ran (a cycle ended, a heartbeat was read) is put off by a tick, once, so
that it reads what waited first: a monitor stopped while it waited for its lease's renewal went
on, once resumed, to state every node lost.

Its time is its own clock, not log time: what it measures is silences between heartbeats it
received itself, which are not in the log, so a receive time is only ever compared with
another receive time of the same host, on a clock no step of the wall clock moves
(``time.monotonic``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.heartbeats import Heartbeat
from corral.events.log import EventLog, Record
from corral.events.nodes import GpuHealthChanged, NodeCordoned, WorkerExited
from corral.projections.fold import apply, collector_paused
from corral.projections.state import State
from corral.services.health.decide import HeartbeatTracker
from corral.services.runtime import heap
from corral.services.runtime.lease import Lease
from corral.services.runtime.shell import Service
from corral.services.runtime.status import StatusBoard

log = logging.getLogger("corral.health")

ROLE = "health"

HEARTBEATS = subjects.heartbeat("*")
_NODE_EVENTS = subjects.node("")
_CORDON = subjects.admin("cordon")
_DELETE = subjects.admin("delete-node")
_decode_heartbeat = msgspec.json.Decoder(Heartbeat).decode
STALL_TICKS = 3  # ticks without running after which an evaluation first reads what waited


class HealthMonitor(Service):
    def __init__(
        self,
        log_: EventLog,
        nc: Client,
        *,
        tracker: HeartbeatTracker | None = None,
        clock: Callable[[], float] = time.time,
        tick: float = 1.0,
        lease: Lease | None = None,
        status: StatusBoard | None = None,
        receive_clock: Callable[[], float] | None = None,
    ) -> None:
        """``nc``: a NATS connection to subscribe to heartbeats on (``JetStreamLog.nc``).
        ``receive_clock``: what heartbeats' receive times and silences are read on, a clock no
        step of the wall clock moves (``time.monotonic``; ``clock`` where one is given): a
        step forward of a minute marked every node lost, and one back hid a node gone silent."""
        self.tracker = tracker if tracker is not None else HeartbeatTracker()
        super().__init__(ROLE, self._evaluate, log_, clock=clock, tick=tick, lease=lease, status=status)
        if receive_clock is None:
            receive_clock = time.monotonic if clock is time.time else clock
        self.receive_clock = receive_clock
        self.nc = nc
        self.heartbeats = 0  # received and recorded
        # What ``evaluate`` reads is heartbeats, node facts and the clock, not the log position:
        # it runs once a tick (silences grow, heartbeats arrive), and at once when a node fact
        # was folded since it last ran (``settled``).
        self._evaluated_at = -math.inf
        self._facts_folded = True
        # When this process last ran (a cycle ended, a heartbeat was read), and whether the
        # last evaluation was put off for a stall (``_evaluate``).
        self._awake_at = -math.inf
        self._put_off = False

    def _evaluate(self, state: State, now: float) -> list[Event]:
        at = self.receive_clock()
        if at - self._awake_at >= STALL_TICKS * self.tick and not self._put_off:
            # Stopped meanwhile: what was sent to it since waits unread. Once, not again at
            # the next tick, so that a monitor slow at every tick still evaluates.
            log.warning(
                "%s did not run for %.1f s: evaluating the nodes once it has read what waited",
                self.producer,
                at - self._awake_at,
            )
            self._put_off = True
            self._evaluated_at = at
            return []
        self._put_off = False
        self._evaluated_at, self._facts_folded = at, False
        events = self.tracker.evaluate(at)
        for n, times in self.tracker.take_notices():
            if not n.signal:
                log.warning("node %s: %d more notices, not shown", n.node, times)
            elif times == 1:
                log.warning("node %s GPU %s: %s (%s)", n.node, n.gpu, n.signal, n.action)
            else:
                log.warning("node %s GPU %s: %s (%s), %d times", n.node, n.gpu, n.signal, n.action, times)
        for ev in events:
            if isinstance(ev, NodeCordoned) and ev.cordoned and not ev.drain:
                # A quarantine: its reason is in the log alone, and the node stays out of
                # placement until a person lifts the cordon.
                log.warning(
                    "node %s cordoned: %s; `corral node uncordon %s` once repaired",
                    ev.node,
                    ev.reason,
                    ev.node,
                )
        return events

    def settled(self, now: float) -> bool:
        """No node fact folded since the last evaluation, and less than a tick since it (a tenth
        of a tick spared for the loop's timer, so a quiet log is evaluated every tick)."""
        return not self._facts_folded and self.receive_clock() - self._evaluated_at < self.tick * 0.9

    def fold(self, batch: list[Record]) -> None:
        state = self.state
        spans = self.traces
        with collector_paused():
            for r in batch:
                rejected = state.rejected_total
                apply(state, r)
                if spans is not None:
                    spans.folded(state, r, rejected)
                if state.rejected_total != rejected:
                    # The fold refused it: it changed nothing the tracker should know, unless it
                    # was a GPU verdict of ours judged on GPUs the node no longer has where they
                    # were: the tracker reads what the log says of them again.
                    void = bool(state.rejections) and state.rejections[-1].code == "void"
                    if void and r.subject.startswith(_NODE_EVENTS):
                        body = codec.decode_body(r.subject, r.data, r.headers).body
                        if isinstance(body, GpuHealthChanged):
                            self.tracker.adopt(body.node, state)
                            self._facts_folded = True
                    continue
                if r.subject.startswith(_NODE_EVENTS) or r.subject in (_CORDON, _DELETE):
                    body = codec.decode_body(r.subject, r.data, r.headers).body
                    if isinstance(body, WorkerExited) and body.node_fault:
                        # A start its node failed: a node that fails them in a row is cordoned.
                        ns = state.nodes.get(body.node)
                        count = len(ns.start_faults) if ns is not None else 0
                        if self.tracker.start_faults(body.node, count, body.node_fault):
                            self._facts_folded = True
                    if isinstance(body, WorkerExited) and body.xids:
                        # A worker's exit may have failed a GPU it died of: the tracker reads it.
                        self.tracker.adopt(body.node, state)
                        self._facts_folded = True
                    elif self.tracker.observe(body, self.receive_clock()):
                        self._facts_folded = True
        heap.settle()  # what the batch folded lives long: no full collection walks it

    async def restore(self) -> None:
        await super().restore()
        self._awake_at = at = self.receive_clock()
        self.tracker.sync(self.state, at)

    async def cycle(self) -> int:
        try:
            return await super().cycle()
        finally:
            self._awake_at = self.receive_clock()

    def _on_heartbeat(self, subject: str, data: bytes) -> None:
        node = subject.rsplit(".", 1)[-1]
        try:
            beat = _decode_heartbeat(data)
        except codec.UNREADABLE:
            log.warning("unreadable heartbeat on %s", subject)
            return
        if beat.node != node:
            log.warning("heartbeat on %s names node %s: ignored", subject, beat.node)
            return
        self._awake_at = at = self.receive_clock()
        self.tracker.record(node, at, beat)
        self.heartbeats += 1
        if self.lease is not None and not self.lease.held:
            self.tracker.take_notices()  # the holder logs them; a standby's would only pile up

    async def run(self, stop: asyncio.Event) -> None:
        async def on_message(msg: Msg) -> None:
            self._on_heartbeat(msg.subject, msg.data)

        sub = await self.nc.subscribe(HEARTBEATS, cb=on_message)
        try:
            await super().run(stop)
        finally:
            if not self.nc.is_closed:
                await sub.unsubscribe()
