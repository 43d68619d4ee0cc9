"""What durability costs in append rate: ``python -m bench.durability``.

The same payloads (a worker's start report, as agents append them, each with a message id),
appended to the log's stream in three set-ups, all in one run on this machine:

  R1 default   one nats-server, JetStream's default sync: files fsynced every 2 minutes
  R1 always    one nats-server with ``sync_interval: always``: every write fsynced before its ack
  R3           a three-server cluster on loopback (default sync): each append acknowledged once
               a majority of the three has it

Each pipelined (``append_many``, as the services append) and one at a time (each acknowledgement
awaited, as a client's submit). Prints the median rate of a few repetitions and each set-up's
ratio against R1 default measured in the same run. The three servers of R3 share this machine's
cores and disk: on three machines the replication costs a network round trip instead.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from bench.append import awaited, pipelined, started
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append
from corral.events.server import EmbeddedCluster, EmbeddedServer


@asynccontextmanager
async def single(store: Path, sync_always: bool) -> AsyncIterator[tuple[str, int]]:
    async with EmbeddedServer(store, sync_always=sync_always) as server:
        yield server.url, 1


@asynccontextmanager
async def three(store: Path) -> AsyncIterator[tuple[str, int]]:
    async with EmbeddedCluster(store, 3) as cluster:
        yield cluster.url, 3


async def measure(
    setup: AbstractAsyncContextManager[tuple[str, int]], args: argparse.Namespace, name: str
) -> dict[str, float]:
    async with setup as (url, replicas):
        log = await JetStreamLog.connect(url, create=True, replicas=replicas)
        try:
            await pipelined(log, [started(f"{name}-warm", i) for i in range(1_000)])
            rates: dict[str, list[float]] = {"pipelined": [], "awaited": []}
            for rep in range(args.reps):
                cases: dict[str, tuple[Callable[..., object], list[Append]]] = {
                    "pipelined": (pipelined, [started(f"{name}-p{rep}", i) for i in range(args.pipelined)]),
                    "awaited": (awaited, [started(f"{name}-a{rep}", i) for i in range(args.awaited)]),
                }
                for mode, (fn, items) in cases.items():
                    t = time.perf_counter()
                    await fn(log, items)  # type: ignore[misc]
                    rates[mode].append(len(items) / (time.perf_counter() - t))
        finally:
            await log.close()
    return {mode: statistics.median(r) for mode, r in rates.items()}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        root = Path(tmp)
        results = {
            "R1 default": await measure(single(root / "r1", False), args, "r1"),
            "R1 always": await measure(single(root / "r1-always", True), args, "r1a"),
            "R3": await measure(three(root / "r3"), args, "r3"),
        }
    size = len(started("x", 0).data)
    print(f"append rate by durability, median of {args.reps}, {size}-byte payloads (one machine)")
    print(f"{'set-up':<11} {'pipelined/s':>12} {'vs R1':>7} {'awaited/s':>10} {'vs R1':>7}")
    anchor = results["R1 default"]
    for name, r in results.items():
        print(
            f"{name:<11} {r['pipelined']:>12,.0f} {r['pipelined'] / anchor['pipelined']:>6.2f}x"
            f" {r['awaited']:>10,.0f} {r['awaited'] / anchor['awaited']:>6.2f}x"
        )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pipelined", type=int, default=20_000, help="appends pipelined per repetition")
    p.add_argument("--awaited", type=int, default=1_000, help="appends one at a time per repetition")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
