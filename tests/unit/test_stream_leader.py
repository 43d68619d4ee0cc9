"""What the log says of its stream is its leader's: a replica without one may lag."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from corral.events import jetstream
from corral.events.jetstream import JetStreamLog
from corral.events.log import LogError


class Jsm:
    """Stream info as a cluster's server answers it: ``leaders`` one after the other."""

    def __init__(self, *leaders: str | None) -> None:
        self.leaders = list(leaders)
        self.asked = 0

    async def stream_info(self, stream: str) -> Any:
        leader = self.leaders[min(self.asked, len(self.leaders) - 1)]
        self.asked += 1
        state = SimpleNamespace(messages=0 if leader is None else 7, first_seq=1, last_seq=7, bytes=70)
        return SimpleNamespace(state=state, cluster=SimpleNamespace(leader=leader))


def log_on(jsm: Jsm) -> JetStreamLog:
    nc: Any = SimpleNamespace(jetstream=lambda: jsm)
    return JetStreamLog(nc, read_idle_timeout=0.5)


async def test_a_stream_without_a_leader_is_not_read_from_a_replica_that_may_lag() -> None:
    log = log_on(Jsm(None))
    with pytest.raises(LogError, match="no leader"):
        await log.info()
    with pytest.raises(LogError, match="no leader"):
        await log.last_seq()


async def test_an_election_is_waited_for() -> None:
    jsm = Jsm(None, None, "corral-2")
    assert (await log_on(jsm).info()).last_seq == 7 and jsm.asked == 3


async def test_a_server_of_its_own_names_itself_leader() -> None:
    assert (await log_on(Jsm("NBCP")).info()).messages == 7


def test_the_wait_is_the_read_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jetstream, "READ_IDLE_TIMEOUT", 1.5)
    nc: Any = SimpleNamespace(jetstream=lambda: Jsm("x"))
    assert JetStreamLog(nc)._read_idle_timeout == 1.5
