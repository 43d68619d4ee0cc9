"""Shared fixtures. Integration tests get a real nats-server with JetStream, one per test, on a
free loopback port with its store in the test's temporary directory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from corral.events.server import EmbeddedCluster, EmbeddedServer


@pytest.fixture
async def embedded_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedServer]:
    """The server itself, for tests that stop and restart it (the port and store are kept)."""
    server = EmbeddedServer(tmp_path_factory.mktemp("nats"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def nats_server(embedded_server: EmbeddedServer) -> AsyncIterator[str]:
    """The URL of a running nats-server with JetStream, e.g. ``nats://127.0.0.1:40123``."""
    yield embedded_server.url


@pytest.fixture
async def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedCluster]:
    """Three nats-servers as one JetStream cluster on loopback, each with its own store; its
    ``url`` is all three, comma separated. Tests kill and restart its ``servers``."""
    cluster = EmbeddedCluster(tmp_path_factory.mktemp("nats-cluster"))
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture(autouse=True)
def _corral_logging_let_go() -> Iterator[None]:
    """A command run in-process (``main([...])``, ``corral serve`` in a test) configures the
    root logger onto the stream it had then: a test's captured output. Left there, a later
    record (a thread's, another test's) went to a closed file, and the logging error that
    followed landed in the output of whatever test ran then, which asserts on it."""
    root = logging.getLogger()
    level = root.level
    yield
    for h in list(root.handlers):
        if h.get_name() == "corral":
            root.removeHandler(h)
    root.setLevel(level)
