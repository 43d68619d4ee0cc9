"""What one ``output`` answer of the read service costs: a real nats-server, the read service
folding a log written here, and workers' output published into the stream as agents would.

- a tail reads back from the job's newest message only as far as its lines need: a job that
  printed hundreds of messages of bare newlines is answered its last lines from a handful;
- when the lines a tail asks for lie further back than one answer reads, it answers what it
  read and says, first, that older lines were not read.

Waits are on the answers, with timeouts; never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from corral.events.jetstream import JetStreamLog
from corral.events.log import Append
from corral.services.query import service
from corral.services.query.service import ReadService
from corral.services.runtime import output
from tests.builders import Cluster, LogBuilder, job, placement, whole, worker
from tests.integration.polling import until

pytestmark = pytest.mark.integration

WAIT = 60.0
MANY = 612  # messages: more than one answer reads (``service.TAIL_READS``)
N0, N1 = "node-00", "node-01"


@pytest.fixture
async def read(nats_server: str) -> AsyncIterator[tuple[JetStreamLog, ReadService]]:
    log = await JetStreamLog.connect(nats_server, create=True)
    await output.ensure_stream(log.nc)
    reader = ReadService(log)
    stop = asyncio.Event()
    running = asyncio.create_task(reader.run(stop))
    try:
        await asyncio.wait_for(reader.caught_up.wait(), WAIT)
        yield log, reader
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, WAIT)
        reader.close()
        await log.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream sequences of the messages the read service reads, one a read."""
    seen: list[int] = []
    next_chunk = output.next_chunk

    async def counted(*args: Any, **kw: Any) -> output.Chunk | None:
        chunk = await next_chunk(*args, **kw)
        seen.append(0 if chunk is None else chunk.seq)
        return chunk

    monkeypatch.setattr(output, "next_chunk", counted)
    return seen


async def _placed(log: JetStreamLog, reader: ReadService, built: LogBuilder) -> None:
    for r in built.records:
        await log.append(Append(r.subject, r.data, headers=r.headers))
    last = await log.last_seq()
    await until(lambda: reader.state.seq >= last, WAIT)


async def _ask(nc: Any, asker: str, **question: object) -> dict[str, Any]:
    msg = await nc.request(f"corral.read.{asker}.output", json.dumps(question).encode(), timeout=WAIT)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


def _gang(job_id: str, ranks: int) -> list[Any]:
    return [worker(r, (N0, N1)[r % 2], whole(r // 2)) for r in range(ranks)]


async def test_a_tail_reads_only_as_far_back_as_its_lines_need(
    nats_server: str, read: tuple[JetStreamLog, ReadService], reads: list[int]
) -> None:
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(2)).queue("team-a")
    built.submit("a", "x", job().gpus(1).replicas(4)).accept("x").admit("x", replicas=4)
    built.place(placement("x", *_gang("x", 4)))
    await _placed(log, reader, built)
    run = reader.state.jobs["x"].submitted_seq
    js = log.nc.jetstream()
    blank = b"\n" * output.MAX_MESSAGE  # as the agent ships a worker printing blank lines
    for i in range(200):
        await js.publish(output.subject((N0, N1)[i % 2], "x", run, 0, i % 4), blank, stream=output.STREAM)
    for rank in range(4):
        last = b"rank %d's last\n" % rank
        await js.publish(output.subject((N0, N1)[rank % 2], "x", run, 0, rank), last, stream=output.STREAM)

    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    try:
        told = await _ask(a, "a", job="x", tail=2)
        assert [row[2:] for row in told["lines"][-4:]] == [[r, f"rank {r}'s last"] for r in range(4)]
        assert [row[3] for row in told["lines"][:4]] == [""] * 4  # and a blank line of each before
        assert not told["more"] and len(reads) <= 16, f"{len(reads)} messages read for a tail of 2 lines"

        reads.clear()
        told = await _ask(a, "a", job="x", tail=2**63 - 1)  # all it keeps: what fits one answer
        assert told["lines"][-1] == [N1, 0, 3, "rank 3's last"] and len(reads) <= 16
        assert len(json.dumps(told, separators=(",", ":"))) <= service.PAGE_BYTES + service._MARK_COST
        after = told["cursor"]

        await js.publish(output.subject(N0, "x", run, 0, 0), b"then\n", stream=output.STREAM)
        told = await _ask(a, "a", job="x", cursor=after)  # a follower goes on from the tail
        assert [row[3] for row in told["lines"]] == ["then"]
    finally:
        await a.close()


async def test_a_tail_says_when_the_lines_it_asks_for_lie_further_back_than_it_reads(
    nats_server: str, read: tuple[JetStreamLog, ReadService], reads: list[int]
) -> None:
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(2)).queue("team-a")
    built.submit("a", "x", job().gpus(1).replicas(4)).accept("x").admit("x", replicas=4)
    built.place(placement("x", *_gang("x", 4)))
    await _placed(log, reader, built)
    run = reader.state.jobs["x"].submitted_seq
    js = log.nc.jetstream()
    await js.publish(output.subject(N1, "x", run, 0, 3), b"rank 3's only line\n", stream=output.STREAM)
    for i in range(MANY):
        rank = i % 3
        subj = output.subject((N0, N1)[rank % 2], "x", run, 0, rank)
        await js.publish(subj, b"line %d\n" % i, stream=output.STREAM)

    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    try:
        told = await _ask(a, "a", job="x", tail=1)
        lines = told["lines"]
        assert lines[0][3] == "[... older lines not read: more than one answer reads]", lines[0]
        last = MANY - 1
        assert [row[3] for row in lines[1:]] == [f"line {i}" for i in range(last - 2, last + 1)]
        assert len(reads) <= service.TAIL_READS

        reads.clear()
        told = await _ask(a, "a", job="x", rank=3, tail=1)  # one worker's: its subjects only
        assert [row[3] for row in told["lines"]] == ["rank 3's only line"] and len(reads) <= 2
    finally:
        await a.close()
