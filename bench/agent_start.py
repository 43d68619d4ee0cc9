"""A node agent's start-up time and memory with a long log: ``python -m bench.agent_start``.

For each size, fills a stream on an embedded server with ``bench.workload.synthetic_log`` (jobs on
40 other nodes) and registers one more node, ``bench-node``, with no job; the assignments
service's own path (``Index.everywhere`` and ``views``) writes every node's view into the
``corral_assignments`` bucket. Then, each in a fresh Python process:

  agent (view)   a real ``NodeAgent`` of ``bench-node`` reading its key (``KvNodeViews``): the
                 time from ``run`` to its first cycle on its view, and the process's peak RSS
  agent (fold)   what an agent did before views: replay the whole stream into a State
                 (``JetStreamLog.read`` + the fold), time and peak RSS

Both columns include nothing of Python's start-up or imports (the RSS does: the baseline of a
process that imported corral is printed too). The view column must not grow with the log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

NODE = "bench-node"


def _rss_mib() -> float:
    """This process's peak RSS. ``VmHWM``, not ``ru_maxrss``: Linux keeps the latter across
    ``execve``, so a child would report its parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _child_agent(url: str, work: str) -> dict[str, float]:
    from corral.services.agent import discovery
    from corral.services.agent.service import NodeAgent
    from corral.services.cli.up import connect
    from corral.services.runtime.views import KvNodeViews

    base = _rss_mib()
    t0 = time.perf_counter()
    log = await connect(url)
    agent = NodeAgent(
        NODE,
        log,
        KvNodeViews(log.nc),
        work_dir=work,
        found=discovery.simulated(NODE, "h100-8x"),
        sandbox="none",
        tick=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.wait_for(agent.registered.wait(), 60)
    while agent.view.seq == 0:  # its view has arrived and been decided on
        await asyncio.sleep(0.01)
    await agent.cycle()
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    await log.close()
    return {"seconds": elapsed, "rss_mib": _rss_mib(), "base_mib": base}


async def _child_fold(url: str) -> dict[str, float]:
    from corral.events.jetstream import JetStreamLog
    from corral.projections.fold import apply
    from corral.projections.state import State

    base = _rss_mib()
    t0 = time.perf_counter()
    log = await JetStreamLog.connect(url)
    state = State()
    async for batch in log.read(1):
        for r in batch:
            apply(state, r)
    elapsed = time.perf_counter() - t0
    await log.close()
    return {"seconds": elapsed, "rss_mib": _rss_mib(), "base_mib": base, "jobs": len(state.jobs)}


def _child(kind: str, url: str, work: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.agent_start", "--child", kind, url, work],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _one(events: int) -> None:
    from bench.replay import fill
    from bench.workload import records, synthetic_log
    from corral.events import codec, subjects
    from corral.events.jetstream import JetStreamLog
    from corral.events.log import Append
    from corral.events.nodes import NodeRegistered
    from corral.events.server import EmbeddedServer
    from corral.projections import assignments
    from corral.projections.fold import fold
    from corral.services.agent import discovery
    from corral.services.assignments.decide import Index, views
    from corral.services.runtime import views as node_views

    appends = synthetic_log(events)
    found = discovery.simulated(NODE, "h100-8x")
    body = NodeRegistered(node=NODE, inventory=found.inventory)
    env = codec.seal(body, event_id=f"register:{NODE}", time=1.0, producer=f"agent/{NODE}")
    appends.append(Append(subjects.node(NODE), codec.encode(env), f"register:{NODE}"))
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(tmp)
        await server.start()
        try:
            log = await JetStreamLog.connect(server.url, create=True)
            await fill(log, appends)
            await node_views.ensure_bucket(log.nc)
            state = fold(records(appends))
            t0 = time.perf_counter()
            store = await node_views.KvViewStore.open(log.nc)
            index = Index()
            written = views(state, index, index.everywhere(state))
            await asyncio.gather(*(store.put(v.node, assignments.encode(v)) for v in written))
            projection_s = time.perf_counter() - t0
            await log.close()
            by_view = _child("agent", server.url, os.path.join(tmp, "agent"))
            by_fold = _child("fold", server.url, tmp)
        finally:
            await server.stop()
    print(
        f"{len(appends):>9,} records {len(state.jobs):>7,} jobs | all {len(written)} views written in "
        f"{projection_s * 1000:6.0f} ms | agent (view): {by_view['seconds'] * 1000:6.0f} ms, "
        f"RSS {by_view['rss_mib']:5.0f} MiB | agent (fold): {by_fold['seconds'] * 1000:7.0f} ms, "
        f"RSS {by_fold['rss_mib']:5.0f} MiB | imports alone: {by_view['base_mib']:.0f} MiB",
        flush=True,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, url, work = sys.argv[2:5]
        result = asyncio.run(_child_agent(url, work) if kind == "agent" else _child_fold(url))
        print(json.dumps(result))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # About 5.5 records per job: 55k records hold about 10k jobs, 550k about 100k.
    p.add_argument("--records", type=int, nargs="+", default=[55_000, 550_000])
    args = p.parse_args()
    for n in args.records:
        asyncio.run(_one(n))


if __name__ == "__main__":
    main()
