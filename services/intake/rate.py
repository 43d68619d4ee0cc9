"""How fast one tenant's requests, or one node's reports, go into the log: a token bucket each.

Every request the intake appends is in the log for good (the log is append-only), and every
service folds it. A tenant's client in a loop would grow the log, and every replica's work, as
fast as the intake appends; the waiting caps (``service.MAX_WAITING_PER_TENANT``) keep it from
crowding others out of a batch, not from filling the disk. So each tenant may send ``per_s``
requests a second, with ``burst`` at once after a quiet while (a sweep of jobs submitted
together); past that, a request is answered 429 at once with when to send again, and nothing is
appended. The buckets are each intake replica's: with ``n`` replicas sharing the requests a
tenant gets up to ``n`` times the rate, which is what the operator sizes.

A request costs a token for each ``TOKEN_BYTES`` it starts (``cost``), its headers with its body:
a job's spec, some hundreds of bytes, is one, and the largest request the intake takes about 65.
Counted by requests alone, requests of 250 KB at a fifth of the rate grew the log by 40 MB a
second; so the log a tenant can grow is bounded in bytes too, ``per_s * TOKEN_BYTES`` a second
(4 MB by default).

Pure: the caller gives the time (monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    per_s: float  # requests a second a tenant may keep sending
    burst: int  # requests a tenant may send at once after a quiet while

    def __post_init__(self) -> None:
        # ``not (x > 0)`` also refuses NaN, which every comparison lets through.
        if not (self.per_s > 0 and math.isfinite(self.per_s)):
            raise ValueError(f"{self.per_s!r} requests a second: a number above 0")
        if self.burst < 1:
            raise ValueError(f"a burst of {self.burst}: at least 1")


# Generous for people and their sweeps (10,000 jobs at once, then 1,000 a second), a bound on a
# client gone wrong: a day of it is some 86 million records, not unbounded.
DEFAULT = Rate(per_s=1_000.0, burst=10_000)

# A node agent's reports are each well under a token (a start some 360 bytes, an exit 460, a
# registration of 8 GPUs 1,200), and a node runs at most 256 workers unless it says more
# (``events.nodes.MAX_WORKERS``). Its busiest honest second is every worker ending and as many
# starting: some 513 reports; kept up, 256 workers of 10 s each with a checkpoint of each every
# 30 s send 60 a second. So a node may send 2,000 at once and 100 a second: a node taken over
# grows the log by at most 400 KB a second (with 8 MB at once), and an honest one is never
# told to wait.
NODE_DEFAULT = Rate(per_s=100.0, burst=2_000)

TOKEN_BYTES = 4096

_ROUNDING = 1e-9  # of a token: the refill's floating-point error


def cost(size: int) -> int:
    """Tokens a request of ``size`` bytes costs: one for each ``TOKEN_BYTES`` it starts."""
    return max(1, -(-size // TOKEN_BYTES))


class Buckets:
    """A token bucket per tenant: ``take`` a request's tokens (``cost``), or say how long until
    it may."""

    def __init__(self, rate: Rate) -> None:
        self.rate = rate
        self._left: dict[str, tuple[float, float]] = {}  # tenant: (tokens, when counted)
        self._forget_past = 1_024  # a size past which full buckets are let go

    def take(self, tenant: str, now: float, tokens_asked: int = 1) -> float:
        """0.0 when ``tenant`` may send a request of ``tokens_asked`` now (they are taken); else
        the seconds until it may. A request that costs more than the burst is taken once the
        bucket is full, and leaves it owing the rest (a bucket that can never hold its cost
        would refuse it for good; one charged only the burst would let a small burst undo the
        bound in bytes: at a burst of 1, a 256 KiB request cost what a 4 KiB one does)."""
        rate = self.rate
        want = float(tokens_asked)
        need = min(want, float(rate.burst))  # what the bucket must hold to take it
        tokens, at = self._left.get(tenant, (float(rate.burst), now))
        tokens = min(float(rate.burst), tokens + max(now - at, 0.0) * rate.per_s)
        if tokens >= need - _ROUNDING:  # a tenant back when it was told to be is taken
            self._left[tenant] = (max(tokens - want, need - want), now)
            if len(self._left) > self._forget_past:
                self._forget_full(now)
            return 0.0
        self._left[tenant] = (tokens, now)
        return (need - tokens) / rate.per_s

    def tenants(self) -> int:
        """How many tenants' buckets are kept (a full one is the same as none)."""
        return len(self._left)

    def _forget_full(self, now: float) -> None:
        """Let go of the buckets that have filled again: a tenant with none starts full. Without
        logins anyone may name any tenant, so the buckets are bounded by the tenants active
        within ``(burst + the largest cost) / per_s`` seconds (a bucket may owe what a request
        cost past it); the size that triggers this doubles with what is kept,
        so that each request pays for it a constant share."""
        rate = self.rate
        self._left = {
            t: (tokens, at)
            for t, (tokens, at) in self._left.items()
            if tokens + max(now - at, 0.0) * rate.per_s < rate.burst
        }
        self._forget_past = max(1_024, 2 * len(self._left))
