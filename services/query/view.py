"""The read service's view of jobs: those the state holds, and in SQLite those the fold let go.

The fold lets a finished job go a retention period after it ended (``projections/retention.py``),
so the folded state alone cannot answer ``corral jobs --all`` or ``corral explain`` of an old
job. ``JobView`` folds the log record by record; just before a record that lets jobs go is
folded (``retention.due``), it writes each of them to SQLite as it stood (its row and its
explanation, history included) and forgets its history in memory. Memory then holds the jobs
the state holds; the rest is on disk.

Invariants:

- a job let go is stored once, keyed by its id and the position of its submission: an id the
  fold gave to a later job keeps both, and ``explain`` shows the newest the asker may see (one
  the state still holds before any let go);
- a tenant sees only its own jobs here as in the state: another tenant's job is no job;
- each job's workers as the fold placed them, over all its attempts (``placed``, then stored
  with the job let go), are whose output is the job's (``decide.OutputScope``), on its run's
  subjects, from its submission to the next submission of its id;
- the jobs let go are kept within a bound, oldest let go first: at most ``per_tenant`` of one
  tenant's (its own oldest go), at most ``in_all`` of everyone's (past it, the oldest of the
  tenant that has the most go), so the file stops growing and one tenant's churn pushes out
  its own history, not another's; what each tenant lost is kept as one row (``dropped``: how
  many, the newest position one of them was let go at), which ``explain`` of a job no longer
  kept tells its owner, and no one else; rows of at most ``dropped_kept`` tenants, those that
  lost jobs latest: an older one joins the row of no tenant, whose position is then told to
  every tenant without a row of its own (each name a tenant ever used, one job each, was a row
  for good);
- the view is derived: by default a private temporary SQLite database, gone when the view
  closes, since the read service refolds the log from its start whenever it starts.
"""

from __future__ import annotations

import heapq
import json
import math
import sqlite3
import sys
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.events import subjects
from corral.events.log import Record
from corral.projections import retention
from corral.projections.fold import apply
from corral.projections.index import JobEvent, job_events
from corral.projections.state import JobState, State
from corral.services.query.decide import OutputScope
from corral.services.query.explain import anyone_stoppable, explain, notes_for

if TYPE_CHECKING:
    from corral.services.runtime.metrics import FoldWatch

_SCHEMA = """
CREATE TABLE IF NOT EXISTS let_go (
    id TEXT NOT NULL,
    submitted_seq INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    let_go_seq INTEGER NOT NULL,
    row TEXT NOT NULL,
    explain TEXT NOT NULL,
    PRIMARY KEY (id, submitted_seq)
);
CREATE INDEX IF NOT EXISTS let_go_by_tenant ON let_go (tenant, submitted_seq);
CREATE INDEX IF NOT EXISTS let_go_in_order ON let_go (submitted_seq);
CREATE INDEX IF NOT EXISTS let_go_oldest ON let_go (tenant, let_go_seq, submitted_seq);
CREATE TABLE IF NOT EXISTS let_go_workers (
    id TEXT NOT NULL,
    submitted_seq INTEGER NOT NULL,
    submitted_at REAL NOT NULL,
    workers TEXT NOT NULL,
    PRIMARY KEY (id, submitted_seq)
);
CREATE TABLE IF NOT EXISTS let_go_dropped (
    tenant TEXT PRIMARY KEY,
    jobs INTEGER NOT NULL,
    through_seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS let_go_dropped_oldest ON let_go_dropped (through_seq, tenant);
"""
# The jobs let go that the view keeps, the oldest let go first out. A job let go takes about
# 4.3 kB of the file with a short history, about 120 kB with a full one (``HISTORY_MOST``
# entries, a job that ran for days): at these bounds about 43 MB of one tenant's (1.2 GB if
# every one had a full history), 430 MB in all (12 GB). A cluster letting 100,000 jobs a day go
# keeps about its last day of them, one letting 10,000 a day go its last ten days.
KEPT_PER_TENANT = 10_000
KEPT_IN_ALL = 100_000
Workers = frozenset[tuple[str, int, int]]  # (node, attempt, rank)
HISTORY_FIRST = 64  # a held job's first records, kept in its history whatever follows
HISTORY_MOST = 512  # records kept in a held job's history: its first, then its newest
LEFT_OUT = "LeftOut"  # the type of the history entry that counts the records left out
# Requests about a held job (its submit, a resize, a cancel; taken or refused) kept in its
# history; later ones are counted in one entry where the newest of them is (``REQUESTS_LEFT_OUT``). A
# tenant may send them at will (a submit again, a resize of a waiting job, each refused or
# taken): kept, they made every job's history as long as ``HISTORY_MOST``, in every read
# service, for every job a tenant may hold.
REQUESTS_MOST = 8
REQUESTS_LEFT_OUT = "RequestsLeftOut"
# Requests other than submits that the fold took, newest kept: what tells such a request's verdict
# "applied" from a question about a position where the asker made none. A verdict is asked just
# after the request; one older than every kept is "unknown".
REQUESTS_KEPT = 16_384
# Tenants whose jobs no longer kept are counted in a row of their own (``let_go_dropped``), those
# that lost one latest; the others' are counted in the row of no tenant (``_ANYONE``).
DROPPED_KEPT = 1_024
_ANYONE = ""  # no tenant's name: a name is a token
_REQUEST = subjects.IN + "."
_SUBMIT = ".submit"


