"""A service started while its server is away waits for it, for as long as it would reconnect
once running; a login the server refuses is said at once, not tried for that long."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from corral.events.jetstream import JetStreamLog
from corral.events.server import EmbeddedServer, User, free_ports
from corral.services.cli.access import Failure, Login, open_log


async def test_a_service_started_before_its_server_opens_the_log_once_the_server_is_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (port,) = free_ports(1)
    url = f"nats://127.0.0.1:{port}"
    server = EmbeddedServer(tmp_path / "nats", port=port)
    opening = asyncio.create_task(open_log(url, reconnect=60.0))
    async with asyncio.timeout(30):
        while "trying again for 60 s" not in capsys.readouterr().err:  # it has failed once
            assert not opening.done(), opening
            await asyncio.sleep(0.05)
    await server.start()
    try:
        setup = await JetStreamLog.connect(url, create=True)  # `corral up`'s part: the stream
        await setup.close()
        log = await asyncio.wait_for(opening, 30)
        await log.close()
    finally:
        await server.stop()


async def test_a_command_gives_up_at_once_and_a_refused_login_is_not_tried_again(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    url = f"nats://127.0.0.1:{port}"
    began = time.monotonic()
    with pytest.raises(Failure, match="cannot reach"):
        await open_log(url)  # a command's: no server, no waiting
    async with EmbeddedServer(tmp_path / "nats", port=port, users=[User("a", "right")]):
        with pytest.raises(Failure, match="[Aa]uthoriz"):
            await open_log(url, Login("a", "wrong"), reconnect=60.0)
    assert time.monotonic() - began < 30  # neither waited out the 60 s a service reconnects for
