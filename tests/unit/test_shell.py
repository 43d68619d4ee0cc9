"""The service shell against a competing writer: a cycle decided on a state another replica has
since written to is refused whole, whichever subjects its events are on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.decisions import JobsPlaced
from corral.events.jobs import JobAccepted
from corral.events.log import InMemoryLog, Record
from corral.projections.rules import RULES
from corral.projections.state import State
from corral.services.runtime.shell import Service


def facts_only(state: State, now: float) -> Sequence[Event]:
    """A cycle that writes nothing on the decision subject: before, nothing fenced it."""
    return [JobAccepted(job_id=f"accepted-at-{state.seq}", priority=0)]


def with_a_decision(state: State, now: float) -> Sequence[Event]:
    return [
        JobAccepted(job_id=f"accepted-at-{state.seq}", priority=0),
        JobsPlaced(based_on=state.seq, now=now, placements=()),
    ]


async def _folded(svc: Service, log: InMemoryLog) -> None:
    svc.fold([r for r in log.records if r.seq > svc.state.seq])


def _subjects(log: InMemoryLog) -> list[str]:
    return [r.subject for r in log.records]


async def test_a_stale_replica_stores_nothing_of_its_cycle() -> None:
    log = InMemoryLog()
    leader = Service("placer", with_a_decision, log, clock=lambda: 1.0)
    stale = Service("placer", facts_only, log, clock=lambda: 1.0)
    await leader.restore()
    await stale.restore()

    assert await leader.cycle() == 2
    assert _subjects(log) == ["corral.ev.job.accepted-at-0", "corral.ev.decision.placer"]
    # The stale replica decided on the empty log; the leader has written since.
    assert await stale.cycle() == 0
    assert len(log.records) == 2

    await _folded(stale, log)
    assert await stale.cycle() == 1  # on the newer state, it may
    assert _subjects(log)[-1] == "corral.ev.job.accepted-at-2"


async def test_all_of_a_cycle_or_none() -> None:
    """A competing write between deciding and appending voids the whole cycle, not only the
    events on the decision subject."""
    log = InMemoryLog()
    svc = Service("placer", with_a_decision, log, clock=lambda: 1.0)
    await svc.restore()
    other = Service("placer", with_a_decision, log, clock=lambda: 1.0)
    await other.restore()
    await other.cycle()
    before = list(log.records)
    assert await svc.cycle() == 0
    assert list(log.records) == before


async def test_a_fence_unknown_after_a_snapshot_is_learnt_not_a_stall() -> None:
    """A service restored from a snapshot does not know where its decision subject stands; the
    first conflict tells it, and once it has folded that far it decides again."""
    log = InMemoryLog()
    first = Service("placer", with_a_decision, log, clock=lambda: 1.0)
    await first.restore()
    await first.cycle()
    restored = Service("placer", with_a_decision, log, clock=lambda: 1.0)
    restored.state = State()
    restored.fold([Record(r.seq, "corral.ev.job.other", r.data, r.headers, r.time) for r in log.records])
    assert restored._last_decision_seq == 0  # as after a snapshot: the subject's seq unknown
    assert await restored.cycle() == 0
    assert await restored.cycle() == 2


async def test_a_snapshot_that_cannot_be_written_does_not_stop_the_service() -> None:
    # The log is the truth; a snapshot only spares a restart folding from the start. One that
    # cannot be written (a state it cannot encode, a full disk) is logged, and the service goes on.
    class Broken:
        tried = 0

        async def save(self, state: State) -> None:
            self.tried += 1
            raise OverflowError("can't serialize ints > 2**64 - 1")

        async def load(self) -> State | None:
            return None

    log = InMemoryLog()
    snapshots = Broken()
    svc = Service("placer", with_a_decision, log, clock=lambda: 1.0, snapshots=snapshots, snapshot_every=1)
    await svc.restore()
    assert await svc.cycle() == 2
    await _folded(svc, log)
    await svc._maybe_snapshot()
    assert snapshots.tried == 1 and await svc.cycle() == 2  # and it decides on


def _sealed_under(rules: int, seq: int) -> Record:
    body = JobsPlaced(based_on=seq - 1, now=1.0, placements=())
    env = codec.seal(body, event_id=f"placer:{seq}", time=1.0, producer="placer@b:2", rules=rules)
    data = codec.encode(env)
    return Record(seq, subjects.decision("placer"), data, {}, 1.0)


async def test_a_cycle_decided_under_newer_rules_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A replica of an older build, beside newer ones in a rolling upgrade or brought back in a
    rollback, folds their cycles by its own rules: where the rules differ, its state is not
    theirs. It says so, once per newer rules version, naming the record and both versions."""
    svc = Service("admission", facts_only, InMemoryLog(), clock=lambda: 1.0)
    with caplog.at_level(logging.ERROR, logger="corral.shell"):
        svc.fold([_sealed_under(RULES, 1), _sealed_under(RULES + 1, 2), _sealed_under(RULES + 1, 3)])
        svc.fold([_sealed_under(RULES + 2, 4)])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert f"log seq 2, decided under rules {RULES + 1}, by this build's older rules {RULES}" in said[0]
    assert "upgrade it" in said[0]
    assert f"log seq 4, decided under rules {RULES + 2}" in said[1]
    assert svc.state.seq == 4  # folded all the same: a rolled-back corral still decides
