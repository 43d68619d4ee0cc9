"""Many real node agents in one process, whose workers are timers: ``python -m bench.e2e.agents``.

What runs is the node agent of ``services/agent`` (``NodeAgent.run``: its registration, its watch
of its node's view in the ``corral_assignments`` bucket through ``KvNodeViews``, its ``decide`` on
that view at every new view and every tick, its gang start barrier, its reports sent to the intake
with their message ids, its heartbeats on core NATS), with one part swapped: ``TimerRuntime`` stands where
``services.agent.workers.Runtime`` starts processes. A job's command must be ``sleep N``; the
timer "runs" it as the process would (started, then exited 0 after N seconds, or exited 143 when
the agent stops it) without a process, so 10,000 GPUs' worth of workers fit on a laptop. No agent
reads the log: the assignments service (``corral serve assignments``) folds it and writes each
node's view.

Two ways to host the agents (``--mode``):

- ``shared`` (the default): the agents of this process share one NATS connection (its reports,
  heartbeats, key subscriptions and key reads all go over it), each running its own loop.
- ``own``: each agent on a connection of its own, exactly as ``corral up`` runs it.

Prints ``ready <nodes>`` once every agent's node is registered; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.events.nats_client import Client, open_client
from corral.services.agent import discovery
from corral.services.agent.decide import (
    GONE_CODE,
    Action,
    Exited,
    Forget,
    Report,
    ReportGone,
    RequestCheckpoint,
    Started,
    StartFailed,
    StartGang,
    StartWorker,
    StopWorker,
    WorkerKey,
    WorkerPhase,
)
from corral.services.agent.intake import IntakeReports
from corral.services.agent.service import NodeAgent
from corral.services.runtime.shell import stop_on_signals
from corral.services.runtime.views import KvNodeViews

SIGTERM_CODE = 143  # what a process stopped by SIGTERM exits with (128 + 15)
_pids = itertools.count(os.getpid() * 100_000)  # a "pid" per timer, unique within this process


class _Timer:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.phase: WorkerPhase = "running"
        self.handle: asyncio.TimerHandle | None = None


class TimerRuntime:
    """The runtime's part ``NodeAgent`` drives (``workers``, ``act``, ``start_gang``, ``stop``,
    ``close``, ``pid``, ``reports``), with a timer in place of each worker's process."""

    def __init__(self, reports: Any) -> None:
        self.reports = reports  # the agent's own queue: a report put there wakes its loop
        self._workers: dict[WorkerKey, _Timer] = {}

    def workers(self) -> dict[WorkerKey, WorkerPhase]:
        return {k: w.phase for k, w in self._workers.items()}

    def pid(self, key: WorkerKey) -> int | None:
        w = self._workers.get(key)
        return None if w is None or w.phase == "exited" else w.pid

    def _report(self, report: Report) -> None:
        self.reports.put_nowait(report)

    async def act(self, action: Action, start_timeout: float = 120.0) -> None:
        if isinstance(action, StartGang):
            await self.start_gang(action.workers, start_timeout)
        elif isinstance(action, RequestCheckpoint):
            w = self._workers.get(action.key)
            if w is not None and w.phase == "running":
                w.phase = "checkpoint-requested"  # a timer cannot checkpoint: stopped at the deadline
        elif isinstance(action, StopWorker):
            await self.stop(action.key, action.grace)
        elif isinstance(action, ReportGone):
            if action.key not in self._workers:
                w = self._workers[action.key] = _Timer(0)
                w.phase = "exited"
                self._report(Exited(action.key, GONE_CODE))
        elif isinstance(action, Forget):
            w = self._workers.get(action.key)
            if w is not None and w.phase == "exited":
                del self._workers[action.key]

    async def start_gang(self, specs: Sequence[StartWorker], timeout: float) -> None:
        fresh = sorted((s for s in specs if s.key not in self._workers), key=lambda s: s.rank)
        if not fresh:
            return
        seconds = _sleep_seconds(fresh[0].command)
        if seconds is None:
            for s in fresh:  # known, so not started twice; never announced, so nothing to report
                self._workers[s.key] = _Timer(0)
                self._workers[s.key].phase = "exited"
            self._report(StartFailed(fresh[0].key, "these simulated nodes run only `sleep N` commands"))
            return
        loop = asyncio.get_running_loop()
        for s in fresh:
            w = self._workers[s.key] = _Timer(next(_pids))
            self._report(Started(s.key, w.pid))
            w.handle = loop.call_later(seconds, self._exit, s.key, 0, False)

    def _exit(self, key: WorkerKey, code: int, stopped: bool) -> None:
        w = self._workers.get(key)
        if w is None or w.phase == "exited":
            return
        if w.handle is not None:
            w.handle.cancel()
        w.phase = "exited"
        self._report(Exited(key, code, stopped, w.pid))

    async def stop(self, key: WorkerKey, grace: float = 0.0) -> None:
        self._exit(key, SIGTERM_CODE, True)

    async def close(self, grace: float = 0.0, unkillable_after: float = 0.0) -> None:
        for key in list(self._workers):
            self._exit(key, SIGTERM_CODE, True)


