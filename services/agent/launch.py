"""Launching a gang's workers, each under a keeper of its own, and watching each until it ends
(``Launching``): on the host, in a bwrap sandbox or in a container, behind the gang's barrier.

A gang starts whole or not at all: when any worker fails to start, or not within the timeout,
the others are stopped unreported and the first failure is the gang's. Whether bwrap can run
and which engine runs containers are probed once, by the first start to ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import resource
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from corral.events.jobs import Mount, image_problem
from corral.services.agent import confined, container, handover, sandbox
from corral.services.agent.checkpoints import Checkpoints
from corral.services.agent.container import ContainerMode, EngineInfo, Probe
from corral.services.agent.decide import GONE_CODE, Exited, Started, StartFailed, StartWorker, WorkerKey
from corral.services.agent.sandbox import RunAs, SandboxMode
from corral.services.agent.worker import DONE, REQUEST, StartError, Worker, children_of, kill, log, log_tail

Prepare = Callable[[StartWorker], Awaitable[None]]


_MIG_PLACEHOLDER = re.compile(r"mig:([^/,]+)/([^@,]+)@(\d+)")


class GangResult(NamedTuple):
    started: tuple[WorkerKey, ...]
    failed: WorkerKey | None = None
    reason: str = ""


class Launching(Checkpoints):
    """The runtime's part that starts workers and watches them until they end."""

    # The runtime's state this part reads, set by ``Runtime.__init__`` (``workers.py``).
    root: Path
    node: str
    poll_interval: float
    _mode: SandboxMode
    _hidden: list[str]
    _narrow: bool
    _as: RunAs | None
    _bwrap: str | None
    _probe: asyncio.Future[str | None] | None
    _containers: ContainerMode
    _engine_probe: asyncio.Future[Probe] | None
    _agent: str | None
    _prepare: Prepare | None
    _base_env: dict[str, str]
    _mig: dict[tuple[str, int], str]

    async def sandboxed(self) -> bool:
        """Whether workers run in a bwrap sandbox (probed once, by the first start to ask: bwrap
        may be installed but not allowed to create namespaces)."""
        if self._mode == "none":
            return False
        if self._probe is None:
            self._probe = asyncio.ensure_future(sandbox.probe())
        self._bwrap = await asyncio.shield(self._probe)
        if self._mode == "bwrap" and self._bwrap is None:
            raise StartError(
                "sandbox 'bwrap' was asked for, but bwrap is missing or cannot run here", node=True
            )
        return self._bwrap is not None

    async def container_engine(self) -> Probe:
        """The engine that runs image jobs here, or why none can (probed once, by the first
        start to ask: an engine may be installed but unable to work)."""
        if self._engine_probe is None:
            self._engine_probe = asyncio.ensure_future(container.probe(self._containers))
        return await asyncio.shield(self._engine_probe)

    def agent_id(self) -> str:
        """The id of this agent's work directory, which its containers' names carry
        (``container.agent_id``): read once, made by the first agent on the directory. Raises
        ``OSError`` where it cannot be read or kept."""
        if self._agent is None:
            self._agent = container.agent_id(self.root)
        return self._agent

    async def start_gang(self, specs: Sequence[StartWorker], timeout: float) -> GangResult:
        """Start a gang's workers on this node together. When every one has started, report
        them all started; if any fails or is not started within ``timeout`` seconds, stop them
        all (silently: they were never reported) and report the first failure."""
        gang = [Worker(s, self.root) for s in specs if s.key not in self._workers]
        for w in gang:
            self._workers[w.key] = w  # before any await: ``decide`` must not start them twice
        if not gang:
            return GangResult(())
        launches = {w.key: asyncio.create_task(self._launch(w)) for w in gang}
        done, pending = await asyncio.wait(
            launches.values(), timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        failures: list[tuple[WorkerKey, str, bool]] = []  # (rank, why, the node's fault)
        for w in gang:
            t = launches[w.key]
            if t in done and t.exception() is not None:
                failures.append((w.key, _why(t.exception()), _node_fault(t.exception())))
            elif t in pending:
                failures.append((w.key, f"not started within {timeout:g}s", False))
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
        key, reason, node_fault = min(real or failures, key=lambda f: f[0].rank)
        log.warning(
            "gang %s attempt %s failed to start: rank %s: %s%s",
            key.job_id,
            key.attempt,
            key.rank,
            reason,
            " (the node's fault)" if node_fault else "",
        )
        self.reports.put_nowait(StartFailed(key, reason, node_fault))
        return GangResult((), key, reason)

    async def _launch(self, w: Worker) -> None:
        spec = w.spec
        if spec.image is not None:
            await self._launch_container(w)
            return
        if not spec.command:
            raise StartError("the job has no command to run")
        sandboxed = await self.sandboxed()
        spec = w.spec = _resolved(spec, self._hidden)
        for m in spec.mounts:
            if not sandboxed and os.path.realpath(m.source) != os.path.realpath(m.target):
                # What this job asks of a node that does not offer it (every job without data mounts
                # starts here): the job's to fail, not the node's, which no quarantine should take.
                raise StartError(f"data mount {m.target} needs bubblewrap (bwrap), which this node lacks")
        env = await self._prepare_start(w, {**self._base_env, **spec.env})
        if sandboxed:
            await self._spawn_sandboxed(w, env)
        else:
            await self._spawn_plain(w, env)

    async def _launch_container(self, w: Worker) -> None:
        spec = w.spec
        problem = image_problem(spec.image or "")
        if problem:  # admission refuses it; a view written some other way meets this
            raise StartError(problem)
        found = await self.container_engine()
        engine = found.engine
        if engine is None:  # as a data mount without bwrap: what the job asks, not a fault here
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
        spec = w.spec = _resolved(spec, self._hidden)
        env = await self._prepare_start(w, container.container_env(spec.env))
        try:
            devices = container.gpu_devices(spec.gpus, self._mig)
        except LookupError as e:  # a GPU or MIG device it was placed on is not here
            raise StartError(str(e), node=True) from None
        ulimits = None
        if engine.name == "podman":
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
            ulimits = container.podman_ulimits(nofile, resource.getrlimit(resource.RLIMIT_NPROC))
        workdir = str(w.workdir)
        user = None if self._as is None else (self._as.uid, self._as.gid)
        try:
            agent = self.agent_id()
        except OSError as e:  # the node's disk or permissions, under corral's own directory
            log.warning("worker %s: cannot keep the agent's id: %s", w.key, e)
            raise StartError(f"cannot keep the agent's id: {_what(e)}", node=True) from None
        argv = container.run_args(
            engine.name,
            spec,
            agent=agent,
            workdir=workdir,
            env=env,
            devices=devices,
            ulimits=ulimits,
            exe=engine.path,
            user=user,
        )
        await self._spawn_container(w, engine, argv)

    async def _prepare_start(self, w: Worker, env: dict[str, str]) -> dict[str, str]:
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
        w: Worker,
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
                if e.errno == errno.E2BIG:  # an argument or variable of the job's, too long to run
                    raise StartError(f"cannot run {what}: its command or environment is too long") from None
                # The keeper is corral's own: the node could not run it.
                raise StartError(f"cannot run {command[0]}: {e.strerror or e}", node=True) from None
        keeper = w.keeper
        try:
            state = await self._keeper_state(w, lambda s: True)
        except BaseException:
            # A start cut short (the gang's barrier gave up): the keeper's end takes its child.
            kill(keeper.pid, signal.SIGKILL)
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
        self, w: Worker, enough: Callable[[dict[str, Any]], bool]
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

    async def _spawn_plain(self, w: Worker, env: dict[str, str]) -> None:
        await self._keep(w, w.spec.command, env, w.spec.command[0], cwd=w.workdir, user=self._as)

    async def _spawn_sandboxed(self, w: Worker, env: dict[str, str]) -> None:
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
        while not children_of(w.sandbox_pid) and not w.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.done.wait(), delay)
            delay = min(delay * 2, self.poll_interval)
        if w.done.is_set():
            problem = sandbox.bwrap_error(log_tail(w.log))
            if problem:
                raise StartError(f"sandbox setup failed: {problem}")

    async def _spawn_container(self, w: Worker, engine: EngineInfo, argv: list[str]) -> None:
        w.engine = engine
        w.container = name = container.container_name(*w.key, agent=self.agent_id())
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
        problem = container.engine_error(log_tail(w.log)) if w.code in container.ENGINE_FAILURES else ""
        if problem:
            where = f"on node {self.node}"
            raise StartError(f"{engine.name} could not run image {w.spec.image} {where}: {problem}")

    def _sandbox_args(self, w: Worker, status_fd: int) -> list[str]:
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

    async def _watch(self, w: Worker) -> None:
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


