"""Start forecasts and what-if on a live corral with logins: a real nats-server, every service,
the read service and the forecast role.

- a waiting job gets its forecast start in ``jobs`` and ``explain``, as its tenant's client
  reads them (behind the job that holds the node, for that job's estimate);
- a tenant's what-if works through its own login and tells nothing of another tenant's jobs;
  another tenant's what-if subject is refused by the server.

Waits are on the log or on the forecasts' bucket (its key's messages), with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec
import pytest

from corral.events.jobs import JobSpec, Resources
from corral.services.client import AsyncClient, NoSuchJob
from corral.services.query.client import Refused, Session
from corral.services.runtime import forecasts, identities
from tests.builders import TRAIN
from tests.integration.test_tenancy_nats import WAIT, Secured
from tests.integration.test_tenancy_nats import secured as secured  # the fixture

WHOLE_NODE = Resources(gpus=8)
HOUR = 3600.0


async def test_a_waiting_job_gets_a_forecast_and_whatif_keeps_tenancy(secured: Secured) -> None:
    heard: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_put(msg: object) -> None:
        heard.put_nowait(msg.data)  # type: ignore[attr-defined]

    sub = await secured.log.nc.subscribe(forecasts.key_subject("a"), cb=on_put)
    try:
        # b's job takes the one node for an hour; a's job waits behind it.
        await secured.submit(
            "b", "b-holds", JobSpec(queue="qb", resources=WHOLE_NODE, runtime_estimate_s=HOUR, command=TRAIN)
        )
        await secured.watch.until(
            lambda st: st.jobs.get("b-holds") is not None and st.jobs["b-holds"].held, WAIT
        )
        await secured.submit(
            "a", "a-waits", JobSpec(queue="qa", resources=WHOLE_NODE, runtime_estimate_s=600, command=TRAIN)
        )

        async def forecast_of_a() -> forecasts.TenantForecast:
            while True:
                value = forecasts.decode(await heard.get())
                if value is not None and "a-waits" in value.jobs:
                    return value

        told = await asyncio.wait_for(forecast_of_a(), WAIT)
        assert told.jobs["a-waits"].start is not None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()

    async with AsyncClient(secured.url, tenant="a", user="a", password=secured.passwords["a"]) as a:
        jobs = {j.id: j for j in await a.jobs()}
        assert set(jobs) == {"a-waits"}
        eta = jobs["a-waits"].eta
        assert eta is not None and eta.start is not None and eta.early is not None and eta.late is not None
        # Behind b's hour on the node, and the band around the forecast.
        assert eta.start >= eta.forecast_at + HOUR - 120
        assert eta.early <= eta.start <= eta.late
        explained = await a.explain("a-waits")
        assert explained.job.eta is not None and "estimated start:" in explained.text
        with pytest.raises(NoSuchJob):
            await a.explain("b-holds")

        # What if a submitted another whole-node job: accepted, waits, starts after both.
        what = await a.whatif(
            JobSpec(queue="qa", resources=WHOLE_NODE, runtime_estimate_s=60, command=TRAIN), "a-maybe"
        )
        assert what.accepted and not what.starts_now
        assert what.start is not None and what.start >= what.now + HOUR - 120
        assert "estimated start: in" in what.text
        raw = msgspec.json.encode(what)
        assert b"b-holds" not in raw  # nothing of b's jobs but what a may see
        # A what-if never writes: the job is not in the log.
        assert "a-maybe" not in secured.watch.state.jobs

    # Another tenant's what-if subject is the server's to refuse.
    s = await Session.open(secured.url, "a", secured.passwords["a"])
    try:
        with pytest.raises(Refused, match="permissions violation"):
            await s.request(identities.read_subject("b", "whatif"), b'{"job": {"queue": "qb"}}')
    finally:
        await s.close()


async def test_a_tenant_with_no_job_waiting_has_no_key_after_the_role_restarts(tmp_path: Path) -> None:
    # A tenant's key outlived its last waiting job (an empty value, for good), and one the role
    # wrote before it restarted kept its stale forecasts: over months, a key per tenant ever.
    import math

    import nats

    from corral.events.log import InMemoryLog
    from corral.events.server import EmbeddedServer
    from corral.services.forecast import service
    from tests.unit.test_forecast import busy

    async with EmbeddedServer(tmp_path / "nats") as server:
        nc = await nats.connect(server.url)
        try:
            await forecasts.ensure_bucket(nc)
            store = await forecasts.KvForecasts.open(nc)
            stale = forecasts.TenantForecast(1, 0.0, HOUR, "", {"old": forecasts.Eta(5.0, 4.0, 6.0)})
            await store.put("gone", forecasts.encode(stale))

            async def forecast(svc: service.ForecastService, waiting: tuple[tuple[str, str], ...]) -> None:
                svc.state, svc.last_at, svc.rest_until = busy(*waiting).state, None, -math.inf
                await svc.cycle()
                assert svc._running is not None
                await svc._running

            role = service.ForecastService(InMemoryLog(), store)
            await forecast(role, (("t1", "t"), ("u1", "u")))
            assert await store.tenants() == {"t", "u"} and await store.get("gone") is None
            told = await store.get("t")
            assert told is not None and set(told.jobs) == {"t1"}
            await forecast(role, (("u1", "u"),))  # t1 is no longer waiting
            assert await store.tenants() == {"u"} and await store.get("t") is None

            restarted = service.ForecastService(InMemoryLog(), store)  # u1 started meanwhile
            await forecast(restarted, ())
            assert await store.tenants() == set()
        finally:
            await nc.close()
