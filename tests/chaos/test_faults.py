"""Faults of the machinery under a corral of ``corral serve`` processes, under a steady load:

- the nats-server killed -9 in the middle of a burst of submissions and started again on the
  same JetStream store: every part reconnects and goes on (none exits), jobs submitted after it
  came back run, and every submission acknowledged before the kill is still a job;
- the health role's leader frozen (SIGSTOP) past the lost-node timeout while its standby
  takes over, then resumed with the silences its own pause made: it says it stopped leading,
  and no node is stated lost or suspect, by it or anyone (every agent beat all along);
- a node agent frozen (SIGSTOP) past the lost-node timeout, then resumed (SIGCONT) with the
  state it had: its node is found lost and its job runs elsewhere meanwhile; once resumed, the
  agent stops the worker of the attempt that moved away (reported stopped, never counted as the
  job's failure), and its node takes work again.

Each ends with the checks of ``harness.Corral.check``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from corral.events.nodes import NodeConditionChanged, WorkerExited, WorkerStarted
from corral.events.server import EmbeddedServer
from corral.projections.state import State
from tests.chaos.harness import LEASED, WAIT, corral, job
from tests.chaos.test_agents import events
from tests.integration import polling

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

HEARTBEAT = 1.0
LOST_AFTER = 8.0


def running(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: job_id in s.jobs and s.jobs[job_id].phase == "running"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_nats_server_killed_mid_burst_and_restarted_on_its_store_loses_nothing(
    embedded_server: EmbeddedServer, tmp_path: Path
) -> None:
    async with corral(embedded_server.url, tmp_path, dict.fromkeys(LEASED, 1)) as c:
        c.start_load(every=0.05)  # a burst: twenty a second
        await c.until(running("load-0005"))
        await embedded_server.kill()
        await embedded_server.start()  # the same port, the same store
        c.check_alive()
        # Every part reconnected: a job submitted once the server is back runs to its end.
        await c.submit("after", job(("sleep", "1")))
        await c.until(lambda s: "after" in s.jobs and s.jobs["after"].phase == "succeeded")
        c.check_alive()
        await c.check()


async def test_an_agent_frozen_past_the_lost_node_timeout_stops_its_moved_worker_once_resumed(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(
        nats_server, tmp_path, dict.fromkeys(LEASED, 1), heartbeat=HEARTBEAT, lost_after=LOST_AFTER
    ) as c:
        c.start_load()
        await c.until(running("load-0002"))
        await c.submit("moved", job(("sleep", "600"), gpus=8, priority_class="batch"))
        s = await c.until(running("moved"))
        placement = s.jobs["moved"].placement
        assert placement is not None
        node = placement.workers[0].node
        [started] = [e for _, e in events(list(c.watch.records), WorkerStarted) if e.job_id == "moved"]
        frozen = c.parts[f"agent-{node}"]
        c.kill(frozen, signal.SIGSTOP)

        def lost_and_moved(s: State) -> bool:
            jb = s.jobs["moved"]
            return (
                s.nodes[node].condition == "lost"
                and jb.attempt >= 1
                and jb.phase == "running"
                and jb.placement is not None
                and jb.placement.workers[0].node != node
            )

        await c.until(lost_and_moved)
        assert alive(started.pid)  # nobody there to stop it while its agent is frozen
        c.kill(frozen, signal.SIGCONT)

        def old_attempt_stopped(_: State) -> bool:
            return any(
                e.job_id == "moved" and e.attempt == 0 and e.stopped
                for _, e in events(list(c.watch.records), WorkerExited)
            )

        await c.until(old_attempt_stopped)
        await polling.until(lambda: not alive(started.pid), WAIT)
        await c.until(lambda s: s.nodes[node].condition == "ready")
        s = c.watch.state
        assert s.jobs["moved"].restarts == 0, s.jobs["moved"].reasons
        changes = events(list(c.watch.records), NodeConditionChanged)
        conditions = [e.condition for _, e in changes if e.node == node]
        assert "lost" in conditions
        await c.check()


async def test_a_health_leader_frozen_past_the_lost_node_timeout_states_nothing_for_its_pause(
    nats_server: str, tmp_path: Path
) -> None:
    roles = {r: 2 if r == "health" else 1 for r in LEASED}
    async with corral(nats_server, tmp_path, roles, heartbeat=HEARTBEAT, lost_after=LOST_AFTER) as c:
        c.start_load()
        await c.until(running("load-0002"))
        leader = await c.leader("health")
        [standby] = [p for n, p in c.parts.items() if n.startswith("health-") and p is not leader]
        frozen_at = c.watch.state.time
        c.kill(leader, signal.SIGSTOP)
        await c.says(standby, "leads")
        # Well past the lost-node timeout, in log time (the load's records carry it on).
        await c.until(lambda s: s.time >= frozen_at + 1.5 * LOST_AFTER)
        c.kill(leader, signal.SIGCONT)
        await c.says(leader, "stops leading")
        last = max(int(j.split("-")[1]) for j in c.acked if j.startswith("load-"))
        await c.until(running(f"load-{last:04d}"))
        records = list(c.watch.records)
        await c.check()
    said = [(e.node, e.condition) for _, e in events(records, NodeConditionChanged)]
    assert said == [], said
