"""The node agent's service: one per node, the async shell around ``decide`` and ``Runtime``.

It registers its node (NVML discovery, or a simulated inventory) and watches its node's view
(``NodeView``: its node's assignments, which the assignments service derives from the log and
keeps in the ``corral_assignments`` bucket; ``services/runtime/views.py``). It does not read the
log: its start-up and memory are its node's, not the log's. On every new view (and every
``tick``) it asks ``decide`` what its node must start, checkpoint and stop; the runtime carries
that out with real processes, and its reports become ``WorkerStarted`` / ``WorkerExited`` /
``CheckpointCompleted`` on ``corral.ev.node.<node>``, appended through the intake (``intake.py``:
the agent may not write the log itself). Beside the log it publishes a heartbeat on
core NATS (``corral.hb.<node>``) every interval, with the health and load of its GPUs and the XID
errors seen since the last one.

Invariants:

- Only what the fold accepted runs: the view is one pure function of the folded state
  (``projections.assignments.node_view``), which holds placements, never proposals, so a voided
  placement starts nothing.
- A view lags the log; ``decide`` is written for that: a worker whose exit the view does not show
  yet is kept (as exited) until it does, so nothing is started twice.
- Reports are appended in the order the runtime made them, each of a job once the one before it
  is stored (the jobs side by side), with a deterministic message id
  (``started:<job>:<attempt>:<rank>``, ``exited:…``, ``checkpoint:<job>:<attempt>:<step>``): an
  append retried after a lost acknowledgement is stored once. One whose append failed is kept
  with its job's later reports, in order, and they are sent again on the next cycle: pipelined,
  a later report could be stored while an earlier one failed, and a checkpoint retried after its
  worker's exit was lost. One the log refuses for what it is (too large) is dropped, logged and
  counted: kept, it would hold back its job's reports for good. Past its node's rate the intake
  says when to send again (``RetryLater``): every report waits, in order, until then.
- A gang whose job has restarted before starts only after its restart backoff (counted from its
  placement); a gang whose ranks on other nodes do not all start within ``gang_timeout`` is
  stopped here, so the fold restarts it whole.
- Workers outlive their agent. Each runs under a keeper of its own (``keeper.py``) that
  records it by pid and start time and writes its exit; an agent starting on a work directory
  takes back every worker whose keeper still runs and reports, once, the exits of those that
  ended while no agent watched (``Runtime.reattach``).
- Three ways to end: ``run(stop)`` with ``stop`` set stops every worker and reports their exits
  (``corral up`` stopping the whole corral), after a ``NodeShutdown`` that tells the fold the
  stops are the operator's, not the jobs' failures (their jobs requeue, no restart counted);
  ``leave()`` ends the agent and leaves its workers running, writing nothing that would charge
  their jobs (an agent restart: ``corral serve agent`` on SIGTERM); ``crash()`` is a node
  dying: no heartbeat, no report, every worker killed at once. An agent that stays away past
  the lost-node timeout has its node declared lost by the health monitor, as any silent node:
  its jobs move on, and when it comes back the workers it took back are stopped as superseded.
  Tests use ``crash`` (and ``pause_heartbeats``, ``inject_xid``, ``kill_worker``) to play
  failures on a live cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from corral.events import codec, routing, subjects
from corral.events.base import Event
from corral.events.heartbeats import GpuHealthSample, Heartbeat, XidReport
from corral.events.log import Ack, Append, LogError, RetryLater, UnstorableError
from corral.events.nodes import (
    REPORT_IDS,
    CheckpointCompleted,
    NodeInventory,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
    agent_producer,
)
from corral.projections import trace_ids, xids
from corral.projections.assignments import NodeView
from corral.projections.rules import RULES
from corral.services.agent import discovery
from corral.services.agent.decide import (
    STOP_GRACE,
    UNKILLABLE_S,
    Exited,
    Report,
    Started,
    StartGang,
    WorkerKey,
    decide,
    report_events,
)
from corral.services.agent.discovery import Discovery, NvmlGpus
from corral.services.agent.output import OutputSink, Shipper
from corral.services.agent.worker import job_logs, log_path
from corral.services.agent.workers import Runtime, SandboxMode, restart_backoff
from corral.services.runtime import logs
from corral.services.runtime.clock import LogClock
from corral.services.runtime.views import NodeViews
from corral.services.runtime.worker_spans import WorkerSpans

log = logging.getLogger("corral.agent")

# How far back a failed worker's exit looks for XIDs on its GPUs: the driver reports the fault
# as it happens, the process dies of it moments later. And how many of the latest are kept.
XID_WINDOW = 60.0
_XIDS_KEPT = 256

# Free space under which a work or checkpoint directory is too full to start workers in: a
# worker's record, keeper files, log and first checkpoint go there, and a start that cannot write
# them fails and is charged to its job. The heartbeat then says so, and the node takes no work.
MIN_FREE_BYTES = 16 << 20
SPACE_WAIT_S = 1.0  # the longest a heartbeat waits to hear how much space is free


def short_of_space(paths: Sequence[Path | str], least: int = MIN_FREE_BYTES) -> str:
    """Why workers cannot be started under ``paths`` for lack of space ("" if they can)."""
    for p in dict.fromkeys(str(p) for p in paths):
        try:
            free = shutil.disk_usage(p).free
        except OSError:
            continue  # not made yet, or gone: the start says what is wrong with it
        if free < least:
            return f"{p} has {free >> 20} MiB free, under the {least >> 20} MiB a worker's start needs"
    return ""


Publish = Callable[[str, bytes], Awaitable[None]]


class Reports(Protocol):
    """Where an agent's reports are appended: the intake (``intake.IntakeReports``), or in a
    test any ``EventLog``."""

    async def append(self, item: Append) -> Ack: ...


def _job_of(body: Event) -> str | None:
    """The job a report is of; None for a node's own fact (its shutdown), which orders all."""
    job_id = getattr(body, "job_id", None)
    return job_id if isinstance(job_id, str) else None


