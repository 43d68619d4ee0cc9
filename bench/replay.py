"""Replay from JetStream into the fold: ``python -m bench.replay [--events N]``.

Fills a stream on an embedded server with ``bench.workload.synthetic_log`` (pipelined appends),
then reads it all back with ``JetStreamLog.read``:

  transport       records read, nothing decoded: the raw JetStream read rate of the stream,
                  the anchor the two below are measured against
  transport+fold  every record folded into a fresh State with ``projections.fold.apply``
  fold only       the same records folded from memory (no transport), for where the time goes
  read ahead      transport+fold with the reading in a process of its own: it reads and parses the
                  stream and hands batches of records, msgpack-encoded, down a pipe to this one,
                  which decodes and folds them, so that reading overlaps folding on two cores
                  (an alternative measured, not what the services do: see DESIGN.md, section 9)

Both folds pause the cycle collector for each batch, as the services do.

Prints the median of a few repetitions: events per second of wall time, and this process's CPU
time per event (what the reader costs on a machine shared with other work; the nats-server runs
beside it and is not counted). The goals: transport+fold 100,000 events/s, fold only 200,000
events per CPU-second.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time

import msgspec

from bench.workload import records, synthetic_log
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append, LogError, Record
from corral.events.server import EmbeddedServer
from corral.projections.fold import apply, collector_paused, fold
from corral.projections.state import State

GOAL = 100_000  # events/s replayed into the fold
FOLD_GOAL = 200_000  # events folded per CPU-second
CHUNK = 20_000  # appends per append_many while filling


async def fill(log: JetStreamLog, appends: list[Append]) -> None:
    for lo in range(0, len(appends), CHUNK):
        results = await log.append_many(appends[lo : lo + CHUNK])
        failed = [r for r in results if isinstance(r, LogError)]
        if failed:
            raise SystemExit(f"fill failed at {lo}: {failed[0]} ({len(failed)} failures)")


class Timer:
    """Wall time and this process's CPU time: on a shared machine the second says what the reader
    itself costs, whatever else runs beside it."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


async def transport(log: JetStreamLog, n: int) -> Timer:
    got = 0
    with Timer() as t:
        async for batch in log.read():
            got += len(batch)
    if got != n:
        raise SystemExit(f"read {got} of {n} records")
    return t


async def transport_fold(log: JetStreamLog, n: int) -> Timer:
    state = State()
    with Timer() as t:
        async for batch in log.read():
            with collector_paused():  # as a service folds each batch it reads
                for record in batch:
                    apply(state, record)
    check(state, n)
    return t


# The reading process of ``read ahead``: the log's own reader, each batch it yields written as
# a length-prefixed msgpack frame (a Record is array-like: a frame is compact and decodes in C).
READER = """
import asyncio, sys
import msgspec
from corral.events.jetstream import JetStreamLog

async def main():
    log = await JetStreamLog.connect(sys.argv[1])
    out = sys.stdout.buffer
    encode = msgspec.msgpack.Encoder().encode
    try:
        async for batch in log.read():
            frame = encode(batch)
            out.write(len(frame).to_bytes(4, "big") + frame)
        out.flush()
    finally:
        await log.close()

asyncio.run(main())
"""
_decode_batch = msgspec.msgpack.Decoder(list[Record]).decode


async def read_ahead(url: str, n: int) -> Timer:
    state = State()
    before = child_cpu()
    with Timer() as t:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", READER, url, stdout=asyncio.subprocess.PIPE, limit=1 << 24
        )
        assert child.stdout is not None
        while True:
            head = await child.stdout.read(4)
            if not head:
                break
            if len(head) < 4:
                head += await child.stdout.readexactly(4 - len(head))
            batch = _decode_batch(await child.stdout.readexactly(int.from_bytes(head, "big")))
            with collector_paused():
                for record in batch:
                    apply(state, record)
        if await child.wait():
            raise SystemExit(f"the reading process failed ({child.returncode})")
    t.cpu += child_cpu() - before  # the reading process's CPU counts: it is part of the replay
    check(state, n)
    return t


def child_cpu() -> float:
    """CPU time of this process's children that have ended, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fold_only(recs: list[Record]) -> Timer:
    with Timer() as t:
        state = fold(recs)  # as a service folds a batch: the cycle collector paused for it
    check(state, len(recs))
    return t


def check(state: State, n: int) -> None:
    if state.seq != n or state.faults:
        raise SystemExit(f"folded to {state.seq} of {n} with {state.faults} faults")


async def main(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    appends = synthetic_log(args.events, seed=args.seed)
    generated = time.perf_counter() - t
    n = len(appends)
    recs = records(appends)
    folded = fold(recs)
    print(
        f"{n:,} events ({sum(len(a.data) for a in appends) / n:.0f} bytes on average), generated in "
        f"{generated:.1f}s: {len(folded.jobs):,} jobs on {len(folded.nodes)} nodes, "
        f"{folded.rejected_total} rejections, {folded.faults} faults"
    )
    runs: dict[str, list[Timer]] = {"transport": [], "transport+fold": [], "read ahead": [], "fold only": []}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as store:
        async with EmbeddedServer(store) as server:
            log = await JetStreamLog.connect(server.url, create=True)
            try:
                with Timer() as filled:
                    await fill(log, appends)
                print(f"fill (pipelined appends): {n / filled.wall:,.0f} events/s")
                for _ in range(args.reps):
                    runs["transport"].append(await transport(log, n))
                    runs["transport+fold"].append(await transport_fold(log, n))
                    runs["read ahead"].append(await read_ahead(server.url, n))
                    runs["fold only"].append(fold_only(recs))
            finally:
                await log.close()
    print(
        f"replay of {n:,} events, median of {args.reps}; "
        "CPU is this process's alone (read ahead: with its reading process)"
    )
    anchor = n / statistics.median(t.wall for t in runs["transport"])
    print(f"{'path':<15} {'events/s':>10} {'of transport':>13} {'CPU us/event':>13} {'events/CPU-s':>13}")
    for name, timers in runs.items():
        wall = statistics.median(t.wall for t in timers)
        cpu = statistics.median(t.cpu for t in timers)
        rate = n / wall
        print(f"{name:<15} {rate:>10,.0f} {rate / anchor:>13.0%} {cpu / n * 1e6:>13.1f} {n / cpu:>13,.0f}")
    got = n / statistics.median(t.wall for t in runs["transport+fold"])
    print(f"goal {GOAL:,} events/s into the fold: {'met' if got >= GOAL else 'not met'} ({got / GOAL:.0%})")
    print(f"replay into the fold is {got / anchor:.0%} of the raw read rate of the same stream")
    folded = n / statistics.median(t.cpu for t in runs["fold only"])
    verdict = "met" if folded >= FOLD_GOAL else "not met"
    print(f"goal {FOLD_GOAL:,} events folded per CPU-second: {verdict} ({folded / FOLD_GOAL:.0%})")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
