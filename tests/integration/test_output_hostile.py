"""The read service's ``output`` against what a node agent that is not corral's own, or a tenant
given a reused job id, could try (``decide.OutputScope``): a real nats-server, the read service
folding a log written here, and messages published into the output stream as agents would.

- tenant ``a``'s job ``x`` ran on both nodes and was let go; tenant ``b`` then got the id ``x``
  for a job on node-01 only. ``b`` reads its own lines, never ``a``'s, whatever the subjects
  (``a``'s run's, after ``b``'s submission; none naming a run);
- node-00's agent writes lines for ``b``'s ``x`` under its own node, for an attempt ``x`` never
  had, with a number ``int`` cannot read: none is shown, none stops the reader;
- a line with raw terminal escapes is shown written out, a message of bare newlines is
  answered within what NATS carries (what fits, with a mark), and a tail of 2**63 - 1 lines
  is answered.

Waits are on the answers, with timeouts; never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import nats
import pytest

from corral.client import AsyncClient, OutputLine
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append
from corral.services.query.service import ReadService
from corral.services.runtime import output
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker
from tests.integration.polling import until
from tests.integration.reading import serving

pytestmark = pytest.mark.integration

WAIT = 60.0
N0, N1 = "node-00", "node-01"


@pytest.fixture
async def read(nats_server: str) -> AsyncIterator[tuple[JetStreamLog, ReadService]]:
    async with serving(nats_server, with_output=True) as served:
        yield served


async def _append(log: JetStreamLog, built: LogBuilder, since: int) -> int:
    """Append ``built``'s records from index ``since`` on; the index to go on from."""
    for r in built.records[since:]:
        await log.append(Append(r.subject, r.data, headers=r.headers))
    return len(built.records)


async def _folded(reader: ReadService, log: JetStreamLog) -> None:
    last = await log.last_seq()
    await until(lambda: reader.state.seq >= last, WAIT)  # the read service folds as the log grows


async def _lines(client: AsyncClient, job_id: str, **kw: object) -> list[OutputLine]:
    return await asyncio.wait_for(_collect(client, job_id, **kw), WAIT)


async def _collect(client: AsyncClient, job_id: str, **kw: object) -> list[OutputLine]:
    return [line async for line in client.logs(job_id, **kw)]  # type: ignore[arg-type]


async def test_a_job_shows_only_its_own_workers_output(
    nats_server: str, read: tuple[JetStreamLog, ReadService]
) -> None:
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(2)).retention(0.0).queue("team-a")
    built.submit("a", "x", job().gpus(1).replicas(2)).accept("x").admit("x", replicas=2)
    built.place(placement("x", worker(0, N0, whole(0)), worker(1, N1, whole(0))))
    built.started(N0, "x", rank=0).started(N1, "x", rank=1)
    built.exited(N0, "x", rank=0).exited(N1, "x", rank=1)
    done = await _append(log, built, 0)
    await _folded(reader, log)
    a_run = reader.state.jobs["x"].submitted_seq
    js = log.nc.jetstream()
    await js.publish(output.subject(N0, "x", a_run, 0, 0), b"a's secret\n", stream=output.STREAM)
    await js.publish(output.subject(N1, "x", a_run, 0, 1), b"a's other secret\n", stream=output.STREAM)

    built.cordon(N0, False)  # ``a``'s x is let go before this record (a retention of 0)
    built.submit("b", "x", job().gpus(1)).accept("x").admit("x")
    built.place(on(N1, 3, job_id="x"))
    await _append(log, built, done)
    await _folded(reader, log)
    assert reader.state.jobs["x"].tenant == "b"
    b_run = reader.state.jobs["x"].submitted_seq
    assert b_run > a_run

    hostile = [
        (output.subject(N0, "x", b_run, 0, 0), b"forged by node-00\n"),  # x of b never ran there
        (output.subject(N1, "x", b_run, 7, 0), b"forged attempt\n"),  # nor had attempt 7
        (output.subject(N1, "x", b_run, 0, 1), b"forged rank\n"),  # nor rank 1
        (f"corral.out.node-01.x.{b_run}.\u00b2.0", b"a number int cannot read\n"),
        (output.subject(N1, "x", a_run, 0, 1), b"forged on a's run\n"),  # a's x is over
        ("corral.out.node-01.x.0.0", b"forged without a run\n"),  # as older agents wrote
        (output.subject(N1, "x", b_run, 0, 0), b"b \x1b[2J\x00 line\n"),  # raw, as no corral agent sends
        (output.subject(N1, "x", b_run, 0, 0), b"\n" * 60000),  # bare newlines: many rows per byte
        (output.subject(N1, "x", b_run, 0, 0), b"\n" * 60000),
        (output.subject(N1, "x", b_run, 0, 0), b"b's last\n"),
    ]
    for subj, data in hostile:
        await js.publish(subj, data, stream=output.STREAM)

    async with AsyncClient(nats_server, tenant="b") as b:
        seen = await _lines(b, "x")
        assert {(x.node, x.attempt, x.rank) for x in seen} == {(N1, 0, 0)}
        texts = [x.text for x in seen]
        assert "forged" not in " ".join(texts) and "secret" not in " ".join(texts)
        assert texts[0] == "b \\x1b[2J\\x00 line" and texts[-1] == "b's last", texts[:3]
        # each message of bare newlines alone is more than one answer carries: what fits, and a mark
        marks = [t for t in texts if t.endswith("lines not shown: too many for one answer]")]
        assert len(marks) == 2 and 0 < texts.count("") < 120000
        tail = await _lines(b, "x", tail=2**63 - 1)
        assert tail[-1].text == "b's last" and len(tail) < len(seen)  # the newest that fit one answer
        assert [x.text for x in await _lines(b, "x", tail=1)] == ["b's last"]

    async with AsyncClient(nats_server, tenant="a") as a:
        # a reads its own x, let go: its own lines, none of b's, though b's job holds the id now
        mine = await _lines(a, "x")
        assert sorted(x.text for x in mine) == ["a's other secret", "a's secret"]

    # An agent's flood under its own node for a job never there leaves the reader answering.
    nc = await nats.connect(nats_server)
    try:
        for i in range(50):
            await nc.jetstream().publish(
                output.subject(N0, "x", b_run, i, 0), b"flood\n", stream=output.STREAM
            )
    finally:
        await nc.close()
    async with AsyncClient(nats_server, tenant="b") as b:
        assert [x.text for x in await _lines(b, "x", tail=1)] == ["b's last"]


