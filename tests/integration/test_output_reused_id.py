"""A job id used again once its job was let go, live: a corral with logins, a retention of 0 and
one node with a real agent. Tenant ``a``'s job ``x`` prints and ends, and is let go; tenant
``b`` then submits a job ``x`` of its own, which lands on the same node, on the same attempt
and rank.

- ``b``'s worker writes a file of its own (its run's, ``worker.log_path``): it neither appends
  to ``a``'s file nor is ``a``'s file read as its own;
- ``b`` reads its own lines only, never ``a``'s, though the stream still keeps them; ``a``
  still reads its own, and not ``b``'s.

Waits are on the job's phase and on the read service's answers, with timeouts; never sleeps.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.client import AsyncClient, OutputLine
from corral.events.queues import ApplyQueue, ApplyRetention, QueueSpec, Quota, RetentionSpec
from corral.services.agent.decide import WorkerKey
from corral.services.agent.worker import log_path
from corral.services.cli.up import Cluster, Settings, cluster
from corral.services.runtime import identities

pytestmark = pytest.mark.integration

WAIT = 60.0
SETTINGS = Settings(
    tick=0.1, agent_tick=0.1, auth=True, tenants=("a", "b"), sandbox="none", worker_user=None, heartbeat=0.5
)
N0 = "node-00"


async def _lines(client: AsyncClient, job_id: str) -> list[OutputLine]:
    return [line async for line in client.logs(job_id)]


def _says(line: str) -> dict[str, object]:
    return {
        "queue": "qa",
        "resources": {"gpus": 1},
        "command": [sys.executable, "-c", f"print({line!r}, flush=True)"],
    }


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[tuple[Cluster, dict[str, str]]]:
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=SETTINGS) as running:
        assert running.credentials is not None
        passwords = identities.load(running.credentials)
        async with AsyncClient(running.url, user="admin", password=passwords["admin"]) as admin:
            q = QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a", "b"))
            await admin.apply("queue", "qa", ApplyQueue(queue=q), timeout=WAIT)
            keep = RetentionSpec(finished_s=0.0)  # a job ended is let go at the next record
            await admin.apply("retention", "retention", ApplyRetention(retention=keep), timeout=WAIT)
        yield running, passwords


async def test_a_job_given_a_let_go_jobs_id_has_files_and_output_of_its_own(
    corral: tuple[Cluster, dict[str, str]],
) -> None:
    running, passwords = corral
    agent = running.agents[N0]
    async with AsyncClient(running.url, user="a", password=passwords["a"]) as a:
        first = await a.submit(_says("a's secret"), id="x", timeout=WAIT)
        await a.wait("x", "succeeded", timeout=WAIT)
        assert [x.text for x in await _lines(a, "x")] == ["a's secret"]

    async with AsyncClient(running.url, user="b", password=passwords["b"]) as b:
        second = await b.submit(_says("b's line"), id="x", timeout=WAIT)  # a's x was let go
        assert second.seq > first.seq and not second.duplicate
        done = await b.wait("x", "succeeded", timeout=WAIT)
        assert done.tenant == "b" and done.attempt == 0
        seen = await _lines(b, "x")
        assert [(x.node, x.attempt, x.rank, x.text) for x in seen] == [(N0, 0, 0, "b's line")]

    # On the node: a file per run, each holding its own job's lines only.
    key = WorkerKey("x", 0, 0)
    assert log_path(agent.work_dir, key, first.seq).read_text() == "a's secret\n"
    assert log_path(agent.work_dir, key, second.seq).read_text() == "b's line\n"
    assert agent.logs("x") == [log_path(agent.work_dir, key, second.seq)]
    assert {p.name for p in (agent.work_dir / "logs" / "x").iterdir()} == {
        f"run-{first.seq}",
        f"run-{second.seq}",
    }

    # a still reads its own job, let go: its own line, none of b's.
    async with AsyncClient(running.url, user="a", password=passwords["a"]) as a:
        assert [x.text for x in await _lines(a, "x")] == ["a's secret"]