def _resolved(spec: StartWorker, hidden: Sequence[str]) -> StartWorker:
    """``spec`` with each data mount's source checked (``_check_source``) and named by its
    resolved path, which is what is bound: a symlink on the way, re-pointed between the check
    and the bind, is not followed again."""
    if not spec.mounts:
        return spec
    mounts = tuple(msgspec.structs.replace(m, source=_check_source(m, hidden)) for m in spec.mounts)
    return msgspec.structs.replace(spec, mounts=mounts)


def _check_source(m: Mount, hidden: Sequence[str] = ()) -> str:
    """A data mount's source, resolved: it must exist, and must neither be, lie inside nor hold
    one of the directories corral keeps from workers (``hidden``: the data directory, with the
    credentials, the log's store and every job's files): a bind of it would show them again."""
    if not os.path.exists(m.source):
        raise StartError(f"mount source {m.source} does not exist on this node")
    source = os.path.realpath(m.source)
    for h in hidden:
        kept = os.path.realpath(h)
        if _within(source, kept) or _within(kept, source):
            raise StartError(f"mount source {m.source} would show corral's own directory {h} to the job")
    return source


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _prepare_directories(w: Worker, user: RunAs | None = None) -> None:
    """The worker's directories, made and given to its user. Below the job's run directory, which
    the job's earlier workers could write, each is reached without following a link
    (``confined``): one planted there would have the agent make, clear or chown a directory of
    the worker's choosing."""
    try:
        for path in (w.workdir, w.log.parent, w.checkpoint_top):
            path.mkdir(parents=True, exist_ok=True)
        if user is not None:
            os.chown(w.workdir, user.uid, user.gid)
        job_dir = Path(w.spec.job_checkpoint_dir)
        with confined.directory(w.checkpoint_top, job_dir, create=True) as fd:
            if user is not None:
                os.fchown(fd, user.uid, user.gid)
        with confined.directory(w.checkpoint_top, w.checkpoints, create=True) as fd:
            for stale in (REQUEST, DONE):
                confined.remove(fd, stale)
            if user is not None:  # the worker's own directories are the only ones it may write
                os.fchown(fd, user.uid, user.gid)
    except confined.Escaped as e:  # a link or file the job's own workers left in its directories
        raise StartError(f"cannot prepare directories: {e}") from None
    except OSError as e:  # the node's disk or permissions, under corral's own directories
        # Where, for the node's operator; the job's owner is told what, not the node's paths.
        log.warning("worker %s: cannot prepare directories: %s", w.key, e)
        raise StartError(f"cannot prepare directories: {_what(e)}", node=True) from None
    except ValueError as e:  # the job's checkpoint directory, as it names it
        raise StartError(f"cannot prepare directories: {e}") from None


def _pid(w: Worker) -> int:
    return w.pid or 0


def _why(e: BaseException | None) -> str:
    if isinstance(e, StartError):
        return str(e)
    if isinstance(e, OSError):
        log.warning("a worker's start failed: %s", e)  # with the node's paths, for its operator
        return f"{type(e).__name__}: {_what(e)}"
    return f"{type(e).__name__}: {e}"


def _what(e: OSError) -> str:
    """What went wrong, without the node's paths an ``OSError`` names (the job's owner reads it)."""
    return e.strerror or type(e).__name__


def _node_fault(e: BaseException | None) -> bool:
    """Whether a start failed for the node's fault (``StartError.node``): also an error of the
    system the launch met writing corral's own files (a worker's record on a full disk)."""
    if isinstance(e, StartError):
        return e.node
    return isinstance(e, OSError) and not isinstance(e, confined.Escaped)


def _tail(path: Path, lines: int = 3) -> str:
    text = log_tail(path).strip().splitlines()
    return " | ".join(text[-lines:]) or "no output"
