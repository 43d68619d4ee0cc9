"""Leader leases: one replica of a decision role decides at a time, the others stand by.

A lease is a key per role in the JetStream key-value bucket ``corral_leases``, whose entries
expire ``ttl`` seconds after they were last written (the bucket's max age). The holder writes it
with compare-and-swap on the revision it last wrote, at least every ``ttl / 3``; a standby
creates it only once it is absent (expired, or deleted by a holder that stopped), so at most one
replica holds it at a time as the server sees it. A holder that cannot renew in time (a pause, a
partition) loses it at its next attempt, when its revision is no longer the latest. A renewal
that gets no answer (a NATS cluster electing the bucket's leader) is not a refusal: the holder
decides nothing meanwhile and tries again with the same revision until the lease would have
expired, and a renewal stored late (sent when the connection came back) is recognised by its
value, the holder's own name, so a leader keeps its role across a NATS failover. While the
bucket answers nothing, a replica asks again at most every ``ttl / 20`` (a standby's cycles come
with every record it folds: it would otherwise ask, and fail, many times a second) and says so
once when it starts, every ``SAY_EVERY_S`` while it lasts, and once when answers come back.

This is for efficiency, not safety: two replicas deciding at once (a holder that has not yet
noticed it lost its lease) only make proposals the fold arbitrates, and the expected-sequence
check on the decision subject makes one of them lose its race.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from nats import errors as nats_errors
from nats.js import errors as js_errors

from corral.services.runtime import buckets

log = logging.getLogger("corral.lease")

BUCKET = "corral_leases"
TTL = 10.0  # seconds a lease outlives its holder's last renewal
SAY_EVERY_S = 30.0  # while the bucket answers nothing, how often a replica says it still does not


class Lease(Protocol):
    async def hold(self) -> bool:
        """Whether this replica holds the role's lease now, taking or renewing it as needed."""
        ...

    async def release(self) -> None:
        """Give the lease up (a replica that stops, or whose cycle failed), so that a standby
        takes over at once."""
        ...

    @property
    def held(self) -> bool:
        """Whether this replica held the lease at its last ``hold``."""
        ...


async def ensure_bucket(nc: Any, ttl: float = TTL, replicas: int = 1) -> None:
    """Create the leases' bucket if it is missing, with ``replicas`` (the log's), or bring it to
    them (whoever sets the corral up: the services may use it, not make or remove it)."""
    await buckets.ensure(nc.jetstream(), BUCKET, replicas, ttl=ttl, history=1)


async def bucket(nc: Any, ttl: float = TTL) -> Any:
    """The leases' bucket on the server ``nc`` is connected to, made if missing (by a replica
    started against a server nobody set up; under logins, ``corral up`` has made it)."""
    return await buckets.open_bucket(nc.jetstream(), BUCKET, ttl=ttl, history=1)


