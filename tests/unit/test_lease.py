"""A lease whose bucket answers nothing (a NATS cluster electing its leader, a server away): the
replica asks again at a pace, not at every cycle, and says so once, not at every try."""

from __future__ import annotations

import logging

import pytest
from nats import errors as nats_errors

from corral.services.runtime.lease import SAY_EVERY_S, KvLease


class Silent:
    """A bucket nobody answers for, until ``back``; then it stores what it is sent."""

    def __init__(self) -> None:
        self.asked = 0
        self.back = False
        self.revision = 0

    async def create(self, key: str, value: bytes) -> int:
        return self._answer()

    async def update(self, key: str, value: bytes, last: int) -> int:
        return self._answer()

    def _answer(self) -> int:
        self.asked += 1
        if not self.back:
            raise nats_errors.NoRespondersError
        self.revision += 1
        return self.revision


def lease(kv: Silent, t: list[float]) -> KvLease:
    out = KvLease(kv, "placer", "replica-a", ttl=10.0, clock=lambda: t[0])
    out.pause_clock = lambda: t[0]
    return out


async def test_an_unanswered_standby_asks_at_a_pace_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kv, t = Silent(), [0.0]
    a = lease(kv, t)
    with caplog.at_level(logging.INFO, logger="corral.lease"):
        for _ in range(1000):  # a standby folding a busy log: a cycle every 10 ms for 10 s
            assert not await a.hold()
            t[0] += 0.01
        tries = kv.asked
        # Every ttl / 20 (0.5 s), not at each of the thousand cycles.
        assert 15 <= tries <= 21
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "not renewed" in said[0]
        t[0] += SAY_EVERY_S  # still nothing: said again once the interval has passed
        assert not await a.hold()
        assert len(caplog.records) == 2 and "still not renewed" in caplog.records[1].getMessage()
        kv.back = True
        t[0] += 1.0
        assert await a.hold()
        assert "answers replica-a again" in caplog.records[-1].getMessage()
    # Answered again: the next silence is said at once, as a new one.
    kv.back = False
    t[0] += 4.0  # past a third of the ttl: a renewal is due, and nobody answers it
    with caplog.at_level(logging.INFO, logger="corral.lease"):
        caplog.clear()
        assert not await a.hold() and a.held  # its claim kept while the lease would not have expired
        assert [r.getMessage() for r in caplog.records][0].startswith(
            "placer: lease of replica-a not renewed"
        )
