"""Workers' output over NATS, live: a corral with logins and real agents, a job of two workers that
print lines, read through the read service as ``corral logs`` and ``Client.logs`` read it.

- ``follow`` sees a line as the worker prints it (the worker prints its second line only after
  the test has seen the first), then ends when the job ends;
- ``tail`` gives the last lines, ``rank`` one worker's;
- another tenant reads the job as one that does not exist, and the server refuses it the
  output's subjects and stream outright.

Waits are on the output or on the job's phase, with timeouts; never sleeps.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from corral.client import AsyncClient, NoSuchJob, OutputLine
from corral.events import codec, subjects
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.services.cli.up import Settings, cluster
from corral.services.query.client import Session
from corral.services.runtime import identities, output
from corral.services.runtime.output import JetStreamOutput

WAIT = 60.0
SETTINGS = Settings(
    tick=0.1, agent_tick=0.1, auth=True, tenants=("a", "b"), sandbox="none", worker_user=None, heartbeat=0.5
)
# Each worker prints two lines, a third only once the test has made ``go``, and a line of
# hostile bytes; rank 1 prints its own. It ends a moment after its last line, as work does: by
# then a follower has read every line, and what ends its follow is the job's end alone.
WORKER = """
import os, sys, time, pathlib
rank = os.environ["RANK"]
print(f"hello from {rank}", flush=True)
print(f"second from {rank}", flush=True)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
sys.stdout.buffer.write(b"\\x1b[31mred\\xff\\n" + b"x" * 20000 + b"\\n")
print(f"after go {rank}", flush=True)
time.sleep(2)
"""


async def _lines(client: AsyncClient, job_id: str, **kw: object) -> list[OutputLine]:
    return [line async for line in client.logs(job_id, **kw)]  # type: ignore[arg-type]


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=SETTINGS) as running:
        assert running.credentials is not None
        passwords = identities.load(running.credentials)
        admin = await Session.open(running.url, identities.ADMIN, passwords[identities.ADMIN])
        try:
            q = QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a",))
            await admin.send(subjects.admin("queue"), codec.encode(ApplyQueue(queue=q)), "queue:qa")
        finally:
            await admin.close()
        yield running.url, passwords


async def test_a_tenant_follows_tails_and_picks_a_rank_and_no_one_else_sees_it(
    corral: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, passwords = corral
    script, go = tmp_path / "worker.py", tmp_path / "go"
    script.write_text(WORKER)
    spec = {
        "queue": "qa",
        "replicas": 2,
        "resources": {"gpus": 1},
        "command": [sys.executable, str(script), str(go)],
    }
    async with AsyncClient(url, user="a", password=passwords["a"]) as a:
        await a.submit(spec, id="printer", timeout=WAIT)
        seen: list[OutputLine] = []

        async def follow() -> None:
            async for line in a.logs("printer", rank=0, follow=True):
                seen.append(line)
                if line.text == "second from 0":
                    go.touch()  # the worker prints on only now: follow saw its lines as they came

        await asyncio.wait_for(follow(), WAIT)  # ends once the job has ended
        texts = [x.text for x in seen]
        assert texts[:2] == ["hello from 0", "second from 0"] and texts[-1] == "after go 0", texts
        assert {(x.attempt, x.rank) for x in seen} == {(0, 0)} and seen[0].node == "node-00"
        hostile = texts[2]
        assert hostile == "\\x1b[31mred\ufffd" and "\x1b" not in "".join(texts)
        assert texts[3].startswith("x" * 1000) and texts[3].endswith("line cut at 16384 bytes]")

        done = await a.wait("printer", "succeeded", timeout=WAIT)
        assert done.phase == "succeeded"
        tail = await _lines(a, "printer", rank=1, tail=2)
        assert [x.text for x in tail] == [texts[3], "after go 1"]  # the x line and the last
        assert {x.rank for x in tail} == {1}
        everything = await _lines(a, "printer")
        assert {x.rank for x in everything} == {0, 1} and len(everything) == 2 * len(texts)

    async with AsyncClient(url, user="b", password=passwords["b"]) as b:
        with pytest.raises(NoSuchJob, match="no such job printer"):
            await _lines(b, "printer")
        with pytest.raises(NoSuchJob):
            await _lines(b, "printer", follow=True)

    # Under the read service, NATS itself keeps the output from another tenant.
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_error(e: Exception) -> None:
        if "permissions violation" in str(e).lower() and not refused.done():
            refused.set_result(str(e))

    nc = await nats.connect(url, user="b", password=passwords["b"], error_cb=on_error)
    try:
        await nc.subscribe("corral.out.>")
        assert "corral.out" in await asyncio.wait_for(refused, WAIT)
    finally:
        await nc.close()


async def test_an_agent_on_a_server_nobody_set_up_makes_the_stream_and_resumes_from_it(
    nats_server: str,
) -> None:
    """Without logins an agent may make the output stream (with the log's replicas) when it is
    missing; the newest message of a worker's subject says where its file was shipped to."""
    nc = await nats.connect(nats_server)
    try:
        sink = JetStreamOutput(nc)
        subj = output.subject("n0", "train", 12, 0, 0)
        assert await sink.shipped(subj) is None
        await sink.send(subj, b"one\n", 4)
        await sink.send(subj, b"two\n", 8)
        assert await sink.shipped(subj) == 8
        info = await nc.jetstream().stream_info(output.STREAM)
        assert info.config.max_msgs_per_subject == output.MAX_MSGS_PER_WORKER
        chunk = await output.next_chunk(nc.jetstream(), "train", 12, None, 0)
        assert chunk is not None and chunk.text == "one\n" and chunk.source.rank == 0
        assert chunk.source.run == 12
        assert await output.next_chunk(nc.jetstream(), "other", 12, None, 0) is None
        assert await output.next_chunk(nc.jetstream(), "train", 13, None, 0) is None  # another run
    finally:
        await nc.close()
