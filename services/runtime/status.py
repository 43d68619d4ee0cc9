"""Each replica's own account of itself, for ``corral status``: leading or standing by, cycles
decided, failures counted, the last one (where in the log, which job, what error), and when it
tries again.

Every replica of a service writes its status under ``status.<role>.<replica>`` in the leases'
bucket (``lease.BUCKET``), whose entries expire ``TTL`` seconds after their last write: a
replica rewrites its own at least every third of that, and at once when it fails, takes or loses
the lease, so a replica that died leaves the board within seconds and a failing one shows at
once. The board is for people; no decision reads it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

import msgspec
from nats import errors as nats_errors
from nats.js import errors as js_errors

from corral.services.runtime import traced
from corral.services.runtime.lease import BUCKET, TTL, bucket
from corral.services.runtime.supervise import Failure

log = logging.getLogger("corral.status")

PREFIX = "status"


class Unreadable(Exception):
    """The board cannot be read now: what it holds is not known, which is not an empty board."""


class ServiceStatus(msgspec.Struct, frozen=True):
    role: str
    replica: str  # the process: role@host:pid
    leading: bool  # holds the role's lease (or has none to hold)
    seq: int  # the log sequence its state is folded to
    cycles: int  # cycles decided without failing
    failures: int  # cycles that raised, in all
    in_a_row: int  # failures since the last good cycle
    retry_at: float  # no cycle before this (its ``now``; 0: none failed)
    last_failure: Failure | None = None
    at: float = 0.0  # its ``now`` when it wrote this


def key(role: str, replica: str) -> str:
    """The board's key for one replica: KV keys allow fewer characters than a process name."""
    return f"{PREFIX}.{role}.{re.sub(r'[^-_a-zA-Z0-9]', '-', replica)}"


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(ServiceStatus).decode


class StatusBoard:
    def __init__(self, kv: Any, role: str, replica: str, ttl: float = TTL) -> None:
        self.kv = kv
        self.key = key(role, replica)
        self.every = ttl / 3
        self._written: ServiceStatus | None = None

    @classmethod
    async def open(cls, nc: Any, role: str, replica: str, ttl: float = TTL) -> StatusBoard:
        """The board in the leases' bucket; posts are renewed on the bucket's own age (as the
        leases are), so a status does not expire between two posts."""
        kv = await bucket(nc, ttl)
        with contextlib.suppress(nats_errors.Error, TimeoutError, AttributeError):
            age = (await kv.status()).ttl
            if age:
                ttl = float(age)
        return cls(kv, role, replica, ttl)

    async def post(self, status: ServiceStatus) -> None:
        """Write ``status`` if it says something new, or the last write is near its expiry."""
        last = self._written
        if (
            last is not None
            and status.at - last.at < self.every
            and (status.leading, status.failures) == (last.leading, last.failures)
        ):
            return
        try:
            await self.kv.put(self.key, _encode(status))
        except (nats_errors.Error, TimeoutError) as e:  # the board is for people: decide on
            log.warning("status of %s not written: %s", self.key, e)
            return
        self._written = status

    async def withdraw(self) -> None:
        """A replica that stops takes its status down."""
        with contextlib.suppress(nats_errors.Error, TimeoutError):
            await self.kv.delete(self.key)


async def read(nc: Any) -> tuple[dict[str, str], list[ServiceStatus]]:
    """Who holds each role's lease, and every live replica's status, from the server ``nc`` is
    connected to."""
    try:
        kv = await nc.jetstream().key_value(BUCKET)
    except js_errors.BucketNotFoundError:
        return {}, []
    holders: dict[str, str] = {}
    statuses = []
    for k in await _keys(nc):
        try:
            entry = await kv.get(k)
        except js_errors.KeyNotFoundError:
            continue  # expired meanwhile
        if entry.value is None:
            continue
        if k.startswith(traced.PREFIX + "."):
            continue  # how far a holder traced (``traced.py``): not a lease
        if k.startswith(PREFIX + "."):
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                statuses.append(_decode(entry.value))
        else:
            holders[k] = entry.value.decode(errors="replace")
    return holders, statuses


async def _keys(nc: Any) -> list[str]:
    """Every key the bucket holds a message for, from the stream's own count per subject: one
    request its leader answers. ``kv.keys()`` watches the bucket instead, and on a loaded
    three-server cluster it has come back with no keys while every role held its lease."""
    subject = f"$KV.{BUCKET}."
    info = await nc.jetstream().stream_info(f"KV_{BUCKET}", subjects_filter=subject + ">")
    if info.cluster is not None and info.cluster.replicas and info.cluster.leader is None:
        # A replica without a leader (its cluster has no majority, or is electing one) answers
        # with no subjects: read as an empty board, every running replica looked stopped.
        raise Unreadable(
            f"the bucket {BUCKET} has no leader: its NATS servers have no majority, or are electing one"
        )
    return sorted(s[len(subject) :] for s in (info.state.subjects or {}))
