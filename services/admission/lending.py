"""Lending holds: what of its nominal quota a queue keeps from being lent to other queues'
jobs during one admission cycle, for its own first waiting job (``decide.py`` says when)."""

from __future__ import annotations

from collections.abc import Mapping

from corral.events.queues import QueueSpec
from corral.projections.holds import Hold, QuotaHolders, hold
from corral.projections.quota import Ledger
from corral.services.admission.backlog import Backlog


def kept(ledger: Ledger, queue: str, spec: QueueSpec, found: Hold) -> int:
    """What of its nominal quota a queue keeps from being lent for its held job: the whole ask
    when the job would be within the nominal now (for any reclaim policy: borrowers are not
    admitted into quota the preemptor is about to take back); when the queue's own jobs must
    end first, what of the nominal is free now, unless ``reclaim_within_cohort`` is ``any``
    and the queue can take back whatever it lends meanwhile (Kueue's reservation for a lender
    that cannot be sure to reclaim)."""
    free = ledger.nominal(queue, found.key) - ledger.used(queue, found.key)
    if found.need <= free:
        return found.need
    if spec.preemption.reclaim_within_cohort == "any":
        return 0
    return max(0, free)


class LendingHolds:
    """Queues' lending holds this cycle: what a queue may still take of a key is what the ledger
    says with every other queue's hold charged, as if its held job were admitted (a queue's own
    hold is ``Hold.spare``'s, which lets jobs that end in time go first). Kept as a copy of the
    ledger with every hold charged, charged as the ledger is, so that the question costs a look
    and not a charge and a refund per hold (quadratic in queues over a cycle). The ledger's
    figures depend on what each queue holds, not on the order of the charges: the copy less a
    queue's own hold is the ledger with the others'."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.held: Ledger | None = None  # made at the first hold
        self.own: dict[tuple[str, str], int] = {}
        self.kept_for: dict[str, str] = {}  # queue -> the job its hold is for
        self.by_job: dict[str, tuple[str, str, int]] = {}  # job -> (queue, key, milli) kept for it

    def keep_for_heads(
        self,
        waiting: Mapping[str, Backlog],
        holders: QuotaHolders,
        now: float,
    ) -> None:
        """Before anyone is admitted, the holds of the queues' first waiting jobs: of one that
        does not fit as things are, as ``kept`` says; of one that fits within its queue's free
        nominal, its minimum. In whatever order the cycle takes the queues, a borrower is not
        admitted into what a lender keeps for its own job (an elastic job admitted at its most
        workers would otherwise borrow the nominal another queue's first job fits in, and that
        queue would then have to take it back by stopping it). A hold is let go once its job is
        admitted (``admitted``)."""
        ledger = self.ledger
        for name in sorted(waiting):
            backlog = waiting[name]
            if not backlog or not ledger.has_queue(name):
                continue
            head = backlog[0]
            wanted = ledger.key_for(name, head)
            if wanted is None:
                continue
            key, need = wanted
            if ledger.fits(name, key, need, not ledger.held_fixed(head)):
                if 0 < need <= ledger.nominal(name, key) - ledger.used(name, key):
                    self.keep(name, head.id, Hold(head.id, key, need, now))
                continue
            found = hold(ledger, name, head, holders, now)
            if found is not None:
                self.keep(name, head.id, found)

    def keep(self, queue: str, job_id: str, found: Hold) -> None:
        """Hold for ``queue``'s job ``job_id`` what of its nominal it keeps from being lent
        (``kept``), once per job."""
        if self.kept_for.get(queue) == job_id:
            return
        self.kept_for[queue] = job_id
        milli = kept(self.ledger, queue, self.ledger.spec(queue), found)
        if milli:
            self.add(queue, found.key, milli)
            self.by_job[job_id] = (queue, found.key, milli)

    def admitted(self, job_id: str) -> None:
        """``job_id`` is admitted and charged: what was kept for it is let go, or its queue
        would count it twice for everyone else."""
        kept_for = self.by_job.pop(job_id, None)
        if kept_for is None:
            return
        queue, key, milli = kept_for
        if self.kept_for.get(queue) == job_id:
            del self.kept_for[queue]
        self.add(queue, key, -milli)

    def add(self, queue: str, key: str, milli: int) -> None:
        if self.held is None:
            self.held = self.ledger.copy()
        self.held.charge(queue, key, milli)
        self.own[queue, key] = self.own.get((queue, key), 0) + milli

    def charge(self, queue: str, key: str, milli: int, fixed: bool = False) -> None:
        """Charge an admission (``fixed``: of a job that may not be preempted) to the ledger and
        to the copy with the holds."""
        self.ledger.charge(queue, key, milli, fixed)
        if self.held is not None:
            self.held.charge(queue, key, milli, fixed)

    def available(self, queue: str, key: str, borrow: bool = True) -> int:
        held = self.held
        if held is None:
            return self.ledger.available(queue, key, borrow)
        own = self.own.get((queue, key), 0)
        if own:
            held.charge(queue, key, -own)
        avail = held.available(queue, key, borrow)
        if own:
            held.charge(queue, key, own)
        return avail