def _sleep_seconds(command: Sequence[str]) -> float | None:
    if len(command) == 2 and command[0] == "sleep":
        try:
            return max(0.0, float(command[1]))
        except ValueError:
            return None
    return None


def timed_agent(name: str, nc: Client, work_dir: Path, tick: float, heartbeat: float) -> NodeAgent:
    """A real ``NodeAgent`` of a simulated 8xH100 node, reading its view and sending its
    reports to the intake through ``nc``, whose runtime is ``TimerRuntime``."""
    agent = NodeAgent(
        name,
        IntakeReports(nc, name),
        KvNodeViews(nc),
        work_dir=work_dir / name,
        found=discovery.simulated(name, "h100-8x", labels=_labels(name)),
        publish=nc.publish,
        tick=tick,
        heartbeat_interval=heartbeat,
        sandbox="none",
    )
    # The one part swapped: the agent's reports queue is kept (its loop wakes on it), the
    # process runtime is replaced by timers that report into it.
    agent.runtime = TimerRuntime(agent.reports)  # type: ignore[assignment]
    return agent


def _labels(name: str) -> dict[str, str]:
    """The labels ``inventory.cluster`` gives the node of this name (racks of 4, blocks of 16)."""
    i = int(name.rsplit("-", 1)[1])
    return {"rack": f"rack-{i // 4}", "block": f"block-{i // 16}", "address": "127.0.0.1"}


def node_names(first: int, count: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(first, first + count)]


# -- hosting ---------------------------------------------------------------------------------------


async def host(url: str, names: list[str], work: Path, tick: float, heartbeat: float, shared: bool) -> None:
    """Every agent's own ``run`` loop, on one connection for all (``shared``) or one each.

    Nothing here paces the agents: each loop awaits its view, its reports and its tick, so the
    event loop reads and writes the shared connection between any two agents' cycles, and a
    cycle decides on one node's view, not on the log."""
    stop = stop_on_signals()
    conns: list[Client] = []
    try:
        if shared:
            conns.append(await open_client(url, name=f"agents-{names[0]}"))
        else:
            conns += [await open_client(url, name=f"agent-{n}") for n in names]
        agents = [timed_agent(n, conns[i % len(conns)], work, tick, heartbeat) for i, n in enumerate(names)]
        tasks = [asyncio.create_task(a.run(stop)) for a in agents]
        try:
            ready = asyncio.ensure_future(asyncio.gather(*(a.registered.wait() for a in agents)))
            await asyncio.wait({ready, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():  # an agent ended before its node was registered: say why
                ready.cancel()
                for t in tasks:
                    if t.done():
                        t.result()
                raise RuntimeError("an agent stopped before registering")
            print(f"ready {len(agents)}", flush=True)
            # On SIGTERM every agent stops its workers and reports their exits, as a node does.
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.e2e.agents", description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--first", type=int, default=0, help="number of the first node")
    p.add_argument("--count", type=int, default=8, help="nodes, one agent each")
    p.add_argument("--mode", choices=("shared", "own"), default="shared")
    p.add_argument("--tick", type=float, default=0.5, help="each agent cycles at least this often")
    p.add_argument("--heartbeat", type=float, default=5.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="corral-e2e-agents-") as work:
        names = node_names(args.first, args.count)
        shared = args.mode == "shared"
        asyncio.run(host(args.server, names, Path(work), args.tick, args.heartbeat, shared))


if __name__ == "__main__":
    main()
