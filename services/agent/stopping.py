"""Stopping a worker and signalling its processes: SIGTERM now and SIGKILL after its grace, to every
process of its sandbox, its process group, or its container by name (``Stopping``).

A sandbox's SIGTERM goes to the processes inside only (bwrap dies of it, which would leave the
worker no grace); a container's signals go through its engine, as calls tracked until they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Coroutine

from corral.services.agent import container
from corral.services.agent.decide import STOP_GRACE, WorkerKey
from corral.services.agent.keeper import start_time
from corral.services.agent.worker import Worker, children_of, kill, log


class Stopping:
    """The runtime's part that stops workers and signals their processes."""

    # The runtime's state this part reads, set by ``Runtime.__init__`` (``workers.py``).
    _workers: dict[WorkerKey, Worker]
    _engine_calls: set[asyncio.Task[None]]

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

    def _terminate(self, w: Worker, grace: float) -> None:
        w.phase = "stopping"
        if w.engine is not None and w.container is not None and w.sandbox_pid is not None:
            argv = container.stop_args(w.engine.name, w.container, grace, w.engine.path)
            self._engine_call(argv, timeout=grace + 30.0)
        else:
            self._signal_all(w, signal.SIGTERM)
        if w.killer is None:
            w.killer = asyncio.create_task(self._kill_after(w, grace))

    async def _kill_after(self, w: Worker, grace: float) -> None:
        try:
            await asyncio.wait_for(w.done.wait(), grace)
        except TimeoutError:
            self._signal_all(w, signal.SIGKILL)

    def unkillable(self, after_s: float) -> set[str]:
        """The UUIDs of the GPUs of every worker still there ``after_s`` seconds after it was sent
        SIGKILL: a process in uninterruptible sleep (a hung driver call, a wedged GPU) that keeps
        its GPU's memory, and that no job placed there can use. A MIG slice's or a share's names
        its whole GPU: the health of a GPU is kept whole, and resetting it needs every process
        on it gone. The kill's time is in the worker's record, so an agent that takes it back
        counts from it (``Runtime.reattach``)."""
        now = time.monotonic()
        return {
            g.uuid
            for w in self._workers.values()
            if w.phase != "exited" and w.killed_at is not None and now - w.killed_at >= after_s
            for g in w.spec.gpus
        }

    def _main_pid(self, w: Worker) -> int | None:
        if w.pid is None or w.code is not None:
            return None
        if w.sandbox_pid is None:
            return w.pid
        children = children_of(w.sandbox_pid)
        return children[0] if children else None

    def _signal_all(self, w: Worker, sig: signal.Signals) -> None:
        """``sig`` to every process of the worker. In a sandbox, SIGTERM goes to the processes
        inside only: bwrap itself dies of it, and its death kills the sandbox at once
        (``--die-with-parent``), which would leave the worker no grace."""
        if w.pid is None or w.code is not None:
            return
        if sig == signal.SIGKILL and w.killed_at is None:
            w.killed_at = time.monotonic()  # a worker still there long after is unkillable
            if w.announced:
                w.save()  # the next agent counts from this kill, not from one of its own
        if w.container is not None:
            self._to_container(w, sig)
            return
        if w.sandboxed and w.sandbox_pid is None:
            sig = signal.SIGKILL  # the sandbox is not built yet: nothing in it to stop gracefully
        if w.sandbox_pid is not None and sig != signal.SIGKILL:
            for pid in _descendants(w.sandbox_pid):
                kill(pid, sig)
            return
        if w.sandbox_pid is not None:
            # pid 1 of the namespace: its end takes every process in it, and bwrap, still alive
            # to reap it, exits with 128+9.
            kill(w.sandbox_pid, sig)
            return
        if start_time(w.pid) == w.pid_start:  # not a process that took its pid once it ended
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, sig)

    def _to_container(self, w: Worker, sig: signal.Signals) -> None:
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


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children_of(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out
