"""The blocking client: the asyncio one run on a loop of its own, in a thread of its own, so it
works the same in a script, in a notebook whose loop is already running, and in the CLI."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from corral.events.jobs import JobSpec
from corral.services.client.aio import VERDICT_TIMEOUT, WHATIF_TIMEOUT, AsyncClient
from corral.services.client.results import Applied, AsOf, Explanation, Job, OutputLine, Submitted, WhatIf

T = TypeVar("T")

CANCEL_WAIT = 5.0  # seconds an interrupted call is given to unwind on the loop
# How often the waiting thread wakes while a call runs. A Ctrl-C that arrives just before the
# thread blocks for the answer wakes nothing (CPython handles a signal when the blocked thread
# returns to Python); waking now and then handles it within this many seconds, not never.
WAKE_S = 0.25


async def _cancelled(running: list[asyncio.Task[Any]]) -> None:
    """Cancel the interrupted call's task (it runs before this one, on the same loop) and wait
    for it to end."""
    for task in running:
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_WAIT)


class Client:
    """``with Client(server, tenant=...) as c: c.submit({...})``; the same arguments, methods and
    errors as ``AsyncClient``, each call blocking until it has its answer."""

    def __init__(
        self,
        server: str | None = None,
        *,
        tenant: str | None = None,
        user: str | None = None,
        password: str | None = None,
        credentials: str | os.PathLike[str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.aio = AsyncClient(
            server, tenant=tenant, user=user, password=password, credentials=credentials, timeout=timeout
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="corral-client", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        running: list[asyncio.Task[Any]] = []

        async def tracked() -> T:
            if (task := asyncio.current_task()) is not None:
                running.append(task)
            return await coro

        call = None
        outer = tracked()
        try:
            call = asyncio.run_coroutine_threadsafe(outer, self._loop)
            while not call.done():
                concurrent.futures.wait((call,), timeout=WAKE_S)
            return call.result()
        except BaseException:
            # Interrupted (Ctrl-C) while handing the call over or waiting for it: it may still
            # run on the loop. Stop it there and wait until it has stopped, so that what closes
            # next (the generator it was advancing, the connection) finds it ended, not running,
            # and the command exits. Loop callbacks run in order, so a call handed over before
            # has begun by the time this runs; one never handed over is closed unstarted.
            if call is None or not call.done():
                ended = asyncio.run_coroutine_threadsafe(_cancelled(running), self._loop)
                ended.result(timeout=CANCEL_WAIT)
                if not running:
                    outer.close()
                    coro.close()
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.aio.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def tenant(self) -> str:
        return self.aio.tenant

    @property
    def as_of(self) -> AsOf | None:
        """How current the read service's last answer was (``AsyncClient.as_of``)."""
        return self.aio.as_of

    def submit(
        self,
        spec: JobSpec | dict[str, Any],
        id: str | None = None,  # noqa: A002 - the job's id, as the job file calls it
        *,
        wait: bool = True,
        timeout: float = VERDICT_TIMEOUT,
    ) -> Submitted:
        return self._run(self.aio.submit(spec, id, wait=wait, timeout=timeout))

    def cancel(
        self, job_id: str, reason: str = "", *, wait: bool = True, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        return self._run(self.aio.cancel(job_id, reason, wait=wait, timeout=timeout))

    def resize(
        self, job_id: str, replicas: int, *, wait: bool = True, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        return self._run(self.aio.resize(job_id, replicas, wait=wait, timeout=timeout))

    def jobs(self, *, all: bool = False) -> list[Job]:  # noqa: A002 - as `corral jobs --all`
        return self._run(self.aio.jobs(all=all))

    def job_list(self, *, all: bool = False) -> tuple[list[Job], int]:  # noqa: A002
        return self._run(self.aio.job_list(all=all))

    def watch(self, *, all: bool = False) -> Iterator[list[Job]]:  # noqa: A002 - as `corral jobs --all`
        """As ``AsyncClient.watch``: the jobs now, then again each time the log moves on."""
        updates = self.aio.watch(all=all)

        async def next_update() -> list[Job]:
            return await anext(updates)

        try:
            while True:
                yield self._run(next_update())
        finally:
            self._run(updates.aclose())

    def logs(
        self, job_id: str, rank: int | None = None, tail: int | None = None, follow: bool = False
    ) -> Iterator[OutputLine]:
        """As ``AsyncClient.logs``: the job's output, line by line; ``follow`` until it ends."""
        lines = self.aio.logs(job_id, rank, tail, follow)

        async def next_line() -> OutputLine | None:
            return await anext(lines, None)

        try:
            while (line := self._run(next_line())) is not None:
                yield line
        finally:
            self._run(lines.aclose())

    def cordon(
        self, node: str, reason: str = "", *, drain: bool = False, timeout: float = VERDICT_TIMEOUT
    ) -> Applied:
        return self._run(self.aio.cordon(node, reason, drain=drain, timeout=timeout))

    def uncordon(self, node: str, *, repaired: bool = False, timeout: float = VERDICT_TIMEOUT) -> Applied:
        return self._run(self.aio.uncordon(node, repaired=repaired, timeout=timeout))

    def delete_node(self, node: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        return self._run(self.aio.delete_node(node, timeout=timeout))

    def delete_queue(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        return self._run(self.aio.delete_queue(name, timeout=timeout))

    def delete_cohort(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        return self._run(self.aio.delete_cohort(name, timeout=timeout))

    def delete_priority_class(self, name: str, *, timeout: float = VERDICT_TIMEOUT) -> Applied:
        return self._run(self.aio.delete_priority_class(name, timeout=timeout))

    def explain(self, job_id: str) -> Explanation:
        return self._run(self.aio.explain(job_id))

    def whatif(
        self,
        spec: JobSpec | dict[str, Any],
        id: str | None = None,  # noqa: A002 - the job's id, as the job file calls it
        *,
        timeout: float = WHATIF_TIMEOUT,
    ) -> WhatIf:
        return self._run(self.aio.whatif(spec, id, timeout=timeout))

    def wait(self, job_id: str, state: str = "running", *, timeout: float = 600.0) -> Job:
        return self._run(self.aio.wait(job_id, state, timeout=timeout))
