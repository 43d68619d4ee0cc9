"""A service started while its server is away waits for it, for as long as it would reconnect
once running; a login the server refuses is said at once, not tried for that long. The intake,
the read service and the forecast role's what-if say they are ready only once the server has
their subscriptions, or has failed to confirm them in time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

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


class Answering:
    """The parts of corral that answer requests (the intake, the read service, the forecast
    role's what-if), each on its own connection and not started; what says each is ready; the
    subject it answers on; and a tenant's connection to ask them (``asker``)."""

    def __init__(self, url: str, stop: asyncio.Event) -> None:
        self.url, self.stop = url, stop
        self.running: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Answering:
        import nats

        from corral.events import subjects
        from corral.services.forecast import service as forecast_service
        from corral.services.intake.service import Intake
        from corral.services.query.service import ReadService
        from corral.services.runtime import forecasts, identities

        self.logs = [await JetStreamLog.connect(self.url, create=True)]
        self.logs += [await JetStreamLog.connect(self.url) for _ in range(2)]
        intake, reader = Intake(self.logs[0], rate=None), ReadService(self.logs[1])
        forecaster = forecast_service.service(self.logs[2], forecasts.MemoryForecasts())
        self.reader = reader
        self.parts: list[tuple[Any, asyncio.Event, str]] = [
            (intake, intake.ready, subjects.intake("team-a", "submit")),
            (reader, reader.caught_up, identities.read_subject("team-a", "jobs")),
            (forecaster, forecaster.answering, identities.read_subject("team-a", forecast_service.WHATIF)),
        ]
        self.asker = await nats.connect(self.url, inbox_prefix=identities.inbox_prefix("team-a"))
        return self

    def start(self, part: Any) -> None:
        self.running.append(asyncio.create_task(part.run(self.stop)))

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.running, return_exceptions=True), 30)
        await self.asker.close()
        self.reader.close()
        for log in self.logs:
            await log.close()


async def test_the_intake_the_read_service_and_what_if_answer_from_the_moment_they_say_they_are_ready(
    nats_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each said so once it had subscribed (the forecast role even before, as it caught up),
    # while its subscription could still wait in its connection's buffer: a request from
    # another connection then (``corral up`` said ready, a person submitted) could reach the
    # server first, and nobody answered it. Here the services' connections write what they
    # buffered 0.3 s late, as on a loaded machine (a write forced, and the asker's, at once).
    from nats.aio.client import Client

    async with Answering(nats_server, asyncio.Event()) as parts:
        flush = Client._flush_pending

        async def late(self: Client, force_flush: bool = False) -> None:
            if force_flush or self is parts.asker:
                await flush(self, force_flush)
                return
            later = asyncio.get_running_loop().call_later
            later(0.3, lambda: asyncio.ensure_future(flush(self, force_flush)))

        monkeypatch.setattr(Client, "_flush_pending", late)
        # One at a time, each asked the moment it says it is ready. Answered, a refusal will
        # do; nats-py raises NoRespondersError where nobody listens.
        for part, ready, subject in parts.parts:
            parts.start(part)
            await asyncio.wait_for(ready.wait(), 30)
            await parts.asker.request(subject, b"{}", timeout=30)


async def test_each_says_it_is_ready_though_the_server_is_slow_to_confirm_its_subscriptions(
    nats_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The forecast role's confirmation ran in a task nothing awaited before the role stopped: a
    # server that did not answer its PING in time ended that task, the error unseen, and
    # ``corral up`` waited for ``answering`` for ever. The intake and the read service ended
    # with their tasks left running. Each goes on as ready: the server has the subscriptions
    # once it answers again.
    import nats.errors
    from nats.aio.client import Client

    # The server's PONG comes after the wait gave up: what the connection wrote before its PING
    # (the subscriptions) has reached the server, only the confirmation is late. Raising before
    # the buffer was written would model a client that never sent its subscriptions, and a
    # request could then find nobody listening.
    flush = Client.flush

    async def slow(self: Client, timeout: int = 10) -> None:
        await flush(self, timeout)
        raise nats.errors.FlushTimeoutError

    async with Answering(nats_server, asyncio.Event()) as parts:
        monkeypatch.setattr(Client, "flush", slow)
        for part, _, _ in parts.parts:
            parts.start(part)
        for _, ready, subject in parts.parts:
            await asyncio.wait_for(ready.wait(), 30)
            await parts.asker.request(subject, b"{}", timeout=30)
        assert not any(t.done() for t in parts.running)
