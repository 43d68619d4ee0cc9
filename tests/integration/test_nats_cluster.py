"""corral on a three-server NATS JetStream cluster, and through the loss of its servers.

- the log's stream and both buckets are made with three replicas;
- on R3, every acknowledged append survives kill -9 of the stream's leader, read through another
  server;
- a connection that gives up reconnecting ends its reader with a ``LogError`` (a service then
  exits for its supervisor), never a wait for ever;
- two servers of three gone, the read service's answers say since when and why they may be
  stale, and ``corral jobs`` says it in one line beside the jobs; current again once one is back;
- under a steady load of submits, with every service and an agent per node running against the
  cluster: kill -9 one NATS server (the stream's leader) and bring it back; stop all three and
  start them again. The agents reconnect, report their workers, and jobs finish again; at the
  end every acknowledged submit is in the log and has finished, each job was placed at most once
  per attempt, no GPU was held twice at any point of the log, no job was stopped for one already
  placed, ``replay --verify`` is clean and every service's state equals the log replayed to where
  it folded.

The agents run real (one-second) workers; the health timing is long enough that a NATS outage of
a few seconds finds no node lost (heartbeats travel on core NATS, and stop with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from corral.events import codec, jetstream, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, LogError, Record
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.events.server import EmbeddedCluster, EmbeddedServer
from corral.projections.fold import fold
from corral.projections.state import State
from corral.services.cli import deploy
from corral.services.cli.main import main
from corral.services.cli.up import Cluster, Settings, cluster, connect, service_roles
from corral.services.cli.watch import Watcher
from corral.services.replay.report import format_report
from corral.services.replay.verify import verify
from corral.services.runtime import forecasts, lease, status, views
from corral.services.runtime.status import ServiceStatus, StatusBoard
from tests.chaos.harness import check_no_stop_for_a_placed_job, check_placed_once_and_gpus_unshared
from tests.integration.polling import until, until_answered

WAIT = 60.0  # generous: a loaded 2-core machine, and a cluster electing leaders
NODES = 3  # 24 GPUs, an agent each: a few one-second jobs at a time
# Heartbeats every half second; a node silent for 10 s is suspect, for 30 s lost: far past the
# outages below, so every node stays in service through them and is trusted again at once.
CLUSTERED = Settings(
    tick=0.1,
    agent_tick=0.1,
    heartbeat=0.5,
    suspect_after=20,
    lost_after=30.0,
    probation=1.0,
    sandbox="none",
    stop_grace=2.0,
    nats_servers=3,
)


def leader_of(info: object) -> str:
    cluster_info = getattr(info, "cluster", None)
    return str(getattr(cluster_info, "leader", "") or "")


async def stream_leader(log: JetStreamLog, stream: str = subjects.STREAM) -> str:
    """The name of the server leading ``stream`` (waiting out an election)."""
    js = log.nc.jetstream()
    led: list[str] = []

    async def elected() -> bool:
        with contextlib.suppress(Exception):
            led[:] = [leader_of(await js.stream_info(stream))]
        return bool(led and led[0])

    await until_answered(elected, WAIT)
    return led[0]


def server_named(nats: EmbeddedCluster, name: str) -> int:
    return next(i for i, s in enumerate(nats.servers) if s.name == name)


# -- the stream and buckets ------------------------------------------------------------------


async def off_the_leader(nats: EmbeddedCluster, log: JetStreamLog, timeout: float) -> tuple[Any, int]:
    """A client of team-a (``AsyncClient``) whose session is on a server that does not lead the
    stream (a fault of its server has no election to wait out), and that server's index."""
    from corral.services.client.aio import AsyncClient

    leader = server_named(nats, await stream_leader(log))
    urls = [s.url for s in nats.servers]
    while True:
        client = AsyncClient(nats.url, tenant="team-a", timeout=timeout)
        session = await client._connected()
        assert session.nc is not None and session.nc.connected_url is not None
        server = next(i for i, u in enumerate(urls) if u.endswith(f":{session.nc.connected_url.port}"))
        if server != leader:
            return client, server
        await client.close()


