"""corral's buckets are made, or found, through a cluster that does not answer for a while (a
leader elected again under load): the same request asked again within the placing bound, a
bucket that does not exist still made, any other refusal raised."""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest
from nats.js import errors as js_errors

from corral.services.runtime import buckets


class Cluster:
    """JetStream's key-value calls as a cluster answers them: ``silent`` requests go unanswered
    (timed out) first, then the bucket is found, or made if it is not there."""

    def __init__(self, silent: int, exists: bool) -> None:
        self.silent, self.exists, self.asked, self.made = silent, exists, 0, 0

    def _answer(self) -> None:
        self.asked += 1
        if self.silent:
            self.silent -= 1
            raise nats.errors.TimeoutError()

    async def key_value(self, bucket: str) -> str:
        self._answer()
        if not self.exists:
            raise js_errors.BucketNotFoundError()
        return f"kv:{bucket}"

    async def stream_info(self, stream: str) -> Any:
        self._answer()
        if stream.startswith("KV_"):
            config = type("Config", (), {"num_replicas": 1, "allow_msg_ttl": True})()
            return type("Info", (), {"config": config})()
        raise js_errors.NotFoundError()

    async def create_key_value(self, config: Any) -> str:
        self._answer()
        self.made += 1
        self.exists = True
        return f"kv:{config.bucket}"


async def test_a_bucket_is_found_after_the_cluster_was_silent() -> None:
    js = Cluster(silent=2, exists=True)
    assert await buckets.open_bucket(js, "corral_leases") == "kv:corral_leases"
    assert js.asked == 3 and js.made == 0


async def test_a_missing_bucket_is_made_after_the_cluster_was_silent() -> None:
    js = Cluster(silent=1, exists=False)
    assert await buckets.open_bucket(js, "corral_leases") == "kv:corral_leases"
    assert js.made == 1


async def test_ensure_waits_out_a_silent_cluster_and_leaves_a_bucket_as_it_is() -> None:
    js = Cluster(silent=2, exists=True)
    await buckets.ensure(js, "corral_leases", replicas=1)
    assert js.made == 0 and js.asked == 4  # two unanswered, then the bucket and its stream


async def test_another_refusal_is_raised_at_once() -> None:
    class Refusing(Cluster):
        async def key_value(self, bucket: str) -> str:
            self.asked += 1
            raise js_errors.BadRequestError()

    js = Refusing(silent=0, exists=True)
    with pytest.raises(js_errors.BadRequestError):
        await buckets.open_bucket(js, "corral_leases")
    assert js.asked == 1
