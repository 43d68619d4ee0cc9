"""How far a leased role's holder has emitted the spans that are the lease's, so that the next
holder resumes right after it: each record's span once, whoever held the lease when it was folded.

The spans of records no deciding role wrote (a node agent's reports, a client's requests) are
emitted by the holder of a lease (``traces.py``), but the lease changes hands between records:
a holder killed has emitted up to some record, a standby that takes over has folded past it.
So every replica keeps those spans of what it folds, and the holder, at most every
``EMIT_EVERY_S``, emits what it kept, waits until the collector has them, and posts the log
sequence it has traced to under ``traced.<role>`` in the leases' bucket. A standby drops what
the holder posted as traced; a replica that takes the lease reads the position and emits its
kept spans after it, and says so.

The key outlives the bucket's age, which is a lease's: it is written with a per-message TTL
of ``never`` (``Nats-TTL``), so a whole corral stopped and started again resumes where its last
holder traced to. The records written while a corral stops (a node's shutdown, its workers'
exits: ``corral up`` stops the services before the agents) are folded by no holder then; the
next one emits their spans once, as it would after a handover. A bucket made without
per-message TTLs (by an older corral; whoever sets the corral up turns them on,
``buckets.ensure``) takes the position as a plain value, which expires with the lease, and the
holder says so once. What is not exact: a holder killed after the collector took its
spans but before its position was stored has them sent again by the next holder, with the same
ids (the span ids are derived from the log, so a viewer shows one span); and one that lost its
lease without knowing (paused past it) may emit beside the new holder until its next renewal.

Only the ``services`` login may write the bucket, but a node agent may still name it as the
reply subject of its own publishes and have JetStream write its acknowledgement there
(DESIGN.md §10). So a value is read as a position only if it is one: a whole number from 0 to
the log's last sequence. Anything else (an acknowledgement's JSON, a negative number, one past
the log, which would have every holder after it emit nothing) is no position: the next holder
traces what it folded and posts over it.
"""

from __future__ import annotations

import logging
from typing import Any

from nats import errors as nats_errors
from nats.js import errors as js_errors

from corral.services.runtime.lease import BUCKET

log = logging.getLogger("corral.traced")

PREFIX = "traced"
EMIT_EVERY_S = 0.5  # how long the lease's spans wait, at most, before the holder emits them
# A replica started far behind the posted position keeps the lease's spans of no more records
# than these from its replay: each waits in memory until the holder emits it, and a position
# that old (spans made while no collector was configured, say) is not worth a start's memory.
RESUME_WITHIN = 100_000
LASTING = {"Nats-TTL": "never"}  # the position outlives the bucket's age, a lease's
TTL_DISABLED = 10166  # JetStream's error code for a per-message TTL on a stream that allows none


def key(role: str) -> str:
    return f"{PREFIX}.{role}"


class TracedPosition:
    """The posted position of role ``role`` in the leases' bucket ``kv`` (named ``bucket``), on
    the server ``nc`` is connected to."""

    def __init__(self, nc: Any, kv: Any, role: str, bucket: str = BUCKET) -> None:
        self.kv = kv
        self.key = key(role)
        # ``KeyValue.put`` sends no headers: a lasting value is published on the key's subject
        # through a JetStream context of its own.
        self.js = nc.jetstream()
        self.subject = f"$KV.{bucket}.{self.key}"
        self.lasting = True  # the bucket takes a per-message TTL, until it says it does not

    async def read(self, last: int) -> int | None:
        """The log sequence the last holder traced to, if one is posted (None: none, no answer,
        or a value that is no position in a log whose last sequence is ``last``)."""
        try:
            entry = await self.kv.get(self.key)
        except (js_errors.KeyNotFoundError, nats_errors.Error, TimeoutError):
            return None
        value = entry.value or b""
        if not (0 < len(value) <= 20 and value.isdigit()):  # ASCII digits, at most 64 bits' worth
            return None
        seq = int(value)
        return seq if seq <= last else None

    async def post(self, seq: int) -> bool:
        value = str(seq).encode()
        try:
            if self.lasting:
                try:
                    await self.js.publish(self.subject, value, headers=LASTING)
                    return True
                except js_errors.APIError as e:
                    if e.err_code != TTL_DISABLED:
                        raise
                    self.lasting = False
                    log.warning(
                        "the leases' bucket takes no per-message TTL: traced position %s expires "
                        "with the lease, and a corral restarted later does not trace what its last "
                        "holder did not; corral up or corral deploy setup turns it on",
                        self.key,
                    )
            await self.kv.put(self.key, value)
        except (nats_errors.Error, TimeoutError) as e:  # the next post says it again
            log.warning("traced position %s not posted: %s", self.key, e)
            return False
        return True