async def test_one_tenant_following_many_jobs_leaves_others_room_to_wait(
    nats_server: str, read: tuple[JetStreamLog, ReadService]
) -> None:
    """Tenant a asks to follow its job as many times as the read service lets questions wait at
    all; tenant b's follow still waits for its job's next line, rather than being answered at
    once (and its client asking again at once, over and over)."""
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(1)).queue("team-a")
    built.submit("a", "ja", job().gpus(1)).accept("ja").admit("ja").place(on(N0, 0, job_id="ja"))
    built.submit("b", "jb", job().gpus(1)).accept("jb").admit("jb").place(on(N0, 1, job_id="jb"))
    await _append(log, built, 0)
    await _folded(reader, log)

    def asks(job_id: str, wait: int) -> bytes:
        return b'{"job": "%s", "wait": %d, "cursor": 0}' % (job_id.encode(), wait)

    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    b = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.b")
    flood: list[asyncio.Task[object]] = []
    try:
        flood = [
            asyncio.create_task(a.request("corral.read.a.output", asks("ja", 60), timeout=WAIT))
            for _ in range(256)
        ]

        def settled() -> bool:  # each of a's questions answered or waiting, few of them waiting
            return sum(t.done() for t in flood) + len(reader._waiting) >= 256 and len(reader._waiting) <= 64

        await until(settled, 40.0)  # before a's follows give up waiting (60 s)
        waiting = len(reader._waiting)
        followed = asyncio.create_task(b.request("corral.read.b.output", asks("jb", 30), timeout=WAIT))

        await until(lambda: len(reader._waiting) != waiting or followed.done(), WAIT)
        assert not followed.done(), "b's follow was answered at once"
        jb = output.subject(N0, "jb", reader.state.jobs["jb"].submitted_seq, 0, 0)
        await log.nc.jetstream().publish(jb, b"next\n", stream=output.STREAM)
        told = json.loads((await asyncio.wait_for(followed, WAIT)).data)  # type: ignore[attr-defined]
        assert [row[3] for row in told["lines"]] == ["next"]
    finally:
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        await a.close()
        await b.close()


async def test_a_follow_answered_empty_at_once_asks_again_after_a_pause_not_in_a_loop(
    nats_server: str, read: tuple[JetStreamLog, ReadService]
) -> None:
    """When the read service answers a follow at once with nothing (its asker holds every wait
    it is given), the client pauses, doubling, before it asks again: a handful of questions in
    two seconds, not hundreds."""
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(1)).queue("team-a")
    built.submit("a", "ja", job().gpus(1)).accept("ja").admit("ja").place(on(N0, 0, job_id="ja"))
    await _append(log, built, 0)
    await _folded(reader, log)
    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    watcher = await nats.connect(nats_server)
    asked: list[float] = []

    async def heard(_: object) -> None:
        asked.append(time.monotonic())

    sub = await watcher.subscribe("corral.read.a.output", cb=heard)
    body = b'{"job": "ja", "wait": 60, "cursor": 0}'
    flood = [asyncio.create_task(a.request("corral.read.a.output", body, timeout=WAIT)) for _ in range(64)]
    try:
        # a holds every wait the read service gives one asker
        await until(lambda: sum(t.done() for t in flood) + len(reader._waiting) >= len(flood), 40.0)
        asked.clear()
        async with AsyncClient(nats_server, tenant="a") as client:

            async def follow() -> None:
                async for _ in client.logs("ja", follow=True):
                    pass

            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(follow(), 2.0)
        assert 2 <= len(asked) <= 8, f"{len(asked)} questions in two seconds"
    finally:
        await sub.unsubscribe()
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        await a.close()
        await watcher.close()
