"""When holders give GPUs and quota back, and what a waiting job keeps for itself meanwhile.

Admission, the placer and the preemptor all project the near future from the state alone, the
same way, so that they agree on it: a job holding GPUs is expected to end at ``phase_since +
its runtime estimate`` (its owner's, else one learned from history: ``runtimes.of``)
(``grace_seconds`` for one that is checkpointing; never, if it has no
estimate), and a job admitted but not placed yet holds its quota for its runtime estimate from
now (``expected_end``, ``quota_end``).

A best-effort queue's first job that does not fit holds its share of the queue's nominal quota
(``Hold``, ``hold``): later jobs of the queue may use only what leaves it room when the queue's
own jobs are projected to give it that room (so that they do not put its start off, as Slurm's
backfill starts a lower-priority job only if the higher one's expected start does not move),
unless they end before then, or the held job may stop them to take it back (its queue's
``within_queue`` policy). Admission keeps the hold when it admits;
the preemptor keeps the same hold when it chooses victims.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from corral.events.queues import PreemptionPolicy
from corral.projections import indexes, quota, runtimes
from corral.projections.index import expected_text
from corral.projections.preemption import eligible
from corral.projections.quota import Ledger
from corral.projections.state import JobState, State


def expected_end(job: JobState, now: float) -> float:
    """When ``job`` is expected to give its GPUs back (``inf``: unknown)."""
    spec = job.spec
    if job.phase == "checkpointing":
        end = job.preempt_deadline or job.phase_since + spec.grace_seconds
    elif job.phase == "running":
        est = runtimes.of(job)
        end = math.inf if est is None else job.phase_since + est
    elif job.phase in ("placed", "starting"):
        est = runtimes.of(job)
        end = math.inf if est is None else max(job.phase_since, now) + est
    else:
        end = now  # stopped or stopping: its last workers are on their way out
    return max(end, now)


# A hold made without its queue's policy stops nobody.
NO_STOPS = PreemptionPolicy(within_queue="never")


@dataclass(frozen=True, slots=True)
class Hold:
    """``need`` milli-GPU of ``key`` of its queue's nominal quota kept for ``job_id``, the queue's
    first job that does not fit; ``start``: when the queue's own jobs are projected to have given
    it that room (``inf``: not known, as jobs without a runtime estimate hold it, so no job is
    known to end before then). ``freed``: milli-GPU of the queue's own holders projected to have
    given quota back by ``start``. ``held`` (the job) and ``policy`` (its queue's) say which later
    jobs it may stop."""

    job_id: str
    key: str
    need: int
    start: float
    policy: PreemptionPolicy = NO_STOPS
    held: JobState | None = None
    freed: int = 0

    def spare(self, ledger: Ledger, queue: str, key: str, job: JobState, now: float) -> int | None:
        """How much of ``key`` a later ``job`` of the queue may take past the held job (None: no
        limit beyond the ledger's): what leaves the held job room within the nominal at
        ``start``, once what is projected to end by then has ended (a job that runs past it
        there puts the held job's start off by nothing); no limit if ``job`` cannot delay it: its
        runtime estimate ends by ``start``, or the held job may stop it to take the room back
        (``takes_back``). With ``start`` unknown, what leaves it room now."""
        if key != self.key or self.takes_back(ledger, job, now):
            return None
        estimate = runtimes.of(job)
        if estimate is not None and now + estimate <= self.start < math.inf:
            return None
        freed = self.freed if self.start < math.inf else 0
        return ledger.nominal(queue, key) - (ledger.used(queue, key) - freed) - self.need

    def takes_back(self, ledger: Ledger, job: JobState, now: float) -> bool:
        """Whether ``job`` may go past the held job because the held job may stop it for its
        room once it needs it: the preemption rule's test of a victim of the beneficiary's own
        queue (``preemption.eligible``: a lower priority, or an equal one submitted later where
        ``within_queue`` allows that; neither stopped for the other before), of a job that may
        still be preempted (``Ledger.may_take_back``). Such a job only borrows the held job's
        room until the held job needs it, as a borrower of another queue does. Not while that
        room is free now (``start`` is ``now``): the held job then waits only for quota other
        queues borrow, which the preemptor takes back at once, and a job admitted into its
        room would be stopped as soon as it ran."""
        if self.held is None or self.start <= now:
            return False
        mine = eligible(self.policy, job, None, self.held, None, lent=False, reclaims=False)
        return mine and ledger.may_take_back(job)

    def when(self) -> str:
        # An absolute log time, as the placer's reservation says it: stable from cycle to cycle.
        if math.isinf(self.start):
            return "when jobs without a runtime estimate end"
        return f"at {expected_text(self.start)}"


def quota_end(job: JobState, now: float) -> float:
    """When ``job``, holding quota, is expected to give it back: as the placer projects the end of
    a job holding GPUs (``expected_end``); a job admitted and not yet placed, its runtime estimate
    from ``now``."""
    if job.phase == "admitted":
        est = runtimes.of(job)
        return math.inf if est is None else now + est
    return expected_end(job, now)


class QuotaHolders:
    """Per queue and quota key, the jobs holding that quota: when each is expected to give it
    back (``ends``: log time, milli-GPU) and who they are (``jobs``: priority, milli-GPU, whether
    it could be stopped to give it back, ``quota.stoppable``). A queue's are read from the fold's
    index of its holders (``State.holding_quota_by_queue``) the first time the cycle asks about
    it, so that a cycle pays for the queues it asks about, not for every job running in the
    cluster. ``end`` counts what the cycle itself adds: jobs it admits, victims it keeps stopped.
    A job's admission names one key (the fold refuses any other); one that named several would
    not be counted. Queues ``has_queue`` does not know have none."""

    def __init__(self, state: State, now: float, has_queue: Callable[[str], bool]) -> None:
        self._state = state
        self._now = now
        self._has_queue = has_queue
        self._read: set[str] = set()
        self._ends: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self._jobs: dict[tuple[str, str], list[tuple[int, int, bool]]] = {}

    def ends(self, queue: str, key: str) -> list[tuple[float, int]]:
        self._read_queue(queue)
        return self._ends.get((queue, key), [])

    def jobs(self, queue: str, key: str) -> list[tuple[int, int, bool]]:
        self._read_queue(queue)
        return self._jobs.get((queue, key), [])

    def end(self, queue: str, key: str, at: float, milli: int) -> None:
        """Count ``milli`` of ``key`` in ``queue`` given back at ``at``, besides its holders."""
        self._ends.setdefault((queue, key), []).append((at, milli))

    def _read_queue(self, queue: str) -> None:
        if queue in self._read:
            return
        self._read.add(queue)
        if not self._has_queue(queue):
            return
        state, now = self._state, self._now
        classes = state.priority_classes
        for job in indexes.holding_quota(state, queue):
            held = quota.holding(job)
            if len(held) == 1:
                key, milli = held[0]
                self._ends.setdefault((queue, key), []).append((quota_end(job, now), milli))
                self._jobs.setdefault((queue, key), []).append(
                    (job.priority, milli, quota.stoppable(job, classes))
                )


def hold(
    ledger: Ledger,
    queue: str,
    job: JobState,
    holders: QuotaHolders,
    now: float,
) -> Hold | None:
    """The quota ``job`` holds in ``queue`` as its first job that does not fit: what it would be
    admitted with (its minimum replicas, on the key it counts against now, ``Ledger.key_for``),
    and when the queue's holders of that key (``holders``) leave room for it in the nominal.
    None if it needs no quota or more than the nominal."""
    found = ledger.key_for(queue, job)
    if found is None:
        return None
    key, need = found
    nominal = ledger.nominal(queue, key)
    if need > nominal:
        return None
    left, start = ledger.used(queue, key), now
    for end, milli in sorted(holders.ends(queue, key)):
        if left + need <= nominal:
            break
        left -= milli
        start = max(now, end)
    if left + need > nominal:  # held by more than the projection knows of
        start = math.inf
    policy = ledger.spec(queue).preemption
    return Hold(job.id, key, need, start, policy, job, ledger.used(queue, key) - left)
