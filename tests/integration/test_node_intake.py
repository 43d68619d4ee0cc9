"""Node agents' reports reach the log through the intake only, at each node's rate: a corral with
logins on a real nats-server, one node's login flooding large reports while another node
reports as an honest agent does.

- the flooding node's share of the log grows by at most its rate's bound in bytes
  (``burst + per_s * elapsed`` tokens of ``TOKEN_BYTES``), and it is told when to send again;
- the honest node's reports are each stored, promptly, through the flood;
- a node cannot append for another node: not on its subject (the server refuses), not by
  naming it in a report (the intake refuses), not into the stream at all;
- a report sent again under its message id (its answer lost) is stored once.

Waits are on the server's answers, with a timeout; never sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.jetstream import JetStreamLog
from corral.events.log import Ack, Append, RetryLater, UnstorableError
from corral.events.nats_client import Client, open_client
from corral.events.nodes import CheckpointCompleted, WorkerStarted, agent_producer
from corral.services.agent.intake import IntakeReports
from corral.services.agent.service import msg_id as agent_msg_id
from corral.services.cli.up import Settings, cluster, connect
from corral.services.intake.rate import TOKEN_BYTES, Rate
from corral.services.runtime import identities

pytestmark = pytest.mark.integration

HONEST, FLOODER = "node-00", "node-01"
RATE = Rate(per_s=20.0, burst=40)  # 160 KiB at once, then 80 KiB a second
SETTINGS = Settings(tick=0.1, agents=False, auth=True, node_rate=RATE)
LARGE = 60_000  # bytes of a flooding report's location: 15 tokens each
PROMPT_S = 2.0  # an honest report, through the flood, is stored within this
FLOOD_S = 3.0


@dataclass
class Nodes:
    url: str
    passwords: dict[str, str]
    log: JetStreamLog  # the services identity's, to read what was stored

    async def agent(self, node: str, **options: object) -> Client:
        return await open_client(
            self.url,
            inbox_prefix=identities.agent_inbox(node),
            **identities.login(self.passwords, identities.agent(node)),
            **options,  # type: ignore[arg-type]
        )


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Nodes]:
    data = tmp_path / "data"
    # Logins for the two nodes' agents, which this test plays itself (``agents=False``).
    identities.ensure(data / identities.CREDENTIALS, (), [HONEST, FLOODER])
    async with cluster(None, 2, "h100-8x", data, settings=SETTINGS) as running:
        assert running.credentials is not None
        passwords = identities.load(running.credentials)
        log = await connect(running.url, **identities.login(passwords, identities.SERVICES))
        try:
            yield Nodes(running.url, passwords, log)
        finally:
            await log.close()


def _append(body: Event, msg_id: str) -> Append:
    """``body`` sealed as its node's agent seals it, appended under ``msg_id``."""
    producer = agent_producer(body.node) + "test:1"
    env = codec.seal(body, event_id=agent_msg_id(body), time=time.time(), producer=producer)
    return Append(subjects.node(body.node), codec.encode(env), msg_id)


async def _stored_on(log: JetStreamLog, subject: str, after: int) -> list[int]:
    """The size each record on ``subject`` after ``after`` took in the log (body and headers)."""
    sizes = []
    async for batch in log.read(after + 1):
        for r in batch:
            if r.subject == subject:
                sizes.append(len(r.data) + sum(len(k) + len(v) for k, v in (r.headers or {}).items()))
    return sizes


