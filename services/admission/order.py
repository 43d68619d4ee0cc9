"""Fair-share order of pending jobs: which queue's head goes next.

Within a queue, jobs wait by priority (highest first), then submission (log sequence), then id;
in a ``shortest-first`` queue, by priority then the highest response ratio
(``projections.queueing``). Across queues, the next job is the head of the queue that

1. borrows least far up its cohort tree (``Ledger.borrowing_height``: jobs within their queue's
   nominal first, then by the height of the lowest cohort that holds enough for them, the
   height being how far that cohort's furthest queue is below it, as Kueue counts it),
2. is a short job, when the admin opened the short-job lane (``FairShareSpec.short_job_gpu_s``,
   ``queueing.short``): among heads that borrow equally far, short jobs of any queue go before
   the rest, then by the rules below,
3. among heads that borrow, has the higher priority (Kueue's ``PrioritySortingWithinCohort``):
   a borrower of another queue may be stopped by a waiting borrower of a higher priority, so
   letting the lower one in first only starts work the preemptor stops at once (Armada's
   "Queued jobs are not preempted cross queue"). Under a ``borrow_priority_threshold`` a head
   counts its priority up to one above it: over a borrower it may not stop, a higher priority
   wins nothing by going first, and fair share decides. Within their nominal, heads keep
   fair-share order: nobody may stop them there,
4. has the lowest weighted dominant share: the largest, over GPU keys, of
   (held now + decayed past holding) / all quota of that key in the queue's cohort tree,
   divided by the queue's weight,
5. then the head with the higher priority, the earlier submission, the smaller id.

After each admission the admitting queue's share is recomputed before its next head competes,
so teams interleave rather than one queue draining first. A strict-FIFO queue stops at a head
that does not fit; a best-effort-FIFO queue lets later jobs go, looking at most ``lookahead``
jobs past ones that do not fit per cycle (the rest wait for the queue to move).

No starvation inside a queue. Letting later jobs go must not keep a large job out for ever:
smaller jobs of its own queue would take every bit of quota its running jobs give back, and the
preemptor cannot help it (it may take back lent quota, or stop lower-priority jobs, but not its
queue's own jobs of its priority). So the first job of a best-effort queue that does not fit
holds its quota (``Hold``), as the placer's reservation holds GPUs: of the queue's nominal quota,
later jobs of the queue may use only what leaves room for it, unless their runtime estimate ends
before the queue's own jobs are projected to have given it that room (a backfill). Once its
queue is within its nominal with it, the preemptor reclaims what other queues borrow for it. A
job that needs more than its queue's nominal can only run on borrowed quota, which nothing
can hold for it: it holds nothing.

Past holding is the GPU time the queue's jobs held, from placement to release, every attempt,
decayed with the half-life the admin set (``ApplyFairShare``): the fold keeps it per queue and
key (``projections/gpu_time.py``), so it counts what ran, not what tenants estimated, and every
replica computes the same order. A GPU held ``t`` seconds ago weighs ``2 ** (-t / half_life)``,
normalised so that holding ``g`` GPUs for ever counts as ``g``; a team that used little lately
goes first. Held now is the quota the queue holds (``Ledger``), which admissions keep current
within a cycle. Everything is deterministic: no clock (``now`` is an argument), no dict-order
dependence (queues are visited by name, ties end at job id).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import islice
from operator import attrgetter, lt

from corral.events.queues import QueueSpec
from corral.projections import gpu_time, indexes, queueing, quota
from corral.projections.holds import Hold
from corral.projections.placement.inventory import Inventory
from corral.projections.quota import Ledger
from corral.projections.shape import kind_of
from corral.projections.state import WHOLE, JobState, State

_by_id = attrgetter("id")
_by_seq = attrgetter("submitted_seq")
_by_priority = attrgetter("priority")


def sort_queue(jobs: list[JobState], in_order: bool = False, strategy: str = "", now: float = 0.0) -> None:
    """Order one queue's pending jobs in place: priority, then submission, then id; for a
    ``shortest-first`` queue, priority then response ratio (``projections.queueing``).

    ``in_order``: the jobs are already by priority, submission and id (the fold keeps each
    queue so, ``State.queued_by_queue``), and only a shortest-first queue is ordered further."""
    if not jobs:
        return
    if in_order:
        if strategy == queueing.SHORTEST_FIRST:
            queueing.shortest_first(jobs, now)
        return
    # The submission sequence is the SubmitJob record's log position, one per job; only a State
    # built by hand can repeat one, and then the id decides.
    seqs = list(map(_by_seq, jobs))
    if not all(map(lt, seqs, islice(seqs, 1, None))):
        if len(set(seqs)) != len(seqs):
            jobs.sort(key=_by_id)
        jobs.sort(key=_by_seq)
    jobs.sort(key=_by_priority, reverse=True)  # stable, also in reverse
    if strategy == queueing.SHORTEST_FIRST:
        queueing.shortest_first(jobs, now)


class FairShare:
    """Per queue and key: held now (from the ledger, which admissions keep current) plus the
    decayed GPU time the queue held (from the State), and the weighted dominant share that
    follows."""

    def __init__(self, ledger: Ledger, state: State, now: float) -> None:
        self._ledger = ledger
        self._now = now
        self._half_life = state.fair_share.half_life_s
        self.short_gpu_s = state.fair_share.short_job_gpu_s
        self._gpu_time = state.gpu_time
        self._history: dict[str, dict[str, float]] = {}
        self._caps: dict[str, dict[str, int]] = {}  # the tree's quota per key: fixed for a cycle

    def history(self, queue: str) -> dict[str, float]:
        """Decayed past holding of ``queue`` per key, in milli-GPU."""
        found = self._history.get(queue)
        if found is None:
            now, half_life = self._now, self._half_life
            held = self._gpu_time.get(queue, {})
            found = self._history[queue] = {k: gpu_time.recent(g, now, half_life) for k, g in held.items()}
        return found

    def share(self, queue: str) -> float:
        """Weighted dominant share: called after every admission, so kept to dict lookups."""
        ledger = self._ledger
        past = self.history(queue)
        used = ledger.usage(queue)
        caps = self._caps.get(queue)
        if caps is None:
            caps = self._caps[queue] = {}
        worst = 0.0
        for key in used.keys() | past.keys():
            cap = caps.get(key)
            if cap is None:
                cap = caps[key] = ledger.capacity(queue, key)
            if cap > 0:
                worst = max(worst, (used.get(key, 0) + past.get(key, 0.0)) / cap)
        return worst / ledger.spec(queue).weight


class Cursor:
    """One queue's pending jobs in order, and how far this cycle has walked them."""

    __slots__ = (
        "name",
        "spec",
        "jobs",
        "pos",
        "blocked",
        "stopped",
        "passes",
        "admitted",
        "room",
        "fixed_room",
        "hold",
    )

    def __init__(self, name: str, spec: QueueSpec, jobs: Sequence[JobState]) -> None:
        self.name = name
        self.spec = spec
        self.jobs = jobs
        self.pos = 0  # jobs before pos were admitted or found not to fit
        self.blocked = False  # strict FIFO: the head at pos does not fit, the rest wait for it
        self.stopped = False  # best effort: looked ``lookahead`` jobs past ones that do not fit
        self.passes = 0  # jobs found not to fit this cycle
        self.admitted: list[int] = []  # positions admitted this cycle
        # Per key, an upper bound on what the queue may still take this cycle: availability only
        # shrinks within a cycle, so a job needing more is known not to fit without a check.
        self.room: dict[str, int] = {}
        # The same for its jobs that may not be preempted, which may not borrow either
        # (``Ledger.available`` without borrowing: within the nominal, beside the others).
        self.fixed_room: dict[str, int] = {}
        self.hold: Hold | None = None  # best effort: quota kept for the first job that did not fit

    @property
    def strict(self) -> bool:
        return self.spec.strategy == "strict-fifo"

    @property
    def head(self) -> JobState:
        return self.jobs[self.pos]


