"""Runs workers as real processes: start behind a gang barrier, checkpoint on request, stop, and
report what happened. The agent's service drives it with the actions of ``decide`` and turns its
reports (``Runtime.reports``) into node events with ``decide.report_events``.

``Runtime`` here holds what runs, carries out ``decide``'s actions, reports workers lost with an
earlier agent and hands its workers over to the next one. Its parts, one role each: starting
workers and watching them until they end (``launch.py``), checkpoint requests
(``checkpoints.py``), stops and signals (``stopping.py``), one worker's record and files
(``worker.py``).

Each worker runs under a keeper process of its own (``keeper.py``), so that it outlives the
agent: the agent learns how it runs and how it ended from the files its keeper writes, not from
being its parent. What one agent leaves for the next (``Runtime.leave``) and how the next takes
the workers back (``Runtime.reattach``) is ``handover.py``'s: the record beside each keeper, the
keeper's pid, start time and boot, the exits written while no agent watched.

Each worker gets a working directory ``<root>/work/<job>/run-<n>/attempt-<a>/rank-<r>``
(``run_dir``: a job id used again once its job was let go names another run) and its stdout and
stderr go to ``<root>/logs/<job>/run-<n>/attempt-<a>.rank-<r>.log`` (``log_path``, ``job_logs``;
the agent ships what they gain to the output stream, ``output.py``, which ``corral logs JOB``
reads). Where ``bwrap`` (bubblewrap) works, each worker runs in its own mount and PID
namespace: a read-only view of the host's root, private ``/proc``, ``/dev`` and ``/tmp``, its
working and checkpoint directories read-write, and each data mount bound at the path the job asked
for, read-only when asked; it dies with its keeper (``--die-with-parent``). Without bwrap, workers
run as plain processes in their own session, and a job with data mounts cannot start (unless each
mount's target is its source).

A job with an ``image`` runs in a container instead, with podman or docker (``container``): the
same environment, directories, data mounts, logs, signals and exit codes, its GPUs passed as CDI
devices, its signals sent by container name. Which engine runs containers is probed once, by the
first image job to start; where none can, an image job fails to start and says why. Its command
never runs on the host instead.

Checkpoint contract (what a checkpointable job implements; ``examples/train.py`` does):

1. ``$CORRAL_CHECKPOINT_DIR`` is the worker's own directory (one per attempt and rank) inside its
   job's checkpoint directory, which outlives attempts and is read-write in the sandbox; a
   restarted worker gets ``$CORRAL_RESUME_FROM``, the location its job last reported (rank 0's).
2. To ask for a checkpoint the agent writes ``$CORRAL_CHECKPOINT_DIR/REQUEST`` holding the deadline
   (seconds since the epoch, a decimal number on one line), then sends ``SIGUSR1`` to the
   worker's process if that process handles SIGUSR1 (its default action would kill it). Either
   one is enough for the worker to act on; the file is there for workers that cannot take signals
   (a shell wrapper, a child process, a worker still starting). The worker may remove
   ``REQUEST`` once it acts on it.
3. The worker saves its state, then writes ``$CORRAL_CHECKPOINT_DIR/DONE`` atomically (write
   another file, rename it to ``DONE``) holding JSON ``{"step": N, "location": "..."}``. The agent
   polls for it, reports the checkpoint, and removes ``DONE`` and ``REQUEST``. A worker may also
   write ``DONE`` unasked, after a periodic checkpoint; it is reported the same way, at most once
   in ``checkpoints.REPORT_EVERY_S`` (the newest ``DONE`` waits in place until then), and only if
   its step is past the one reported before.
4. To stop a worker the agent sends ``SIGTERM`` (to every process of the sandbox, or the
   process group; a container gets ``stop``, its image's stop signal) and ``SIGKILL`` after the
   grace period. A worker that has checkpointed should exit 0 on ``SIGTERM``.

Exit codes are reported as the process's status, or 128+N when signal N killed it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from corral.projections.assignments import GpuBinding
from corral.services.agent import container, handover
from corral.services.agent.container import ContainerMode, Probe
from corral.services.agent.decide import (
    GONE_CODE,
    UNKILLABLE_S,
    Action,
    Exited,
    Forget,
    Report,
    ReportGone,
    RequestCheckpoint,
    Started,
    StartGang,
    StartWorker,
    StopWorker,
    WorkerKey,
    WorkerPhase,
)
from corral.services.agent.discovery import MigDevice
from corral.services.agent.handover import Kept
from corral.services.agent.launch import Launching, Prepare
from corral.services.agent.sandbox import RunAs

# The Runtime's sandbox= choices, named from here by whoever builds a Runtime.
from corral.services.agent.sandbox import SandboxMode as SandboxMode
from corral.services.agent.workdirs import Workdirs
from corral.services.agent.worker import Worker, kill, log, log_path_before_runs

_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")
_OTLP = "OTEL_EXPORTER_OTLP_"  # where the agent sends spans, a job's own spans go too
# Which of the agent's OTLP settings a worker gets: where and how to send, never the credentials
# (``HEADERS`` carries the collector's tokens, ``CLIENT_KEY`` / ``CLIENT_CERTIFICATE`` its
# identity), which any job on the node could read from its environment and send as the agent.
_OTLP_PASSED = ("ENDPOINT", "PROTOCOL", "TIMEOUT", "COMPRESSION", "INSECURE", "CERTIFICATE")


def _passed_on(name: str, value: str) -> bool:
    """Whether the agent's variable ``name`` (of ``value``) goes into every worker's environment:
    an endpoint that carries credentials itself (``https://user:token@…``, ``user:token@host``,
    a key in its query or fragment) does not."""
    if name in _INHERITED:
        return True
    if not name.startswith(_OTLP):
        return False
    rest = name[len(_OTLP) :]
    for kind in ("TRACES_", "METRICS_", "LOGS_"):
        rest = rest.removeprefix(kind)
    if rest == "ENDPOINT":  # with or without a scheme (gRPC's host:port), nothing after the path
        return not any(c in value for c in "@?#")
    return rest in _OTLP_PASSED


def restart_backoff(restarts: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Seconds to wait before restart number ``restarts`` (1, 2, …): ``base`` doubled each
    time, never more than ``cap``; no wait before the first attempt."""
    if restarts <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(restarts - 1, 62))


