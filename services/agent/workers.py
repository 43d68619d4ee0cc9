"""Runs workers as real processes: start behind a gang barrier, checkpoint on request, stop, and
report what happened. The agent's service drives it with the actions of ``decide`` and turns its
reports (``Runtime.reports``) into node events with ``decide.report_events``.

Each worker gets a working directory ``<root>/work/<job>/attempt-<a>/rank-<r>`` and its stdout and
stderr go to ``<root>/logs/<job>/attempt-<a>.rank-<r>.log`` (``job_logs``; ``corral logs JOB``
reads them). Where ``bwrap`` (bubblewrap) works, each worker runs in its own mount and PID
namespace: a read-only view of the host's root, private ``/proc``, ``/dev`` and ``/tmp``, its
working and checkpoint directories read-write, and each data mount bound at the path the job
asked for, read-only when asked; it dies with the agent (``--die-with-parent``). Without bwrap,
workers run as plain processes in their own session, and a job with data mounts cannot start
(unless each mount's target is its source).

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
   write ``DONE`` unasked, after a periodic checkpoint; it is reported the same way.
4. To stop a worker the agent sends ``SIGTERM`` (to every process of the sandbox, or the
   process group; a container gets ``stop``, its image's stop signal) and ``SIGKILL`` after the
   grace period. A worker that has checkpointed should exit 0 on ``SIGTERM``.

Exit codes are reported as the process's status, or 128+N when signal N killed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from corral.events.jobs import Mount
from corral.services.agent import container, sandbox
from corral.services.agent.container import ContainerMode, EngineInfo, Probe
from corral.services.agent.decide import (
    GONE_CODE,
    STOP_GRACE,
    Action,
    Checkpointed,
    Exited,
    Forget,
    Report,
    ReportGone,
    RequestCheckpoint,
    Started,
    StartFailed,
    StartGang,
    StartWorker,
    StopWorker,
    WorkerKey,
    WorkerPhase,
)
from corral.services.agent.discovery import MigDevice
from corral.services.agent.sandbox import RunAs

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]
Prepare = Callable[[StartWorker], Awaitable[None]]
REQUEST = "REQUEST"
DONE = "DONE"
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")
_MIG_PLACEHOLDER = re.compile(r"mig:([^/,]+)/([^@,]+)@(\d+)")


class StartError(Exception):
    """A worker could not be started; the message says why in an operator's words."""


class GangResult(NamedTuple):
    started: tuple[WorkerKey, ...]
    failed: WorkerKey | None = None
    reason: str = ""


