"""The traced position is posted through nats-py's public API alone: a JetStream context of its
own, on the key's subject in the leases' bucket, with the per-message TTL that outlives a lease.
The bucket here answers only what ``KeyValue`` offers its users (``get``, ``put``)."""

from __future__ import annotations

from typing import Any

from corral.services.runtime import lease
from corral.services.runtime.traced import LASTING, TracedPosition


class Bucket:
    """A key-value bucket with a ``KeyValue``'s public methods only."""

    def __init__(self) -> None:
        self.put_values: dict[str, bytes] = {}

    async def get(self, key: str) -> Any:
        raise AssertionError("not read here")

    async def put(self, key: str, value: bytes) -> int:
        self.put_values[key] = value
        return 1


class JetStream:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict[str, str] | None]] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.published.append((subject, payload, headers))


class Connection:
    def __init__(self) -> None:
        self.js = JetStream()

    def jetstream(self) -> JetStream:
        return self.js


async def test_the_position_is_published_on_the_keys_subject_with_a_lasting_ttl() -> None:
    nc, kv = Connection(), Bucket()
    assert await TracedPosition(nc, kv, "admission").post(42)
    assert nc.js.published == [(f"$KV.{lease.BUCKET}.traced.admission", b"42", LASTING)]
    assert kv.put_values == {}  # a plain put would expire with the leases


def test_a_lease_opened_on_a_connection_keeps_it_for_the_traced_position() -> None:
    nc, kv = Connection(), Bucket()
    assert lease.KvLease(kv, "admission", "a", nc=nc).nc is nc
