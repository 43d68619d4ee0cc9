"""The health monitor as its own process, as ``corral up`` builds it: ``python -m bench.e2e.health``.

(``corral serve`` has no health role yet; this is the same ``HealthMonitor`` on a connection of
its own, with ``corral up``'s default heartbeat settings.)
"""

from __future__ import annotations

import argparse
import asyncio

from corral.events.jetstream import JetStreamLog
from corral.services.health.decide import HeartbeatTracker
from corral.services.health.service import HealthMonitor
from corral.services.runtime.shell import stop_on_signals


async def run(url: str) -> None:
    conn = await JetStreamLog.connect(url, name="health")
    try:
        await HealthMonitor(conn, conn.nc, tracker=HeartbeatTracker()).run(stop_on_signals())
    finally:
        await conn.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.e2e.health")
    p.add_argument("--server", required=True)
    asyncio.run(run(p.parse_args().server))
