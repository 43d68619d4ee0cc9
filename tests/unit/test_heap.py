"""``heap.settle``: what is alive after a fold is kept out of the collector's full collections,
and a cycle that was alive then is still collected, at the next whole collection."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from corral.services.runtime.heap import FREEZE_S, REFREEZE_S, Heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_what_is_alive_at_a_settle_is_left_out_of_collections(unfrozen: None) -> None:
    now = [0.0]
    heap = Heap(lambda: now[0])
    gc.unfreeze()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, alive now
    gone = weakref.ref(a)
    heap.settle()
    assert gc.get_freeze_count() > 0
    del a, b  # now garbage, but frozen: a full collection does not walk it
    gc.collect()
    assert gone() is not None
    frozen = gc.get_freeze_count()
    c = Node()
    now[0] = FREEZE_S / 2
    heap.settle()  # too soon after the last: nothing more frozen
    assert gc.get_freeze_count() == frozen
    del c
    now[0] = REFREEZE_S - 2 * FREEZE_S
    heap.settle()
    gc.collect()
    assert gone() is not None
    now[0] = REFREEZE_S  # the next whole collection takes it
    heap.settle()
    assert gone() is None and gc.get_freeze_count() > 0


def test_garbage_made_after_a_settle_is_collected_as_ever(unfrozen: None) -> None:
    heap = Heap(lambda: 0.0)
    heap.settle()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
