"""``corral up --cluster`` starts again a nats-server of its cluster that ended on its own, and
leaves one stopped on purpose until it is started again: it waits on the server (its start, its
process's exit), never looking at it on a timer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.services.cli.up import _keep_up

WAIT = 5.0


class Server:
    """An ``EmbeddedServer`` as ``_keep_up`` uses it, its process's ends told by the test."""

    name = "n1"
    log_path = Path("nats-server.log")

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()
        self.exit: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.waiting_exit = asyncio.Event()
        self.waiting_start = asyncio.Event()
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.ready.is_set()

    async def started(self) -> None:
        if not self.ready.is_set():
            self.waiting_start.set()
        await self.ready.wait()

    async def ended_on_its_own(self) -> int | None:
        self.waiting_exit.set()
        return await self.exit

    def ends(self, code: int | None) -> None:
        """Its process ends: on its own (``code``) or stopped on purpose (None)."""
        if code is None:
            self.ready.clear()
        self.waiting_exit.clear()
        self.exit.set_result(code)
        self.exit = asyncio.get_running_loop().create_future()

    async def kill(self) -> None:
        self.ready.clear()

    async def start(self) -> None:
        self.starts += 1
        self.ready.set()


async def test_a_server_stopped_on_purpose_waits_for_its_start_and_one_that_dies_is_started() -> None:
    srv = Server()
    keeping = asyncio.create_task(_keep_up(srv, backoff=0.0))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(srv.waiting_exit.wait(), WAIT)
        srv.ends(None)  # stopped on purpose: left down, waited on until it is started
        await asyncio.wait_for(srv.waiting_start.wait(), WAIT)
        assert srv.starts == 0
        srv.ready.set()  # a drill starts it again: its exit is waited on again
        await asyncio.wait_for(srv.waiting_exit.wait(), WAIT)
        srv.ends(137)  # killed from outside: started again
        await asyncio.wait_for(srv.waiting_exit.wait(), WAIT)
        assert srv.starts == 1 and srv.running
    finally:
        keeping.cancel()
