"""One tenant asking the read service in a loop takes its share of the service's time, not all of
it (``ReadService.spent``): a real nats-server, the read service folding a log written here, and
two tenants asking as clients do.

Tenant ``a`` asks for its jobs over and over, one question after another, until the service
answers it busy; the answer says when to ask again, which the Python client raises as ``Busy``
with ``retry_s``; tenant ``b``, asking then, is answered. The share is made small here so that a
few hundred questions use it up.

Waits are on the answers, with timeouts; never sleeps.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import nats
import pytest

from corral.client import AsyncClient, Busy
from corral.events.jetstream import JetStreamLog
from corral.events.log import Append
from corral.services.query.service import ReadService
from corral.services.runtime.spent import Spent
from tests.builders import Cluster, LogBuilder, job
from tests.integration.polling import until
from tests.integration.reading import serving

pytestmark = pytest.mark.integration

WAIT = 60.0
ASKED_AT_MOST = 5_000  # questions of ``a`` before the test gives up on its share running out


@pytest.fixture
async def read(nats_server: str) -> AsyncIterator[tuple[JetStreamLog, ReadService]]:
    async with serving(nats_server) as served:
        yield served


async def test_a_tenant_asking_in_a_loop_is_told_busy_and_another_is_answered(
    nats_server: str, read: tuple[JetStreamLog, ReadService]
) -> None:
    log, reader = read
    built = LogBuilder(start_time=time.time()).nodes(Cluster(1)).queue("team-a")
    for i in range(200):
        built.submit("a", f"a{i}", job().gpus(1)).accept(f"a{i}")
    built.submit("b", "b0", job().gpus(1)).accept("b0")
    for r in built.records:
        await log.append(Append(r.subject, r.data, headers=r.headers))
    last = await log.last_seq()
    await until(lambda: reader.state.seq >= last, WAIT)
    # 50 ms at once, paid back at a thousandth of a core: used up within a few hundred pages
    reader.spent = Spent(share=0.001, most_s=0.05, share_all=0.5, most_all_s=1e9)

    a = await nats.connect(nats_server, inbox_prefix="_INBOX.corral.a")
    try:
        told: dict[str, object] = {}
        for _ in range(ASKED_AT_MOST):
            told = json.loads((await a.request("corral.read.a.jobs", b"{}", timeout=WAIT)).data)
            if told.get("busy") is True:
                break
            assert len(told["jobs"]) == 200  # type: ignore[arg-type]
        assert told.get("busy") is True, "a's share of the read service's time never ran out"
        assert float(told["retry_s"]) > 0  # type: ignore[arg-type]
        assert "share" in str(told["error"])
    finally:
        await a.close()

    # The busy answer came as soon as a's debt passed its share, by at most one page's cost: its
    # retry_s was as short as 0.14 s, which a slow machine spends opening the client below, and
    # a's question was then answered. What a's client is told must not depend on how fast it
    # connects: a is kept past its share for as long as the test may take.
    reader.spent.charge("a", WAIT * reader.spent.share, time.monotonic())
    async with AsyncClient(nats_server, tenant="a") as client_a:
        with pytest.raises(Busy) as busy:
            await client_a.jobs()
        assert busy.value.retry_s > 0
    async with AsyncClient(nats_server, tenant="b") as client_b:
        assert [j.id for j in await client_b.jobs()] == ["b0"]