# Jobs ``room`` alone rules out cost a look each, not a check: up to this many a cycle, over all
# queues, are passed without counting against the lookahead, so that a front of jobs that
# cannot fit this cycle (gangs larger than the room; jobs that may not be preempted, in a queue
# whose such jobs fill its nominal) does not hide the jobs behind it that could, while a cycle
# over many deep queues still reads a bounded part of them.
SKIPS = 4096


def _window(jobs: Sequence[JobState], start: int, stop: int, size: int = 64) -> Iterator[JobState]:
    """``jobs[start:stop]``, read ``size`` at a time only as far as the caller goes: one read a
    stretch, not one a job, and not the whole of a long window for a loop that ends early."""
    for lo in range(start, stop, size):
        yield from jobs[lo : min(stop, lo + size)]


class FairShareOrder:
    """A heap of queue heads keyed by fair share; the caller pops a head, decides about it, and
    says what happened (``admitted``, ``passed``) so the queue competes again with its next job."""

    def __init__(
        self,
        waiting: Mapping[str, Sequence[JobState]],
        ledger: Ledger,
        fair: FairShare,
        lookahead: int = 1 << 30,
        in_order: Collection[str] = (),
        now: float = 0.0,
    ) -> None:
        self._ledger = ledger
        self._lookahead = lookahead
        self._free = SKIPS  # jobs ``passed`` may still pass uncounted this cycle
        self._fair = fair
        self._heap: list[tuple[int, bool, float, float, int, int, str, str]] = []
        self.cursors: dict[str, Cursor] = {}
        for name in sorted(waiting):
            jobs = waiting[name]
            if not jobs or not ledger.has_queue(name):
                continue
            spec = ledger.spec(name)
            if name not in in_order or spec.strategy == queueing.SHORTEST_FIRST:
                jobs = list(jobs)  # the whole queue, to sort
                sort_queue(jobs, name in in_order, spec.strategy, now)
            cur = self.cursors[name] = Cursor(name, spec, jobs)
            self.push(cur)

    def push(self, cur: Cursor) -> None:
        if cur.blocked or cur.stopped or cur.pos >= len(cur.jobs):
            return
        job = cur.head
        borrows = self._borrows(cur, job)
        heapq.heappush(
            self._heap,
            (
                borrows,
                not queueing.short(job, self._fair.short_gpu_s),
                self._borrowing_rank(cur, job) if borrows else 0,
                self._fair.share(cur.name),
                -job.priority,
                job.submitted_seq,
                job.id,
                cur.name,
            ),
        )

    def pop(self) -> Cursor | None:
        if not self._heap:
            return None
        return self.cursors[heapq.heappop(self._heap)[-1]]

    def admitted(self, cur: Cursor) -> None:
        cur.admitted.append(cur.pos)
        cur.pos += 1
        self.push(cur)

    def passed(self, cur: Cursor) -> None:
        """The head does not fit: a strict FIFO queue stops here; a best-effort one goes on with
        the next job its ``room`` (``fixed_room`` for a job that may not be preempted) does not
        already rule out (skipped without a heap round each), looking at most ``lookahead`` jobs
        past ones that do not fit per cycle besides those the room ruled out (``SKIPS``), so
        that a cycle over deep, full queues stays cheap; the rest wait for the queue to move."""
        if cur.strict:
            cur.blocked = True
            return
        jobs, room, fixed_room, spec = cur.jobs, cur.room, cur.fixed_room, cur.spec
        may_borrow = self._ledger.may_borrow
        big = 1 << 62
        room_any = room.get(quota.ANY, big)
        fixed_any = min(room_any, fixed_room.get(quota.ANY, big))
        keys_of: dict[tuple[str, ...], tuple[str, ...]] = {}
        start = cur.pos + 1
        budget = max(0, self._lookahead - cur.passes - 1)  # jobs it may still count
        free = self._free
        pos, counted, skipped = start, 0, 0
        for job in _window(jobs, start, start + budget + free):
            if counted == budget:
                break
            job_spec = job.spec
            res = job_spec.resources
            k = kind_of(res.gpus, res.gpu_milli, res.mig)
            if k == "mig" or k == "cpu":
                break  # rare: let the full check decide
            need = res.gpu_milli if k == "fraction" else res.gpus * WHOLE
            need *= job_spec.replicas if job_spec.min_replicas is None else job_spec.min_replicas
            fixed = bool(fixed_room) and not may_borrow(job)
            models = res.gpu_models
            if not models:
                if need <= (fixed_any if fixed else room_any):
                    break
            else:
                keys = keys_of.get(models)
                if keys is None:
                    keys = keys_of[models] = quota.candidate_keys(spec, res)
                if fixed:
                    if any(need <= min(room.get(k, big), fixed_room.get(k, big)) for k in keys):
                        break
                elif any(need <= room.get(k, big) for k in keys):
                    break
            pos += 1
            if skipped < free:
                skipped += 1
            else:
                counted += 1
        cur.passes += counted + 1
        self._free -= skipped
        cur.pos = pos
        if counted == budget and pos < len(jobs):
            cur.stopped = True
        self.push(cur)

    @staticmethod
    def _borrowing_rank(cur: Cursor, job: JobState) -> int:
        """Among borrowers, lower first: minus the head's priority, as Kueue sorts them, but
        under a ``borrow_priority_threshold`` no higher than one above it (``preemption.
        may_borrow_over``: the borrowers it may stop are of at most the threshold), so that over
        one it may not stop a higher priority wins nothing and fair share decides. A queue under
        ``never`` counts its priority whole: ranked after every other (as if it could stop
        none), its borrowers would wait behind theirs at equal priority, whatever the shares, and
        with every job of the default class that is every time. (No one total order puts each
        head before exactly those it may stop.)"""
        policy = cur.spec.preemption
        threshold = policy.borrow_priority_threshold
        if policy.borrow_within_cohort != "lower-priority" or threshold is None:
            return -job.priority
        return -min(job.priority, threshold + 1)

    def _borrows(self, cur: Cursor, job: JobState) -> int:
        """How far up its cohort tree the head would borrow (``Ledger.borrowing_height``) on the key
        it counts against now (``Ledger.key_for``)."""
        ledger = self._ledger
        wanted = ledger.key_for(cur.name, job)
        if wanted is None:
            return 0
        key, need = wanted
        if ledger.used(cur.name, key) + need <= ledger.nominal(cur.name, key):
            return 0  # the common case, without a walk up the tree
        return ledger.borrowing_height(cur.name, key, need)


def pending_order(state: State, now: float) -> list[JobState]:
    """Every queued job in the order admission would consider it if each were admitted in
    turn, each charged to the model admission would charge it to (one a node can host it on).
    Deterministic for a State."""
    ledger = Ledger(state)
    ledger.hosts = Inventory(state).hosts_spec
    fair = FairShare(ledger, state, now)
    for job in indexes.jobs_in(state, *indexes.HOLDS_QUOTA):
        ledger.hold(job)
    waiting = {name: indexes.queued_in(state, name) for name in state.queued_by_queue}
    order = FairShareOrder(waiting, ledger, fair, now=now, in_order=waiting.keys())
    out: list[JobState] = []
    while (cur := order.pop()) is not None:
        job = cur.head
        out.append(job)
        wanted = ledger.key_for(cur.name, job)  # the model it would be admitted on
        if wanted is not None:
            key = wanted[0]
            ledger.charge(cur.name, key, quota.worker_milli(job.spec.resources, key) * job.spec.replicas)
        order.admitted(cur)
    return out