async def test_a_flooding_node_grows_the_log_by_its_bound_and_an_honest_one_is_stored_promptly(
    nodes: Nodes,
) -> None:
    before = await nodes.log.last_seq()
    flooder_nc, honest_nc = await nodes.agent(FLOODER), await nodes.agent(HONEST)
    flooder, honest = IntakeReports(flooder_nc, FLOODER), IntakeReports(honest_nc, HONEST)
    stored, told = 0, []
    honest_s: list[float] = []
    n = 0

    large = _append(
        CheckpointCompleted(node=FLOODER, job_id="j", attempt=0, step=1, location="/" + "x" * LARGE), ""
    )

    async def flood_one(i: int) -> None:
        nonlocal stored
        try:
            await flooder.append(Append(large.subject, large.data, f"flood:{i}"))
            stored += 1
        except RetryLater as e:
            told.append(e.retry_s)

    async def honest_one(i: int) -> None:
        t0 = time.monotonic()
        body = WorkerStarted(node=HONEST, job_id=f"h{i}", attempt=0, rank=0, pid=i + 1)
        await honest.append(_append(body, f"started:h{i}"))  # raises unless stored
        honest_s.append(time.monotonic() - t0)

    try:
        started = time.monotonic()
        rounds, honest_at = 0, started
        while time.monotonic() - started < FLOOD_S:
            # Rounds of 30 large reports at once, as fast as they are answered; with one of them
            # in each tenth of a second, an honest report (10 a second, within the node's rate).
            sends = [flood_one(n + i) for i in range(30)]
            if time.monotonic() >= honest_at:
                sends.append(honest_one(rounds))
                rounds, honest_at = rounds + 1, honest_at + 0.1
            await asyncio.wait_for(asyncio.gather(*sends), 60)
            n += 30
        elapsed = time.monotonic() - started
    finally:
        await flooder_nc.close()
        await honest_nc.close()

    grown = await _stored_on(nodes.log, subjects.node(FLOODER), before)
    bound = (RATE.burst + RATE.per_s * elapsed) * TOKEN_BYTES
    print(f"flood: {n} sent, {stored} stored, {sum(grown)} B (bound {bound:.0f}) in {elapsed:.2f}s;",
          f"honest: {rounds}, slowest {max(honest_s):.3f}s")  # fmt: skip
    assert len(grown) == stored and 0 < stored < n
    assert sum(grown) <= bound, (sum(grown), bound, elapsed)
    assert len(told) == n - stored and max(told) > 0  # each refused one told when to retry
    assert len(honest_s) == rounds and max(honest_s) < PROMPT_S, honest_s
    assert len(await _stored_on(nodes.log, subjects.node(HONEST), before)) == rounds


async def test_a_node_cannot_append_for_another_or_into_the_stream(nodes: Nodes) -> None:
    errors: list[str] = []
    heard = asyncio.Event()

    async def on_error(e: Exception) -> None:
        errors.append(str(e).lower())
        heard.set()

    nc = await nodes.agent(FLOODER, error_cb=on_error)
    try:
        reports = IntakeReports(nc, FLOODER)
        # Naming the other node in a report on its own subject: refused by the intake.
        other = WorkerStarted(node=HONEST, job_id="j", attempt=0, rank=0)
        env = codec.seal(other, event_id="x", time=1.0, producer="test")
        item = Append(subjects.node(FLOODER), codec.encode(env), "started:j")
        with pytest.raises(UnstorableError, match="reports for node-01 only"):
            await reports.append(item)
        # The other node's intake subject, or the stream itself: refused by the server.
        for subject in (subjects.node_intake(HONEST), subjects.node(FLOODER), subjects.node(HONEST)):
            errors.clear()
            heard.clear()
            await nc.publish(subject, item.data)
            await nc.flush()
            await asyncio.wait_for(heard.wait(), 10)
            assert "permissions violation" in errors[0], subject
    finally:
        await nc.close()


async def test_a_report_sent_again_under_its_id_is_stored_once(nodes: Nodes) -> None:
    nc = await nodes.agent(HONEST)
    try:
        reports = IntakeReports(nc, HONEST)
        item = _append(WorkerStarted(node=HONEST, job_id="again", attempt=0, rank=0, pid=9), "started:again")
        first = await reports.append(item)
        assert await reports.append(item) == Ack(first.seq, duplicate=True)
    finally:
        await nc.close()
