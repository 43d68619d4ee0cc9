"""What one ``output`` answer of the read service costs, and how one asker's questions share its
reading with the others': a real nats-server, the read service folding a log written here,
and workers' output published into the stream as agents would.

- a tail reads back from the job's newest message only as far as its lines need: a job that
  printed hundreds of messages of bare newlines is answered its last lines from a handful;
- when the lines a tail asks for lie further back than one answer reads, it answers what it
  read and says, first, that older lines were not read;
- one asker's flood of output questions holds its share of the reading slots, no more: another
  asker's question about its own job is answered while every one of the flood's waits.

Waits are on the answers, with timeouts; never sleeps.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats
import pytest

from corral.events.jetstream import JetStreamLog
from corral.events.log import Append
from corral.services.query import service
from corral.services.query.service import ReadService
from corral.services.runtime import output
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker
from tests.integration.polling import until
from tests.integration.test_output_hostile import read  # noqa: F401 - the fixture, by name

pytestmark = pytest.mark.integration

WAIT = 60.0
MANY = 612  # messages: more than one answer reads (``service.TAIL_READS``)
N0, N1 = "node-00", "node-01"


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


async def _gang_placed(log: JetStreamLog, reader: ReadService) -> int:
    """Tenant a's job x, four ranks over two nodes, placed and folded; its run."""
    built = LogBuilder(start_time=time.time()).nodes(Cluster(2)).queue("team-a")
    built.submit("a", "x", job().gpus(1).replicas(4)).accept("x").admit("x", replicas=4)
    built.place(placement("x", *_gang("x", 4)))
    await _placed(log, reader, built)
    return reader.state.jobs["x"].submitted_seq


async def test_a_tail_reads_only_as_far_back_as_its_lines_need(
    nats_server: str,
    read: tuple[JetStreamLog, ReadService],  # noqa: F811 - the fixture
    reads: list[int],
) -> None:
    log, reader = read
    run = await _gang_placed(log, reader)
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
    nats_server: str,
    read: tuple[JetStreamLog, ReadService],  # noqa: F811 - the fixture
    reads: list[int],
) -> None:
    log, reader = read
    run = await _gang_placed(log, reader)
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


async def test_one_askers_flood_of_output_questions_leaves_another_asker_a_reading_slot(
    nats_server: str,
    read: tuple[JetStreamLog, ReadService],  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tenant a asks about its job's output eight times at once, each read held up in the
    stream (as a long read would be); tenant b's question about its own job is answered
    meanwhile, and a's reads held at once are its share of the slots."""
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(1)).queue("team-a")
    built.submit("a", "ja", job().gpus(1)).accept("ja").admit("ja").place(on(N0, 0, job_id="ja"))
    built.submit("b", "jb", job().gpus(1)).accept("jb").admit("jb").place(on(N0, 1, job_id="jb"))
    await _placed(log, reader, built)
    js = log.nc.jetstream()
    for job_id in ("ja", "jb"):
        subj = output.subject(N0, job_id, reader.state.jobs[job_id].submitted_seq, 0, 0)
        await js.publish(subj, b"%s says hello\n" % job_id.encode(), stream=output.STREAM)

    held_up = asyncio.Event()
    reading: list[str] = []
    next_chunk = output.next_chunk

    async def slow(js: Any, job_id: str, *args: Any) -> output.Chunk | None:
        if job_id == "ja":
            reading.append(job_id)
            await held_up.wait()
        return await next_chunk(js, job_id, *args)

    monkeypatch.setattr(output, "next_chunk", slow)
    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    b = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.b")
    flood: list[asyncio.Task[dict[str, Any]]] = []
    try:
        flood = [asyncio.create_task(_ask(a, "a", job="ja", tail=1)) for _ in range(8)]
        await until(lambda: len(reader._waiting) >= 8 and len(reading) >= 2, WAIT)
        told = await asyncio.wait_for(_ask(b, "b", job="jb", tail=1), 10.0)
        assert [row[3] for row in told["lines"]] == ["jb says hello"]
        assert len(reading) == service.READING_PER_ASKER  # a's others wait for a's slots
        held_up.set()
        for answered in await asyncio.wait_for(asyncio.gather(*flood), WAIT):
            assert [row[3] for row in answered["lines"]] == ["ja says hello"]
    finally:
        held_up.set()
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        await a.close()
        await b.close()


async def test_an_answer_walks_past_few_messages_of_subjects_no_agent_writes(
    nats_server: str,
    read: tuple[JetStreamLog, ReadService],  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent not corral's own writes messages under its node on a job's subjects with an
    attempt no number: never shown, and one answer walked past every one of them, however many
    (its bound, ``MAX_SKIPPED``, counted only messages of workers the job never had), holding a
    reading slot for as long. It walks past at most ``MAX_SKIPPED`` of either, then says more
    follows; the job's own lines come on the pages after."""
    log, reader = read
    monkeypatch.setattr(service, "MAX_SKIPPED", 16)
    built = LogBuilder(start_time=time.time()).nodes(Cluster(1)).queue("team-a")
    built.submit("a", "x", job().gpus(1)).accept("x").admit("x").place(on(N0, 0, job_id="x"))
    await _placed(log, reader, built)
    run = reader.state.jobs["x"].submitted_seq
    js = log.nc.jetstream()
    for i in range(100):
        await js.publish(f"corral.out.{N0}.x.{run}.a{i}.0", b"forged\n", stream=output.STREAM)
    await js.publish(output.subject(N0, "x", run, 0, 0), b"mine\n", stream=output.STREAM)

    parsed: list[str] = []
    parse = output.parse

    def counted(subj: str) -> output.Source | None:
        parsed.append(subj)
        return parse(subj)

    monkeypatch.setattr(output, "parse", counted)
    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    try:
        told = await _ask(a, "a", job="x")
        assert told["lines"] == [] and told["more"] is True, told
        assert len(parsed) <= 16 + 1  # past its bound, and the one message that told it so
        lines: list[str] = []
        for _ in range(100):  # the pages after, each as bounded
            told = await _ask(a, "a", job="x", cursor=told["cursor"])
            lines += [row[3] for row in told["lines"]]
            if not told["more"]:
                break
        assert lines == ["mine"]
    finally:
        await a.close()
