"""``corral up`` and ``corral serve`` as an operator meets them: refused cleanly when they cannot
run as asked, and a service that outlives its NATS server's restart, or exits when it is gone.

- bad flags are one line and exit 2; so is a second ``corral up`` on a data directory in use,
  and a ``--server`` nobody answers at (and Ctrl-C while it waits ends it at once);
- ``corral up --cluster 3`` comes up on three nats-servers with the log in three replicas;
- ``corral serve admission`` decides again after its nats-server restarted, and exits 1 with one
  line once the server stays away longer than ``--reconnect-s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append
from corral.events.server import EmbeddedServer
from corral.services.cli.watch import Watcher
from corral.services.runtime import lease, views

pytestmark = pytest.mark.e2e

CORRAL = [sys.executable, "-m", "corral"]
WAIT = 60.0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}


def corral(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, *args], env=env, capture_output=True, text=True, timeout=WAIT)


def one_line(done: subprocess.CompletedProcess[str], status: int = 2) -> str:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert done.stderr.startswith("corral: ") and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


class Running:
    """A ``corral`` process in the background, its output read line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*CORRAL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(
            target=lambda: [self.lines.put(x) for x in self.proc.stdout or ()], daemon=True
        ).start()

    def until(self, start: str) -> str:
        try:
            while True:
                line = self.lines.get(timeout=WAIT)
                self.seen.append(line)
                if line.startswith(start):
                    return line
        except queue.Empty:
            raise AssertionError(f"no line starting {start!r}:\n" + "".join(self.seen)) from None

    def ended(self) -> int:
        try:
            return self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.ended()


@contextmanager
def running(args: list[str], env: dict[str, str]) -> Iterator[Running]:
    it = Running(args, env)
    try:
        yield it
    finally:
        if it.proc.poll() is None:
            it.interrupt()


