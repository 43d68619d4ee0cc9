"""``corral up``: a whole corral on one machine.

An embedded nats-server with JetStream (unless ``--server`` names one), the decision services
(each with its own connection, as if it were its own process), the health monitor, the
assignments service (each node's view of the log, which its agent watches), the forecast role
(every waiting job's start, and what-if), and one node
agent per simulated node, each with its own connection, its own work directory under the data
directory (``nodes/<node>``: workers' working directories and logs) and a checkpoint directory
shared by all of them (``checkpoints``, as a shared filesystem would be on a real cluster, so a
job resumes on any node). Runs in the foreground until Ctrl-C or SIGTERM, then stops in order:
the decision services, the read service and the health monitor first (nothing new is decided),
then the agents (their workers are stopped and their exits reported: stopping the whole corral
stops its work, unlike an agent restarting, which leaves its workers running for the next agent
to take back), then the connections and the server. A part that stops on its own (its task
ends, whatever of) stops the whole corral the same way, and ``corral up`` exits with status 1
naming it: never up in name only, with a part gone. A decision core that raises does not end its
part: the shell backs off and retries (``services.runtime.supervise``), and ``corral status``
shows the failures.

With ``Settings.auth`` the embedded server requires a login: each part connects as its identity
(``services.runtime.identities``: the services as ``services``, each node's agent as
``agent-<node>``, the read service as ``query``, the intake as ``intake``), and the passwords of
those, of ``admin`` and of each tenant in ``Settings.tenants`` are in ``credentials.json`` in
the data directory, kept across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append, EventLog, LogError
from corral.events.nats_client import Client, answers, open_client
from corral.events.nats_client import servers as server_list
from corral.events.nodes import NodeInventory, NodeRegistered
from corral.events.server import EmbeddedCluster, EmbeddedServer, ServerError
from corral.services.admission import service as admission_service
from corral.services.agent import discovery, inventory
from corral.services.agent.intake import IntakeReports
from corral.services.agent.sandbox import WORKER_USER, isolation
from corral.services.agent.service import NodeAgent
from corral.services.agent.workers import SandboxMode
from corral.services.assignments import service as assignments_service
from corral.services.forecast import service as forecast_service
from corral.services.health.decide import HeartbeatTracker
from corral.services.health.service import ROLE as HEALTH
from corral.services.health.service import HealthMonitor
from corral.services.intake import service as intake_service
from corral.services.intake.rate import DEFAULT as DEFAULT_RATE
from corral.services.intake.rate import NODE_DEFAULT, Rate
from corral.services.placer import service as placer_service
from corral.services.preemptor import service as preemptor_service
from corral.services.query import service as read_service
from corral.services.runtime import forecasts, identities, metrics
from corral.services.runtime import output as worker_output
from corral.services.runtime import views as node_views
from corral.services.runtime.lease import KvLease, ensure_bucket
from corral.services.runtime.shell import Decide, Service, stop_on_signals
from corral.services.runtime.status import StatusBoard

log = logging.getLogger("corral.up")

# The decision services, each its own package with a pure ``decide`` and a thin ``service``.
DECISION_SERVICES = (admission_service, placer_service, preemptor_service)


def service_roles() -> dict[str, Decide]:
    """The decision services that run in a cluster, by role, each a pure ``decide``."""
    return {s.ROLE: s.decide for s in DECISION_SERVICES}


async def connect(url: str, **options: Any) -> JetStreamLog:
    """A service's log; ``options`` go to nats-py's connect (``user``, ``password``)."""
    return await JetStreamLog.connect(url, **options)


async def register_nodes(log: EventLog, nodes: list[tuple[str, NodeInventory]], now: float) -> None:
    """Announce simulated nodes without agents. Deduplicated by node name, so running
    ``corral up`` again on the same store registers nothing twice."""
    items = []
    for name, inv in nodes:
        body = NodeRegistered(node=name, inventory=inv)
        env = codec.seal(body, event_id=f"register:{name}", time=now, producer=f"agent@{name}")
        items.append(Append(subjects.node(name), codec.encode(env), msg_id=f"register:{name}"))
    for result in await log.append_many(items):
        if isinstance(result, Exception):
            raise result


@dataclass(frozen=True)
class Settings:
    """How a one-machine corral runs. The defaults suit a person at a terminal; tests shorten
    the intervals (heartbeats of 0.2 s, a node lost after 2 s)."""

    tick: float = 1.0  # decision services and the health monitor decide at least this often
    agents: bool = True  # run a node agent per node (else only register the nodes)
    agent_tick: float = 0.5
    heartbeat: float = 5.0  # seconds between an agent's heartbeats
    suspect_after: int = 3  # missed heartbeats before a node is suspect
    lost_after: float = 60.0  # seconds of silence before a node is lost
    probation: float = 30.0  # healthy heartbeats before a suspect or lost node is trusted again
    restart_backoff: float = 2.0  # first restart's wait; doubled for each restart after it
    sandbox: SandboxMode = "auto"  # workers in bubblewrap where it works
    stop_grace: float = 10.0  # SIGTERM to SIGKILL when the agents stop their workers
    start_timeout: float = 120.0  # a gang's start barrier on one node
    gang_timeout: float = 300.0  # a gang's start barrier across nodes
    auth: bool = False  # the embedded server requires a login, with per-identity permissions
    tenants: tuple[str, ...] = ()  # with auth: the tenants that get a login
    # With auth: the unprivileged host user workers run as (None: the agent's own user, without
    # capabilities).
    worker_user: str | None = WORKER_USER
    # Embedded nats-servers: 1, or a JetStream cluster of this many on loopback (odd, 3 or more).
    nats_servers: int = 1
    # The log's stream's and the buckets' replica count; None: one per embedded server (at most
    # 3), or on servers given with ``--server`` as they allow: 3 on a cluster of 3 or more, else 1.
    replicas: int | None = None
    connect_within: float = 5.0  # seconds to reach a server given with ``--server``
    tenant_rate: Rate | None = DEFAULT_RATE  # how fast the intake takes each tenant's requests
    node_rate: Rate | None = NODE_DEFAULT  # and each node agent's reports


@dataclass
class Cluster:
    url: str  # every NATS server's URL, comma separated
    services: list[Service] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    agents: dict[str, NodeAgent] = field(default_factory=dict)  # by node: to kill, cut off, inspect
    health: HealthMonitor | None = None
    assignments: Service | None = None
    forecast: Service | None = None
    query: read_service.ReadService | None = None
    intake: intake_service.Intake | None = None
    data_dir: Path | None = None
    credentials: Path | None = None  # with auth: every identity's password
    nats: EmbeddedServer | EmbeddedCluster | None = None  # the embedded server(s): to kill, restart
    replicas: int = 1  # of the log's stream and the buckets
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # every part, by name
    # Restart a node's agent, leaving its workers running (``NodeAgent.leave``): a drill.
    restart_agent: Callable[[str, Callable[[], Awaitable[None]] | None], Awaitable[NodeAgent]] | None = None


class Refused(Exception):
    """``corral up`` cannot start as asked: the data directory is in use, the server is not
    there. One line for the person at the terminal."""


LOCK = "corral.lock"


def lock_data_dir(data_dir: Path) -> int:
    """Hold ``data_dir`` for this process (an fcntl lock on ``corral.lock`` in it, released when
    the process ends, however it ends, and the embedded server it starts with it: two corrals on
    one store would both run a nats-server on it, and the server is held too, should it outlive
    its corral). The file says which process holds it."""
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise Refused(
            f"{data_dir} is in use by another corral up (pid {holder}), or by a nats-server it left running"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


async def _setup_log(url: str, replicas: int | None, within: float, **options: Any) -> JetStreamLog:
    """The administrator's connection that makes the stream, bounded: a ``--server`` nobody
    answers at is one line within ``within`` seconds, not minutes of nats-py retrying. Whether a
    server answers is asked first with plain asyncio, which a Ctrl-C cancels at once."""

    async def quiet(e: Exception) -> None:
        return None  # the one line below says it; nats-py would log every attempt

    if not await answers(url, within):
        raise Refused(f"cannot reach NATS at {url}: no answer within {within:g}s")
    # A server answered: nats-py tries each server of the list twice at most, then gives up.
    bounded = {"max_reconnect_attempts": 2, "reconnect_time_wait": 0.5, "connect_timeout": 2}
    try:
        return await connect(url, create=True, replicas=replicas, error_cb=quiet, **bounded, **options)
    except LogError as e:
        raise Refused(str(e).splitlines()[0]) from None


class PartStopped(Exception):
    """A part of a running corral stopped on its own."""

    def __init__(self, name: str, error: BaseException | None) -> None:
        why = "returned" if error is None else f"{type(error).__name__}: {error}".strip()
        super().__init__(f"{name} stopped ({why}); corral is down")
        self.name = name
        self.error = error


async def until_stopped(running: Cluster, stop: asyncio.Event) -> None:
    """Wait for ``stop``; raise ``PartStopped`` if any part of ``running`` ends before it."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            parts = set(running.tasks.values())
            await asyncio.wait({stopping, *parts}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                return
            for name, task in running.tasks.items():
                if task.done():
                    error = None if task.cancelled() else task.exception()
                    log.error("%s stopped on its own", name, exc_info=error)
                    raise PartStopped(name, error)
    finally:
        stopping.cancel()


@asynccontextmanager
async def cluster(
    server: str | None,
    nodes: int,
    profile: str,
    data_dir: Path,
    port: int = 0,
    clock: Callable[[], float] | None = None,
    settings: Settings | None = None,
) -> AsyncIterator[Cluster]:
    """Start everything; on exit stop the services, then the agents, then the server."""
    import time

    clock = clock or time.time
    cfg = settings or Settings()
    passwords: dict[str, str] = {}
    credentials = None
    simulated = inventory.cluster(nodes, profile)
    if cfg.auth:
        credentials = data_dir / identities.CREDENTIALS
        agents = [n for n, _ in simulated] if cfg.agents else []
        passwords = identities.ensure(credentials, cfg.tenants, agents)

    def login(name: str) -> dict[str, str]:
        return identities.login(passwords, name) if cfg.auth else {}

    async with AsyncExitStack() as stack:
        lock = lock_data_dir(data_dir)
        stack.callback(os.close, lock)
        server_tasks: list[asyncio.Task[None]] = []
        embedded: EmbeddedServer | EmbeddedCluster | None = None
        users = identities.users(passwords)
        if server is None and cfg.nats_servers > 1:
            size, probe = cfg.nats_servers, login(identities.SERVICES)
            embedded = EmbeddedCluster(
                data_dir, size, port=port or None, users=users, probe=probe, hold_fds=(lock,)
            )
            await embedded.start()
            stack.push_async_callback(embedded.stop)
            url = embedded.url
            # Two of three carry the log when one dies, but nothing else would bring that one
            # back, and losing a second would stop every part: each is started again.
            for srv in embedded.servers:
                server_tasks.append(asyncio.create_task(_keep_up(srv), name=f"nats-server {srv.name}"))
        elif server is None:
            embedded = EmbeddedServer(data_dir, port=port or None, users=users, hold_fds=(lock,))
            await embedded.start()
            stack.push_async_callback(embedded.stop)
            url = embedded.url
            # The server is a part too: every other part waits for it to come back, for ever.
            server_tasks.append(asyncio.create_task(_server_exit(embedded), name="nats-server"))
        else:
            url = ",".join(server_list(server))
        for t in server_tasks:
            stack.callback(t.cancel)
        replicas = cfg.replicas or (min(cfg.nats_servers, 3) if server is None else None)

        service_logs: list[Any] = []  # every service's connection (the agents' are theirs)

        async def service_log() -> JetStreamLog:
            opened = await connect(url, **login(identities.SERVICES))
            stack.push_async_callback(opened.close)
            service_logs.append(opened)
            return opened

        # The one place the log's stream and the leases' bucket are configured, as the
        # administrator: the services may use them, not make, change, purge or delete them.
        admin = {"inbox_prefix": identities.inbox_prefix(identities.ADMIN), **login(identities.ADMIN)}
        within = cfg.connect_within if server is not None else 60.0  # ours: up, merely busy
        setup = await _setup_log(url, replicas, within, **admin)
        replicas = setup.replicas or 1  # asked of the servers, where not given
        try:
            # The buckets as the stream: on a cluster, a lease or a node's view outlives a server.
            await ensure_bucket(setup.nc, replicas=replicas)
            await node_views.ensure_bucket(setup.nc, replicas=replicas)
            await forecasts.ensure_bucket(setup.nc, replicas=replicas)
            await worker_output.ensure_stream(setup.nc, replicas=replicas)
        finally:
            await setup.close()
        log = await service_log()
        if not cfg.agents:
            await register_nodes(log, simulated, clock())
        running = Cluster(
            url,
            nodes=[n for n, _ in simulated],
            data_dir=data_dir,
            credentials=credentials,
            nats=embedded,
            replicas=replicas,
        )

        stop = asyncio.Event()
        tasks = []
        for decider in DECISION_SERVICES:
            role, role_log = decider.ROLE, await service_log()
            # A lease per role, as replicas in other processes (``corral serve``) take turns with.
            replica = f"{role}@{socket.gethostname()}:{os.getpid()}"
            lease = await KvLease.open(role_log.nc, role, replica)
            board = await StatusBoard.open(role_log.nc, role, replica)
            svc = decider.service(role_log, clock=clock, tick=cfg.tick, lease=lease, status=board)
            running.services.append(svc)
            tasks.append(asyncio.create_task(svc.run(stop), name=role))
        query_log = await read_service.connect(url, **login(identities.QUERY))
        stack.push_async_callback(query_log.close)
        service_logs.append(query_log)
        reader = read_service.ReadService(query_log)
        stack.callback(reader.close)
        running.query = reader
        tasks.append(asyncio.create_task(reader.run(stop), name=reader.role))
        intake_log = await intake_service.connect(url, **login(identities.INTAKE))
        stack.push_async_callback(intake_log.close)
        service_logs.append(intake_log)
        intake = intake_service.Intake(intake_log, cfg.tenant_rate, cfg.node_rate)
        running.intake = intake
        # The agents' reports go through the intake: it stops after them (``stop_intake``).
        intake_stop = asyncio.Event()
        intake_task = asyncio.create_task(intake.run(intake_stop), name=intake_service.ROLE)
        # Each node's view of the log, in the bucket its agent watches: agents fold nothing.
        views_log = await service_log()
        holder = f"{assignments_service.ROLE}@{socket.gethostname()}:{os.getpid()}"
        lease = await KvLease.open(views_log.nc, assignments_service.ROLE, holder)
        store = await node_views.KvViewStore.open(views_log.nc)
        projection = assignments_service.service(
            views_log,
            store,
            clock=clock,
            lease=lease,
            status=await StatusBoard.open(views_log.nc, assignments_service.ROLE, holder),
        )
        running.assignments = projection
        tasks.append(asyncio.create_task(projection.run(stop), name=assignments_service.ROLE))
        # Every waiting job's start forecast, in the bucket the read service reads; what-if.
        forecast_log = await service_log()
        holder = f"{forecast_service.ROLE}@{socket.gethostname()}:{os.getpid()}"
        forecaster = forecast_service.service(
            forecast_log,
            await forecasts.KvForecasts.open(forecast_log.nc),
            clock=clock,
            lease=await KvLease.open(forecast_log.nc, forecast_service.ROLE, holder),
            status=await StatusBoard.open(forecast_log.nc, forecast_service.ROLE, holder),
        )
        running.forecast = forecaster
        tasks.append(asyncio.create_task(forecaster.run(stop), name=forecast_service.ROLE))
        monitor_log = await service_log()
        tracker = HeartbeatTracker(cfg.heartbeat, cfg.suspect_after, cfg.lost_after, cfg.probation)
        replica = f"{HEALTH}@{socket.gethostname()}:{os.getpid()}"
        monitor = HealthMonitor(
            monitor_log,
            monitor_log.nc,
            tracker=tracker,
            clock=clock,
            tick=cfg.tick,
            lease=await KvLease.open(monitor_log.nc, HEALTH, replica),
            status=await StatusBoard.open(monitor_log.nc, HEALTH, replica),
        )
        running.health = monitor
        tasks.append(asyncio.create_task(monitor.run(stop), name=HEALTH))

        agents_stop = asyncio.Event()
        agent_tasks = []

        def make_agent(name: str, inv: NodeInventory, agent_nc: Client) -> NodeAgent:
            return NodeAgent(
                name,
                IntakeReports(agent_nc, name),
                node_views.KvNodeViews(agent_nc),
                work_dir=data_dir / "nodes" / name,
                checkpoint_root=data_dir / "checkpoints",
                found=discovery.simulated(name, inv.labels["profile"], labels=inv.labels),
                publish=agent_nc.publish,
                output=worker_output.JetStreamOutput(agent_nc),
                clock=clock,
                tick=cfg.agent_tick,
                heartbeat_interval=cfg.heartbeat,
                # A worker never sees the data directory (the credentials, the log's store,
                # others' jobs); with logins, tenants share nodes (``isolation``).
                hidden=[data_dir],
                **isolation(cfg.auth, cfg.sandbox, cfg.worker_user)._asdict(),
                backoff=cfg.restart_backoff,
                start_timeout=cfg.start_timeout,
                gang_timeout=cfg.gang_timeout,
                stop_grace=cfg.stop_grace,
            )

        agent_ncs: dict[str, tuple[NodeInventory, Client]] = {}
        for name, inv in simulated if cfg.agents else ():
            # Each agent as its own node's identity: it may report for that node only, and only
            # through the intake.
            agent_nc = await open_client(
                url,
                name=f"agent-{name}",
                inbox_prefix=identities.agent_inbox(name),
                **login(identities.agent(name)),
            )
            stack.push_async_callback(agent_nc.close)
            agent_ncs[name] = (inv, agent_nc)
            agent = make_agent(name, inv, agent_nc)
            running.agents[name] = agent
            agent_tasks.append(asyncio.create_task(agent.run(agents_stop), name=f"agent-{name}"))

        async def restart_agent(
            name: str, meanwhile: Callable[[], Awaitable[None]] | None = None
        ) -> NodeAgent:
            """Stop the agent of ``name``, leaving its workers running, wait for ``meanwhile``
            (what happens while no agent watches the node), and start a new one on the same
            work directory, which takes them back."""
            task = running.tasks.pop(f"agent-{name}")  # its end is not the corral's
            await running.agents[name].leave()
            await task
            if meanwhile is not None:
                await meanwhile()
            agent = make_agent(name, *agent_ncs[name])
            running.agents[name] = agent
            task = asyncio.create_task(agent.run(agents_stop), name=f"agent-{name}")
            agent_tasks.append(task)
            running.tasks[task.get_name()] = task
            await _ready([agent.registered], [task])
            return agent

        running.restart_agent = restart_agent

        async def server_gone(logs: Iterable[Any]) -> None:
            """The embedded server is gone for good: nothing a part would tell the log can reach
            it, so its connections close first and its last appends fail at once rather than
            each after its timeout. Workers are stopped all the same."""
            if any(t.done() for t in server_tasks):
                for opened in logs:
                    with contextlib.suppress(Exception):
                        await opened.close()

        async def stop_agents() -> None:
            await server_gone(agent_nc for _, agent_nc in agent_ncs.values())
            agents_stop.set()
            await _finish(agent_tasks, cfg.stop_grace + 20)

        async def stop_services() -> None:
            await server_gone(service_logs)
            stop.set()
            await _finish(tasks, 10)

        async def stop_intake() -> None:
            intake_stop.set()
            await _finish([intake_task], 10)

        running.tasks = {t.get_name(): t for t in [*tasks, intake_task, *agent_tasks, *server_tasks]}
        # Last pushed, first run: the services, then the agents (their last reports), then the
        # intake that appends those.
        stack.push_async_callback(stop_intake)
        stack.push_async_callback(stop_agents)
        stack.push_async_callback(stop_services)
        ready = [s.caught_up for s in running.services] + [reader.caught_up, intake.ready, monitor.caught_up]
        ready += [projection.caught_up, forecaster.answering]
        ready += [a.registered for a in running.agents.values()]
        await _ready(ready, [*tasks, intake_task, *agent_tasks])
        yield running


async def _server_exit(srv: EmbeddedServer) -> None:
    code = await srv.exited()
    raise RuntimeError(f"nats-server exited with status {code}; its log: {srv.log_path}")


async def _keep_up(srv: EmbeddedServer, backoff: float = 1.0, most: float = 60.0) -> None:
    """Start a server of an embedded cluster again whenever it ends on its own, on its store and
    its ports (the others' routes name them); said once each time. A server stopped or killed
    on purpose (corral stopping, a drill) is left as it is until it is started again."""
    while True:
        await srv.started()  # at once while it runs; one stopped on purpose, when it is back
        code = await srv.ended_on_its_own()  # waits on its process's exit
        if code is None:
            continue  # stopped or killed on purpose: not ours to start
        log.error(
            "nats-server %s exited with status %s; starting it again; its log: %s",
            srv.name,
            code,
            srv.log_path,
        )
        await srv.kill()  # its process is gone: forget it
        wait = backoff
        while not srv.running:
            await asyncio.sleep(wait)
            try:
                await srv.start()
            except ServerError as e:
                wait = min(wait * 2, most)
                log.error("nats-server %s did not start again (next try in %gs): %s", srv.name, wait, e)
        log.warning("nats-server %s is running again", srv.name)


async def _ready(events: Iterable[asyncio.Event], tasks: list[asyncio.Task[None]]) -> None:
    """Wait until every part says it is up; a part that dies meanwhile raises its error."""
    waiting = asyncio.ensure_future(_all_set(events))
    try:
        while not waiting.done():
            await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done():
                    t.result()  # raises what it died of
                    raise RuntimeError(f"{t.get_name()} stopped while corral was starting")
    finally:
        waiting.cancel()


async def _all_set(events: Iterable[asyncio.Event]) -> None:
    for e in events:
        await e.wait()


async def _finish(tasks: list[asyncio.Task[None]], timeout: float) -> None:
    """Let each part finish; one that fails on its way out (or had died before: that was
    reported) does not keep the others from stopping."""
    for t in tasks:
        try:
            await asyncio.wait_for(t, timeout=timeout)
        except (asyncio.CancelledError, TimeoutError):
            pass
        except Exception as e:  # noqa: BLE001 - stopping goes on
            log.warning("%s: %s: %s", t.get_name(), type(e).__name__, e)


async def run_cluster(
    server: str | None,
    nodes: int,
    profile: str,
    data_dir: Path,
    port: int,
    settings: Settings | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    metrics_token_file: str | None = None,
) -> None:
    """Run a corral until Ctrl-C or SIGTERM. One that comes while it is still starting (a server
    slow to answer) ends it at once, with ``KeyboardInterrupt``."""
    from corral.services.cli.access import STATE_DIR

    stop = stop_on_signals()
    started = asyncio.Event()

    token_file = metrics_token_file
    if token_file is None and metrics_port is not None and settings is not None and settings.auth:
        # With logins, tenants share the host: /metrics answers only scrapers bearing a token.
        token_file = str(metrics.made_token(data_dir))

    async def serve() -> None:
        async with (
            metrics.serving("corral", metrics_port, metrics_host, token_file) as telemetry,
            cluster(server, nodes, profile, data_dir, port, settings=settings) as running,
        ):
            started.set()
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            (STATE_DIR / "server").write_text(running.url + "\n")
            roles = ", ".join([s.role for s in running.services] + [read_service.ROLE, intake_service.ROLE])
            roles += ", health, assignments, forecast"
            print(f"corral is up at {running.url}", flush=True)
            if isinstance(running.nats, EmbeddedCluster):
                n = len(running.nats.servers)
                print(f"  NATS: a JetStream cluster of {n} servers, the log in {running.replicas} replicas")
            elif running.replicas > 1:  # a --server cluster, asked
                print(f"  NATS: a JetStream cluster, the log in {running.replicas} replicas")
            print(f"  services: {roles}", flush=True)
            if running.credentials is not None:
                print(f"  logins required; passwords of every identity: {running.credentials}", flush=True)
            print(f"  nodes: {len(running.nodes)} simulated ({profile}), one agent each", flush=True)
            print(f"  workers and their logs: {data_dir / 'nodes'}", flush=True)
            if telemetry is not None and telemetry.port:
                # Where it listens: "localhost" may name ::1 first, where nothing does.
                host = metrics_host if metrics_host and metrics_host != "0.0.0.0" else metrics.LOOPBACK
                bearer = f" (scrapers bear the token in {token_file})" if token_file else ""
                print(f"  metrics: http://{host}:{telemetry.port}/metrics{bearer}", flush=True)
            print("  Ctrl-C to stop", flush=True)
            try:
                await until_stopped(running, stop)
            finally:
                (STATE_DIR / "server").unlink(missing_ok=True)
        print("corral stopped", flush=True)

    running = asyncio.create_task(serve())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set() and not started.is_set():
            running.cancel()  # what was started is stopped on the way out
            with contextlib.suppress(asyncio.CancelledError):
                await running
            raise KeyboardInterrupt
        await running  # up: it stops in order itself
    finally:
        stopping.cancel()
