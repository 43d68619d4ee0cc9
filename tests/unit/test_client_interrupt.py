"""Ctrl-C during a blocking client call (``corral jobs --watch``, ``logs --follow``): the call is
stopped on the client's loop before the interrupt goes on, so the generator it was advancing can
be closed and the command exits as interrupted, not with a "generator is already running" error
and a task left pending."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import AsyncGenerator, Iterator

import pytest

from corral.services.client.sync import Client


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client("nats://127.0.0.1:1", tenant="team-a")  # connects only when asked: nothing here asks
    yield c
    c.close()


def interrupt_once(started: threading.Event, *, to_main: bool = True) -> None:
    """Ctrl-C once the call has begun on the loop: a real SIGINT, sent to the main thread, so
    that it interrupts the wait for the answer; or (``to_main`` False) to another thread, as the
    kernel may deliver a terminal's Ctrl-C to any thread of the process. The main thread then
    gets no interrupted wait, only Python's note that a signal came, which it reads once it
    returns to Python (on a loaded machine, a signal sent to the main thread just before it
    blocks is the same case)."""
    main = threading.main_thread().ident
    assert main is not None

    def later() -> None:
        if not started.wait(timeout=30):
            return
        if to_main:
            signal.pthread_kill(main, signal.SIGINT)
            return
        # Once the main thread waits for the answer (blocked, not between two lines of Python,
        # where it would see the signal anyway), to this thread.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            if frame is not None and frame.f_code.co_name == "wait":
                break
            time.sleep(0.01)
        time.sleep(0.2)  # from its last line of Python into the blocking wait
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Thread(target=later, daemon=True).start()


@pytest.mark.parametrize("to_main", [True, False], ids=["main-thread", "another-thread"])
def test_an_interrupted_call_has_ended_on_the_loop(client: Client, to_main: bool) -> None:
    """Another thread: was, the main thread waited for the answer without ever waking, and the
    call ran on."""
    started, ended = threading.Event(), threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(600)
        finally:
            ended.set()

    interrupt_once(started, to_main=to_main)
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
