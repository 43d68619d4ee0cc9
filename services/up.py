"""``corral up``: a whole corral on one machine.

An embedded nats-server with JetStream (unless ``--server`` names one), the decision services
(each with its own connection, as if it were its own process), and simulated nodes registered in
the log. Runs in the foreground until Ctrl-C or SIGTERM, then drains and stops in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from events import codec, subjects
from events.log import Append, EventLog
from events.nodes import NodeInventory, NodeRegistered
from events.server import EmbeddedServer
from services import inventory
from services.shell import Decide, Service, stop_on_signals


def service_roles() -> dict[str, Decide]:
    """The decision services that run in a cluster, by role, each a pure ``decide``."""
    from services.admission.decide import decide as admission
    from services.placer.decide import decide as placer
    from services.preemptor.decide import decide as preemptor

    return {"admission": admission, "placer": placer, "preemptor": preemptor}


async def connect(url: str) -> EventLog:
    from events.jetstream import JetStreamLog

    return await JetStreamLog.connect(url)


async def register_nodes(log: EventLog, nodes: list[tuple[str, NodeInventory]], now: float) -> None:
    """Announce simulated nodes, as their agents would. Deduplicated by node name, so running
    ``corral up`` again on the same store registers nothing twice."""
    items = []
    for name, inv in nodes:
        body = NodeRegistered(node=name, inventory=inv)
        env = codec.seal(body, event_id=f"register:{name}", time=now, producer=f"agent@{name}")
        items.append(Append(subjects.node(name), codec.encode(env), msg_id=f"register:{name}"))
    for result in await log.append_many(items):
        if isinstance(result, Exception):
            raise result


@dataclass
class Cluster:
    url: str
    services: list[Service] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


@asynccontextmanager
async def cluster(
    server: str | None,
    nodes: int,
    profile: str,
    data_dir: Path,
    port: int = 0,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[Cluster]:
    """Start everything; on exit stop the services first, then the server."""
    import time

    clock = clock or time.time
    async with AsyncExitStack() as stack:
        if server is None:
            srv = EmbeddedServer(data_dir, port=port or None)
            await srv.start()
            stack.push_async_callback(srv.stop)
            url = srv.url
        else:
            url = server
        log = await connect(url)
        stack.push_async_callback(log.close)
        simulated = inventory.cluster(nodes, profile)
        await register_nodes(log, simulated, clock())
        running = Cluster(url, nodes=[n for n, _ in simulated])
        stop = asyncio.Event()
        tasks = []
        for role, decide in service_roles().items():
            service_log = await connect(url)
            stack.push_async_callback(service_log.close)
            svc = Service(role, decide, service_log, clock=clock)
            running.services.append(svc)
            tasks.append(asyncio.create_task(svc.run(stop), name=role))

        async def stop_services() -> None:
            stop.set()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(t, timeout=10)

        stack.push_async_callback(stop_services)
        await asyncio.gather(*(s.caught_up.wait() for s in running.services))
        yield running


async def run_cluster(server: str | None, nodes: int, profile: str, data_dir: Path, port: int) -> None:
    from services.cli import STATE_DIR

    stop = stop_on_signals()
    async with cluster(server, nodes, profile, data_dir, port) as running:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / "server").write_text(running.url + "\n")
        roles = ", ".join(s.role for s in running.services) or "none"
        print(f"corral is up at {running.url}", flush=True)
        print(f"  services: {roles}", flush=True)
        print(f"  nodes: {len(running.nodes)} simulated ({profile})", flush=True)
        print("  Ctrl-C to stop", flush=True)
        try:
            await stop.wait()
        finally:
            (STATE_DIR / "server").unlink(missing_ok=True)
    print("corral stopped", flush=True)