class JobView:
    """The folded state, each held job's history, and the jobs let go (SQLite at ``path``; the
    empty path is a private temporary database, ``":memory:"`` one in memory): at most
    ``per_tenant`` of one tenant's and ``in_all`` of everyone's, and the counts of those no
    longer kept of ``dropped_kept`` tenants."""

    def __init__(
        self,
        path: str = "",
        *,
        per_tenant: int = KEPT_PER_TENANT,
        in_all: int = KEPT_IN_ALL,
        dropped_kept: int = DROPPED_KEPT,
    ) -> None:
        if per_tenant < 1 or in_all < 1:
            raise ValueError(f"jobs let go kept: {per_tenant} per tenant, {in_all} in all; at least 1 each")
        self.state = State()
        self.history: dict[str, list[JobEvent]] = {}
        self.left_out: dict[str, int] = {}  # held job -> records left out of its history
        self.requests: dict[str, int] = {}  # held job -> requests about it
        # held job -> the entry of its history counting its later requests, and how many
        self.counting: dict[str, tuple[JobEvent, int]] = {}
        self.placed: dict[str, Workers] = {}  # held job -> every worker the fold placed for it
        self.taken: OrderedDict[int, tuple[str, str]] = OrderedDict()  # seq -> (subject, job id)
        self.taken_from = 0  # every request taken from this position on is in ``taken``
        self.per_tenant, self.in_all, self.dropped_kept = per_tenant, in_all, dropped_kept
        self._dropped_rows = 0  # tenants with a row of ``let_go_dropped`` of their own
        self.db = sqlite3.connect(path)
        self.db.executescript(_SCHEMA)
        # Derived, as the rest: the view is folded from the log's start whenever it opens, and
        # a file given starts empty (kept from a fold before, the jobs it had dropped came and
        # went again, counted twice).
        for table in ("let_go", "let_go_workers", "let_go_dropped"):
            self.db.execute(f"DELETE FROM {table}")  # noqa: S608 - the tables' own names
        # How many each tenant has kept, as jobs come and go, so that neither keeping nor
        # listing counts rows.
        self.kept: Counter[str] = Counter()
        self.kept_total = 0
        self._came: set[str] = set()  # tenants with jobs let go since the last pruning
        # (-kept, tenant) of each tenant as its count last changed, stale ones among them: who
        # holds the most, found without a look at every tenant (``_prune``).
        self._most: list[tuple[int, str]] = []

    def close(self) -> None:
        self.db.close()

    # -- folding --------------------------------------------------------------------------------

    def fold(self, batch: Sequence[Record], watch: FoldWatch | None = None) -> None:
        """Fold ``batch``, keeping what each record says of each job, and the jobs it lets go;
        ``watch`` counts what the fold accepted, for the metrics."""
        state, history = self.state, self.history
        for rec in batch:
            if rec.seq <= state.seq:
                continue  # folded already (a redelivery): the fold takes it no second time
            for job in retention.due(state, rec.seq, rec.time):
                self._keep(job, rec.seq)
            before = state.rejected_total
            seen = watch.before(state, rec) if watch is not None else None
            apply(state, rec)
            if seen:
                watch.after(state, rec, seen)  # type: ignore[union-attr]
            refusals = {rec.seq: state.rejections[-1]} if state.rejected_total > before else {}
            request = not refusals and rec.subject.startswith(_REQUEST) and not rec.subject.endswith(_SUBMIT)
            named = ""
            for e in job_events(state, (rec,), refusals):
                named = e.job_id
                held = state.jobs.get(e.job_id)
                if held is not None:
                    self._note(history.setdefault(e.job_id, []), e)
                    if e.type == "JobsPlaced" and held.placement is not None and not e.refused:
                        self._placed(held.id, held.placement.attempt, held.placement.workers)
            if request:
                self._taken(rec.seq, rec.subject, named)
        self._prune()
        self.db.commit()

    def _taken(self, seq: int, subject: str, job_id: str) -> None:
        taken = self.taken
        taken[seq] = (subject, job_id)
        if len(taken) > REQUESTS_KEPT:
            oldest, _ = taken.popitem(last=False)
            self.taken_from = oldest + 1

    def request(self, seq: int) -> tuple[str, str] | None:
        """The subject of the request (not a submit) the fold took at ``seq``, if it took one, and
        the job it named ("" for the admin's requests of nodes, queues and the like)."""
        return self.taken.get(seq)

    def requests_known_from(self) -> int:
        """The position from which ``request`` knows every request it tells of."""
        return self.taken_from

    def _note(self, events: list[JobEvent], e: JobEvent) -> None:
        """Add ``e`` to a held job's history, which keeps its first ``HISTORY_FIRST`` records and
        its newest, ``HISTORY_MOST`` in all, with one entry in between that counts the records
        left out: a job that runs for weeks, or a client that sends its submit again and again,
        would otherwise grow it, and its ``explain``, without end (the log keeps them all).
        Past ``REQUESTS_MOST`` requests about the job, one entry counts the later ones, standing
        where the newest of them is (each run of them an entry, a tenant that made a service
        answer between two filled the history again)."""
        job_id = e.job_id
        if e.subject.startswith(_REQUEST):
            asked = self.requests[job_id] = self.requests.get(job_id, 0) + 1
            if asked > REQUESTS_MOST:
                run = 1
                old = self.counting.pop(job_id, None)
                if old is not None:  # still in the history: it moves to the newest, one more
                    run += old[1]
                    _remove(events, old[0])
                what = "request" if run == 1 else "requests"
                summary = f"{run} more {what} about it left out of this history (the log has them)"
                e = JobEvent(job_id, e.seq, e.subject, REQUESTS_LEFT_OUT, e.time, summary, e.refused)
                self.counting[job_id] = (e, run)
        if len(events) < HISTORY_MOST:
            events.append(e)
            return
        # The record left out is the first past those kept first (once the count stands there,
        # the one after it); the count stands in its place, with its position and time. The
        # first time, two are left out: one for ``e``, one for the count itself.
        was = left = self.left_out.get(job_id, 0)
        for _ in range(1 if was else 2):
            gone = events.pop(HISTORY_FIRST + (was > 0))
            counting = self.counting.get(job_id)
            if counting is not None and counting[0] is gone:  # the requests it counted go too
                left += self.counting.pop(job_id)[1]
            else:
                left += 1
        self.left_out[job_id] = left
        records = "record" if left == 1 else "records"
        summary = f"{left} {records} about it left out of this history (the log has them)"
        events[HISTORY_FIRST : HISTORY_FIRST + (was > 0)] = [
            JobEvent(job_id, gone.seq, "", LEFT_OUT, gone.time, summary, "")
        ]
        events.append(e)

    def _placed(self, job_id: str, attempt: int, workers: Sequence[Any]) -> None:
        had = self.placed.get(job_id, frozenset())
        new = {(w.node, attempt, w.rank) for w in workers}
        if not new <= had:
            self.placed[job_id] = had | new

    def _keep(self, job: JobState, seq: int) -> None:
        self.left_out.pop(job.id, None)
        self.requests.pop(job.id, None)
        self.counting.pop(job.id, None)
        # Kept once for its owner and the admin alike: its reasons name as data only jobs of its
        # owner's, as their messages do.
        report = explain(job, self.history.pop(job.id, ()), jobs=self.state.jobs)
        report["text"] += f"\n  let go from the cluster's state at seq {seq}: it is kept here only"
        self.kept[job.tenant] += 1
        self.kept_total += 1
        self._came.add(job.tenant)
        self.db.execute(
            "INSERT OR REPLACE INTO let_go VALUES (?, ?, ?, ?, ?, ?)",
            (job.id, job.submitted_seq, job.tenant, seq, json.dumps(report["job"]), json.dumps(report)),
        )
        workers = sorted(self.placed.pop(job.id, frozenset()))
        self.db.execute(
            "INSERT OR REPLACE INTO let_go_workers VALUES (?, ?, ?, ?)",
            (job.id, job.submitted_seq, job.submitted_at, json.dumps(workers)),
        )

    def _prune(self) -> None:
        """Let the oldest jobs let go out of the view, past ``per_tenant`` of a tenant's (its
        own), then past ``in_all`` (the oldest of whoever has the most, one at a time, ties by
        name, so every replica drops alike): once a batch, each tenant's by its index, in as
        many lookups as jobs go, never a count or a scan of the table."""
        over = {
            t: self.kept[t] - self.per_tenant for t in sorted(self._came) if self.kept[t] > self.per_tenant
        }
        most = self._most
        for t in self._came:  # their counts moved: as they stand once their own oldest go
            heapq.heappush(most, (-(self.kept[t] - over.get(t, 0)), t))
        self._came.clear()
        excess = self.kept_total - sum(over.values()) - self.in_all
        for _ in range(excess):
            n, t = heapq.heappop(most)
            while n == 0 or -n != self.kept[t] - over.get(t, 0):  # one that no longer stands
                n, t = heapq.heappop(most)
            over[t] = over.get(t, 0) + 1
            heapq.heappush(most, (n + 1, t))
        for tenant in sorted(over):
            self._drop(tenant, over[tenant])
        if len(most) > 2 * len(self.kept) + 1024:  # mostly entries that no longer stand
            self._most = [(-n, t) for t, n in self.kept.items()]
            heapq.heapify(self._most)

    def _drop(self, tenant: str, n: int) -> None:
        """Let ``tenant``'s ``n`` oldest jobs let go out of the view, and note how far they reach."""
        gone = self.db.execute(
            "SELECT rowid, id, submitted_seq, let_go_seq FROM let_go WHERE tenant = ?"
            " ORDER BY let_go_seq, submitted_seq LIMIT ?",
            (tenant, n),
        ).fetchall()
        if not gone:
            return
        self.db.executemany("DELETE FROM let_go WHERE rowid = ?", [(r[0],) for r in gone])
        self.db.executemany(
            "DELETE FROM let_go_workers WHERE id = ? AND submitted_seq = ?", [(r[1], r[2]) for r in gone]
        )
        had = self.db.execute("SELECT 1 FROM let_go_dropped WHERE tenant = ?", (tenant,)).fetchone()
        self._count_dropped(tenant, len(gone), gone[-1][3])
        if had is None:
            self._dropped_rows += 1
            if self._dropped_rows > self.dropped_kept:
                # The tenant that lost a job longest ago joins no tenant's row: with no login,
                # any name is a tenant, and one job under each new name let go past ``in_all``
                # was a row each, for good.
                oldest = self.db.execute(
                    "SELECT tenant, jobs, through_seq FROM let_go_dropped WHERE tenant != ?"
                    " ORDER BY through_seq, tenant LIMIT 1",
                    (_ANYONE,),
                ).fetchone()
                self.db.execute("DELETE FROM let_go_dropped WHERE tenant = ?", (oldest[0],))
                self._count_dropped(_ANYONE, oldest[1], oldest[2])
                self._dropped_rows -= 1
        self.kept[tenant] -= len(gone)
        self.kept_total -= len(gone)
        if self.kept[tenant] <= 0:
            del self.kept[tenant]

    def _count_dropped(self, tenant: str, jobs: int, through: int) -> None:
        self.db.execute(
            "INSERT INTO let_go_dropped VALUES (?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET"
            " jobs = jobs + excluded.jobs, through_seq = max(through_seq, excluded.through_seq)",
            (tenant, jobs, through),
        )

    # -- reading --------------------------------------------------------------------------------

    def dropped(self, asker: str) -> tuple[int, int] | None:
        """How many of ``asker``'s jobs let go (the admin's: anyone's) the view no longer keeps,
        and the newest position one of them was let go at; None if none. A tenant without a
        row of its own may have lost some counted in no tenant's: 0 jobs (how many is not
        known) at least as far as that row goes."""
        if asker == subjects.ADMIN:
            jobs, through = self.db.execute(
                "SELECT sum(jobs), max(through_seq) FROM let_go_dropped"
            ).fetchone()
            return None if not jobs else (int(jobs), int(through))
        rows = dict(
            (tenant, (jobs, through))
            for tenant, jobs, through in self.db.execute(
                "SELECT tenant, jobs, through_seq FROM let_go_dropped WHERE tenant IN (?, ?)",
                (asker, _ANYONE),
            )
        )
        own, anyone = rows.get(asker), rows.get(_ANYONE)
        if own is None and anyone is None:
            return None
        jobs = own[0] if own is not None else 0
        return jobs, max(int(r[1]) for r in (own, anyone) if r is not None)

    def jobs(self, asker: str, limit: int, budget: int) -> tuple[list[dict[str, Any]], int]:
        """The rows of the newest jobs let go that ``asker`` may see, at most ``limit`` of them
        and ``budget`` bytes of them as stored, oldest first; and how many more there are. Read
        newest first and no further than the budget: what a tenant made its rows weigh (a long
        command line) costs one answer its size, never more."""
        where, args = ("", ()) if asker == subjects.ADMIN else ("WHERE tenant = ?", (asker,))
        total = self.kept_total if asker == subjects.ADMIN else self.kept[asker]
        rows: list[str] = []
        size = 0
        for (row,) in self.db.execute(
            f"SELECT row FROM let_go {where} ORDER BY submitted_seq DESC LIMIT ?",
            (*args, max(0, limit)),
        ):
            size += len(row)
            if size > budget:
                break
            rows.append(row)
        return [json.loads(r) for r in reversed(rows)], max(0, total - len(rows))

    def explain(self, job_id: str, asker: str) -> dict[str, Any] | None:
        """The explanation of the newest job let go of id ``job_id`` that ``asker`` may see."""
        where, args = ("", ()) if asker == subjects.ADMIN else (" AND tenant = ?", (asker,))
        found = self.db.execute(
            f"SELECT explain FROM let_go WHERE id = ?{where} ORDER BY submitted_seq DESC LIMIT 1",
            (job_id, *args),
        ).fetchone()
        return None if found is None else dict(json.loads(found[0]))

    def submitted(self, job_id: str, seq: int, asker: str) -> dict[str, Any] | None:
        """The row of the job let go that the submit at ``seq`` made, if ``asker`` may see it."""
        where, args = ("", ()) if asker == subjects.ADMIN else (" AND tenant = ?", (asker,))
        found = self.db.execute(
            f"SELECT row FROM let_go WHERE id = ? AND submitted_seq = ?{where}", (job_id, seq, *args)
        ).fetchone()
        return None if found is None else dict(json.loads(found[0]))

    def output_scope(self, job_id: str, asker: str) -> OutputScope | None:
        """Whose output is that of the newest job let go of id ``job_id`` that ``asker`` may see,
        up to the next submission of its id (let go too, or held by the state)."""
        where, args = ("", ()) if asker == subjects.ADMIN else (" AND l.tenant = ?", (asker,))
        found = self.db.execute(
            "SELECT w.submitted_seq, w.submitted_at, w.workers FROM let_go l JOIN let_go_workers w"
            f" USING (id, submitted_seq) WHERE l.id = ?{where} ORDER BY l.submitted_seq DESC LIMIT 1",
            (job_id, *args),
        ).fetchone()
        if found is None:
            return None
        seq, since, workers = found
        (later,) = self.db.execute(
            "SELECT min(submitted_at) FROM let_go_workers WHERE id = ? AND submitted_seq > ?", (job_id, seq)
        ).fetchone()
        held = self.state.jobs.get(job_id)
        until = [t for t in (later, held.submitted_at if held is not None else None) if t is not None]
        scope = frozenset((str(n), int(a), int(r)) for n, a, r in json.loads(workers))
        return OutputScope(scope, int(seq), since, min(until, default=math.inf))


def explain_log(records: Sequence[Record], job_id: str, tenant: str | None) -> dict[str, Any] | None:
    """``corral explain`` from the log alone: the newest job of id ``job_id`` that ``tenant``
    (None: anyone's) may see, held by the state at the end or let go before: every job let go
    kept, as the log keeps them."""
    view = JobView(":memory:", per_tenant=sys.maxsize, in_all=sys.maxsize)
    try:
        view.fold(records)
        asker = subjects.ADMIN if tenant is None else tenant
        job = view.state.jobs.get(job_id)
        if job is not None and asker in (subjects.ADMIN, job.tenant):
            notes = notes_for(view.state, job, asker)
            stoppable = anyone_stoppable(view.state, job)
            history = view.history.get(job_id, ())
            return explain(job, history, None, notes, stoppable, view.state.jobs, asker)
        return view.explain(job_id, asker)
    finally:
        view.close()


def _remove(events: list[JobEvent], entry: JobEvent) -> None:
    """Take ``entry`` itself out of ``events``, looking from the newest (where it mostly is)."""
    for i in range(len(events) - 1, -1, -1):
        if events[i] is entry:
            del events[i]
            return