def msg_id(body: Event, run: int = 0) -> str:
    """The deterministic message id of a node event: the same fact appended twice is stored once.
    A worker's start and exit name its pid: a rank an elastic job shrank away from and grew back
    runs again in the same attempt, and that run's start is a new fact. A job's facts name its
    ``run`` (``Assignment.run``, the log position of its submission; 0: not known): a job id used
    again once its job was let go has attempts, ranks and checkpoint steps of the same numbers,
    which are other facts, not duplicates of the earlier run's (a worker that starts no process
    reports no pid)."""
    kind = REPORT_IDS.get(type(body))
    if kind is None:
        raise ValueError(f"a node agent does not write {type(body).__name__}")
    of = f"@{run}" if run else ""
    match body:
        case WorkerStarted() | WorkerExited():
            pid = f":{body.pid}" if body.pid else ""
            return f"{kind}{body.job_id}{of}:{body.attempt}:{body.rank}{pid}"
        case CheckpointCompleted():
            return f"{kind}{body.job_id}{of}:{body.attempt}:{body.step}"
        case NodeRegistered():  # ``run``: the log position of the node's view it registers against
            return f"{kind}{body.node}{of}:{zlib.crc32(codec.encode(body.inventory)):08x}"
        case NodeShutdown():
            return f"{kind}{body.node}:{round(body.at * 1000)}"
    raise ValueError(f"a node agent does not write {type(body).__name__}")


# -- GPU health ------------------------------------------------------------------------------------


class GpuWatch(Protocol):
    """Where heartbeats get GPU health from: NVML on a GPU node, a simulation elsewhere."""

    async def sample(self, used_milli: Sequence[int]) -> tuple[GpuHealthSample, ...]: ...

    def take_xids(self) -> tuple[XidReport, ...]: ...

    def inject_xid(self, gpu: int, xid: int) -> None: ...

    async def close(self) -> None: ...


class SimulatedGpus:
    """A simulated node's GPUs: all well and as busy as the fold says, unless a test injects an
    XID (sent with the next heartbeat) or a faulty counter (``fault(gpu, ecc_uncorrected=1)``)."""

    def __init__(self, inventory: NodeInventory) -> None:
        self._gpus = inventory.gpus
        self._xids: list[XidReport] = []
        self._faults: dict[int, dict[str, Any]] = {}

    async def sample(self, used_milli: Sequence[int]) -> tuple[GpuHealthSample, ...]:
        out = []
        for g in self._gpus:
            used = used_milli[g.index] if g.index < len(used_milli) else 0
            sample = GpuHealthSample(
                index=g.index,
                uuid=g.uuid,
                ecc_uncorrected=0,
                ecc_corrected=0,
                nvlinks_active=g.nvlinks,
                utilisation_pct=used // 10,
                memory_used_mib=g.memory_mib * used // 1000,
            )
            fault = self._faults.get(g.index)
            out.append(msgspec.structs.replace(sample, **fault) if fault else sample)
        return tuple(out)

    def take_xids(self) -> tuple[XidReport, ...]:
        out, self._xids = tuple(self._xids), []
        return out

    def inject_xid(self, gpu: int, xid: int) -> None:
        uuid = self._gpus[gpu].uuid if 0 <= gpu < len(self._gpus) else ""
        self._xids.append(XidReport(gpu=gpu, xid=xid, uuid=uuid))

    def fault(self, gpu: int, **fields: Any) -> None:
        """Make GPU ``gpu``'s samples carry ``fields`` (e.g. ``remap_pending=True``); no fields
        clears it."""
        if fields:
            self._faults[gpu] = fields
        else:
            self._faults.pop(gpu, None)

    async def close(self) -> None:
        return None


