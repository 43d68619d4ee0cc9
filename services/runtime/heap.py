"""A process that holds the fold's state for months, and Python's cycle collector.

The collector's full collections walk every container object alive: with 100,000 jobs queued a
service's state is some 360,000 of them, and a full collection takes 100-300 ms on this
machine's cores, set off every few seconds while jobs arrive (it runs once a quarter more
objects survived than the last one left). Every service that folds paid it at its own moment,
so a job's way from submission to placement met one of those pauses in one service or another
(``bench.e2e`` saw 200 ms to 1.4 s of them in each of six processes while 100,000 jobs queued).

The state makes no reference cycles (``collector_paused``, in the fold, says why and a test holds
it to that): it is freed by reference counts, and the collector has nothing to find in it. So
after a batch is folded, ``settle`` moves every object alive into the collector's permanent
generation (``gc.freeze``, a constant-time splice), and its collections walk only what was made
since: at most every ``FREEZE_S``, as what grew meanwhile is seconds of work, a few milliseconds
to walk. What the service had in flight at a freeze that later ends in a cycle (a task, an
exception and its frames) would stay: every ``REFREEZE_S`` the permanent generation is given
back and collected whole, once, as the collector would have done far more often.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

FREEZE_S = 5.0  # seconds between freezes: what is alive then is what lives long
REFREEZE_S = 600.0  # seconds between the full collections ``settle`` still lets happen


class Heap:
    """When this process last froze and collected its whole heap (``settle``); one per process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.collected_at = clock()
        self.frozen_at = -math.inf

    def settle(self) -> None:
        """After a batch is folded: freeze what is alive now (at most every ``FREEZE_S``), and
        every ``REFREEZE_S`` first collect the whole heap, what was frozen included."""
        now = self.clock()
        if now - self.frozen_at < FREEZE_S:
            return
        self.frozen_at = now
        if now - self.collected_at >= REFREEZE_S:
            gc.unfreeze()
            gc.collect()
            self.collected_at = now
        gc.freeze()


HEAP = Heap()
settle = HEAP.settle