async def heard_through(url: str, subject: str) -> None:
    """Wait until a request on ``subject`` through the server at ``url`` is answered (a
    refusal will do): the interest of a responder on another server reaches it over the
    cluster's routes a moment after that responder subscribed."""
    import nats

    from corral.services.runtime import identities

    probe = await nats.connect(url, inbox_prefix=identities.inbox_prefix("team-a"))
    try:

        async def answered() -> bool:
            with contextlib.suppress(TimeoutError, NatsError):
                await probe.request(subject, b"{}", timeout=1)
                return True
            return False

        await until_answered(answered, WAIT)
    finally:
        await probe.close()


async def until_leaderless(server: EmbeddedServer, stream: str) -> None:
    """Wait until ``server``, its two peers gone, knows ``stream`` has no leader: until then it
    may still lead it, and answer as if nothing had happened."""
    alone = await JetStreamLog.connect(server.url)
    try:

        async def leaderless() -> bool:
            with contextlib.suppress(TimeoutError, NatsError):
                info = await alone.nc.jetstream(timeout=1).stream_info(stream)
                return info.cluster is not None and info.cluster.leader is None
            return False

        await until_answered(leaderless, WAIT)
    finally:
        await alone.close()


async def test_the_log_and_both_buckets_have_three_replicas_and_an_ack_survives_its_leader(
    nats_cluster: EmbeddedCluster,
) -> None:
    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    try:
        await lease.ensure_bucket(setup.nc, replicas=3)
        await views.ensure_bucket(setup.nc, replicas=3)
        js = setup.nc.jetstream()
        for stream in (subjects.STREAM, f"KV_{lease.BUCKET}", views.STREAM):
            assert (await js.stream_info(stream)).config.num_replicas == 3, stream
        acked = [
            (await setup.append(Append(subjects.job(f"j{i}"), b'{"n": %d}' % i, msg_id=f"m{i}"))).seq
            for i in range(50)
        ]
        leader = server_named(nats_cluster, await stream_leader(setup))
    finally:
        await setup.close()

    await nats_cluster.servers[leader].kill()  # no flush, no goodbye: as a power loss
    others = [s.url for i, s in enumerate(nats_cluster.servers) if i != leader]
    log = await JetStreamLog.connect(",".join(others))
    try:
        await stream_leader(log)  # a new one elected among the two left
        records = [r for batch in await _read(log) for r in batch]
        assert [r.seq for r in records] == acked
        assert [r.data for r in records] == [b'{"n": %d}' % i for i in range(50)]
    finally:
        await log.close()


