"""Runs workers as real processes: start behind a gang barrier, checkpoint on request, stop, and
report what happened. The agent's service drives it with the actions of ``decide`` and turns its
reports (``Runtime.reports``) into node events with ``decide.report_events``.

Each worker runs under a keeper process of its own (``keeper.py``), so that it outlives the
agent: the agent learns how it runs and how it ended from the files its keeper writes, not from
being its parent. What one agent leaves for the next (``Runtime.leave``) and how the next takes
the workers back (``Runtime.reattach``) is ``handover.py``'s: the record beside each keeper, the
keeper's pid, start time and boot, the exits written while no agent watched.

Each worker gets a working directory ``<root>/work/<job>/attempt-<a>/rank-<r>`` and its stdout and
stderr go to ``<root>/logs/<job>/attempt-<a>.rank-<r>.log`` (``job_logs``; the agent ships what
they gain to the output stream, ``output.py``, which ``corral logs JOB`` reads). Where ``bwrap``
(bubblewrap) works, each worker runs in its own mount and PID namespace: a read-only view of the
host's root, private ``/proc``, ``/dev`` and ``/tmp``, its working and checkpoint directories
read-write, and each data mount bound at the path the job asked for, read-only when asked; it
dies with its keeper (``--die-with-parent``). Without bwrap, workers run as plain processes in
their own session, and a job with data mounts cannot start (unless each mount's target is its
source).

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
from typing import Any, Literal, NamedTuple

from corral.events.jobs import Mount
from corral.services.agent import container, handover, sandbox
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
from corral.services.agent.handover import Kept, WorkerRecord, keeper_dir
from corral.services.agent.keeper import start_time
from corral.services.agent.sandbox import RunAs

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]
Prepare = Callable[[StartWorker], Awaitable[None]]
REQUEST = "REQUEST"
DONE = "DONE"
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")
_OTLP = "OTEL_EXPORTER_OTLP_"  # where the agent sends spans, a job's own spans go too
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
        self.dir = keeper_dir(root, self.key)
        self.checkpoints = Path(spec.checkpoint_dir)
        self.keeper: asyncio.subprocess.Process | None = None  # a keeper this agent started
        self.keeper_id: tuple[int, int] | None = None  # its pid and start time
        self.boot = ""  # the boot the keeper ran in: after a reboot no pid is its
        self.pid: int | None = None  # the keeper's child: the command, bwrap or the engine's client
        self.pid_start = 0
        self.appended: set[str] = set()  # "start", "exit": what the log is known to hold
        # bwrap's init process, pid 1 of the worker's namespace; or the container's init, seen
        # from the host once the container runs
        self.sandbox_pid: int | None = None
        self.container: str | None = None  # the container's name, for a worker in one
        self.sandboxed = False  # run by bwrap
        self.engine: EngineInfo | None = None
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

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            spec=self.spec,
            container=self.container,
            engine=self.engine,
            container_pid=self.sandbox_pid if self.container is not None else None,
            sandboxed=self.sandboxed,
            announced=self.announced,
            reported_pid=self.reported_pid,
            stop_grace=self.stop_grace if self.stop_requested else None,
            start_appended="start" in self.appended,
            exit_appended="exit" in self.appended,
        )

    def save(self) -> None:
        """Write the record, whole, where the next agent looks for it."""
        handover.save(self.dir, self.record())

    def drop(self) -> None:
        """Forget the worker on disk: nothing of it is left to take back."""
        handover.drop(self.dir)


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
            base_env = {k: v for k, v in os.environ.items() if k in _INHERITED or k.startswith(_OTLP)}
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
                w.save()  # before its start is reported: the next agent reports what this one did
                self.reports.put_nowait(Started(w.key, w.reported_pid))
                if w.stop_requested:  # stopped while it was starting
                    self._terminate(w, w.stop_grace)
            return GangResult(tuple(w.key for w in gang))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for w in gang:
            w.settled.set()
            if w.pid is not None and w.code is None:
                self._terminate(w, grace=1.0)
            else:
                w.phase = "exited"
                if w.watcher is None:
                    w.drop()
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

    async def _keep(
        self,
        w: _Worker,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        what: str,
        *,
        cwd: Path | None = None,
        bwrap: bool = False,
        user: RunAs | None = None,
    ) -> None:
        """Run ``argv`` under a keeper of its own (``keeper.py``), so that the worker outlives this
        agent; return once the keeper has said what runs. ``what``: the program, in a reason."""
        command = handover.keeper_command(w.dir, argv, bwrap=bwrap, user=user)
        w.save()
        with open(w.log, "ab") as out:
            try:
                w.keeper = await asyncio.create_subprocess_exec(
                    *command,
                    cwd=cwd,
                    env=None if env is None else dict(env),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C at the agent's terminal is not the worker's
                )  # fmt: skip
            except OSError as e:
                raise StartError(f"cannot run {command[0]}: {e.strerror or e}") from None
        keeper = w.keeper
        try:
            state = await self._keeper_state(w, lambda s: True)
        except BaseException:
            # A start cut short (the gang's barrier gave up): the keeper's end takes its child.
            _kill(keeper.pid, signal.SIGKILL)
            await asyncio.shield(keeper.wait())
            raise
        if state is None:
            raise StartError(f"cannot run {what}: {_tail(w.log)}")
        if "error" in state:
            raise StartError(f"cannot run {what}: {state['error']}")
        w.keeper_id = (keeper.pid, int(state["keeper"][1]))
        w.boot = str(state.get("boot", ""))
        w.pid, w.pid_start = int(state["worker"][0]), int(state["worker"][1])
        w.watcher = asyncio.create_task(self._watch(w))

    async def _keeper_state(
        self, w: _Worker, enough: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any] | None:
        """The keeper's state once ``enough`` says it is, or its last state once it has ended."""
        # The keeper's end, or once a watcher waits for it, the worker's.
        ended: asyncio.Future[Any] = asyncio.ensure_future(
            w.keeper.wait() if w.watcher is None and w.keeper is not None else w.done.wait()
        )
        delay = 0.002
        try:
            while True:
                state = handover.keeper_state(w.dir)
                if state is not None and enough(state):
                    return state
                if ended.done():
                    return handover.keeper_state(w.dir)
                await asyncio.wait({ended}, timeout=delay)
                delay = min(delay * 2, self.poll_interval)
        finally:
            ended.cancel()

    async def _spawn_plain(self, w: _Worker, env: dict[str, str]) -> None:
        await self._keep(w, w.spec.command, env, w.spec.command[0], cwd=w.workdir, user=self._as)

    async def _spawn_sandboxed(self, w: _Worker, env: dict[str, str]) -> None:
        assert self._bwrap is not None
        try:
            become = sandbox.become(self._as) if self._as is not None else []
        except sandbox.BindError as e:
            raise StartError(str(e)) from None
        # The keeper makes bwrap's status pipe and puts its end where the number stands.
        argv = [self._bwrap, *self._sandbox_args(w, 0), "--", *become, *w.spec.command]
        w.sandboxed = True
        await self._keep(w, argv, env, "bwrap", bwrap=True)
        state = await self._keeper_state(w, lambda s: "sandbox" in s)
        if state is None or "sandbox" not in state:
            await w.done.wait()
            raise StartError(f"sandbox setup failed: {_tail(w.log)}")
        w.sandbox_pid = int(state["sandbox"][0])
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
        await self._keep(w, argv, None, engine.path)
        # Started once the container's init runs: the engine may pull the image first, and may
        # fail to create the container at all.
        inspect = container.pid_args(engine.name, name, engine.path)
        delay = 0.005
        while not w.done.is_set():
            code, answer = await container.run_quietly(inspect, 30.0)
            if code == 0 and answer.strip().isdigit() and int(answer) > 0:
                w.sandbox_pid = int(answer)
                w.save()  # the next agent stops it by name once it runs
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
        """Until the keeper says how the worker ended: poll for its checkpoints meanwhile. A
        keeper this agent started is its child, waited for; one taken back is looked at."""
        waiting = asyncio.ensure_future(w.keeper.wait()) if w.keeper is not None else None
        try:
            while (code := handover.exit_of(w.dir)) is None:
                if waiting is not None:
                    if waiting.done():
                        code = handover.exit_of(w.dir)
                        break
                    await asyncio.wait({waiting}, timeout=self.poll_interval)
                elif not handover.alive(w.keeper_id, w.boot):
                    code = handover.exit_of(w.dir)  # it may have written the exit as it ended
                    break
                else:
                    await asyncio.sleep(self.poll_interval)  # not our child: nothing to wait on
                if w.announced:
                    if w.signal_owed:
                        self._signal_checkpoint(w)
                    self._poll_checkpoint(w, final=False)
        finally:
            if waiting is not None and not waiting.done():
                waiting.cancel()
        # A keeper gone without an exit (killed itself): its child died with it, how is unknown.
        w.code = GONE_CODE if code is None else code
        w.done.set()
        await w.settled.wait()
        if w.announced:
            self._poll_checkpoint(w, final=True)  # a checkpoint written just before exiting
            self.reports.put_nowait(Exited(w.key, w.code, w.stop_requested, w.reported_pid))
        else:
            w.drop()  # never reported: nothing of it for the log, or for the next agent
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
        if w.pid is None or w.code is not None or not w.settled.is_set():
            return  # still starting: stopped once the barrier has decided
        if w.announced:
            w.save()  # a stop the next agent carries on, and reports as corral's
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
            w.drop()

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
        return taken

    def _taken(self, kept: Kept) -> _Worker | None:
        record, code = kept.record, kept.code
        w = _Worker(record.spec, self.root)
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
                _kill(w.keeper_id[0], signal.SIGKILL)
            if w.container is not None and self._containers != "none":
                self._track(self._remove_lost_container(w.key))
            w.drop()
            return None
        w.settled.set()
        self._workers[w.key] = w
        if "start" not in w.appended:
            self.reports.put_nowait(Started(w.key, w.reported_pid))
        if record.stop_grace is not None:
            w.stop_requested, w.stop_grace = True, record.stop_grace
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
            self._terminate(w, w.stop_grace)
        return w

    async def close(self, grace: float = 5.0) -> None:
        """Stop every worker and wait for them (the agent is shutting down)."""
        for w in list(self._workers.values()):
            if w.pid is not None and w.code is None:
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
        if w.pid is None or w.code is not None:
            return None
        if w.sandbox_pid is None:
            return w.pid
        children = _children(w.sandbox_pid)
        return children[0] if children else None

    def _signal_all(self, w: _Worker, sig: signal.Signals) -> None:
        """``sig`` to every process of the worker. In a sandbox, SIGTERM goes to the processes
        inside only: bwrap itself dies of it, and its death kills the sandbox at once
        (``--die-with-parent``), which would leave the worker no grace."""
        if w.pid is None or w.code is not None:
            return
        if w.container is not None:
            self._to_container(w, sig)
            return
        if w.sandboxed and w.sandbox_pid is None:
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
        if start_time(w.pid) == w.pid_start:  # not a process that took its pid once it ended
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, sig)

    def _to_container(self, w: _Worker, sig: signal.Signals) -> None:
        """``sig`` to a container's worker, by name. A container not seen running yet has nothing
        to stop gracefully: its client is killed, and whatever it created removed."""
        assert w.engine is not None and w.container is not None and w.pid is not None
        engine, name = w.engine, w.container
        if w.sandbox_pid is None:
            if start_time(w.pid) == w.pid_start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.pid, signal.SIGKILL)
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
    return w.pid or 0


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
