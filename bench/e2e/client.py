"""The benchmark's tenants: submit jobs through the intake, as a client of corral would.

``python -m bench.e2e.client --server URL`` reads commands on stdin, one a line, and answers each
on stdout once every request of it was answered by the intake:

  mix PREFIX N       N jobs of the measured mix, ids PREFIX-0000000…, spread over the tenants
                     ``team-0`` … ``team-3`` (each submits to its own queue)
  backlog PREFIX N   N one-GPU jobs of tenant ``backlog`` into its queue, which has a small quota

  → done PREFIX N SECONDS

The mix (by count): 80 % one GPU, 15 % eight GPUs packed on one NVLink island, 5 % gangs of four
eight-GPU workers in one rack; each runs ``sleep R`` with R uniform in ``--runtime`` (seconds),
and says so in its runtime estimate. Requests go ``--in-flight`` at a time, at most ``--rate`` a
second (0: as fast as the intake answers), each with its message id as the CLI sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import nats

from corral.events import codec, subjects
from corral.events.jobs import JobSpec, Resources, SubmitJob, Topology
from corral.events.nats_client import servers
from corral.services.runtime import identities

TEAMS = tuple(f"team-{i}" for i in range(4))
BACKLOG = "backlog"
MIX = ((0.80, 1, 1, "none"), (0.15, 1, 8, "nvlink"), (0.05, 4, 8, "rack"))  # share, replicas, gpus, pack


def spec(rng: random.Random, queue: str, runtime: tuple[float, float], mix: bool) -> JobSpec:
    seconds = round(rng.uniform(*runtime), 1)
    replicas, gpus, pack = 1, 1, "none"
    if mix:
        roll = rng.random()
        for share, replicas, gpus, pack in MIX:  # noqa: B007 - the last one taken is the one rolled
            if roll < share:
                break
            roll -= share
    return JobSpec(
        queue=queue,
        replicas=replicas,
        resources=Resources(gpus=gpus),
        topology=Topology(pack=pack),  # type: ignore[arg-type]
        runtime_estimate_s=seconds,
        command=("sleep", f"{seconds:g}"),
    )


async def submit(
    conns: dict[str, nats.NATS], kind: str, prefix: str, n: int, args: argparse.Namespace, rng: random.Random
) -> float:
    slots = asyncio.Semaphore(args.in_flight)
    runtime = (args.runtime_min, args.runtime_max)
    failures: list[bytes] = []

    async def one(i: int) -> None:
        try:
            tenant = TEAMS[i % len(TEAMS)] if kind == "mix" else BACKLOG
            job_id = f"{prefix}-{i:07d}"
            body = SubmitJob(request_id=job_id, job=spec(rng, tenant, runtime, kind == "mix"))
            headers = {"Nats-Msg-Id": job_id}
            answer = await conns[tenant].request(
                subjects.intake(tenant, "submit"), codec.encode(body), timeout=60, headers=headers
            )
            if "seq" not in json.loads(answer.data):
                failures.append(answer.data)
        finally:
            slots.release()

    t0 = time.perf_counter()
    tasks = []
    for i in range(n):
        await slots.acquire()
        if args.rate > 0:
            ahead = t0 + i / args.rate - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    if failures:
        raise RuntimeError(f"{len(failures)} submits refused, e.g. {failures[0]!r}")
    return time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    # A connection per tenant: the intake answers only into the asking tenant's own inbox.
    conns = {
        t: await nats.connect(
            servers(args.server), name=f"bench-{t}", inbox_prefix=identities.inbox_prefix(t)
        )
        for t in (*TEAMS, BACKLOG)
    }
    rng = random.Random(args.seed)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            kind, prefix, count = line.split()
            if kind not in ("mix", "backlog"):
                raise ValueError(f"unknown command {kind!r}")
            seconds = await submit(conns, kind, prefix, int(count), args, rng)
            print(f"done {prefix} {count} {seconds:.3f}", flush=True)
    finally:
        for c in conns.values():
            await c.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.e2e.client", description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--in-flight", type=int, default=256)
    p.add_argument("--rate", type=float, default=0.0, help="jobs a second at most (0: unpaced)")
    p.add_argument("--runtime-min", type=float, default=5.0)
    p.add_argument("--runtime-max", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(main(p.parse_args()))