async def test_a_command_reading_a_log_without_a_majority_says_so_in_one_line(
    nats_cluster: EmbeddedCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two servers of three gone: the third answers, but JetStream has no leader for the stream.
    # ``corral log export`` (and ``nodes``, ``queues``, ``replay`` as the admin) printed a
    # traceback and exited 1. (No election can end here: the 30 s a read gives one is cut short.)
    monkeypatch.setattr(jetstream, "READ_IDLE_TIMEOUT", 2.0)
    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    try:
        await setup.append(Append(subjects.job("j1"), b"{}", msg_id="m1"))  # something to read
    finally:
        await setup.close()
    for s in nats_cluster.servers[:2]:
        await s.kill()
    await until_leaderless(nats_cluster.servers[2], subjects.STREAM)
    with pytest.raises(SystemExit) as stop:
        await asyncio.to_thread(
            main, ["log", "export", str(tmp_path / "log.jsonl"), "--server", nats_cluster.url]
        )
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    # (The server left may lag the two gone: what it holds is not read as the log.)
    assert "exported" not in out, out
    assert err.count("\n") == 1 and err.startswith("corral: ") and "Traceback" not in err, err


async def test_status_without_a_majority_says_it_cannot_read_the_board(
    nats_cluster: EmbeddedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server left answers the bucket's info with no leader and no keys: read as an empty
    # board, ``corral status`` said no service was running (exit 0) while every one was.
    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    try:
        await lease.ensure_bucket(setup.nc, replicas=3)
        board = await StatusBoard.open(setup.nc, "placer", "placer@host:1")
        await board.post(ServiceStatus("placer", "placer@host:1", True, 9, 3, 0, 0, 0.0, at=1.0))
        _, posted = await status.read(setup.nc)
        assert [r.replica for r in posted] == ["placer@host:1"]
    finally:
        await setup.close()
    for s in nats_cluster.servers[:2]:
        await s.kill()
    await until_leaderless(nats_cluster.servers[2], f"KV_{lease.BUCKET}")
    with pytest.raises(SystemExit) as stop:
        await asyncio.to_thread(main, ["status", "--server", nats_cluster.url])
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert "none running" not in out and err.count("\n") == 1 and "no leader" in err, (out, err)


async def test_the_read_service_says_its_answers_are_stale_while_the_stream_has_no_leader(
    nats_cluster: EmbeddedCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two servers of three gone, the read service answered from what it had folded as if
    # nothing had happened: a job read "pending" while the log could not be read at all. Its
    # answers say since when and why they may be stale, the CLI says so in one line beside
    # what it shows, and once a majority is back the answers are current again.
    from corral.services.client.aio import AsyncClient
    from corral.services.client.results import AsOf, Unreachable
    from corral.services.query.service import ReadService
    from tests.builders import LogBuilder, job

    monkeypatch.setattr(jetstream, "LEADER_CHECK_S", 0.2)
    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    try:
        built = LogBuilder(start_time=1.0).queue("team-a").submit("team-a", "j1", job().gpus(1))
        for r in built.records:
            await setup.append(Append(r.subject, r.data, headers=r.headers))
    finally:
        await setup.close()
    # Heartbeats every half second: a consumer on a server that died is found out at once.
    read_log = await JetStreamLog.connect(nats_cluster.url, heartbeat=0.5)
    reader = ReadService(read_log)
    stop = asyncio.Event()
    running = asyncio.create_task(reader.run(stop))
    survivor = nats_cluster.servers[2]
    client = AsyncClient(survivor.url, tenant="team-a", timeout=2.0)
    try:
        await asyncio.wait_for(reader.caught_up.wait(), WAIT)
        await until(lambda: reader.state.seq >= built.last_seq, WAIT)

        async def answered(current: bool) -> bool:
            # Unreachable: the read service reconnecting to the survivor, or (at first) its
            # subscription not yet known on the survivor, which the servers pass on in their
            # own time.
            with contextlib.suppress(Unreachable):
                jobs = await client.jobs()
                assert [j.id for j in jobs] == ["j1"]  # what it has, shown still
                return client.as_of is not None and client.as_of.current == current
            return False

        await until_answered(lambda: answered(True), WAIT)
        assert client.as_of == AsOf(built.last_seq)

        for s in nats_cluster.servers[:2]:
            await s.kill()
        await until_leaderless(survivor, subjects.STREAM)
        await until_answered(lambda: answered(False), WAIT)
        assert client.as_of is not None and client.as_of.seq == built.last_seq
        assert "leader" in client.as_of.why, client.as_of

        capsys.readouterr()
        await asyncio.to_thread(main, ["jobs", "--server", survivor.url])
        out, err = capsys.readouterr()
        assert "j1" in out, out
        assert err.count("\n") == 1 and err.startswith("corral: the log cannot be read since "), err
        assert f"as of position {built.last_seq}" in err, err

        await nats_cluster.restart(0)
        await until_answered(lambda: answered(True), WAIT)
        await asyncio.to_thread(main, ["jobs", "--server", survivor.url])
        out, err = capsys.readouterr()
        assert "j1" in out and err == "", (out, err)
    finally:
        await client.close()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, WAIT)
        reader.close()
        await read_log.close()


async def test_a_connection_to_a_frozen_server_goes_over_to_another(nats_cluster: EmbeddedCluster) -> None:
    # A server that stops answering without closing its sockets (a paused VM, a host cut off)
    # kept every client on it for minutes with nats-py's pings; the services' options leave it
    # within seconds for another server of the cluster.
    import os
    import signal

    import nats

    from corral.events.nats_client import MAX_OUTSTANDING_PINGS, PING_INTERVAL, reconnecting

    first = nats_cluster.servers[0]
    port = int(first.url.rsplit(":", 1)[1])
    urls = [first.url] + [s.url for s in nats_cluster.servers[1:]]
    nc = await nats.connect(servers=urls, dont_randomize=True, **reconnecting())

    def on(p: int) -> bool:
        return nc.is_connected and nc.connected_url is not None and nc.connected_url.port == p

    pid = first.pid
    assert pid is not None and on(port)
    os.kill(pid, signal.SIGSTOP)
    try:
        await until(lambda: nc.is_connected and not on(port), PING_INTERVAL * (MAX_OUTSTANDING_PINGS + 3))
        got = await nc.request("$JS.API.INFO", b"", timeout=5)
        assert b"memory" in got.data, got.data[:200]
    finally:
        os.kill(pid, signal.SIGCONT)
        await nc.close()


async def test_a_client_whose_server_dies_sends_again_through_another_and_is_stored_once(
    nats_cluster: EmbeddedCluster,
) -> None:
    # A client's session does not reconnect. Its server killed after the intake appended a
    # submit and before the answer reached it: the client raised Unreachable, its caller sent
    # the job again under a new message id (the log held it twice), and every later call of
    # that client failed while two servers of three served. A session opened on a list with a
    # dead server in it failed whenever nats-py happened to pick that one first.
    from corral.services.client.aio import AsyncClient
    from corral.services.intake import service as intake_service

    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    urls = [s.url for s in nats_cluster.servers]
    client, victim = await off_the_leader(nats_cluster, setup, 15.0)
    others = [u for i, u in enumerate(urls) if i != victim]
    intake_log = await intake_service.connect(",".join(others))
    intake = intake_service.Intake(intake_log, rate=None)
    answer = intake._answer

    async def answer_once_its_server_is_gone(reply: str, body: dict[str, object]) -> None:
        if nats_cluster.servers[victim].pid is not None:
            await nats_cluster.servers[victim].kill()  # the request was appended; its answer is lost
        await answer(reply, body)

    stop = asyncio.Event()
    serving = asyncio.create_task(intake.run(stop))
    spec = {"queue": "team-a", "resources": {"gpus": 1}, "command": ["sleep", "1"]}
    try:
        await asyncio.wait_for(intake.ready.wait(), WAIT)
        # Through the victim first, then (once it is gone) through either of the others.
        for url in urls:
            await heard_through(url, subjects.intake("team-a", "submit"))
        intake._answer = answer_once_its_server_is_gone  # type: ignore[method-assign]
        first = await client.submit(spec, id="j1", wait=False)
        assert first.duplicate  # the copy sent again found the first one stored
        assert (await client.submit(spec, id="j2", wait=False)).seq > first.seq  # and it goes on
        # Any client opens on a list with a dead server in it.
        dead_first = f"{urls[victim]},{others[0]}"
        for i in range(8):
            async with AsyncClient(dead_first, tenant="team-a", timeout=15.0) as c:
                await c.submit(spec, id=f"k{i}", wait=False)
        reader = await JetStreamLog.connect(",".join(others))  # not through the dead server
        try:
            stored = [r for batch in await _read(reader) for r in batch]
        finally:
            await reader.close()
        ids = Counter(
            json.loads(r.data)["request_id"]
            for r in stored
            if r.subject == subjects.request("team-a", "submit")
        )
        assert ids == Counter(["j1", "j2", *(f"k{i}" for i in range(8))])
        assert next(r.seq for r in stored if json.loads(r.data)["request_id"] == "j1") == first.seq
    finally:
        stop.set()
        await asyncio.wait_for(serving, WAIT)
        await client.close()
        await intake_log.close()
        await setup.close()


async def test_a_client_whose_server_freezes_goes_over_to_another(nats_cluster: EmbeddedCluster) -> None:
    # A frozen server keeps its sockets open: the client's session learnt it only after three
    # pings went unanswered (15 s and more), and every call meanwhile waited out its timeout.
    # One unanswered request now sends the next through a new session. The request may have
    # been stored all the same: sent again, it goes under its first message id.
    import os
    import signal

    from corral.events.log import Ack
    from corral.services.client.results import Unreachable
    from corral.services.intake import service as intake_service
    from corral.services.intake.decide import Accept

    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    urls = [s.url for s in nats_cluster.servers]
    client, victim = await off_the_leader(nats_cluster, setup, 2.0)
    await setup.close()
    intake_log = await intake_service.connect(",".join(u for i, u in enumerate(urls) if i != victim))
    intake = intake_service.Intake(intake_log, rate=None)
    answer, answer_of, lost = intake._answer, intake._answer_of, list[bool]()

    def losing_j3_once(accept: Accept, result: Ack | LogError) -> dict[str, Any]:
        # Once appended (a cluster settling after the thaw may refuse the first try, 503, which
        # the client sends again): its answer (next) goes nowhere.
        if not lost and isinstance(result, Ack) and json.loads(accept.data)["request_id"] == "j3":
            lost.append(True)
        return answer_of(accept, result)

    async def unless_lost(reply: str, body: dict[str, Any]) -> None:
        if lost and lost[-1]:
            lost[-1] = False
        else:
            await answer(reply, body)

    intake._answer_of = losing_j3_once  # type: ignore[method-assign]
    intake._answer = unless_lost  # type: ignore[method-assign]
    stop = asyncio.Event()
    serving = asyncio.create_task(intake.run(stop))
    spec = {"queue": "team-a", "resources": {"gpus": 1}, "command": ["sleep", "1"]}
    pid = nats_cluster.servers[victim].pid
    assert pid is not None
    try:
        await asyncio.wait_for(intake.ready.wait(), WAIT)
        # The next session after the freeze may be on either of the other two servers.
        for url in urls:
            await heard_through(url, subjects.intake("team-a", "submit"))
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(Unreachable, match="no answer"):
            await client.submit(spec, id="j1", wait=False)
        assert (await client.submit(spec, id="j2", wait=False)).seq > 0  # not one more timeout
        os.kill(pid, signal.SIGCONT)
        # A request stored whose answer never came, sent again by the caller: under its first
        # id, so stored once (under a new id the log held it twice, as when a frozen server
        # delivers the first copy once it wakes).
        with pytest.raises(Unreachable, match="no answer"):
            await client.submit(spec, id="j3", wait=False)
        async with asyncio.timeout(WAIT):
            while True:  # the cluster may still be settling after the thaw: sent again, same id
                with contextlib.suppress(Unreachable):
                    told = await client.submit(spec, id="j3", wait=False)
                    break
        assert told.duplicate
        reader = await JetStreamLog.connect(nats_cluster.url)
        try:
            stored = [r for batch in await _read(reader) for r in batch]
        finally:
            await reader.close()
        ids = Counter(json.loads(r.data)["request_id"] for r in stored)
        assert ids["j2"] == ids["j3"] == 1, ids
    finally:
        os.kill(pid, signal.SIGCONT)
        stop.set()
        await asyncio.wait_for(serving, WAIT)
        await client.close()
        await intake_log.close()


async def test_an_append_sent_again_while_its_first_copy_is_in_process_may_be_stored(
    nats_cluster: EmbeddedCluster,
) -> None:
    # The stream's leader alone: an append is proposed and never committed, so no acknowledgement
    # comes. Sent again under its id (as the client does after the intake's 504), the server
    # answers 409/10158 "in process": that copy may be stored as well, not "refused".
    from corral.events.log import UnacknowledgedError

    setup = await JetStreamLog.connect(nats_cluster.url, create=True, replicas=3)
    try:
        leader = server_named(nats_cluster, await stream_leader(setup))
    finally:
        await setup.close()
    log = await JetStreamLog.connect(nats_cluster.servers[leader].url, ack_timeout=1.0)
    try:
        for i, s in enumerate(nats_cluster.servers):
            if i != leader:
                await s.kill()
        item = Append(subjects.request("a", "cancel"), b'{"job_id": "j1"}', msg_id="a/cancel:j1")
        first, again = [(await log.append_many([item]))[0] for _ in range(2)]
        assert isinstance(first, UnacknowledgedError), first
        assert isinstance(again, UnacknowledgedError), again
    finally:
        await log.close()


async def _read(log: JetStreamLog) -> list[list[Record]]:
    return [batch async for batch in log.read(1)]


async def replicas_of(url: str) -> dict[str, int]:
    """Each of the log's and the buckets' streams, and its replica count."""
    log = await JetStreamLog.connect(url)
    try:
        js = log.nc.jetstream()
        names = (subjects.STREAM, f"KV_{lease.BUCKET}", views.STREAM, forecasts.STREAM)
        return {n: (await js.stream_info(n)).config.num_replicas or 1 for n in names}
    finally:
        await log.close()


async def test_on_a_cluster_of_three_the_log_and_buckets_get_three_replicas_unless_told(
    nats_cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    # One URL of the three: the servers are asked how many they are, the URLs are not counted.
    url = nats_cluster.servers[0].url
    assert await deploy.setup(url, 1, {}) == 1  # told: one
    assert set((await replicas_of(url)).values()) == {1}
    settings = Settings(tick=0.5, agents=False, heartbeat=3600.0, lost_after=86_400.0)
    (tmp_path / "corral").mkdir()
    async with cluster(url, 1, "h100-8x", tmp_path / "corral", settings=settings) as c:
        assert c.replicas == 3  # not told: three, brought up from one
    assert set((await replicas_of(url)).values()) == {3}
    assert await deploy.setup(nats_cluster.url, None, {}) == 3


async def test_on_one_server_the_log_and_buckets_get_one_replica(embedded_server: EmbeddedServer) -> None:
    assert await deploy.setup(embedded_server.url, None, {}) == 1
    assert set((await replicas_of(embedded_server.url)).values()) == {1}


async def test_a_connection_that_gives_up_ends_its_reader(embedded_server: EmbeddedServer) -> None:
    log = await JetStreamLog.connect(
        embedded_server.url, create=True, heartbeat=0.2, max_reconnect_attempts=2, reconnect_time_wait=0.1
    )
    try:
        await log.append(Append(subjects.job("j"), b"{}"))
        follow = log.follow(1)
        assert [r.seq for r in await asyncio.wait_for(anext(follow), WAIT)] == [1]
        await embedded_server.stop()  # and it does not come back
        with pytest.raises(LogError, match="for good"):
            await asyncio.wait_for(anext(follow), WAIT)
        assert log.lost.is_set()
    finally:
        await log.close()


# -- faults under load -----------------------------------------------------------------------


@dataclass
class Load:
    """Submits one job after another through the log, as the intake would append them,
    remembering which the log acknowledged; a refused or unanswered one is retried under the
    same message id (so it is stored once) until acknowledged."""

    log: JetStreamLog
    acked: list[str] = field(default_factory=list)
    refused: int = 0

    async def run(self, stop: asyncio.Event, limit: int = 150) -> None:
        for i in range(limit):
            job_id = f"load-{i}"
            spec = JobSpec(queue="team-a", resources=Resources(gpus=1), command=("sleep", "1"))
            data = codec.encode(SubmitJob(request_id=job_id, job=spec))
            item = Append(subjects.request("team-a", "submit"), data, msg_id=f"submit:{job_id}")
            while True:
                try:
                    await self.log.append(item)
                    break
                except LogError:
                    self.refused += 1  # no stream leader at the moment: again, shortly
                    await asyncio.sleep(0.1)
            self.acked.append(job_id)
            if stop.is_set():
                return
            await asyncio.sleep(0.2)  # a steady trickle, not a flood: what is measured is recovery


@dataclass
class Faulted:
    corral: Cluster
    log: JetStreamLog
    watch: Watcher
    load: Load
    heard: dict[str, int] = field(default_factory=dict)  # heartbeats heard per node, so far

    @property
    def nats(self) -> EmbeddedCluster:
        assert isinstance(self.corral.nats, EmbeddedCluster)
        return self.corral.nats

    async def until(self, predicate: Callable[[State], bool]) -> State:
        return await self.watch.until(predicate, WAIT)

    async def jobs_carry_on(self, more: int = 5) -> None:
        """Wait until ``more`` jobs acknowledged from now on have run and finished: admitted,
        placed, started by an agent, reported done."""
        first = len(self.load.acked)
        await until(lambda: len(self.load.acked) >= first + more, WAIT)
        wanted = self.load.acked[first : first + more]
        await self.until(lambda s: all(finished(s, j) for j in wanted))

    async def every_agent_beats_again(self) -> None:
        """Wait until every node's agent has been heard again (heartbeats, on core NATS) since
        now: each has reconnected, whether or not the load gave it work."""
        since = {n: self.heard.get(n, 0) for n in self.corral.nodes}
        await until(lambda: all(self.heard.get(n, 0) > since[n] + 1 for n in since), WAIT)


async def answers_from(alone: JetStreamLog) -> int:
    """The log's last sequence as told through a server just started again, or 0 while it
    cannot tell yet: until it has rejoined the cluster's routes, its JetStream requests go
    unanswered or are refused."""
    try:
        return await alone.last_seq()
    except LogError:
        return 0


def finished(s: State, job_id: str) -> bool:
    return job_id in s.jobs and s.jobs[job_id].phase == "succeeded"


@asynccontextmanager
async def faulted(tmp_path: Path) -> AsyncIterator[Faulted]:
    settings = dataclasses.replace(CLUSTERED)
    async with cluster(None, NODES, "h100-8x", tmp_path / "corral", settings=settings) as c:
        assert c.replicas == 3
        log = await connect(c.url)
        stop = asyncio.Event()
        try:
            async with Watcher(log) as watch:
                queue = QueueSpec("team-a", quotas={"*": Quota(nominal=1000)}, tenants=("team-a",))
                body = codec.encode(ApplyQueue(queue=queue))
                await log.append(Append(subjects.request("admin", "queue"), body, msg_id="queue:team-a"))
                await watch.until(lambda s: "team-a" in s.queues and len(s.nodes) == NODES, WAIT)
                load = Load(log)
                heard: dict[str, int] = {}

                async def beat(msg: Msg) -> None:
                    node = msg.subject.rsplit(".", 1)[1]
                    heard[node] = heard.get(node, 0) + 1

                await log.nc.subscribe(subjects.heartbeat("*"), cb=beat)
                submitting = asyncio.create_task(load.run(stop))
                it = Faulted(c, log, watch, load, heard)
                await it.jobs_carry_on()
                yield it
                stop.set()
                await asyncio.wait_for(submitting, WAIT)
                await check_end(it)
        finally:
            stop.set()
            await log.close()


async def check_end(it: Faulted) -> None:
    acked = list(it.load.acked)
    # Every acknowledged submit is in the log, and ran to its end.
    await it.until(lambda s: all(finished(s, j) for j in acked))
    records = list(it.watch.records)
    submitted = Counter(r.subject for r in records if r.subject.startswith("corral.in.team-a.submit"))
    assert submitted[subjects.request("team-a", "submit")] == len(acked), "a submit stored twice, or lost"
    # Each job placed at most once per attempt, no GPU held twice, no stop for a placed job.
    check_placed_once_and_gpus_unshared(records)
    check_no_stop_for_a_placed_job(records)
    # The log replays clean, to the state every service holds.
    report = verify(records, service_roles())
    assert report.clean, format_report(report)
    state = it.watch.state
    assert fold(records) == state and state.faults == 0
    services = [*it.corral.services, it.corral.assignments, it.corral.health]
    for svc in services:
        assert svc is not None
        await until(lambda svc=svc: it.watch.state.seq >= svc.state.seq, WAIT)  # type: ignore[misc]
        seq = svc.state.seq  # nothing is folded from here to the comparison: no await between
        assert svc.state == fold(r for r in it.watch.records if r.seq <= seq), svc.role


async def test_kill_one_nats_server_of_three_then_bring_it_back(tmp_path: Path) -> None:
    async with faulted(tmp_path) as it:
        # The worst one to lose: the server leading the log's stream.
        victim = server_named(it.nats, await stream_leader(it.log))
        await it.nats.servers[victim].kill()
        await it.jobs_carry_on()  # two of three carry the log on
        await it.nats.restart(victim)
        await it.every_agent_beats_again()
        await it.jobs_carry_on()
        # The server that came back has caught up: the log read through it alone is the log.
        alone = await JetStreamLog.connect(it.nats.servers[victim].url)
        try:
            last = await it.log.last_seq()
            await until(lambda: it.watch.state.seq >= last, WAIT)

            async def caught_up() -> bool:
                return await answers_from(alone) >= last

            await until_answered(caught_up, WAIT)
            through_it = [r for batch in [b async for b in alone.read(1, last)] for r in batch]
            assert through_it == [r for r in it.watch.records if r.seq <= last]
        finally:
            await alone.close()


async def test_restart_all_three_nats_servers(tmp_path: Path) -> None:
    async with faulted(tmp_path) as it:
        await it.nats.stop()  # every connection loses its server at once
        await asyncio.gather(*(s.start() for s in it.nats.servers))
        await it.nats.wait_ready()
        await it.every_agent_beats_again()
        await it.jobs_carry_on()  # everyone reconnected: submits are placed again


async def test_corral_up_starts_a_server_of_its_cluster_again_when_it_dies(tmp_path: Path) -> None:
    # An operator's kill -9 (or the OOM killer, a crash) of one server of ``corral up --cluster
    # 3``: it stayed down, unsaid, and a second loss would have stopped every part.
    settings = dataclasses.replace(CLUSTERED, agents=False)
    async with cluster(None, 1, "h100-8x", tmp_path / "corral", settings=settings) as c:
        assert isinstance(c.nats, EmbeddedCluster)
        victim = c.nats.servers[1]
        first = victim.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await until(lambda: victim.pid not in (None, first), WAIT)
        # Its new process has a pid from the moment it is spawned, before it listens: a
        # connection then was refused.
        await asyncio.wait_for(victim.started(), WAIT)
        # It is back in the cluster: the log read through it alone is the log.
        log = await connect(c.url)
        alone = await JetStreamLog.connect(victim.url)
        try:
            last = await log.last_seq()

            async def caught_up() -> bool:
                return await answers_from(alone) >= last

            await until_answered(caught_up, WAIT)
        finally:
            await alone.close()
            await log.close()
        assert not any(t.done() for t in c.tasks.values()), "a part of corral stopped"
