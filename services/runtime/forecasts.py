"""Where start forecasts live: the JetStream key-value bucket ``corral_forecasts``, one key per
tenant.

The forecast role (``services/forecast``) writes, under each tenant's name, the forecast start of
every job of that tenant's that waits; the read service reads the asker's key (the admin's: every
tenant's) and adds each job's forecast to its ``jobs`` and ``explain`` answers. A key per tenant,
not one for the whole cluster, so that what one answer reads is what its asker may see, and a
tenant's value stays small. The log stays the truth: the bucket is derived, keeps one value per
key and is rewritten by whichever replica takes the role's lease. A tenant with no job waiting
has no key: the role purges it once the tenant's last waiting job starts or ends, and the
replica that takes the lease purges every key of a tenant with none (tenants come and go over
months, and each kept a key of nothing for good).

The read service, whose identity may not create consumers on it, reads a key with a direct get
that names it in the subject (as an agent reads its node's view, ``views.py``).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import msgspec
from nats import errors as nats_errors
from nats.js import errors as kv_errors

from corral.events.jetstream import answered
from corral.services.runtime import buckets

log = logging.getLogger("corral.forecasts")

BUCKET = "corral_forecasts"
STREAM = f"KV_{BUCKET}"
# A tenant's value lists at most this many jobs (the first to start), and at most this many
# bytes of them: a value must fit in one NATS message (1 MiB by default), and an entry is 70
# bytes with an id of 10 characters, 125 with one of 64 (10,000 of those were refused by the
# server, and the tenant's forecasts never written).
MOST = 10_000
MOST_BYTES = 768 * 1024


class Eta(msgspec.Struct, frozen=True, array_like=True):
    """One job's forecast start and its band, in log time; None: not within the horizon."""

    start: float | None
    early: float | None
    late: float | None


class TenantForecast(msgspec.Struct, frozen=True):
    """What one tenant's key holds: the forecast made at log position ``seq`` and time ``at``."""

    seq: int
    at: float
    horizon_s: float
    assumption: str
    jobs: dict[str, Eta]


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(TenantForecast).decode


def eta(early: float, start: float, late: float) -> Eta:
    def finite(t: float) -> float | None:
        return None if math.isinf(t) or math.isnan(t) else t

    return Eta(finite(start), finite(early), finite(late))


def entry_bytes(job_id: str, value: Eta) -> int:
    """What one job's entry takes in an encoded value (its id quoted, a colon, a comma)."""
    return len(_encode(job_id)) + len(_encode(value)) + 2


def encode(value: TenantForecast) -> bytes:
    return _encode(value)


def decode(raw: bytes) -> TenantForecast | None:
    try:
        return _decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.error("unreadable forecast: %s", e)
        return None


def key_subject(tenant: str) -> str:
    return f"$KV.{BUCKET}.{tenant}"


def direct_get_subject(tenant: str) -> str:
    """The direct get of a tenant's key's last value, its key in the subject."""
    return f"$JS.API.DIRECT.GET.{STREAM}.{key_subject(tenant)}"


class ForecastStore(Protocol):
    """Where the forecast role writes and the read service reads."""

    async def put(self, tenant: str, value: bytes) -> None: ...

    async def get(self, tenant: str) -> TenantForecast | None: ...

    async def remove(self, tenant: str) -> None:
        """Purge the tenant's key: it has no job waiting."""
        ...

    async def tenants(self) -> set[str]:
        """The tenants with a key: what a writer that takes over reconciles with."""
        ...


async def ensure_bucket(nc: Any, replicas: int = 1) -> None:
    """Create the forecasts' bucket if it is missing, with ``replicas`` (the log's), or bring it
    to them (whoever sets the corral up, as for the node views' bucket)."""
    await buckets.ensure(nc.jetstream(), BUCKET, replicas, history=1, direct=True)


class KvForecasts:
    """The bucket: written through the KV API (the forecast role's ``services`` identity), read
    by direct gets (which the read service's ``query`` identity may do, key by key)."""

    def __init__(self, nc: Any, kv: Any = None, timeout: float = 2.0) -> None:
        self.nc = nc
        self.kv = kv
        self.timeout = timeout

    @classmethod
    async def open(cls, nc: Any) -> KvForecasts:
        return cls(nc, await answered(lambda: nc.jetstream().key_value(BUCKET)))

    async def put(self, tenant: str, value: bytes) -> None:
        assert self.kv is not None, "opened to read only"
        await self.kv.put(tenant, value)

    async def remove(self, tenant: str) -> None:
        # Purged: the value goes, and what stays is one marker without a value (a purge
        # replaces the key's history), which reads as no forecast.
        assert self.kv is not None, "opened to read only"
        await self.kv.purge(tenant)

    async def tenants(self) -> set[str]:
        assert self.kv is not None, "opened to read only"
        try:
            return set(await self.kv.keys())
        except kv_errors.NoKeysError:
            return set()

    async def get(self, tenant: str) -> TenantForecast | None:
        """The tenant's forecast; None when there is none (or the server did not answer)."""
        try:
            msg = await self.nc.request(direct_get_subject(tenant), b"", timeout=self.timeout)
        except nats_errors.NoRespondersError:
            return None  # no bucket: no forecast role was ever set up here
        except (nats_errors.Error, TimeoutError) as e:
            log.warning("%s: forecast not read: %s", tenant, e)
            return None
        headers = msg.headers or {}
        if headers.get("Status") or not msg.data:  # 404: nothing written yet
            return None
        return decode(msg.data)


class MemoryForecasts:
    """The bucket kept in memory: its stand-in where there is no NATS (unit tests)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def put(self, tenant: str, value: bytes) -> None:
        self.values[tenant] = value

    async def get(self, tenant: str) -> TenantForecast | None:
        raw = self.values.get(tenant)
        return None if raw is None else decode(raw)

    async def remove(self, tenant: str) -> None:
        self.values.pop(tenant, None)

    async def tenants(self) -> set[str]:
        return set(self.values)
