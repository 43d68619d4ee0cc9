"""The fold pauses Python's cycle collector for a batch (``projections.fold.collector_paused``).

That is sound only while the fold makes no reference cycles, which the collector would be the
only one to free: these tests hold the fold to that on the golden log and on a busy cluster's
synthetic log, and check that a paused fold gives the same state as one with the collector on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from bench.workload import records as to_records
from bench.workload import synthetic_log
from corral.events.log import Record
from corral.projections.fold import apply, collector_paused, fold
from corral.projections.state import State
from corral.services.cli import logfile
from tests.golden_log import LOG, state_hash


@pytest.fixture
def collector_on() -> Iterator[None]:
    """Each test starts with the collector on and leaves it on, whatever it did between."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()
    else:
        gc.enable()


def logs() -> dict[str, list[Record]]:
    return {"golden": list(logfile.read(LOG)), "synthetic": to_records(synthetic_log(5_000, seed=1))}


@pytest.mark.parametrize("name", ["golden", "synthetic"])
def test_the_fold_makes_no_reference_cycles(name: str, collector_on: None) -> None:
    recs = logs()[name]
    fold(recs)  # once first: what a first fold in a process builds once (caches) is not at issue
    gc.collect()
    gc.disable()
    state = State()
    for r in recs:
        apply(state, r)
    assert state.faults == 0
    assert gc.collect() == 0, "the fold made reference cycles: it may no longer pause the collector"


@pytest.mark.parametrize("name", ["golden", "synthetic"])
def test_a_fold_with_the_collector_paused_gives_the_same_state(name: str, collector_on: None) -> None:
    recs = logs()[name]
    running = State()
    for r in recs:
        apply(running, r)
    paused = fold(recs)
    assert gc.isenabled()
    assert state_hash(paused) == state_hash(running)


def test_the_collector_is_resumed_after_a_batch_that_raises(collector_on: None) -> None:
    with pytest.raises(KeyError), collector_paused():
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector_on: None) -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
