"""The embedded nats-server as ``corral up`` runs it: it holds the files it is given while it
runs (``corral up``'s lock of its data directory), so that a server outliving its corral still
keeps a second one off its store."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
from pathlib import Path

import pytest

from corral.events import server as server_module
from corral.events.server import EmbeddedCluster, EmbeddedServer, User


def _locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


async def test_the_server_holds_the_lock_it_is_given_while_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "corral.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    server = EmbeddedServer(tmp_path / "nats", hold_fds=(fd,))
    await server.start()
    try:
        os.close(fd)  # the corral that took it is gone
        assert _locked(path)
    finally:
        await server.stop()
    assert not _locked(path)


async def test_the_servers_log_is_rotated_and_its_oldest_files_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server up for months appended to one log file without end: every failed login, slow
    # consumer and reconnect a line. It keeps at most ``LOG_FILES`` of ``LOG_FILE_BYTES`` each.
    monkeypatch.setattr(server_module, "LOG_LIMITS", "logfile_size_limit: 2048\nlogfile_max_num: 2\n")
    async with EmbeddedServer(tmp_path / "nats", users=[User("a", "right")]) as server:
        for _ in range(60):  # each refused login is a line of the server's log
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            await reader.readline()  # INFO
            writer.write(b'CONNECT {"user":"a","pass":"wrong","verbose":false}\r\nPING\r\n')
            await writer.drain()
            assert (await reader.readline()).startswith(b"-ERR")
            writer.close()
            await writer.wait_closed()
        logs = sorted((tmp_path / "nats").glob("nats-server.log*"))
        assert 1 < len(logs) <= 2, logs  # rotated, the oldest removed
        assert sum(p.stat().st_size for p in logs) < 3 * 2048 + 4096


async def test_a_cluster_started_again_on_its_store_keeps_its_urls_while_their_ports_are_free(
    tmp_path: Path,
) -> None:
    # Replicas started beside it name its servers by URL (``corral serve --server``): a
    # cluster that picked new ports at each start left them naming servers gone for good.
    first = EmbeddedCluster(tmp_path / "store")
    await first.start()
    urls = first.urls
    await first.stop()
    again = EmbeddedCluster(tmp_path / "store")
    await again.start()
    try:
        assert again.urls == urls
    finally:
        await again.stop()
    # One of its ports taken meanwhile: it starts on others, and keeps those next time.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(urls[0].rsplit(":", 1)[1])))
        moved = EmbeddedCluster(tmp_path / "store")
        await moved.start()
        try:
            assert moved.urls != urls and len(set(moved.urls)) == 3
        finally:
            await moved.stop()
    last = EmbeddedCluster(tmp_path / "store")
    await last.start()
    try:
        assert last.urls == moved.urls
    finally:
        await last.stop()


@pytest.mark.parametrize(
    "kept", ["not json", '{"client": 5}', '{"client": [70000, 1, 2], "cluster": [3, 4, 5]}', "[]"]
)
async def test_a_cluster_whose_kept_ports_are_garbage_picks_new_ones(tmp_path: Path, kept: str) -> None:
    # The file is under the operator's data directory: one edited by hand is passed over, not a
    # traceback (a port past 65535 made the check of whether it was free raise).
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / server_module.PORTS_FILE).write_text(kept)
    cluster = EmbeddedCluster(tmp_path / "store")
    await cluster.start()
    try:
        assert len(set(cluster.urls)) == 3
    finally:
        await cluster.stop()


async def test_started_waits_for_a_server_stopped_or_killed_until_it_is_started_again(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "nats")
    waiting = asyncio.create_task(server.started())
    try:
        await server.start()
        await asyncio.wait_for(waiting, 15.0)
        await asyncio.wait_for(server.started(), 1.0)  # at once while it runs
        for end in (server.stop, server.kill):
            await end()
            waiting = asyncio.create_task(server.started())
            done, _ = await asyncio.wait({waiting}, timeout=0.5)  # what must not come, bounded
            assert not done
            await server.start()
            await asyncio.wait_for(waiting, 15.0)
            assert server.running
    finally:
        waiting.cancel()
        await server.stop()
