"""Time to resume placements after a NATS server's loss: ``python -m bench.nats_loss``.

A corral on a three-server JetStream cluster on loopback (``corral up --cluster 3``'s parts, in
this process), nodes registered without agents, and a steady trickle of one-GPU submits. Each
round kills -9 the server leading the log's stream, measures until a job submitted after the
kill is placed (the services noticed, a new leader was elected, their consumers and leases came
back), then starts the server again and lets the cluster settle. From the kill, a submit goes
every 0.1 s, each on its own (one waiting out its acknowledgement through the election holds up
none of the others). Two times: until the placer's first placement after the kill was stored
(its log time: the services resumed), and until a reader of the log (a client, whose own
consumer may have lived on the lost server) saw the first of those jobs placed. Printed: the
median and max over the rounds, and, measured in the same run, the submit-to-placed time with
every server up (the anchor). Wall times on a shared machine: indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, LogError
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.events.server import EmbeddedCluster
from corral.services.cli.up import Settings, cluster, connect
from corral.services.cli.watch import Watcher

SETTINGS = Settings(tick=0.1, agents=False, heartbeat=3600.0, lost_after=86_400.0, nats_servers=3)
PLACED = ("placed", "starting", "running")


async def submit_and_place(log: JetStreamLog, watch: Watcher, job_id: str, timeout: float) -> float:
    """Submit ``job_id`` (again and again while the log refuses) and wait until it is placed;
    seconds from the first try."""
    t = time.perf_counter()
    spec = JobSpec(queue="team-a", resources=Resources(gpus=1), command=("sleep", "600"))
    item = Append(
        subjects.request("team-a", "submit"),
        codec.encode(SubmitJob(request_id=job_id, job=spec)),
        msg_id=f"submit:{job_id}",
    )
    while True:
        try:
            await log.append(item)
            break
        except LogError:
            await asyncio.sleep(0.05)
    await watch.until(lambda s: job_id in s.jobs and s.jobs[job_id].phase in PLACED, timeout)
    return time.perf_counter() - t


async def leader(log: JetStreamLog) -> str:
    js = log.nc.jetstream()
    while True:
        try:
            info = await js.stream_info(subjects.STREAM)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        except Exception:  # noqa: BLE001 - electing: ask again
            pass
        await asyncio.sleep(0.1)


async def main(args: argparse.Namespace) -> None:
    anchor: list[float] = []
    resumed: list[float] = []
    stored: list[float] = []
    nodes = max(4, (args.rounds * (args.anchor + 200)) // 8 + 2)
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        async with cluster(None, nodes, "h100-8x", Path(tmp) / "corral", settings=SETTINGS) as c:
            nats = c.nats
            assert isinstance(nats, EmbeddedCluster)
            log = await connect(c.url)
            try:
                async with Watcher(log) as watch:
                    queue = QueueSpec("team-a", quotas={"*": Quota(nominal=10_000)}, tenants=("team-a",))
                    body = codec.encode(ApplyQueue(queue=queue))
                    await log.append(Append(subjects.request("admin", "queue"), body, msg_id="queue"))
                    await watch.until(lambda s: len(s.nodes) == nodes and "team-a" in s.queues, 60)
                    n = 0
                    for r in range(args.rounds):
                        for _ in range(args.anchor):
                            anchor.append(await submit_and_place(log, watch, f"j{n}", 60))
                            n += 1
                        name = await leader(log)
                        victim = next(s for s in nats.servers if s.name == name)
                        await victim.kill()
                        t, wall = time.perf_counter(), time.time()
                        # A submit every 0.1 s from now, each on its own: one left waiting for
                        # its acknowledgement through the election holds none of the others.
                        trickle = []
                        placed_one = asyncio.Event()
                        while not placed_one.is_set():
                            job = f"j{n}"
                            n += 1
                            trickle.append(asyncio.create_task(submit_and_place(log, watch, job, 120)))
                            trickle[-1].add_done_callback(lambda _, done=placed_one: done.set())
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(placed_one.wait(), 0.1)
                        resumed.append(time.perf_counter() - t)
                        await asyncio.gather(*trickle)
                        # When the placer's first placement after the kill was stored (log time):
                        # the services resumed; a client's reader may hear it later.
                        after = [
                            rec.time - wall
                            for rec in watch.records
                            if rec.time > wall and rec.subject == subjects.decision("placer")
                        ]
                        stored.append(min(after))
                        line = f"round {r + 1}: killed {name}; the placer's first placement stored after"
                        print(f"{line} {stored[-1]:.2f} s, a new job seen placed after {resumed[-1]:.2f} s")
                        if args.trace:
                            seen: dict[str, float] = {}
                            for rec in watch.records:
                                kind = (
                                    rec.subject.rsplit(".", 1)[0] if ".job." in rec.subject else rec.subject
                                )
                                if rec.time > wall and kind not in seen:
                                    seen[kind] = rec.time - wall
                            print(
                                "  first record after the kill, by subject:",
                                {k: round(v, 2) for k, v in seen.items()},
                            )
                        await nats.restart(nats.servers.index(victim))
            finally:
                await log.close()
    median = statistics.median(anchor)
    print(f"submit to placed, every server up (anchor, {len(anchor)} jobs): median {median:.2f} s")
    for what, times in (("the placer's first placement stored", stored), ("a new job seen placed", resumed)):
        print(
            f"kill -9 of the stream's leader to {what} ({len(times)} rounds): median "
            f"{statistics.median(times):.2f} s, max {max(times):.2f} s, "
            f"{statistics.median(times) / median:.0f}x the anchor"
        )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.nats_loss", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--anchor", type=int, default=5, help="jobs placed with every server up, each round")
    p.add_argument("--trace", action="store_true", help="when each kind of record came after each kill")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
