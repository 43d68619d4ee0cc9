"""corral's key-value buckets (the leases' and status board's, the node views'), made as the
log's stream is: with its replica count, so that on a NATS cluster a lease or a node's view
survives the loss of a server as the log does.

Whoever sets the corral up makes them (``ensure``: created, or brought to the replica count
asked for); a replica started against a server nobody set up makes what is missing with the
replicas the log's stream has (``replicas_of_log``), never fewer.
"""

from __future__ import annotations

import contextlib
from typing import Any

from nats.js import api
from nats.js import errors as js_errors

from corral.events.jetstream import answered, placed
from corral.events.subjects import STREAM


async def replicas_of_log(js: Any) -> int:
    """The log's stream's replica count (1 where there is no log yet, or it cannot be read)."""
    try:
        info = await js.stream_info(STREAM)
    except js_errors.Error:
        return 1
    return int(info.config.num_replicas or 1)


async def ensure(js: Any, bucket: str, replicas: int, **config: Any) -> None:
    """Create ``bucket`` with ``replicas`` (and ``config``: ttl, history, direct), or bring an
    existing one to ``replicas`` and to taking per-message TTLs. Idempotent. Each request is
    asked again while nobody answers (a cluster electing its leader), within ``placed``'s bound."""
    try:
        await answered(lambda: js.key_value(bucket))
    except js_errors.BucketNotFoundError:
        with contextlib.suppress(js_errors.BadRequestError):  # another made it first
            await placed(
                lambda: js.create_key_value(api.KeyValueConfig(bucket=bucket, replicas=replicas, **config))
            )
            return
    stream = f"KV_{bucket}"
    info = await answered(lambda: js.stream_info(stream))
    # A bucket made by an older client takes no per-message TTL, which one made now does: the
    # traced positions outlive the leases' age by one (``traced.py``).
    if (info.config.num_replicas or 1) != replicas or not info.config.allow_msg_ttl:
        info.config.num_replicas = replicas
        info.config.allow_msg_ttl = True
        await placed(lambda: js.update_stream(info.config))


async def open_bucket(js: Any, bucket: str, **config: Any) -> Any:
    """``bucket``, made if missing with the log's replica count."""
    try:
        return await answered(lambda: js.key_value(bucket))
    except js_errors.BucketNotFoundError:
        replicas = await replicas_of_log(js)
        with contextlib.suppress(js_errors.BadRequestError):  # another replica made it first
            await placed(
                lambda: js.create_key_value(api.KeyValueConfig(bucket=bucket, replicas=replicas, **config))
            )
        return await answered(lambda: js.key_value(bucket))