def test_bad_flags_are_one_line_and_exit_2(env: dict[str, str], tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    cases = {
        "--profile": ["--profile", "foo"],
        "--port": ["--port", "99999"],
        "--nodes": ["--nodes", "0"],
        "--cluster": ["--cluster", "2"],
        "--tenant-rate": ["--tenant-rate", "-1"],
        "--tenant-burst": ["--tenant-burst", "0"],
        "--node-rate": ["--node-rate", "-1"],
        "--node-burst": ["--node-burst", "0"],
    }
    token = ["--metrics-port", "0", "--metrics-token-file", str(tmp_path / "no-token")]
    runs: list[tuple[str, tuple[str, ...]]] = [(f, ("up", "--data", data, *a)) for f, a in cases.items()]
    runs.append(("cannot read the metrics token", ("up", "--data", data, *token)))
    serve_cases = {
        "--reconnect-s": [("placer", "--reconnect-s", "0"), ("placer", "--reconnect-s", "nan")],
        "--heartbeat-s": [("agent", "--heartbeat-s", "-1"), ("health", "--heartbeat-s", "nan"),
                          ("health", "--heartbeat-s", "inf")],
        "--lost-after-s": [("health", "--lost-after-s", "1"), ("health", "--lost-after-s", "nan"),
                           ("health", "--lost-after-s", "inf"),
                           ("health", "--heartbeat-s", "1", "--lost-after-s", "3")],
        "--tenant-rate": [("intake", "--tenant-rate", "nan"), ("intake", "--tenant-rate", "inf")],
        "--tenant-burst": [("intake", "--tenant-burst", "-5")],
        "--node-rate": [("intake", "--node-rate", "nan"), ("intake", "--node-rate", "inf")],
        "--node-burst": [("intake", "--node-burst", "-5")],
        "--max-workers": [("agent", "--node", "n1", "--max-workers", "0"),
                          ("agent", "--node", "n1", "--max-workers", "100000")],
    }  # fmt: skip
    runs += [(flag, ("serve", *args)) for flag, each in serve_cases.items() for args in each]
    # Each its own process, a few at a time: most of each one's time is Python starting.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda run: corral(*run[1], env=env), runs))
    for (said, args), refused in zip(runs, done, strict=True):
        assert said in one_line(refused), args
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_an_unreachable_server_is_one_line_and_ctrl_c_ends_the_wait(
    env: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nobody listens here once it is closed
    refused = corral("up", "--server", f"nats://127.0.0.1:{port}", "--data", str(tmp_path / "a"), env=env)
    assert "cannot reach NATS" in one_line(refused)

    # A server that takes the connection and never says a word: corral up waits, and Ctrl-C ends it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(WAIT)
        url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        waiting = Running(["up", "--server", url, "--data", str(tmp_path / "b")], env)
        conn, _ = silent.accept()  # it is connecting now
        with conn:
            assert waiting.interrupt() == 130


def test_a_second_corral_up_on_the_same_data_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with running(["up", "--nodes", "1", "--data", data], env) as first:
        first.until("corral is up at ")
        second = corral("up", "--nodes", "1", "--data", data, env=env)
        assert "in use by another corral up" in one_line(second)
        assert first.proc.poll() is None  # the first runs on, unharmed
        assert first.interrupt() == 0


def test_with_logins_metrics_answer_only_the_scraper_bearing_the_token(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Tenants' workers share the host's loopback: with logins, /metrics is not theirs to read
    # (every queue's figures), though no token file was given.
    data = tmp_path / "data"
    with running(["up", "--nodes", "1", "--auth", "--metrics-port", "0", "--data", str(data)], env) as up:
        line = up.until("  metrics: ")
        url, token_file = line.split()[1], line.split()[-1].rstrip(")")
        assert url.startswith("http://127.0.0.1:") and Path(token_file) == data / "metrics-token"
        assert Path(token_file).stat().st_mode & 0o777 == 0o600
        token = Path(token_file).read_text().strip()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=WAIT)
        assert refused.value.code == 401
        asked = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(asked, timeout=WAIT) as answered:
            assert answered.status == 200 and b"corral_" in answered.read()
        assert up.interrupt() == 0
    # Started again, it keeps the token a scraper was given.
    with running(["up", "--nodes", "1", "--auth", "--metrics-port", "0", "--data", str(data)], env) as up:
        assert up.until("  metrics: ").split()[-1].rstrip(")") == token_file
        assert Path(token_file).read_text().strip() == token
        assert up.interrupt() == 0


def _servers_on(data: str) -> list[int]:
    """The nats-servers running on ``data``'s store: their pids, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv and argv[0].endswith(b"nats-server") and data.encode() in b" ".join(argv):
            found.append(int(entry.name))
    return found


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="a parent's death is signalled on Linux")
def test_corral_up_killed_takes_its_nats_server_with_it(env: dict[str, str], tmp_path: Path) -> None:
    # A server left running on the store after kill -9 met the next corral up started on it: two
    # servers on one set of JetStream files.
    data = str(tmp_path / "data")
    with running(["up", "--nodes", "1", "--data", data], env) as first:
        first.until("corral is up at ")
        assert len(_servers_on(data)) == 1
        first.proc.kill()
        first.ended()
        _until(lambda: not _servers_on(data), "the nats-server outlived its corral up")
    with running(["up", "--nodes", "1", "--data", data], env) as again:
        again.until("corral is up at ")
        assert len(_servers_on(data)) == 1
        assert again.interrupt() == 0


def test_corral_up_cluster_runs_on_three_servers_with_the_log_in_three_replicas(
    env: dict[str, str], tmp_path: Path
) -> None:
    with running(["up", "--cluster", "3", "--nodes", "2", "--data", str(tmp_path / "data")], env) as up:
        url = up.until("corral is up at ").split()[-1]
        assert len(url.split(",")) == 3
        up.until("  NATS: a JetStream cluster of 3 servers, the log in 3 replicas")

        async def replicas() -> list[int]:
            log = await JetStreamLog.connect(url)
            try:
                js = log.nc.jetstream()
                names = (subjects.STREAM, f"KV_{lease.BUCKET}", views.STREAM)
                return [(await js.stream_info(n)).config.num_replicas for n in names]
            finally:
                await log.close()

        assert asyncio.run(replicas()) == [3, 3, 3]
        assert up.interrupt() == 0


async def test_corral_serve_resumes_after_a_nats_restart_and_exits_when_it_stays_away(
    env: dict[str, str], tmp_path: Path
) -> None:
    server = EmbeddedServer(tmp_path / "nats")
    await server.start()
    try:
        setup = await JetStreamLog.connect(server.url, create=True)
        await lease.ensure_bucket(setup.nc)
        await setup.close()
        serve = Running(["serve", "admission", "--server", server.url, "--reconnect-s", "8"], env)
        try:
            await decided(server, "before")
            await server.kill()  # gone at once: a graceful stop can take longer than 8 s here
            await server.start()  # the same port and store
            try:
                await decided(server, "after")  # it reconnected, its consumer and lease came back
            except BaseException:
                print("SERVE OUTPUT:", "".join(serve.lines.queue))
                raise
            await server.stop()  # and now it stays away
            assert await asyncio.to_thread(serve.ended) == 1
            tail = "".join(serve.lines.queue).strip().splitlines()
            assert tail and tail[-1].startswith("corral: ") and "for good" in tail[-1], tail
        finally:
            if serve.proc.poll() is None:
                serve.proc.kill()
    finally:
        await server.stop()


async def decided(server: EmbeddedServer, job_id: str) -> None:
    """Submit ``job_id`` (to a queue nobody made) and wait for admission to decide on it."""
    log = await JetStreamLog.connect(server.url)
    try:
        async with Watcher(log) as watch:
            spec = JobSpec(queue="nowhere", resources=Resources(gpus=0))
            body = codec.encode(SubmitJob(request_id=job_id, job=spec))
            await log.append(Append(subjects.request("t", "submit"), body, msg_id=job_id))
            await watch.until(lambda s: job_id in s.jobs and s.jobs[job_id].phase != "submitted", WAIT)
    finally:
        await log.close()
