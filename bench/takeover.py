"""How long the placer is gone when its leader dies: ``python -m bench.takeover``.

A real nats-server, the leases' bucket made with ``--ttl`` (the production lease, 10 s, unless
told), ``corral serve admission`` and two ``corral serve placer`` replicas, each its own process,
and ``--nodes`` simulated 8xH100 nodes registered in the log (no agents: a placement is what is
measured, not a start). Then ``--kills`` times: the placer's leader (as the status board names
it) is killed with SIGKILL, a one-GPU job is submitted at once, and the takeover is the time from
the kill to the stream's timestamp of the first placement the fold accepted from the standby;
a fresh replica is started to stand by for the next round, and the round begins once it has
folded the log and posted its status.

It prints each takeover, their median and max, and the anchor: the lease's expiry. A holder
renews every third of it, so its key outlives the kill by two thirds of the expiry to all of it;
a takeover beyond the expiry is the standby's own delay (noticing the key is gone, a decision
cycle, the append).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.events import codec, subjects
from corral.events.decisions import JobsPlaced
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, Record
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.events.server import EmbeddedServer
from corral.projections.state import State
from corral.services.agent.inventory import cluster
from corral.services.cli.up import register_nodes
from corral.services.cli.watch import Watcher
from corral.services.runtime import status
from corral.services.runtime.lease import TTL, ensure_bucket

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "team-a"
WAIT = 120.0


def pid_of(replica: str) -> int:
    return int(replica.rsplit(":", 1)[1])


class Replicas:
    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, role: str) -> int:
        out = open(self.logs / f"{role}-{len(self.procs)}.err", "wb")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", role, "--server", self.url],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        self.procs[proc.pid] = proc
        return proc.pid

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def placer_replicas(nc: object, live: set[int], want: int) -> tuple[int, int]:
    """Wait until ``want`` of the live placer replicas post their status (each has folded the
    log) and one of them leads; the leader's pid and a standby's."""
    deadline = time.monotonic() + WAIT
    while True:
        holders, posted = await status.read(nc)
        ready = {pid_of(r.replica) for r in posted if r.role == "placer"} & live
        leader = holders.get("placer")
        if leader is not None and pid_of(leader) in ready and len(ready) >= want:
            return pid_of(leader), min(ready - {pid_of(leader)})
        if time.monotonic() > deadline:
            raise RuntimeError(f"no placer leading with {want} replicas ready in {WAIT:g}s")
        await asyncio.sleep(0.1)


def placed_by(watch: Watcher, pid: int, job_id: str) -> Record | None:
    """The record of the standby's placement of ``job_id``, once the fold accepted it."""
    job = watch.state.jobs.get(job_id)
    if job is None or job.placement is None:
        return None
    for r in reversed(watch.records):
        if r.subject != subjects.decision("placer"):
            continue
        env = codec.decode_envelope(r.data)
        if isinstance(env.body, JobsPlaced) and any(p.job_id == job_id for p in env.body.placements):
            return r if env.producer.endswith(f":{pid}") else None
    return None


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-takeover-") as tmp:
        server = EmbeddedServer(Path(tmp) / "nats")
        await server.start()
        (Path(tmp) / "logs").mkdir()
        replicas = Replicas(server.url, Path(tmp) / "logs")
        log = await JetStreamLog.connect(server.url, create=True, name="bench-takeover")
        try:
            await ensure_bucket(log.nc, args.ttl)
            queue = QueueSpec(QUEUE, quotas={"*": Quota(nominal=100_000)}, tenants=(QUEUE,))
            await log.append(
                Append(subjects.request("admin", "queue"), codec.encode(ApplyQueue(queue=queue)), "queue")
            )
            await register_nodes(log, cluster(args.nodes, "h100-8x"), time.time())
            replicas.start("admission")
            live = {replicas.start("placer"), replicas.start("placer")}
            took: list[float] = []
            print(f"takeover of the placer after kill -9 of its leader; lease expiry {args.ttl:g} s")
            async with Watcher(log) as watch:
                for i in range(args.kills):
                    leader, standby = await placer_replicas(log.nc, live, 2)
                    killed = time.time()
                    os.kill(leader, signal.SIGKILL)
                    live.discard(leader)
                    job_id = f"after-kill-{i}"
                    spec = JobSpec(queue=QUEUE, resources=Resources(gpus=1), command=("true",))
                    req = SubmitJob(request_id=job_id, job=spec)
                    await log.append(Append(subjects.request(QUEUE, "submit"), codec.encode(req), job_id))
                    found: list[Record] = []

                    def placed(
                        _: State, pid: int = standby, j: str = job_id, out: list[Record] = found
                    ) -> bool:
                        r = placed_by(watch, pid, j)
                        if r is not None:
                            out.append(r)
                        return r is not None

                    await watch.until(placed, WAIT)
                    took.append(found[0].time - killed)
                    print(f"  kill {i + 1}: the standby placed {found[0].time - killed:.2f} s after the kill")
                    live.add(replicas.start("placer"))  # the next round's standby
            print(
                f"takeover over {len(took)} kills: median {statistics.median(took):.2f} s,"
                f" max {max(took):.2f} s;"
                f" anchor: lease expiry {args.ttl:g} s (renewed every {args.ttl / 3:.2f} s), median"
                f" {statistics.median(took) / args.ttl:.2f}x the expiry"
            )
        finally:
            replicas.stop()
            await log.close()
            await server.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.takeover", description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--ttl", type=float, default=TTL, help="the lease's expiry, s (production: %(default)s)")
    p.add_argument("--nodes", type=int, default=8, help="simulated 8-GPU nodes")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
