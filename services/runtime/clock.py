"""The time a service decides at: log time, carried forward between records.

Log time is the stream's own timestamp on each record (the server's clock, ``Record.time``); the
fold keeps the newest in ``State.time`` and stamps every fact with it, so every deadline the fold
records (a checkpoint's grace, a restart's back-off from ``phase_since``, a gang's start timeout)
is log time. A service compares those with ``now``, which must not fall behind the log it has
folded, nor stand still on a quiet log. So ``now`` is the later of

- the host's clock, and
- the newest log time folded, plus the time elapsed on this host (a monotonic clock) since the
  log reached it.

A host whose clock lags the server's thus decides at the log's time, never before what it has
already folded; one whose clock runs ahead decides at its own (its deadlines come early by the
difference, which time synchronisation keeps to milliseconds). No decision compares one host's
clock with another host's: what one service writes down as a time is log time, or its own
``now``, which is no earlier than log time.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogClock:
    def __init__(
        self, clock: Callable[[], float] = time.time, elapsed: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock``: the host's clock (seconds since the epoch); ``elapsed``: a clock that only
        counts seconds on this host, never stepped."""
        self.clock = clock
        self.elapsed = elapsed
        self._log = 0.0  # the newest log time seen
        self._seen_at = 0.0  # ``elapsed()`` when it was seen

    def saw(self, log_time: float) -> None:
        """The log has reached ``log_time`` (a fold just folded up to it). A record stamped
        before the time already carried forward (it spent longer on its way) moves nothing:
        time never goes back."""
        at = self.elapsed()
        if log_time > self._carried(at):
            self._log = log_time
            self._seen_at = at

    def _carried(self, at: float) -> float:
        return self._log + max(0.0, at - self._seen_at) if self._log else 0.0

    def now(self) -> float:
        """The later of the host's clock and the log time carried forward; the host's clock
        while no log time is known (an empty log, or one with no server timestamps)."""
        return max(self.clock(), self._carried(self.elapsed()))
