"""Append throughput on an embedded JetStream server: ``python -m bench.append``.

Three ways of appending the same kind of events, in one run on one server:

  awaited    one append at a time, each acknowledgement awaited before the next is sent
  pipelined  ``append_many`` of single-event appends: all sent, then the acknowledgements gathered
  batched    ``append_many`` of decision events carrying 100 placements each (one cycle's worth)

Every append carries a ``Nats-Msg-Id`` as the services' do. Prints the median of a few
repetitions, and each way's rate relative to ``awaited`` measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

from corral.events import codec
from corral.events import subjects as subj
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append, EventLog, LogError
from corral.events.nodes import WorkerStarted
from corral.events.server import EmbeddedServer

T0 = 1_700_000_000.0


def started(run: str, i: int) -> Append:
    node = f"node-{i % 64:02d}"
    body = WorkerStarted(node=node, job_id=f"job-{i:07d}", attempt=0, rank=0, pid=4242)
    env = codec.seal(body, event_id=f"{run}-s-{i}", time=T0 + i, producer=f"agent/{node}")
    return Append(subj.node(node), codec.encode(env), msg_id=f"start:{run}:{i}")


def placed(run: str, i: int, placements: int) -> Append:
    ps = tuple(
        Placement(
            f"job-{i:05d}-{k:03d}",
            0,
            (WorkerSlot(0, f"node-{(i + k) % 64:02d}", tuple(GpuClaim(g) for g in range(k % 8 + 1))),),
        )
        for k in range(placements)
    )
    body = JobsPlaced(based_on=i, now=T0 + i, placements=ps)
    env = codec.seal(body, event_id=f"{run}-p-{i}", time=T0 + i, producer="placer")
    return Append(subj.decision("placer"), codec.encode(env), msg_id=f"place:{run}:{i}")


async def awaited(log: EventLog, items: list[Append]) -> None:
    for item in items:
        await log.append(item)


async def pipelined(log: EventLog, items: list[Append]) -> None:
    results = await log.append_many(items)
    failed = [r for r in results if isinstance(r, LogError)]
    if failed:
        raise failed[0]


async def timed(
    fn: Callable[[EventLog, list[Append]], Awaitable[None]], log: EventLog, items: list[Append]
) -> tuple[float, float]:
    """Wall time, and this process's CPU time (what the client costs, whatever else runs)."""
    t, c = time.perf_counter(), time.process_time()
    await fn(log, items)
    return time.perf_counter() - t, time.process_time() - c


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as store:
        async with EmbeddedServer(store) as server:
            log = await JetStreamLog.connect(server.url, create=True)
            try:
                await pipelined(log, [started("warm", i) for i in range(2_000)])
                runs: dict[str, list[tuple[float, float]]] = {"awaited": [], "pipelined": [], "batched": []}
                counts: dict[str, int] = {}
                sizes: dict[str, int] = {}
                for rep in range(args.reps):
                    cases = {
                        "awaited": (awaited, [started(f"a{rep}", i) for i in range(args.awaited)]),
                        "pipelined": (pipelined, [started(f"p{rep}", i) for i in range(args.pipelined)]),
                        "batched": (
                            pipelined,
                            [placed(f"b{rep}", i, args.placements) for i in range(args.batched)],
                        ),
                    }
                    for name, (fn, items) in cases.items():
                        sizes[name] = len(items[0].data)
                        counts[name] = len(items)
                        runs[name].append(await timed(fn, log, items))
            finally:
                await log.close()
    per_event = {"awaited": 1, "pipelined": 1, "batched": args.placements}
    rate = {name: counts[name] / statistics.median(w for w, _ in runs[name]) for name in runs}
    print(f"append throughput, median of {args.reps} (JetStream file storage, one local server)")
    print(
        f"{'mode':<10} {'bytes/event':>11} {'events/s':>10} {'decisions/s':>12} {'vs awaited':>10}"
        f" {'client CPU us/event':>20}"
    )
    for name in runs:
        decisions = rate[name] * per_event[name]
        cpu = statistics.median(c for _, c in runs[name]) / counts[name] * 1e6
        print(
            f"{name:<10} {sizes[name]:>11} {rate[name]:>10,.0f} {decisions:>12,.0f}"
            f" {decisions / rate['awaited']:>9.1f}x {cpu:>20.1f}"
        )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.append", description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--awaited", type=int, default=3_000, help="appends one at a time")
    p.add_argument("--pipelined", type=int, default=50_000, help="single-event appends pipelined")
    p.add_argument("--batched", type=int, default=2_000, help="decision events pipelined")
    p.add_argument("--placements", type=int, default=100, help="placements per decision event")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