class KvLease:
    """A role's lease in the ``corral_leases`` bucket, held under the name ``holder``."""

    def __init__(
        self,
        kv: Any,
        role: str,
        holder: str,
        ttl: float = TTL,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
        nc: Any = None,
    ) -> None:
        """``on_change(leading)``: told each time this replica starts or stops holding the lease
        (``corral serve`` says so on stderr, for whoever watches a replica). ``nc``: the
        connection the bucket is on (``open``'s), which what else its role keeps in the bucket
        is written through (``traced.py``)."""
        self.kv = kv
        self.nc = nc
        self.role = role
        self.holder = holder
        self.ttl = ttl
        self.clock = clock
        self.on_change = on_change
        self._revision: int | None = None  # what we last wrote, while we hold the lease
        self._renewed = 0.0
        # What ``on_change`` last said. Not ``held``: a renewal nobody answered keeps its claim
        # (``held``) but decides nothing (``hold`` says False), and says so once, not per tick.
        self._leading = False
        # While the bucket answers nothing: since when (``pause_clock``), how many tries, when
        # the next may go and when it was last said. The pause is this process's own pacing,
        # on its monotonic clock, whatever ``clock`` the lease's age is read by.
        self.pause_clock: Callable[[], float] = time.monotonic
        self._silent_since: float | None = None
        self._tries = 0
        self._retry_at = 0.0
        self._said_at = 0.0

    @classmethod
    async def open(
        cls,
        nc: Any,
        role: str,
        holder: str,
        ttl: float = TTL,
        on_change: Callable[[bool], None] | None = None,
    ) -> KvLease:
        """The lease of ``role`` on the server ``nc`` is connected to (the bucket is made if
        missing with entries kept ``ttl`` seconds). One that exists is used as it is, and its
        own age is the lease's: renewing every third of another age than the bucket's would
        lose the lease between renewals, or keep a dead holder's longer than needed."""
        kv = await bucket(nc, ttl)
        with contextlib.suppress(nats_errors.Error, TimeoutError, AttributeError):
            age = (await kv.status()).ttl
            if age:
                ttl = float(age)
        return cls(kv, role, holder, ttl, on_change=on_change, nc=nc)

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def hold(self) -> bool:
        held = await self._hold()
        self._changed(held)
        return held

    def _changed(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            if self.on_change is not None:
                self.on_change(leading)

    async def _hold(self) -> bool:
        now = self.clock()
        if self._revision is not None and now - self._renewed < self.ttl / 3:
            return True
        if self._silent_since is not None and self.pause_clock() < self._retry_at:
            return False  # asked moments ago and got no answer: decide nothing meanwhile
        value = self.holder.encode()
        try:
            if self._revision is None:
                self._revision = await self.kv.create(self.role, value)
                log.info("%s: %s took the lease", self.role, self.holder)
            else:
                self._revision = await self.kv.update(self.role, value, last=self._revision)
        except js_errors.KeyWrongLastSequenceError:
            self._answered()
            ours = await self._late_renewal() if self._revision is not None else None
            if ours is not None:
                # A renewal that got no answer was stored after all (sent when the connection
                # came back): the key moved by our own hand, so the lease is still ours.
                self._revision = ours
                return False  # renewed from that revision at the next tick
            if self._revision is not None:
                log.warning("%s: %s lost the lease", self.role, self.holder)
            self._revision = None
            return False
        except (nats_errors.Error, TimeoutError) as e:  # no answer: decide nothing meanwhile
            self._unanswered(e)
            if self._revision is not None and now - self._renewed < self.ttl:
                # No answer is not a refusal (a NATS cluster electing the bucket's leader): try
                # again with the same revision, which succeeds only if nobody took the lease
                # meanwhile. Dropping it would leave the key to expire before anyone holds it.
                return False
            self._revision = None
            return False
        self._answered()
        self._renewed = now
        return True

    def _unanswered(self, error: BaseException) -> None:
        at = self.pause_clock()
        self._tries += 1
        self._retry_at = at + self.ttl / 20
        if self._silent_since is None:
            self._silent_since = self._said_at = at
            log.warning("%s: lease of %s not renewed: %s", self.role, self.holder, error)
        elif at - self._said_at >= SAY_EVERY_S:
            self._said_at = at
            log.warning(
                "%s: lease of %s still not renewed after %.0f s (%d tries): %s",
                self.role, self.holder, at - self._silent_since, self._tries, error,
            )  # fmt: skip

    def _answered(self) -> None:
        if self._silent_since is not None:
            log.info(
                "%s: the leases' bucket answers %s again after %.1f s (%d tries)",
                self.role, self.holder, self.pause_clock() - self._silent_since, self._tries,
            )  # fmt: skip
            self._silent_since = None
            self._tries = 0

    async def _late_renewal(self) -> int | None:
        """The key's revision if its value is still this holder's (no one else writes it)."""
        try:
            entry = await self.kv.get(self.role)
        except (js_errors.KeyNotFoundError, nats_errors.Error, TimeoutError):
            return None
        return int(entry.revision) if entry.value == self.holder.encode() else None

    async def release(self) -> None:
        self._changed(False)
        if self._revision is None:
            return
        revision, self._revision = self._revision, None
        with contextlib.suppress(nats_errors.Error, TimeoutError):
            await self.kv.delete(self.role, last=revision)
