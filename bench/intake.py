"""What the intake costs a client's submit: ``python -m bench.intake``.

On one embedded server with logins, the same submit payloads go into the log two ways, in one run:

  raw      the anchor: a client publishing straight into the stream, pipelined, each publish
           acknowledged by JetStream (what tenants did before the intake; no longer allowed)
  intake   a tenant's requests to the intake on ``corral.req.<tenant>.submit``, ``--in-flight``
           at a time, each answered with the sequence the intake stored it at

Prints the median rate of a few repetitions for each, and the intake's share of the anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import nats

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, LogError
from corral.events.server import EmbeddedServer
from corral.services.intake.service import Intake
from corral.services.intake.service import connect as intake_connect
from corral.services.runtime import identities

TENANT = "team-a"


def payload(run: str, i: int) -> bytes:
    spec = JobSpec(queue=TENANT, resources=Resources(gpus=1 + i % 8), command=("python", "train.py"))
    return codec.encode(SubmitJob(request_id=f"{run}-{i:07d}", job=spec))


async def raw(log: JetStreamLog, run: str, n: int) -> float:
    subject = subjects.request(TENANT, "submit")
    items = [Append(subject, payload(run, i), msg_id=f"{run}:{i}") for i in range(n)]
    t = time.perf_counter()
    results = await log.append_many(items)
    elapsed = time.perf_counter() - t
    failed = [r for r in results if isinstance(r, LogError)]
    if failed:
        raise failed[0]
    return n / elapsed


async def via_intake(nc: nats.NATS, run: str, n: int, in_flight: int) -> float:
    slots = asyncio.Semaphore(in_flight)
    subject = subjects.intake(TENANT, "submit")

    async def one(i: int) -> None:
        async with slots:
            headers = {"Nats-Msg-Id": f"{run}:{i}"}
            answer = await nc.request(subject, payload(run, i), timeout=30, headers=headers)
            if "seq" not in json.loads(answer.data):
                raise RuntimeError(answer.data)

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as store:
        passwords = identities.ensure(f"{store}/credentials.json", [TENANT])
        async with EmbeddedServer(f"{store}/nats", users=identities.users(passwords)) as server:
            admin = identities.login(passwords, identities.ADMIN)
            setup = await JetStreamLog.connect(
                server.url, create=True, inbox_prefix=identities.inbox_prefix(identities.ADMIN), **admin
            )
            await setup.close()  # the administrator configures the stream; the services append
            log = await JetStreamLog.connect(server.url, **identities.login(passwords, identities.SERVICES))
            intake_log = await intake_connect(server.url, **identities.login(passwords, identities.INTAKE))
            intake = Intake(intake_log, rate=None)  # what the intake costs, not its rate per tenant
            stop = asyncio.Event()
            running = asyncio.create_task(intake.run(stop))
            await intake.ready.wait()
            tenant = identities.login(passwords, TENANT)
            client = await nats.connect(server.url, inbox_prefix=identities.inbox_prefix(TENANT), **tenant)
            try:
                await raw(log, "warm-raw", 2_000)
                await via_intake(client, "warm-intake", 2_000, args.in_flight)
                anchor, through = [], []
                for rep in range(args.repeat):
                    anchor.append(await raw(log, f"raw{rep}", args.requests))
                    through.append(await via_intake(client, f"intake{rep}", args.requests, args.in_flight))
            finally:
                stop.set()
                await running
                await client.close()
                await intake_log.close()
                await log.close()
    a, b = statistics.median(anchor), statistics.median(through)
    print(f"{args.requests} submits, median of {args.repeat}, one embedded server with logins")
    print(f"  raw JetStream publish (anchor)   {a:10,.0f} /s")
    print(f"  through the intake ({args.in_flight:>3} in flight) {b:10,.0f} /s   {b / a:.0%} of the anchor")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.intake")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--in-flight", type=int, default=256)
    asyncio.run(main(ap.parse_args()))