def restart_backoff(restarts: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Seconds to wait before restart number ``restarts`` (1, 2, …): ``base`` doubled each
    time, never more than ``cap``; no wait before the first attempt."""
    if restarts <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(restarts - 1, 62))


def log_path(root: str | Path, key: WorkerKey) -> Path:
    return Path(root) / "logs" / key.job_id / f"attempt-{key.attempt}.rank-{key.rank}.log"


def job_logs(root: str | Path, job_id: str) -> list[Path]:
    """Every log file of a job on this node, oldest attempt first, then by rank."""
    d = Path(root) / "logs" / job_id
    if not d.is_dir():
        return []

    def order(p: Path) -> tuple[int, int]:
        m = re.fullmatch(r"attempt-(\d+)\.rank-(\d+)\.log", p.name)
        return (int(m.group(1)), int(m.group(2))) if m else (1 << 30, 0)

    return sorted((p for p in d.iterdir() if p.suffix == ".log"), key=order)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Worker:
    def __init__(self, spec: StartWorker, root: Path) -> None:
        self.spec = spec
        self.key = spec.key
        self.phase: WorkerPhase = "starting"
        self.workdir = root / "work" / spec.job_id / f"attempt-{spec.attempt}" / f"rank-{spec.rank}"
        self.log = log_path(root, self.key)
        self.checkpoints = Path(spec.checkpoint_dir)
        self.proc: asyncio.subprocess.Process | None = None
        # bwrap's init process, pid 1 of the worker's namespace; or the container's init, seen
        # from the host once the container runs
        self.sandbox_pid: int | None = None
        self.container: str | None = None  # the container's name, for a worker in one
        self.engine: EngineInfo | None = None
        self.status: asyncio.BaseTransport | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.killer: asyncio.Task[None] | None = None
        self.settled = asyncio.Event()  # the start barrier has decided about this worker
        self.announced = False  # its start was reported: its exit and checkpoints are reported too
        self.stop_requested = False
        self.stop_grace = STOP_GRACE
        self.reported_pid = 0  # the pid its start was reported with, and its exit is
        self.signal_owed = False  # asked to checkpoint, not yet signalled: it had no handler yet
        self.done = asyncio.Event()
        self.code: int | None = None


class Runtime:
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
        self._prepare = prepare
        self._workers: dict[WorkerKey, _Worker] = {}
        if base_env is None:
            base_env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
            base_env = {"PYTHONUNBUFFERED": "1", **base_env}  # logs readable while it runs
        self._base_env = dict(base_env)
        self._mig: dict[tuple[str, int], str] = {}
        self.set_mig_devices(mig_devices)

    def set_mig_devices(self, devices: Iterable[MigDevice]) -> None:
        """The MIG instances that exist now (after discovery, or after creating one)."""
        self._mig = {(d.parent_uuid, d.start): d.uuid for d in devices if d.start >= 0}

    # -- what runs ---------------------------------------------------------------------------

    def workers(self) -> dict[WorkerKey, WorkerPhase]:
        """What ``decide`` needs: every worker the runtime knows, with its phase."""
        return {k: w.phase for k, w in self._workers.items()}

    def pid(self, key: WorkerKey) -> int | None:
        """The worker's own process (inside its sandbox, the command bwrap runs)."""
        w = self._workers.get(key)
        return None if w is None else self._main_pid(w)

    async def sandboxed(self) -> bool:
        """Whether workers run in a bwrap sandbox (probed once, by the first start to ask: bwrap
        may be installed but not allowed to create namespaces)."""
        if self._mode == "none":
            return False
        if self._probe is None:
            self._probe = asyncio.ensure_future(sandbox.probe())
        self._bwrap = await asyncio.shield(self._probe)
        if self._mode == "bwrap" and self._bwrap is None:
            raise StartError("sandbox 'bwrap' was asked for, but bwrap is missing or cannot run here")
        return self._bwrap is not None

    async def container_engine(self) -> Probe:
        """The engine that runs image jobs here, or why none can (probed once, by the first
        start to ask: an engine may be installed but unable to work)."""
        if self._engine_probe is None:
            self._engine_probe = asyncio.ensure_future(container.probe(self._containers))
        return await asyncio.shield(self._engine_probe)

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
            self.report_gone(action.key)
        elif isinstance(action, Forget):
            self.forget(action.key)

    # -- starting ----------------------------------------------------------------------------

    async def start_gang(self, specs: Sequence[StartWorker], timeout: float) -> GangResult:
        """Start a gang's workers on this node together. When every one has started, report
        them all started; if any fails or is not started within ``timeout`` seconds, stop them
        all (silently: they were never reported) and report the first failure."""
        gang = [_Worker(s, self.root) for s in specs if s.key not in self._workers]
        for w in gang:
            self._workers[w.key] = w  # before any await: ``decide`` must not start them twice
        if not gang:
            return GangResult(())
        launches = {w.key: asyncio.create_task(self._launch(w)) for w in gang}
        done, pending = await asyncio.wait(
            launches.values(), timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        failures: list[tuple[WorkerKey, str]] = []
        for w in gang:
            t = launches[w.key]
            if t in done and t.exception() is not None:
                failures.append((w.key, _why(t.exception())))
            elif t in pending:
                failures.append((w.key, f"not started within {timeout:g}s"))
        if not failures:
            for w in sorted(gang, key=lambda w: w.key.rank):
                if w.phase == "starting":
                    w.phase = "running"
                w.announced = True
                w.settled.set()
                w.reported_pid = self._main_pid(w) or w.sandbox_pid or _pid(w)
                self.reports.put_nowait(Started(w.key, w.reported_pid))
                if w.stop_requested:  # stopped while it was starting
                    self._terminate(w, w.stop_grace)
            return GangResult(tuple(w.key for w in gang))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for w in gang:
            w.settled.set()
            if w.proc is not None and w.code is None:
                self._terminate(w, grace=1.0)
            else:
                w.phase = "exited"
        # A rank that failed says more than the ranks cancelled with the gang.
        real = [f for f in failures if launches[f[0]] in done]
        key, reason = min(real or failures, key=lambda f: f[0].rank)
        log.warning(
            "gang %s attempt %s failed to start: rank %s: %s", key.job_id, key.attempt, key.rank, reason
        )
        self.reports.put_nowait(StartFailed(key, reason))
        return GangResult((), key, reason)

    async def _launch(self, w: _Worker) -> None:
        spec = w.spec
        if spec.image is not None:
            await self._launch_container(w)
            return
        if not spec.command:
            raise StartError("the job has no command to run")
        sandboxed = await self.sandboxed()
        for m in spec.mounts:
            _check_source(m)
            if not sandboxed and os.path.realpath(m.source) != os.path.realpath(m.target):
                raise StartError(f"data mount {m.target} needs bubblewrap (bwrap), which this node lacks")
        env = await self._prepare_start(w, {**self._base_env, **spec.env})
        if sandboxed:
            await self._spawn_sandboxed(w, env)
        else:
            await self._spawn_plain(w, env)

    async def _launch_container(self, w: _Worker) -> None:
        spec = w.spec
        found = await self.container_engine()
        engine = found.engine
        if engine is None:
            raise StartError(
                f"image {spec.image} needs podman or docker, none can run containers on node "
                f"{self.node}: {found.why}"
            )
        if spec.gpus and engine.name == "docker" and engine.major() < container.DOCKER_CDI_MAJOR:
            raise StartError(
                f"docker {engine.version} on node {self.node} cannot give containers GPUs: CDI devices "
                f"need docker {container.DOCKER_CDI_MAJOR} or newer"
            )
        for m in spec.mounts:
            problem = container.mount_problem(m)
            if problem:
                raise StartError(problem)
            _check_source(m)
        env = await self._prepare_start(w, container.container_env(spec.env))
        try:
            devices = container.gpu_devices(spec.gpus, self._mig)
        except LookupError as e:
            raise StartError(str(e)) from None
        ulimits = None
        if engine.name == "podman":
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
            ulimits = container.podman_ulimits(nofile, resource.getrlimit(resource.RLIMIT_NPROC))
        workdir = str(w.workdir)
        argv = container.run_args(
            engine.name, spec, workdir=workdir, env=env, devices=devices, ulimits=ulimits, exe=engine.path
        )
        await self._spawn_container(w, engine, argv)

    async def _prepare_start(self, w: _Worker, env: dict[str, str]) -> dict[str, str]:
        """What every worker needs before it starts, in a container or not: its directories, the
        node's own preparation (a MIG instance); ``env`` with its devices resolved."""
        _prepare_directories(w, self._as)
        if self._prepare is not None:
            await self._prepare(w.spec)
        if "CUDA_VISIBLE_DEVICES" in env:
            env["CUDA_VISIBLE_DEVICES"] = self.resolve_devices(env["CUDA_VISIBLE_DEVICES"])
        return env

    def resolve_devices(self, value: str) -> str:
        """Replace MIG placeholders by the instances' own UUIDs, where known."""

        def one(m: re.Match[str]) -> str:
            return self._mig.get((m.group(1), int(m.group(3))), m.group(0))

        return _MIG_PLACEHOLDER.sub(one, value)

    async def _spawn_plain(self, w: _Worker, env: dict[str, str]) -> None:
        with open(w.log, "ab") as out:
            try:
                w.proc = await asyncio.create_subprocess_exec(
                    *w.spec.command,
                    cwd=w.workdir,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own process group: a stop reaches its children
                    **sandbox.as_user(self._as),
                )
            except OSError as e:
                raise StartError(f"cannot run {w.spec.command[0]}: {e.strerror or e}") from None
        w.watcher = asyncio.create_task(self._watch(w))

    async def _spawn_sandboxed(self, w: _Worker, env: dict[str, str]) -> None:
        assert self._bwrap is not None
        try:
            become = sandbox.become(self._as) if self._as is not None else []
        except sandbox.BindError as e:
            raise StartError(str(e)) from None
        read_fd, write_fd = os.pipe()
        try:
            argv = [self._bwrap, *self._sandbox_args(w, write_fd), "--", *become, *w.spec.command]
            with open(w.log, "ab") as out:
                try:
                    w.proc = await asyncio.create_subprocess_exec(
                        *argv,
                        env=env,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                        pass_fds=(write_fd,),
                    )
                except OSError as e:
                    raise StartError(f"cannot run bwrap: {e.strerror or e}") from None
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        w.watcher = asyncio.create_task(self._watch(w))
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        # Kept open until bwrap exits: it writes the exit code there last.
        w.status, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        while True:
            line = await reader.readline()
            if not line:
                await w.done.wait()
                raise StartError(f"sandbox setup failed: {_tail(w.log)}")
            with contextlib.suppress(ValueError):
                pid = json.loads(line).get("child-pid")
                if isinstance(pid, int):
                    w.sandbox_pid = pid
                    break
        # bwrap names its first process before building the sandbox; that process forks the
        # command only once every mount is in place. So the command's process is the sign that
        # the sandbox stands, and a bwrap that exits first says why in the log.
        delay = 0.002
        while not _children(w.sandbox_pid) and not w.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.done.wait(), delay)
            delay = min(delay * 2, self.poll_interval)
        if w.done.is_set():
            problem = sandbox.bwrap_error(w.log)
            if problem:
                raise StartError(f"sandbox setup failed: {problem}")

    async def _spawn_container(self, w: _Worker, engine: EngineInfo, argv: list[str]) -> None:
        w.engine = engine
        w.container = name = container.container_name(w.key.job_id, w.key.attempt, w.key.rank)
        # One left by an agent that died while this attempt ran here would hold the name.
        await container.run_quietly(container.remove_args(engine.name, name, engine.path), 60.0)
        with open(w.log, "ab") as out:
            try:
                w.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                raise StartError(f"cannot run {engine.path}: {e.strerror or e}") from None
        w.watcher = asyncio.create_task(self._watch(w))
        # Started once the container's init runs: the engine may pull the image first, and may
        # fail to create the container at all.
        inspect = container.pid_args(engine.name, name, engine.path)
        delay = 0.005
        while not w.done.is_set():
            code, answer = await container.run_quietly(inspect, 30.0)
            if code == 0 and answer.strip().isdigit() and int(answer) > 0:
                w.sandbox_pid = int(answer)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.done.wait(), delay)
            delay = min(delay * 2, self.poll_interval)
        # The client ended before the container was seen running: the engine failed, or the
        # worker ran and ended in between (then it started, and its exit is reported).
        problem = container.engine_error(_read(w.log)) if w.code in container.ENGINE_FAILURES else ""
        if problem:
            where = f"on node {self.node}"
            raise StartError(f"{engine.name} could not run image {w.spec.image} {where}: {problem}")

    def _sandbox_args(self, w: _Worker, status_fd: int) -> list[str]:
        spec = w.spec
        try:
            return sandbox.args(
                str(w.workdir),
                spec.job_checkpoint_dir,
                spec.command,
                spec.mounts,
                status_fd,
                self._hidden,
                # A worker left as root keeps no capability; one that becomes a user needs
                # CAP_SETUID to, and keeps none once it has.
                privileged=self._as is None and os.geteuid() == 0,
                narrow=self._narrow,
                as_user=self._as is not None,
            )
        except sandbox.BindError as e:
            raise StartError(str(e)) from None

    # -- watching ----------------------------------------------------------------------------

    async def _watch(self, w: _Worker) -> None:
        assert w.proc is not None
        waiting = asyncio.ensure_future(w.proc.wait())
        while not waiting.done():
            await asyncio.wait({waiting}, timeout=self.poll_interval)
            if w.announced:
                if w.signal_owed:
                    self._signal_checkpoint(w)
                self._poll_checkpoint(w, final=False)
        w.code = exit_code(waiting.result())
        if w.status is not None:
            w.status.close()
        w.done.set()
        await w.settled.wait()
        if w.announced:
            self._poll_checkpoint(w, final=True)  # a checkpoint written just before exiting
            self.reports.put_nowait(Exited(w.key, w.code, w.stop_requested, w.reported_pid))
        w.phase = "exited"

    def _poll_checkpoint(self, w: _Worker, final: bool) -> None:
        done = w.checkpoints / DONE
        try:
            raw = done.read_bytes()
        except OSError:
            return
        try:
            body = json.loads(raw)
            step, location = int(body["step"]), str(body["location"])
        except (ValueError, KeyError, TypeError):
            if final:
                log.warning("worker %s wrote an unreadable %s: %r", w.key, done, raw[:200])
                done.unlink(missing_ok=True)
            return  # maybe half-written by a worker that does not rename; read it next time
        done.unlink(missing_ok=True)
        (w.checkpoints / REQUEST).unlink(missing_ok=True)
        if w.phase == "checkpoint-requested":
            w.phase = "checkpointed"
        self.reports.put_nowait(Checkpointed(w.key, step, location))

    # -- checkpoints and stops ---------------------------------------------------------------

    async def request_checkpoint(self, key: WorkerKey, deadline: float) -> None:
        w = self._workers.get(key)
        if w is None or w.code is not None or w.phase in ("stopping", "exited", "checkpoint-requested"):
            return
        request = w.checkpoints / REQUEST
        tmp = w.checkpoints / (REQUEST + ".tmp")
        w.checkpoints.mkdir(parents=True, exist_ok=True)
        tmp.write_text(f"{deadline:.3f}\n")
        os.replace(tmp, request)
        w.phase = "checkpoint-requested"
        w.signal_owed = True
        self._signal_checkpoint(w)

    def _signal_checkpoint(self, w: _Worker) -> None:
        """SIGUSR1 to a worker asked to checkpoint, once it handles the signal: one that installs
        its handler a moment after it started still hears a request made before."""
        if w.phase != "checkpoint-requested":
            w.signal_owed = False
            return
        pid = self._main_pid(w)
        if pid is None or not _handles(pid, signal.SIGUSR1):
            return
        w.signal_owed = False
        if w.container is not None:
            self._to_container(w, signal.SIGUSR1)
        else:
            _kill(pid, signal.SIGUSR1)

    async def stop(self, key: WorkerKey, grace: float = STOP_GRACE) -> None:
        """SIGTERM now, SIGKILL after ``grace`` seconds; the exit is reported when it happens."""
        w = self._workers.get(key)
        if w is None or w.phase == "exited":
            return
        w.stop_requested = True
        w.stop_grace = grace
        if w.proc is None or w.code is not None or not w.settled.is_set():
            return  # still starting: stopped once the barrier has decided
        self._terminate(w, grace)

    def _terminate(self, w: _Worker, grace: float) -> None:
        w.phase = "stopping"
        if w.engine is not None and w.container is not None and w.sandbox_pid is not None:
            argv = container.stop_args(w.engine.name, w.container, grace, w.engine.path)
            self._engine_call(argv, timeout=grace + 30.0)
        else:
            self._signal_all(w, signal.SIGTERM)
        if w.killer is None:
            w.killer = asyncio.create_task(self._kill_after(w, grace))

    async def _kill_after(self, w: _Worker, grace: float) -> None:
        try:
            await asyncio.wait_for(w.done.wait(), grace)
        except TimeoutError:
            self._signal_all(w, signal.SIGKILL)

    def report_gone(self, key: WorkerKey) -> None:
        """Report a worker the log has live here but that runs no more (lost with an earlier
        agent), once: it is kept as exited until ``forget``."""
        if key in self._workers:
            return
        if self._containers != "none":
            self._track(self._remove_lost_container(key))
        spec = StartWorker(key.job_id, key.attempt, key.rank, (), {}, (), "", "")
        w = _Worker(spec, self.root)
        w.phase = "exited"
        w.code = GONE_CODE
        w.announced = True
        self._workers[key] = w
        self.reports.put_nowait(Exited(key, GONE_CODE))

    async def _remove_lost_container(self, key: WorkerKey) -> None:
        """A container outlives the agent that started it (its engine keeps it): one that still
        runs a worker reported gone would hold its GPUs with no one to stop it."""
        engine = (await self.container_engine()).engine
        if engine is not None:
            name = container.container_name(*key)
            await container.run_quietly(container.remove_args(engine.name, name, engine.path), 60.0)

    def forget(self, key: WorkerKey) -> None:
        w = self._workers.get(key)
        if w is not None and w.phase == "exited":
            del self._workers[key]

    async def wait_exited(self, key: WorkerKey, timeout: float) -> int:
        w = self._workers[key]
        await asyncio.wait_for(w.done.wait(), timeout)
        assert w.code is not None
        return w.code

    async def close(self, grace: float = 5.0) -> None:
        """Stop every worker and wait for them (the agent is shutting down)."""
        for w in list(self._workers.values()):
            if w.proc is not None and w.code is None:
                w.stop_requested = True
                self._terminate(w, grace)
        tasks = [t for w in self._workers.values() for t in (w.watcher, w.killer) if t is not None]
        for w in self._workers.values():
            w.settled.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._engine_calls:  # stops and kills sent to containers, which killers may add to
            await asyncio.gather(*list(self._engine_calls), return_exceptions=True)

    # -- signals -----------------------------------------------------------------------------

    def _main_pid(self, w: _Worker) -> int | None:
        if w.proc is None or w.code is not None:
            return None
        if w.sandbox_pid is None:
            return w.proc.pid
        children = _children(w.sandbox_pid)
        return children[0] if children else None

    def _signal_all(self, w: _Worker, sig: signal.Signals) -> None:
        """``sig`` to every process of the worker. In a sandbox, SIGTERM goes to the processes
        inside only: bwrap itself dies of it, and its death kills the sandbox at once
        (``--die-with-parent``), which would leave the worker no grace."""
        if w.proc is None or w.code is not None:
            return
        if w.container is not None:
            self._to_container(w, sig)
            return
        if self._bwrap is not None and w.sandbox_pid is None:
            sig = signal.SIGKILL  # the sandbox is not built yet: nothing in it to stop gracefully
        if w.sandbox_pid is not None and sig != signal.SIGKILL:
            for pid in _descendants(w.sandbox_pid):
                _kill(pid, sig)
            return
        if w.sandbox_pid is not None:
            # pid 1 of the namespace: its end takes every process in it, and bwrap, still alive
            # to reap it, exits with 128+9.
            _kill(w.sandbox_pid, sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, sig)

    def _to_container(self, w: _Worker, sig: signal.Signals) -> None:
        """``sig`` to a container's worker, by name. A container not seen running yet has nothing
        to stop gracefully: its client is killed, and whatever it created removed."""
        assert w.engine is not None and w.container is not None and w.proc is not None
        engine, name = w.engine, w.container
        if w.sandbox_pid is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            self._engine_call(container.remove_args(engine.name, name, engine.path))
        else:
            self._engine_call(container.kill_args(engine.name, name, sig, engine.path))

    def _engine_call(self, argv: list[str], timeout: float = 60.0) -> None:
        async def call() -> None:
            code, out = await container.run_quietly(argv, timeout)
            if code != 0:  # most often: the container has ended meanwhile
                log.debug("%s: exit %s: %s", " ".join(argv[1:]), code, out.strip()[-300:])

        self._track(call())

    def _track(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(work)
        self._engine_calls.add(task)
        task.add_done_callback(self._engine_calls.discard)


def _check_source(m: Mount) -> None:
    if not os.path.exists(m.source):
        raise StartError(f"mount source {m.source} does not exist on this node")


def _prepare_directories(w: _Worker, user: RunAs | None = None) -> None:
    try:
        for d in (w.workdir, w.checkpoints, Path(w.spec.job_checkpoint_dir), w.log.parent):
            d.mkdir(parents=True, exist_ok=True)
        for stale in (REQUEST, DONE):
            (w.checkpoints / stale).unlink(missing_ok=True)
        if user is not None:  # the worker's own directories are the only ones it may write
            for d in (w.workdir, w.checkpoints, Path(w.spec.job_checkpoint_dir)):
                os.chown(d, user.uid, user.gid)
    except OSError as e:
        raise StartError(f"cannot prepare directories: {e}") from None


def _pid(w: _Worker) -> int:
    return w.proc.pid if w.proc is not None else 0


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _handles(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` catches or ignores ``sig``: SIGUSR1's default action is to terminate, and a
    worker still starting up (or one that only watches the file) must not die of a request."""
    bit = 1 << (int(sig) - 1)
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return bool((int(fields["SigCgt"], 16) | int(fields["SigIgn"], 16)) & bit)
    except (OSError, KeyError, ValueError):
        return False


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = _children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _why(e: BaseException | None) -> str:
    if isinstance(e, StartError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    return " | ".join(text[-lines:]) or "no output"
