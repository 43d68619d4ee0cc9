"""What a service does when a cycle fails: count it, say where, wait, and let a standby decide.

A decision core that raises (a bug meeting an input nobody foresaw) must neither take its
service down nor let it spin on the same input. The shell asks ``Supervision`` before each
cycle whether it may decide, and tells it how each ended:

- a failure is counted (in total and in a row), with the log sequence the state was folded to
  and, where the traceback shows one, the job the core was working on;
- the next try waits an exponential back-off, ``base * 2 ** (in_a_row - 1)``, never more than
  ``cap``; the waits are measured in the service's ``now`` (log time, ``clock.py``);
- meanwhile the shell hands its lease over, so that a standby replica decides on the same log:
  one whose code does not fail there keeps the role going, and this one tries again after its
  back-off only if the lease is free;
- a cycle that ends well resets the run of failures (the totals stay, for ``corral status``),
  and so does another replica's decision past the failure, seen while this one stands by.

Pure: no IO, no clock; time comes in as ``now``.
"""

from __future__ import annotations

import traceback
from types import TracebackType

import msgspec

BASE = 1.0  # seconds before the first retry
CAP = 60.0  # never more between two tries


def backoff(in_a_row: int, base: float = BASE, cap: float = CAP) -> float:
    """Seconds to wait after the ``in_a_row``-th failure in a row (1, 2, ...)."""
    if in_a_row <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(in_a_row - 1, 62))


class Failure(msgspec.Struct, frozen=True):
    """One failed cycle, as ``corral status`` shows it."""

    at: float  # the service's ``now``
    seq: int  # the log sequence its state was folded to
    job: str  # the job the core was working on, where the traceback shows one ("" if not)
    error: str  # the exception, one line


class Supervision:
    def __init__(self, base: float = BASE, cap: float = CAP) -> None:
        self.base = base
        self.cap = cap
        self.cycles = 0  # cycles that ended well
        self.failures = 0  # cycles that raised, in all
        self.in_a_row = 0
        self.retry_at = 0.0  # no cycle before this ``now``
        self.last: Failure | None = None

    def may_decide(self, now: float) -> bool:
        return now >= self.retry_at

    def succeeded(self) -> None:
        self.cycles += 1
        self.in_a_row = 0

    def decided_elsewhere(self, seq: int) -> None:
        """Another replica decided at log ``seq``: past this one's last failure, the role went on
        where it failed, and the run of failures is over (a standby never has a good cycle of
        its own to end it: it stood shown as failing, and its next failure as leader backed off
        as a second in a row)."""
        if self.in_a_row and self.last is not None and seq > self.last.seq:
            self.in_a_row = 0
            self.retry_at = 0.0

    def failed(self, now: float, seq: int, error: BaseException) -> Failure:
        """Count a failed cycle; the next may start ``backoff(in_a_row)`` seconds from ``now``."""
        self.failures += 1
        self.in_a_row += 1
        self.retry_at = now + backoff(self.in_a_row, self.base, self.cap)
        self.last = Failure(now, seq, culprit(error.__traceback__), _one_line(error))
        return self.last


def culprit(tb: TracebackType | None) -> str:
    """The job a decision core was working on when it raised: the innermost frame of the
    traceback holding a job (a local ``job`` with an ``id``, or a ``job_id`` string)."""
    for frame, _ in reversed(list(traceback.walk_tb(tb))):
        local = frame.f_locals
        job = local.get("job")
        job_id = getattr(job, "id", None)
        if isinstance(job_id, str):
            return job_id
        job_id = local.get("job_id")
        if isinstance(job_id, str):
            return job_id
    return ""


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".splitlines()
    return text[0][:300] if text else type(error).__name__