class NvmlWatch:
    """Real GPUs through NVML: samples read in a worker thread (NVML calls may block), XID events
    waited for in a thread of their own."""

    def __init__(self, nvml: Any) -> None:
        self._gpus = NvmlGpus(nvml)
        self._lock = threading.Lock()
        self._xids: list[XidReport] = []
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if self._gpus.watch_xids():
            self._thread = threading.Thread(target=self._watch, name="nvml-xid", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._closed.is_set():
            x = self._gpus.wait_xid(500)
            if x is not None:
                with self._lock:
                    self._xids.append(x)

    async def sample(self, used_milli: Sequence[int]) -> tuple[GpuHealthSample, ...]:
        return await asyncio.to_thread(self._gpus.health)

    def take_xids(self) -> tuple[XidReport, ...]:
        with self._lock:
            out, self._xids = tuple(self._xids), []
        return out

    def inject_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._xids.append(XidReport(gpu=gpu, xid=xid, uuid=self._gpus.uuid_of(gpu)))

    async def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)
        self._gpus.close()


def gpu_watch(found: Discovery) -> GpuWatch:
    if found.source == "nvml":
        module = discovery.load_nvml()
        if module is not None:
            return NvmlWatch(module)
    return SimulatedGpus(found.inventory)


# -- the agent -------------------------------------------------------------------------------------