class Runtime(Launching):
    def __init__(
        self,
        root: str | Path,
        *,
        sandbox: SandboxMode = "auto",
        poll_interval: float = 0.1,
        base_env: Mapping[str, str] | None = None,
        mig_devices: Iterable[MigDevice] = (),
        prepare: Prepare | None = None,
        containers: ContainerMode = "auto",
        node: str | None = None,
        hidden: Iterable[str | Path] = (),
        worker_user: str | None = None,
        narrow_view: bool = False,
    ) -> None:
        """``prepare`` runs before each worker's process starts, inside the start barrier (e.g. to
        create its MIG instance); ``mig_devices`` resolve MIG placeholders in
        ``CUDA_VISIBLE_DEVICES``; ``containers`` says which engine runs image jobs (``auto``:
        docker if its daemon answers, else podman); ``node`` names this node in reasons."""
        self.root = Path(root)
        self.node = node or socket.gethostname()
        self.poll_interval = poll_interval
        self.reports: asyncio.Queue[Report] = asyncio.Queue()
        self._mode = sandbox
        self._hidden = [str(p) for p in hidden]  # directories a sandboxed worker never sees
        self._narrow = narrow_view  # the sandbox shows only the system and what the job runs from
        # The host user workers run as: only a root agent can start them as another.
        self._as = RunAs.named(worker_user) if worker_user and os.geteuid() == 0 else None
        self._bwrap: str | None = None
        self._probe: asyncio.Future[str | None] | None = None
        self._containers = containers
        self._engine_probe: asyncio.Future[Probe] | None = None
        self._engine_calls: set[asyncio.Task[None]] = set()
        self._agent: str | None = None  # the work directory's id, read when a container needs it
        self._prepare = prepare
        self._workers: dict[WorkerKey, Worker] = {}
        self.workdirs = Workdirs(self.root)  # ended workers' directories, deleted after a day
        if base_env is None:
            base_env = {k: v for k, v in os.environ.items() if _passed_on(k, v)}
            base_env = {"PYTHONUNBUFFERED": "1", **base_env}  # logs readable while it runs
        self._base_env = dict(base_env)
        self._mig: dict[tuple[str, int], str] = {}
        self.set_mig_devices(mig_devices)

    def set_mig_devices(self, devices: Iterable[MigDevice]) -> None:
        """The MIG instances that exist now (after discovery, or after creating one)."""
        self._mig = {(d.parent_uuid, d.start): d.uuid for d in devices if d.start >= 0}

    def workers(self) -> dict[WorkerKey, WorkerPhase]:
        """What ``decide`` needs: every worker the runtime knows, with its phase."""
        return {k: w.phase for k, w in self._workers.items()}

    def gpus_of(self, key: WorkerKey) -> tuple[GpuBinding, ...]:
        """The GPUs the worker was started on (none if the runtime does not know it)."""
        w = self._workers.get(key)
        return () if w is None else w.spec.gpus

    def busy(self) -> dict[WorkerKey, tuple[GpuBinding, ...]]:
        """The GPUs of each worker running or starting, for ``decide``."""
        return {k: w.spec.gpus for k, w in self._workers.items() if w.phase != "exited"}

    def runs(self) -> dict[WorkerKey, int]:
        """Each worker's job's run (``Assignment.run``), for ``decide``."""
        return {k: w.spec.run for k, w in self._workers.items()}

    def run_of(self, key: WorkerKey) -> int | None:
        """The run of the worker's job (``Assignment.run``), if the runtime knows the worker."""
        w = self._workers.get(key)
        return None if w is None else w.spec.run

    def log_of(self, key: WorkerKey) -> Path | None:
        """The file the worker writes its output to (``worker.log_path``), if the runtime knows it."""
        w = self._workers.get(key)
        return None if w is None else w.log

    def pid(self, key: WorkerKey) -> int | None:
        """The worker's own process (inside its sandbox, the command bwrap runs)."""
        w = self._workers.get(key)
        return None if w is None else self._main_pid(w)

    async def next_report(self, timeout: float) -> Report:
        return await asyncio.wait_for(self.reports.get(), timeout)

    async def act(self, action: Action, start_timeout: float = 120.0) -> None:
        """Carry out one action of ``decide``. A gang start waits for its barrier; a service runs
        it in a task of its own so that other actions are not held up."""
        if isinstance(action, StartGang):
            await self.start_gang(action.workers, start_timeout)
        elif isinstance(action, RequestCheckpoint):
            await self.request_checkpoint(action.key, action.deadline)
        elif isinstance(action, StopWorker):
            await self.stop(action.key, action.grace)
        elif isinstance(action, ReportGone):
            self.report_gone(action.key, action.run)
        elif isinstance(action, Forget):
            self.forget(action.key)

    def report_gone(self, key: WorkerKey, run: int = 0) -> None:
        """Report a worker of its job's ``run`` the log has live here but that runs no more (lost
        with an earlier agent), once: it is kept as exited until ``forget``."""
        if key in self._workers:
            return
        if self._containers != "none":
            self._track(self._remove_lost_container(key, None))
        spec = StartWorker(key.job_id, key.attempt, key.rank, (), {}, (), "", "", run=run)
        w = Worker(spec, self.root)
        w.phase = "exited"
        w.code = GONE_CODE
        w.announced = True
        self._workers[key] = w
        self.reports.put_nowait(Exited(key, GONE_CODE))

    async def _remove_lost_container(self, key: WorkerKey, name: str | None) -> None:
        """A container outlives the agent that started it (its engine keeps it): one that still
        runs a worker reported gone would hold its GPUs with no one to stop it. ``name``: the one
        the worker's record kept, which an agent before this one gave it (an older version's
        name, perhaps); None: the name this work directory's agents give it. Never a name made
        up otherwise: an agent of another corral on this host may run a job of the same id."""
        engine = (await self.container_engine()).engine
        if engine is None:
            return
        if name is None:
            try:
                name = container.container_name(*key, agent=self.agent_id())
            except OSError as e:  # no id kept: no container of this directory's agents either
                log.warning("%s: worker %s's container not looked for: %s", self.node, key, e)
                return
        await container.run_quietly(container.remove_args(engine.name, name, engine.path), 60.0)

    def forget(self, key: WorkerKey) -> None:
        w = self._workers.get(key)
        if w is not None and w.phase == "exited":
            del self._workers[key]
            w.drop()
            self.workdirs.ended(w.workdir)

    def sweep_workdirs(self) -> None:
        """Delete the directories of workers that ended ``workdirs.KEEP_S`` ago."""
        self.workdirs.sweep({w.workdir for w in self._workers.values()})

    def appended(self, key: WorkerKey, what: Literal["start", "exit"]) -> None:
        """The log holds the worker's start or exit now: a later agent must not report it again."""
        w = self._workers.get(key)
        if w is not None and w.announced and what not in w.appended:
            w.appended.add(what)
            if w.dir.is_dir():
                w.save()

    async def wait_exited(self, key: WorkerKey, timeout: float) -> int:
        w = self._workers[key]
        await asyncio.wait_for(w.done.wait(), timeout)
        assert w.code is not None
        return w.code

    async def leave(self) -> None:
        """Let go of every worker without stopping it (the agent restarts): their keepers run on,
        and the next agent on this work directory takes them back (``reattach``)."""
        for w in self._workers.values():
            if w.announced and w.dir.is_dir():
                w.save()
        tasks = [t for w in self._workers.values() for t in (w.watcher, w.killer) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._engine_calls:  # a stop already sent to a container completes
            await asyncio.gather(*list(self._engine_calls), return_exceptions=True)
        self._workers.clear()

    def reattach(self) -> list[WorkerKey]:
        """Take back the workers an agent before this one left running here: each whose keeper
        still runs (the same pid and start time, in this boot) is watched again; one whose
        keeper wrote its exit meanwhile is reported exited, once; one whose keeper is gone
        without an exit (killed, or the machine rebooted) is dropped, and the log's view of it
        makes ``decide`` report it gone. Reports the log was not known to hold are made again,
        with the pid they were made with: the message id of the same fact, stored once."""
        taken: list[WorkerKey] = []
        for kept in handover.kept(self.root, self._workers):  # self._workers grows as it goes
            w = self._taken(kept)
            if w is not None:
                taken.append(w.key)
        # The directories of workers that ended under earlier agents, by when they ended.
        self.workdirs.listed({w.workdir for w in self._workers.values()})
        return taken

    def _taken(self, kept: Kept) -> Worker | None:
        record, code = kept.record, kept.code
        w = Worker(record.spec, self.root)
        w.container, w.engine, w.sandboxed = record.container, record.engine, record.sandboxed
        w.announced, w.reported_pid = record.announced, record.reported_pid
        w.appended = {
            what for what, done in (("start", record.start_appended), ("exit", record.exit_appended)) if done
        }
        w.keeper_id, w.boot, w.sandbox_pid = kept.keeper_id, kept.boot, kept.sandbox_pid
        w.pid, w.pid_start = kept.pid, kept.pid_start
        running = kept.running
        if not w.announced or (code is None and not running):
            # Never reported started (its gang's start was cut short), or gone without an exit:
            # nothing to take back. A keeper still there is ended, which ends its worker.
            if running and w.keeper_id is not None:
                kill(w.keeper_id[0], signal.SIGKILL)
            if w.container is not None and self._containers != "none":
                self._track(self._remove_lost_container(w.key, w.container))
            w.drop()
            return None
        w.settled.set()
        self._log_from_before_runs(w)
        self._workers[w.key] = w
        if "start" not in w.appended:
            self.reports.put_nowait(Started(w.key, w.reported_pid))
        if record.stop_grace is not None:
            w.stop_requested, w.stop_grace = True, record.stop_grace
        if record.killed_at is not None:  # its grace is over: killed again at once
            w.killed_at = time.monotonic() - max(0.0, time.time() - record.killed_at)
        if code is not None:
            w.code, w.phase = code, "exited"
            w.done.set()
            if "exit" not in w.appended:
                self._poll_checkpoint(w, final=True)
                self.reports.put_nowait(Exited(w.key, code, w.stop_requested, w.reported_pid))
            return w
        w.phase = "running"
        w.watcher = asyncio.create_task(self._watch(w))
        if w.stop_requested:  # its stop carries on, with a kill after the grace
            self._terminate(w, 0.0 if w.killed_at is not None else w.stop_grace)
        return w

    def _log_from_before_runs(self, w: Worker) -> None:
        """A worker an older agent started, before log files were kept per run, writes to the
        file it was given then (``worker.log_path_before_runs``). That file is moved to where
        this agent reads and ships it, and the worker writes on into it (a rename keeps the file
        it has open). One that cannot be moved stays the worker's file, not shipped."""
        if w.log.exists():
            return
        old = log_path_before_runs(self.root, w.key)
        try:
            w.log.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, w.log)
        except FileNotFoundError:
            return  # none there either: the worker's file is where this agent looks
        except OSError as e:
            log.warning("%s: worker %s writes to %s, not moved: %s", self.node, w.key, old, e)
            w.log = old

    async def close(self, grace: float = 5.0, unkillable_after: float = UNKILLABLE_S) -> None:
        """Stop every worker and wait for them (the agent is shutting down), each at most
        ``unkillable_after`` seconds past its SIGKILL: one still there then (asleep in a hung
        driver call) is left to its keeper, stopping, for the next agent to take back."""
        for w in list(self._workers.values()):
            if w.pid is not None and w.code is None:
                w.stop_requested = True
                self._terminate(w, grace)
        for w in self._workers.values():
            w.settled.set()
        killers = [w.killer for w in self._workers.values() if w.killer is not None]
        await asyncio.gather(*killers, return_exceptions=True)
        watchers = [w.watcher for w in self._workers.values() if w.watcher is not None]
        if watchers:
            _, stuck = await asyncio.wait(watchers, timeout=unkillable_after)
            for t in stuck:
                t.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        while self._engine_calls:  # stops and kills sent to containers, which killers may add to
            await asyncio.gather(*list(self._engine_calls), return_exceptions=True)
