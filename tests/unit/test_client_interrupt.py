"""Ctrl-C during a blocking client call (``corral jobs --watch``, ``logs --follow``): the call is
stopped on the client's loop before the interrupt goes on, so the generator it was advancing can
be closed and the command exits as interrupted, not with a "generator is already running" error
and a task left pending."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncGenerator, Iterator

import pytest

from corral.services.client.sync import Client


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client("nats://127.0.0.1:1", tenant="team-a")  # connects only when asked: nothing here asks
    yield c
    c.close()


def interrupt_once(started: threading.Event) -> None:
    """Ctrl-C in the main thread once the call has begun on the loop: a real SIGINT, sent to the
    main thread, so that it interrupts the wait for the answer as a terminal's would."""
    main = threading.main_thread().ident
    assert main is not None

    def later() -> None:
        if started.wait(timeout=30):
            signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=later, daemon=True).start()


def test_an_interrupted_call_has_ended_on_the_loop_when_the_interrupt_arrives(client: Client) -> None:
    started, ended = threading.Event(), threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(600)
        finally:
            ended.set()

    interrupt_once(started)
    with pytest.raises(KeyboardInterrupt):
        client._run(slow())
    assert ended.is_set()


def test_a_generator_interrupted_mid_step_closes_cleanly(client: Client) -> None:
    started, closed = threading.Event(), threading.Event()

    async def updates() -> AsyncGenerator[int, None]:
        try:
            while True:
                started.set()
                await asyncio.sleep(600)
                yield 1
        finally:
            closed.set()

    gen = updates()

    async def step() -> int:
        return await anext(gen)

    interrupt_once(started)
    with pytest.raises(KeyboardInterrupt):
        client._run(step())
    client._run(gen.aclose())  # was: RuntimeError, aclose(): asynchronous generator is already running
    assert closed.is_set()