class NodeAgent:
    """The agent of node ``node``. ``run(stop)`` until ``stop`` is set: then every worker is
    stopped (SIGTERM, SIGKILL after ``stop_grace``) and its exit reported; or until ``leave``,
    which leaves them running for the next agent on ``work_dir``."""

    role = "agent"

    def __init__(
        self,
        node: str,
        log_: Reports,
        views: NodeViews,
        *,
        work_dir: str | Path,
        checkpoint_root: str | Path | None = None,
        found: Discovery | None = None,
        gpus: GpuWatch | None = None,
        publish: Publish | None = None,
        output: OutputSink | None = None,
        clock: Callable[[], float] = time.time,
        tick: float = 0.5,
        heartbeat_interval: float = 5.0,
        sandbox: SandboxMode = "auto",
        backoff: float = 2.0,
        backoff_cap: float = 300.0,
        start_timeout: float = 120.0,
        gang_timeout: float = 300.0,
        stop_grace: float = STOP_GRACE,
        hidden: Sequence[str | Path] = (),
        worker_user: str | None = None,
        narrow_view: bool = False,
        first_view_wait: float = 5.0,
        unkillable_after: float = UNKILLABLE_S,
    ) -> None:
        """``log_``: where its reports are appended (it reads nothing there); ``views``: where it watches its
        node's view; ``found``: the node's inventory (default: NVML discovery, a simulated H100 node
        without GPUs); ``checkpoint_root``: where jobs checkpoint, shared by every node that may resume
        them (default: under ``work_dir``); ``publish``: core NATS publish for heartbeats (none: no
        heartbeats); ``output``: where its workers' output is shipped (none: it stays in their files
        only); ``hidden``: directories no sandboxed worker may see (corral's data directory:
        credentials, the log's store), besides its own work and checkpoint directories, which it
        always hides; ``worker_user``: the unprivileged host user
        workers run as (none: the agent's own); ``narrow_view``: the sandbox shows the system's directories
        and what the job runs from, not the host's whole root; ``first_view_wait``: how long it waits for
        its node's view before registering (a node the log already holds as it is now need not be announced
        again); ``unkillable_after``: how long after SIGKILL a worker still there marks its GPUs
        (``UNKILLABLE_S``)."""
        self.node = node
        self.log = log_
        self.views = views
        self.view = NodeView(node)  # nothing known until the first view arrives
        self.clock = clock
        self.log_clock = LogClock(clock)
        self.tick = tick
        self.first_view_wait = first_view_wait
        self.producer = f"{agent_producer(node)}{socket.gethostname()}:{os.getpid()}"
        self.spans = WorkerSpans(node, self._trace_of)
        self.found = found if found is not None else discovery.discover(node)
        self.gpus = gpus if gpus is not None else gpu_watch(self.found)
        # Absolute: workers run in their own working directory, and the checkpoint paths they are
        # given and report must mean the same there as here.
        self.work_dir = Path(work_dir).resolve()
        self.checkpoint_root = str(Path(checkpoint_root or self.work_dir / "checkpoints").resolve())
        # The free-space question asked in a thread (``_space``), and the last answer it gave.
        self._space_asked: asyncio.Future[str] | None = None
        self._space_said = ""
        self.runtime = Runtime(
            self.work_dir,
            sandbox=sandbox,
            mig_devices=self.found.mig_devices,
            node=self.node,
            # Its own directories too, whatever the operator names: they hold every job's
            # working directory, output and keeper, and every tenant's checkpoints (a served
            # agent's --work-dir and --checkpoint-dir lie outside any data directory named).
            hidden=[*hidden, self.work_dir, self.checkpoint_root],
            worker_user=worker_user,
            narrow_view=narrow_view,
        )
        self.reports = self.runtime.reports = _Reports(lambda: self.clock())
        self.publish = publish
        self.shipper = (
            Shipper(node, self.work_dir, output, live=self._worker_files) if output is not None else None
        )
        self.heartbeat_interval = heartbeat_interval
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.start_timeout = start_timeout
        self.gang_timeout = gang_timeout
        self.stop_grace = stop_grace
        self.unkillable_after = unkillable_after
        self.registered = asyncio.Event()
        self.stopped = asyncio.Event()
        self.heartbeats_sent = 0
        self.reports_dropped = 0  # refused by the log for what they are (``flush``)
        self._beating = True
        self._hb_seq = 0
        # XIDs taken from the GPU watch: those for the next heartbeat, and the latest seen, by
        # when, for a failed worker's exit to name (``_xids_on``).
        self._xids_unsent: list[XidReport] = []
        self._xids_seen: deque[tuple[float, XidReport]] = deque(maxlen=_XIDS_KEPT)
        self._halt = asyncio.Event()
        self._ending: Literal["stop", "leave", "crash"] = "stop"
        self._unsent: list[Event] = []
        # Past its node's rate, the intake said when to send again (the loop's clock); until
        # then ``flush`` sends nothing.
        self._held_until = 0.0
        self._starting: dict[tuple[str, int], asyncio.Task[Any]] = {}
        # The shutdown (its log position) this agent registered the node again after: once each.
        self._back_from = 0

    # -- failures a test (or an operator's drill) can play -------------------------------------

    def pause_heartbeats(self) -> None:
        self._beating = False

    def resume_heartbeats(self) -> None:
        self._beating = True

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Report XID ``xid`` on GPU ``gpu`` with the next heartbeat, as NVML would."""
        self.gpus.inject_xid(gpu, xid)

    def kill_worker(self, job_id: str, rank: int = 0, sig: signal.Signals = signal.SIGKILL) -> int:
        """Send ``sig`` to the newest attempt's worker ``rank`` of ``job_id`` here; its pid."""
        keys = [k for k in self.runtime.workers() if k.job_id == job_id and k.rank == rank]
        pid = self.runtime.pid(max(keys)) if keys else None
        if pid is None:
            raise LookupError(f"no running worker {rank} of {job_id} on {self.node}")
        os.kill(pid, sig)
        return pid

    async def crash(self) -> None:
        """Die as a node dies: heartbeats and reports stop, every worker is killed at once."""
        self._beating = False
        self._ending = "crash"
        self._halt.set()
        await self.stopped.wait()

    async def leave(self) -> None:
        """End this agent and leave its workers running, for the next agent on its work directory
        to take back: what they reported so far is appended, and nothing else (no exit, so no
        job is charged for an agent restarting)."""
        self._ending = "leave"
        self._halt.set()
        await self.stopped.wait()

    def logs(self, job_id: str, run: int | None = None) -> list[Path]:
        """This node's log files of ``job_id``'s ``run`` (None: the newest run here), oldest
        attempt first."""
        return job_logs(self.work_dir, job_id, run)

    # -- registering and heartbeats ------------------------------------------------------------

    async def register(self) -> None:
        """Announce the node, unless the log already holds this very inventory in service (not
        shut down by an agent before this one). Sent again while the intake cannot take it yet
        (none answering while a corral starts, past the node's rate, not acknowledged: the same
        message id, stored once), until stored or the agent is told to end; refused for what it
        is, raised."""
        inventory = self.found.inventory
        back_from = self._back_from = self.view.shut_down
        if self.view.inventory != inventory or back_from:
            body = NodeRegistered(node=self.node, inventory=inventory)
            # Named by the view it answers, so that it is not taken for a duplicate of an
            # earlier registration of the same hardware (before a shutdown, or before the
            # hardware changed and changed back) still in the stream's duplicate window.
            item = self._append(body, self.clock(), run=self.view.seq)
            while True:
                try:
                    await self.log.append(item)
                    break
                except UnstorableError:
                    raise
                except LogError as e:
                    wait = e.retry_s if isinstance(e, RetryLater) else 1.0
                    log.warning("%s: registration not stored, sent again in %gs: %s", self.node, wait, e)
                    with contextlib.suppress(TimeoutError):  # the wait is cancelled, not left behind
                        await asyncio.wait_for(self._halt.wait(), wait)
                    if self._halt.is_set():
                        return
        self.registered.set()

    def _registered_again(self, task: asyncio.Task[None]) -> None:
        """Say why a registration after a shutdown was not stored (the node stays out of service
        until the next agent registers it)."""
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: registration after a shutdown refused: %s", self.node, task.exception())

    async def _heartbeats(self) -> None:
        subject = subjects.heartbeat(self.node)
        while True:
            if self._beating and self.publish is not None:
                beat = None
                try:
                    beat = await self._heartbeat()
                    await self.publish(subject, codec.encode(beat))
                    self.heartbeats_sent += 1
                except Exception as e:  # noqa: BLE001 - a missed heartbeat is the monitor's to judge
                    log.warning("%s: heartbeat not sent: %s", self.node, e)
                    if beat is not None:  # its XIDs that matter go with the next one
                        kept = [x for x in beat.xids if xids.xid_action(x.xid) != "ignore"]
                        self._xids_unsent[:0] = kept
                        del self._xids_unsent[:-_XIDS_KEPT]  # a long outage: the latest
            await asyncio.sleep(self.heartbeat_interval)

    async def _heartbeat(self) -> Heartbeat:
        samples = await self.gpus.sample(self.view.used_milli)
        unkillable = getattr(self.runtime, "unkillable", None)  # ``bench``'s timers cannot hang
        stuck = unkillable(self.unkillable_after) if unkillable is not None else set()
        if stuck:
            samples = tuple(
                msgspec.structs.replace(s, unkillable=True) if s.uuid in stuck else s for s in samples
            )
        # Growing across agent restarts too (the monitor drops a sequence it has seen), from the clock.
        self._hb_seq = max(self._hb_seq + 1, int(self.clock() * 1000))
        self._take_xids()
        sent, self._xids_unsent = tuple(self._xids_unsent), []
        why = await self._space()
        return Heartbeat(node=self.node, seq=self._hb_seq, gpus=samples, xids=sent, ok=not why, why=why)

    async def _space(self) -> str:
        """``short_of_space`` of the work and checkpoint directories, asked in a thread: a
        checkpoint root on a network filesystem that hangs must not stop the heartbeats (the
        node would be lost, every job on it interrupted). While a question has no answer within
        ``SPACE_WAIT_S`` the last answer stands, and no other is asked beside it."""
        asked = self._space_asked
        if asked is not None and asked.done() and not asked.cancelled() and asked.exception() is None:
            self._space_said = asked.result()  # answered since the last heartbeat stopped waiting
        if asked is None or asked.done():
            paths = (self.work_dir, self.checkpoint_root)
            asked = self._space_asked = asyncio.ensure_future(asyncio.to_thread(short_of_space, paths))
        with contextlib.suppress(TimeoutError):
            self._space_said = await asyncio.wait_for(asyncio.shield(asked), SPACE_WAIT_S)
        return self._space_said

    def _take_xids(self) -> None:
        now = self.clock()
        for x in self.gpus.take_xids():
            self._xids_unsent.append(x)
            if len(self._xids_unsent) > 2 * _XIDS_KEPT:
                del self._xids_unsent[:-_XIDS_KEPT]  # heartbeats off a long while: the latest
            if x.uuid and xids.hardware(x.xid):  # those an exit may name; an application's flood
                self._xids_seen.append((now, x))  # of XIDs does not push them out

    def _events_of(self, report: Report) -> list[Event]:
        """The node events a runtime report becomes; a failed exit names the XIDs seen on the
        worker's GPUs since it started, in the last ``XID_WINDOW`` seconds (the fold takes one
        that says the GPU is at fault for the GPU's failure, not the job's)."""
        if isinstance(report, Started):
            self.reports.started.setdefault(report.key, self.clock())  # a report not queued
        elif isinstance(report, Exited):
            started = self.reports.started.pop(report.key, -math.inf)  # re-attached: not known
            if report.code != 0 and not report.stopped:
                self._take_xids()
                return report_events(self.node, report, self._xids_on(report.key, started))
        return report_events(self.node, report)

    def _xids_on(self, key: WorkerKey, started: float) -> tuple[XidReport, ...]:
        """The XIDs seen on the worker's GPUs in the last ``XID_WINDOW`` seconds, since it
        ``started`` (one before it, on a GPU repaired since, is not its)."""
        gpus_of = getattr(self.runtime, "gpus_of", None)  # ``bench``'s timers run on no GPU
        uuids = {g.uuid for g in gpus_of(key)} if gpus_of is not None else set()
        since = max(self.clock() - XID_WINDOW, started)
        return tuple(x for at, x in self._xids_seen if at >= since and x.uuid in uuids)

    def _saw(self, view: NodeView) -> None:
        self.view = view
        self.log_clock.saw(view.time)

    def now(self) -> float:
        """This host's clock, never behind the log time of the node's newest view."""
        return self.log_clock.now()

    # -- one cycle -----------------------------------------------------------------------------

    async def cycle(self) -> int:
        """Bring the node's workers in line with the fold, then append what they reported."""
        # Log time at the least: checkpoint deadlines, restart back-offs and gang start timeouts
        # are log times, and this host's clock may lag the server's.
        now = self.now()
        workers = self.runtime.workers()
        runs = self.runtime.runs() if hasattr(self.runtime, "runs") else None
        busy = self.runtime.busy() if hasattr(self.runtime, "busy") else None
        # Before ``decide`` forgets an exited worker: its report, taken now, names its run.
        self._take_reports()
        for action in decide(self.view, workers, now, self.checkpoint_root, runs, busy):
            if isinstance(action, StartGang):
                self._start(action, now)
                continue
            try:
                await self.runtime.act(action)
            except Exception:  # noqa: BLE001 - one action failing must not take the node down
                log.exception("%s: %s failed; it is decided again next cycle", self.node, action)
        await self._gang_deadlines(now)
        # Not before the node's first view: until then ``decide`` cannot name the workers lost
        # with an earlier agent that the log still has live here (``ReportGone``), and the
        # directory of one that ran for days reads as of a worker that ended as long ago.
        sweep = getattr(self.runtime, "sweep_workdirs", None)  # ``bench``'s timers have none
        if sweep is not None and self.view.seq:
            sweep()
        return await self.flush(now)

    def _start(self, gang: StartGang, now: float) -> None:
        key = (gang.job_id, gang.attempt)
        if key in self._starting:
            return
        if not self._due(gang.job_id, now):
            return
        if self.shipper is not None:
            self.shipper.expect(log_path(self.work_dir, w.key, w.run) for w in gang.workers)
        task = asyncio.create_task(self.runtime.start_gang(gang.workers, self.start_timeout))
        self._starting[key] = task
        task.add_done_callback(lambda t: self._started(key, t))
        if self.spans.enabled:
            started, ranks = time.time(), [w.rank for w in gang.workers]
            gpus = sum(len(w.gpus) for w in gang.workers)
            task.add_done_callback(
                lambda t: self.spans.gang(gang.job_id, gang.attempt, ranks, gpus, started, t)
            )

    def _worker_files(self) -> list[Path]:
        """The files of the workers the runtime knows, which the shipper keeps reading (a
        runtime without files, ``bench``'s timers, has none)."""
        log_of = getattr(self.runtime, "log_of", lambda _: None)
        return [path for key in self.runtime.workers() if (path := log_of(key)) is not None]

    def _due(self, job_id: str, now: float) -> bool:
        """A job that failed waits out its restart backoff, counted from its placement."""
        job = self.view.job(job_id)
        if job is None or job.restarts <= 0 or job.phase != "placed":
            return True
        return now >= job.phase_since + restart_backoff(job.restarts, self.backoff, self.backoff_cap)

    def _started(self, key: tuple[str, int], task: asyncio.Task[Any]) -> None:
        self._starting.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: starting %s attempt %s failed: %r", self.node, *key, task.exception())

    async def _gang_deadlines(self, now: float) -> None:
        """A gang is running only when every rank has started: ranks here that have waited for
        the others longer than ``gang_timeout`` are stopped, and the fold restarts the gang."""
        for key, phase in self.runtime.workers().items():
            if phase != "running":
                continue
            job = self.view.job(key.job_id)
            if job is None or job.attempt != key.attempt or job.phase != "starting":
                continue
            if now - job.phase_since > self.gang_timeout:
                log.warning("%s: gang %s attempt %s did not start everywhere", self.node, *key[:2])
                await self.runtime.stop(key, STOP_GRACE)

    async def flush(self, now: float | None = None, *, patient: bool = False) -> int:
        """Append the runtime's reports as node events: each job's in order, each once the one
        before it is stored, the jobs side by side; a node's own fact (its shutdown) after all
        before it, before all after it. A job's report that failed is kept with the job's later
        ones, and with everything after the next node fact. This is the queue's only reader, so
        reports keep the order the runtime made them in. Returns how many were appended (or
        dropped for good). Told to send again later (past the node's rate), it sends nothing
        until then; ``patient`` (the last flushes, bounded by their caller) waits for it, and
        again while it is told to, instead."""
        self._take_reports()
        if not self._unsent:
            return 0
        loop, done = asyncio.get_running_loop(), 0
        while True:
            wait = self._held_until - loop.time()
            if wait > 0:
                if not patient:
                    return done
                await asyncio.sleep(wait)
            done += await self._flush(now)
            if not (patient and self._unsent and self._held_until > loop.time()):
                return done

    async def _flush(self, now: float | None) -> int:
        if not self._unsent:
            return 0
        now = self.clock() if now is None else now
        bodies = self._unsent
        if self.shipper is not None:
            # What a worker printed reaches the output stream before the log says it ended, so
            # whoever waited for the job to end and then reads its output finds all of it.
            # The runtime knows each worker's file (its job's run; one an older agent started
            # may write elsewhere); a runtime without files (``bench``'s timers) has none.
            log_of = getattr(self.runtime, "log_of", lambda _: None)
            ended = [
                path
                for b in bodies
                if isinstance(b, WorkerExited)
                and (path := log_of(WorkerKey(b.job_id, b.attempt, b.rank))) is not None
            ]
            if ended:
                await self.shipper.drain(ended)  # cut short here, every report is still kept
        self._unsent = []
        done: set[int] = set()
        try:
            first = 0
            while first < len(bodies):
                if _job_of(bodies[first]) is None:  # a node's own fact: after all before it, alone
                    if not await self._append_one(bodies[first], now):
                        break
                    done.add(first)
                    first += 1
                    continue
                last = first
                while last < len(bodies) and _job_of(bodies[last]) is not None:
                    last += 1
                chains: dict[str | None, list[int]] = {}
                for i in range(first, last):
                    chains.setdefault(_job_of(bodies[i]), []).append(i)
                went = await asyncio.gather(
                    *(self._append_chain(bodies, c, now, done) for c in chains.values())
                )
                if not all(went):
                    break  # what comes after a job's failed report waits with it
                first = last
        finally:  # failed, or cancelled (a bounded last flush): kept, in order, before any newer
            self._unsent[:0] = [b for i, b in enumerate(bodies) if i not in done]
        return len(done)

    async def _append_chain(self, bodies: list[Event], chain: list[int], now: float, done: set[int]) -> bool:
        """One job's reports of a flush, one after the other (its order is the fold's): False at
        the first that failed, the rest of its chain kept with it."""
        for i in chain:
            if not await self._append_one(bodies[i], now):
                return False
            done.add(i)
        return True

    async def _append_one(self, body: Event, now: float) -> bool:
        """Append one report: True once stored, or dropped for good (no codec writes it, or the
        log refuses it for what it is); False if it is to be sent again."""
        try:
            item = self._append(body, now)
        except (ValueError, TypeError, UnicodeError) as e:  # a report no codec can write
            log.error("%s: report %s dropped, it cannot be encoded: %s", self.node, msg_id(body), e)
            self.reports_dropped += 1
            return True
        try:
            await self.log.append(item)
        except RetryLater as e:
            # Nothing of it was appended: it and everything after it waits until told.
            held = asyncio.get_running_loop().time() + e.retry_s
            if held > self._held_until:
                log.warning("%s: reports held for %.3gs: %s", self.node, e.retry_s, e)
                self._held_until = held
            return False
        except UnstorableError as e:
            # Refused for what it is, it would be refused for ever, and every report after it
            # of its job would wait behind it.
            log.error("%s: report %s dropped: %s", self.node, msg_id(body), e)
            self.reports_dropped += 1
            return True
        except LogError as e:
            log.warning(
                "%s: append of %s failed; it and its job's later reports will be sent again: %s",
                self.node,
                msg_id(body),
                e,
            )
            return False
        self.spans.reported(body, time.time())
        appended = getattr(self.runtime, "appended", None)
        if appended is not None and isinstance(body, (WorkerStarted, WorkerExited)):
            # The next agent must not report it again (after the stream's duplicate window the
            # fold would refuse a second exit).
            appended(
                WorkerKey(body.job_id, body.attempt, body.rank),
                "start" if isinstance(body, WorkerStarted) else "exit",
            )
        return True

    def _take_reports(self) -> None:
        """The runtime's reports, in order, as node events to append, each naming its job's run
        now, while the runtime still knows the worker (``decide`` may have it forgotten next)."""
        while not self.reports.empty():
            self._unsent.extend(self._stamped(b) for b in self._events_of(self.reports.get_nowait()))

    def _stamped(self, body: Event) -> Event:
        """``body``, a worker's report, naming its job's run (``_run_of``): the fold refuses it
        for a later job of the id."""
        if isinstance(body, (WorkerStarted, WorkerExited, CheckpointCompleted)) and not body.run:
            run = self._run_of(body)
            if run:
                return msgspec.structs.replace(body, run=run)
        return body

    def _append(self, body: Event, now: float, run: int | None = None) -> Append:
        body = self._stamped(body)
        mid = msg_id(body, getattr(body, "run", 0) if run is None else run)
        traceparent = self._traceparent(body)
        env = codec.seal(
            body, event_id=mid, time=now, producer=self.producer, traceparent=traceparent, rules=RULES
        )
        headers = {"traceparent": traceparent} if traceparent else None
        return Append(routing.subject_of(body), codec.encode(env), mid, None, headers)

    def _run_of(self, body: Event) -> int:
        """The run of the job a worker's report is about: the runtime's word for its own worker
        (the same whenever the report is made again), else the view's; 0 if neither knows it."""
        if isinstance(body, (WorkerStarted, WorkerExited, CheckpointCompleted)):
            run_of = getattr(self.runtime, "run_of", None)  # ``bench``'s timers keep no runs
            rank = 0 if isinstance(body, CheckpointCompleted) else body.rank  # rank 0's checkpoint
            run = run_of(WorkerKey(body.job_id, body.attempt, rank)) if run_of is not None else None
            if isinstance(run, int):
                return run
            job = self.view.job(body.job_id)
            return job.run if job is not None else 0
        return 0

    def _traceparent(self, body: Event) -> str | None:
        """The trace of the job a report is about (the view carries each job's span)."""
        for job_id in routing.job_ids(body):
            job = self.view.job(job_id)
            if job is not None and job.traceparent:
                return job.traceparent
        return None

    def _trace_of(self, job_id: str) -> trace_ids.JobTrace | None:
        """A job's trace, for the spans of this node's work (``worker_spans.py``)."""
        job = self.view.job(job_id)
        return trace_ids.from_traceparent(job_id, job.traceparent) if job is not None else None

    # -- running -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        logs.set_role(f"agent-{self.node}")
        # Before the first view: ``decide`` must see the workers an earlier agent left running,
        # or it would report them gone.
        reattach = getattr(self.runtime, "reattach", None)
        if reattach is not None:
            taken = reattach()
            self.spans.taken_back(taken)
            # A worker whose keeper wrote its exit is taken back only to report that exit: it
            # is not said to run, as after a whole corral stopped its workers and started again.
            phases = self.runtime.workers()
            left = [k for k in taken if phases.get(k) != "exited"]
            ended = [k for k in taken if phases.get(k) == "exited"]
            if left:
                log.info("%s: took back %d workers left running: %s", self.node, len(left), left)
            if ended:
                log.info("%s: %d workers of an earlier agent had ended: %s", self.node, len(ended), ended)
        views = aiter(self.views.watch(self.node))
        nxt: asyncio.Future[NodeView] = asyncio.ensure_future(anext(views))
        try:
            try:
                # The node's view says whether the log already holds this node as it is now.
                await asyncio.wait({nxt}, timeout=self.first_view_wait)
                if nxt.done():
                    self._saw(nxt.result())
                    nxt = asyncio.ensure_future(anext(views))
                await self.register()
            except BaseException:
                nxt.cancel()
                raise
            await self._serve(stop, views, nxt)
        finally:
            self.stopped.set()

    async def _serve(
        self, stop: asyncio.Event, views: AsyncIterator[NodeView], nxt: asyncio.Future[NodeView]
    ) -> None:
        beat = asyncio.create_task(self._heartbeats())
        shipped = asyncio.Event()  # set once the workers are stopped or left: then a last look
        ship = asyncio.create_task(self.shipper.run(shipped)) if self.shipper is not None else None
        arrived = self.reports.arrived
        report = asyncio.ensure_future(arrived.wait())
        ended = asyncio.ensure_future(_first(stop.wait(), self._halt.wait()))
        again: asyncio.Task[None] | None = None  # a registration after a shutdown, under way
        try:
            await self.cycle()
            while not ended.done():
                waits: set[asyncio.Future[Any]] = {nxt, report, ended}
                done, _ = await asyncio.wait(waits, timeout=self.tick, return_when=asyncio.FIRST_COMPLETED)
                if nxt in done:
                    self._saw(nxt.result())
                    nxt = asyncio.ensure_future(anext(views))
                    if self.view.shut_down not in (0, self._back_from) and (again is None or again.done()):
                        # Shut down by an agent before this one, which the first view did not
                        # say yet (a view written before that agent's shutdown was folded):
                        # registered again beside the cycles, which go on meanwhile.
                        again = asyncio.create_task(self.register())
                        again.add_done_callback(self._registered_again)
                if report in done:
                    arrived.clear()  # the cycle below appends everything reported so far
                    report = asyncio.ensure_future(arrived.wait())
                if ended.done():
                    break
                await self.cycle()
        finally:
            waited = [f for f in (nxt, report, ended, beat, again) if f is not None]
            for f in waited:
                f.cancel()
            # Each cancelled read must end before the feed is closed: closing a generator that a
            # pending read is still inside fails, and leaves that read's error unretrieved.
            await asyncio.gather(*waited, return_exceptions=True)
            aclose = getattr(views, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            try:
                await self._shut_down(self._ending if self._halt.is_set() else "stop")
            finally:
                shipped.set()
                if ship is not None:
                    with contextlib.suppress(Exception):  # the server may be gone already
                        await asyncio.wait_for(ship, 10.0)

    async def _shut_down(self, ending: Literal["stop", "leave", "crash"]) -> None:
        # Gangs still starting finish their start first: a start cut short could leave a process
        # the runtime never learnt of. Then every worker is stopped, or left running.
        starting = list(self._starting.values())
        if starting:
            _, late = await asyncio.wait(starting, timeout=self.start_timeout)
            for task in late:
                task.cancel()
        if ending == "leave":
            self._take_reports()  # named by their runs while the runtime still knows the workers
            await self.runtime.leave()
        else:
            if ending == "stop":
                await self._say_shut_down()
            grace = 0.0 if ending == "crash" else self.stop_grace
            await self.runtime.close(grace, self.unkillable_after)
        if ending != "crash":  # a node that stops cleanly says its workers stopped; one that
            # leaves them says what they reported so far
            try:
                await asyncio.wait_for(self.flush(patient=True), 10.0)
            except (TimeoutError, LogError) as e:
                log.warning("%s: last reports not appended: %s", self.node, e)
        await self.gpus.close()

    async def _say_shut_down(self) -> None:
        """Tell the log the node's workers are being stopped on purpose, before the first is: the
        fold then interrupts their jobs without counting a restart. What the workers reported until
        now goes first, so an exit of their own before the shutdown still counts as theirs."""
        self._take_reports()
        self._unsent.append(NodeShutdown(node=self.node, at=self.clock(), registers_again=True))
        try:
            await asyncio.wait_for(self.flush(patient=True), 10.0)  # what it did not store is kept, in order
        except (TimeoutError, LogError) as e:
            log.warning("%s: shutdown not appended before stopping workers: %s", self.node, e)


class _Reports(asyncio.Queue[Report]):
    """The runtime's report queue, which also wakes the agent's loop when a report arrives (a
    second reader waiting on the queue itself could take a report out of its order)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self.arrived = asyncio.Event()
        self.clock = clock
        # When each worker's start was reported, by the agent's clock, as it happened: the
        # agent may take the report later (a slow append), after XIDs the worker saw.
        self.started: dict[WorkerKey, float] = {}

    def put_nowait(self, item: Report) -> None:
        if isinstance(item, Started):
            self.started[item.key] = self.clock()
        super().put_nowait(item)
        self.arrived.set()


async def _first(*waits: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
