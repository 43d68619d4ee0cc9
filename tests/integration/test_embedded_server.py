"""The embedded nats-server as ``corral up`` runs it: it holds the files it is given while it
runs (``corral up``'s lock of its data directory), so that a server outliving its corral still
keeps a second one off its store."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from corral.events.server import EmbeddedServer


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
