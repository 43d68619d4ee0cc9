"""Supervised services on a real nats-server.

- A replica whose decision core raises on a poisoned request counts the failure (with the job and
  the log sequence, posted on the status board), hands its lease over, and a standby decides;
  once the standby stops, the first replica decides the next cycles again.
- ``corral serve health`` runs the health monitor under a lease: one replica holds it, and a
  standby takes it when the holder stops.
- A part of a running corral that dies stops the corral (``until_stopped`` raises), and
  ``corral up`` exits with status 1 when its embedded nats-server dies under it, instead of
  looking healthy with nothing behind it.

Nothing sleeps: every wait is on the log (``Watcher.until``), on a key of the leases' bucket
(a KV watch), or on a process, each with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import nats
import pytest
from nats.js.kv import KeyValue

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobRejected, JobSpec, Resources, SubmitJob
from corral.events.log import Append
from corral.projections.state import State
from corral.services.admission.decide import decide as admit
from corral.services.cli.up import PartStopped, Settings, cluster, until_stopped
from corral.services.cli.watch import Watcher
from corral.services.runtime import status
from corral.services.runtime.lease import BUCKET, KvLease, bucket
from corral.services.runtime.shell import Service
from corral.services.runtime.status import StatusBoard
from corral.services.runtime.supervise import Supervision
from tests.builders import TRAIN

WAIT = 30.0
HOST = socket.gethostname()
CORRAL = [sys.executable, "-m", "corral"]


def admission_with_a_bug(state: State, now: float) -> Sequence[Event]:
    """The real admission, in a build with a bug: it raises on any request named ``poison-*``
    still waiting to be judged."""
    for job in state.jobs.values():
        if job.id.startswith("poison") and job.phase == "submitted":
            raise ValueError(f"cannot read the request of {job.id}")
    return admit(state, now)


async def kv_until(kv: KeyValue, key: str, holds: Callable[[bytes], bool], timeout: float = WAIT) -> bytes:
    """Wait until ``key`` in ``kv`` holds a value for which ``holds`` is true; that value."""
    watcher = await kv.watch(key)
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    entry = await watcher.updates(timeout=timeout)
                except nats.errors.TimeoutError:
                    continue
                if entry is not None and entry.value and holds(entry.value):
                    return entry.value
    finally:
        await watcher.stop()


async def submit(log: JetStreamLog, job_id: str) -> None:
    req = SubmitJob(request_id=job_id, job=JobSpec(queue="q", resources=Resources(gpus=0), command=TRAIN))
    await log.append(Append(subjects.request("team-a", "submit"), codec.encode(req), job_id))


def decided_by(watch: Watcher, job_id: str) -> str | None:
    """Who judged the job (it names a queue nobody made: it is rejected)."""
    for r in watch.records:
        if r.subject == subjects.job(job_id):
            env = codec.decode_envelope(r.data)
            if isinstance(env.body, JobRejected):
                return env.producer
    return None


def judged(job_id: str) -> Callable[[State], bool]:
    return lambda s: job_id in s.jobs and s.jobs[job_id].phase != "submitted"


async def test_a_failing_replica_is_counted_and_a_standby_decides_until_it_decides_again(
    nats_server: str,
) -> None:
    logs = [await JetStreamLog.connect(nats_server, create=True) for _ in range(3)]
    buggy_lease = await KvLease.open(logs[0].nc, "admission", "replica-buggy", ttl=5.0)
    assert await buggy_lease.hold()  # the buggy replica leads from the start
    buggy = Service(
        "admission",
        admission_with_a_bug,
        logs[0],
        tick=0.05,
        lease=buggy_lease,
        status=await StatusBoard.open(logs[0].nc, "admission", "replica-buggy"),
        supervision=Supervision(base=0.5, cap=2.0),
    )
    sound = Service(
        "admission",
        admit,
        logs[1],
        tick=0.05,
        lease=await KvLease.open(logs[1].nc, "admission", "replica-sound", ttl=5.0),
    )
    buggy.producer, sound.producer = "replica-buggy", "replica-sound"
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(svc.run(stops[i])) for i, svc in enumerate([buggy, sound])]
    try:
        async with Watcher(logs[2]) as watch:
            await submit(logs[2], "before")
            await watch.until(judged("before"), WAIT)
            assert decided_by(watch, "before") == "replica-buggy"

            await submit(logs[2], "poison-1")
            await watch.until(judged("poison-1"), WAIT)
            assert decided_by(watch, "poison-1") == "replica-sound"  # the standby took over
            sup = buggy.supervision
            assert sup.failures >= 1 and sup.last is not None
            assert sup.last.job == "poison-1"
            poisoned_at = next(
                r.seq for r in watch.records if r.subject.endswith(".submit") and b"poison-1" in r.data
            )
            assert sup.last.seq >= poisoned_at  # the position it had folded the poisoned request at

            # The failure is on the board for ``corral status``.
            kv = await logs[2].nc.jetstream().key_value(BUCKET)
            posted = await kv_until(
                kv, status.key("admission", "replica-buggy"), lambda v: b'"failures":0' not in v
            )
            on_board = status._decode(posted)
            assert on_board.failures >= 1 and on_board.last_failure is not None
            assert on_board.last_failure.job == "poison-1"
            holders, replicas = await status.read(logs[2].nc)
            assert holders["admission"] == "replica-sound"
            assert any(r.replica == "replica-buggy" for r in replicas)

            stops[1].set()  # the standby stops and gives the lease up
            await tasks[1]
            await submit(logs[2], "after")
            await watch.until(judged("after"), WAIT)
            assert decided_by(watch, "after") == "replica-buggy"  # deciding again
            assert sup.in_a_row == 0 and sup.cycles > 0
            facts = [r for r in watch.records if r.subject.startswith(subjects.job(""))]
            assert len(facts) == 3  # each job judged once
    finally:
        for s in stops:
            s.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for log in logs:
            with contextlib.suppress(Exception):
                await log.close()


def _serve_health(url: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CORRAL, "serve", "health", "--server", url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


async def test_corral_serve_health_holds_a_lease_and_a_standby_takes_it(
    nats_server: str, tmp_path: Path
) -> None:
    setup = await JetStreamLog.connect(nats_server, create=True)  # what `corral up` would have made
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    first = _serve_health(nats_server, env)
    second: subprocess.Popen[str] | None = None
    try:
        kv = await bucket(setup.nc)
        held = await kv_until(kv, "health", lambda v: v == f"health@{HOST}:{first.pid}".encode())
        second = _serve_health(nats_server, env)
        # The standby is up (it posts its status) while the first holds the lease.
        await kv_until(kv, status.key("health", f"health@{HOST}:{second.pid}"), lambda v: True)
        assert (await kv.get("health")).value == held
        shown = subprocess.run(
            [*CORRAL, "status", "--server", nats_server, "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=True,
        )
        board = json.loads(shown.stdout)
        assert board["leases"]["health"] == held.decode()
        assert {r["replica"] for r in board["replicas"]} >= {
            f"health@{HOST}:{first.pid}",
            f"health@{HOST}:{second.pid}",
        }
        assert _stop(first) == 0  # the holder stops and gives the lease up
        await kv_until(kv, "health", lambda v: v == f"health@{HOST}:{second.pid}".encode())
    finally:
        for p in (first, second):
            if p is not None:
                _stop(p)
        await setup.close()


async def test_a_part_that_dies_stops_the_corral(tmp_path: Path) -> None:
    settings = Settings(tick=0.1, agents=False)
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=settings) as running:
        stop = asyncio.Event()
        watching = asyncio.create_task(until_stopped(running, stop))
        placer = next(s for s in running.services if s.role == "placer")
        await placer.log.close()  # its connection is gone for good: its task ends
        with pytest.raises(PartStopped) as stopped:
            await asyncio.wait_for(watching, WAIT)
        assert stopped.value.name == "placer"


async def test_every_role_of_a_corral_up_that_holds_a_lease_posts_its_status(tmp_path: Path) -> None:
    """``corral status`` lists each leased replica from the board: a role of ``corral up`` that
    took its lease but posted nothing would be missing there, dead or alive alike."""
    settings = Settings(tick=0.1, agents=False)
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=settings) as running:
        nc = await nats.connect(running.url)
        try:
            kv = await bucket(nc)
            leased = ("admission", "placer", "preemptor", "health", "assignments", "forecast")
            for role in leased:
                holder = await kv_until(kv, role, lambda v: True)
                await kv_until(kv, status.key(role, holder.decode()), lambda v: True)
            holders, replicas = await status.read(nc)
            assert sorted(holders) == sorted(leased)
            assert sorted(r.role for r in replicas) == sorted(leased)
        finally:
            await nc.close()


def _children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``pid``: (pid, name)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            if ppid == pid:
                out.append((int(entry.name), name))
    return out


def test_corral_up_exits_non_zero_when_its_server_dies(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [*CORRAL, "up", "--nodes", "1", "--data", str(tmp_path / "data")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    try:
        while not any(line.startswith("corral is up at ") for line in seen):
            seen.append(lines.get(timeout=60))
        servers = [pid for pid, name in _children(proc.pid) if name.startswith("nats-server")]
        assert len(servers) == 1, _children(proc.pid)
        os.kill(servers[0], signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while not lines.empty():
        seen.append(lines.get())
    assert code == 1, "".join(seen)
    assert any("nats-server stopped" in line for line in seen), "".join(seen)
