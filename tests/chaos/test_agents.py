"""A node agent killed with -9 in the middle of a gang's start, under a steady load: the agent of
one of the gang's two nodes is frozen (SIGSTOP) before the gang is placed, so that the other
node's rank starts and its own cannot; it is then killed, and started again on the same work
directory, as a supervisor restarts it. The gang never runs in part: every attempt either has
all its ranks started, or every rank it started has exited; and its last attempt runs whole.
Then the checks of ``harness.Corral.check``.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from pathlib import Path

import pytest

from corral.events import codec
from corral.events.log import Record
from corral.events.nodes import WorkerExited, WorkerStarted
from corral.projections import indexes
from tests.chaos.harness import LEASED, corral, job

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]


def ranks(records: list[Record], job_id: str, kind: type) -> dict[int, set[int]]:
    """Per attempt, the ranks of ``job_id`` with a ``kind`` report."""
    out: dict[int, set[int]] = defaultdict(set)
    for r in records:
        if r.subject.startswith("corral.ev.node."):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, kind) and body.job_id == job_id:
                out[body.attempt].add(body.rank)
    return out


async def test_an_agent_killed_mid_gang_start_leaves_no_gang_running_in_part(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(nats_server, tmp_path, dict.fromkeys(LEASED, 1)) as c:
        c.start_load()
        await c.until(lambda s: "load-0002" in s.jobs and s.jobs["load-0002"].phase == "running")
        # The gang needs both nodes whole, and a frozen agent reports no exit: a load job left on
        # node-1 would hold its GPUs until the node is lost. So the load pauses until node-1 is
        # empty and the gang is half started (before node-1's silence makes it suspect), and goes
        # on through the agent's death and restart.
        await c.stop_load()
        await c.until(lambda s: not indexes.holding_on(s, "node-1"))
        frozen = c.parts["agent-node-1"]
        c.kill(frozen, signal.SIGSTOP)
        await c.submit("gang", job(("sleep", "20"), gpus=8, replicas=2, priority_class="batch"))

        def half_started(s: object) -> bool:
            return bool(ranks(c.watch.records, "gang", WorkerStarted).get(0))

        await c.until(lambda s: half_started(s))  # the other node's rank runs, this one's cannot
        c.start_load()
        c.kill(frozen)
        c.agent("node-1")  # its supervisor starts it again, on the same work directory

        def whole(_: object) -> bool:
            job_ = c.watch.state.jobs.get("gang")
            started = ranks(c.watch.records, "gang", WorkerStarted)
            return job_ is not None and job_.phase == "running" and started.get(job_.attempt) == {0, 1}

        state = await c.until(whole)
        attempt = state.jobs["gang"].attempt
        records = list(c.watch.records)
        await c.check()

    started, exited = ranks(records, "gang", WorkerStarted), ranks(records, "gang", WorkerExited)
    for a, got in started.items():
        if a != attempt:
            assert got <= exited.get(a, set()), (
                f"attempt {a}: ranks {got - exited.get(a, set())} left running"
            )
    assert started[attempt] == {0, 1}
