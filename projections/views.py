"""The query view: the State and each job's history as SQLite tables, for the CLI and ``corral
explain``.

Tables: ``jobs`` and ``nodes`` (one row each, as the fold last left them), ``job_events`` (every
record that concerns a job, one row per job it names), and ``meta`` (the stream sequence the view
reflects). One writer keeps a view file up to date with ``update``; any number of readers (other
processes) query it meanwhile.

Invariants:

- ``update`` writes everything of one call in one transaction, the sequence included, so a reader
  sees the view at one position of the log or the one before, never a mix.
- The view is derived. A file of another ``FORMAT`` is dropped and rebuilt from the log, never
  migrated.
- Updates are idempotent: a record seen twice adds no second event row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import aiosqlite
import msgspec

from corral.events.base import Reason
from corral.events.log import Record
from corral.projections.index import JobEvent, gpus_per_worker, job_events, job_ids_of
from corral.projections.state import JobState, NodeState, State

__all__ = ["FORMAT", "JobEvent", "JobRow", "NodeRow", "QueryView", "job_ids_of"]

FORMAT = 1

_TABLES = ("jobs", "nodes", "job_events", "meta")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    queue TEXT NOT NULL,
    name TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    priority_class TEXT NOT NULL,
    replicas INTEGER NOT NULL,
    gpus REAL,
    mig TEXT,
    submitted_seq INTEGER NOT NULL,
    submitted_at REAL NOT NULL,
    phase_since REAL NOT NULL,
    updated_seq INTEGER NOT NULL,
    restarts INTEGER NOT NULL,
    preemptions INTEGER NOT NULL,
    reasons TEXT NOT NULL,
    nodes TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, submitted_seq);
CREATE INDEX IF NOT EXISTS jobs_by_phase ON jobs (phase, submitted_seq);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    condition TEXT NOT NULL,
    cordoned INTEGER NOT NULL,
    draining INTEGER NOT NULL,
    gpu_models TEXT NOT NULL,
    gpus_total INTEGER NOT NULL,
    gpus_free INTEGER NOT NULL,
    gpus_healthy INTEGER NOT NULL,
    cpu_used INTEGER NOT NULL,
    cpu_total INTEGER NOT NULL,
    memory_used INTEGER NOT NULL,
    memory_total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    subject TEXT NOT NULL,
    type TEXT NOT NULL,
    time REAL NOT NULL,
    summary TEXT NOT NULL,
    refused TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class JobRow(msgspec.Struct, frozen=True):
    """One job as the fold last left it. ``gpus`` is per worker (a fraction for a shared GPU,
    None for a MIG instance, then named by ``mig``); ``nodes`` are the current attempt's."""

    id: str
    tenant: str
    queue: str
    name: str
    phase: str
    attempt: int
    priority: int
    priority_class: str
    replicas: int
    gpus: float | None
    mig: str | None
    submitted_seq: int
    submitted_at: float
    phase_since: float
    updated_seq: int
    restarts: int
    preemptions: int
    reasons: tuple[Reason, ...]
    nodes: tuple[str, ...]


class NodeRow(msgspec.Struct, frozen=True):
    """One node. ``gpus_free`` counts healthy GPUs no job holds any share of."""

    name: str
    condition: str
    cordoned: bool
    draining: bool
    gpu_models: tuple[str, ...]
    gpus_total: int
    gpus_free: int
    gpus_healthy: int
    cpu_used: int
    cpu_total: int
    memory_used: int
    memory_total: int


_JOB_COLUMNS = tuple(JobRow.__struct_fields__)
_NODE_COLUMNS = tuple(NodeRow.__struct_fields__)
_EVENT_COLUMNS = tuple(JobEvent.__struct_fields__)
_reasons = msgspec.json.Decoder(tuple[Reason, ...])
_names = msgspec.json.Decoder(tuple[str, ...])
_json = msgspec.json.Encoder()


def _insert(table: str, columns: tuple[str, ...], verb: str = "INSERT OR REPLACE") -> str:
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


_UPSERT_JOB = _insert("jobs", _JOB_COLUMNS)
_UPSERT_NODE = _insert("nodes", _NODE_COLUMNS)
_ADD_EVENT = _insert("job_events", _EVENT_COLUMNS, "INSERT OR IGNORE")
_SET_SEQ = "INSERT OR REPLACE INTO meta (key, value) VALUES ('seq', ?)"


class QueryView:
    """Open with ``await QueryView.open(path)``. ``update`` keeps some in-memory bookkeeping, so a
    view file has one writer at a time; readers may be many."""

    def __init__(self, db: aiosqlite.Connection, seq: int) -> None:
        self._db = db
        self._seq = seq  # the sequence this writer last committed
        self._node_rows: dict[str, tuple[Any, ...]] = {}  # as last written, to skip unchanged

    @classmethod
    async def open(cls, path: str, *, readonly: bool = False) -> QueryView:
        """``readonly`` for a reader such as the CLI: it never creates, migrates or writes."""
        if readonly:
            db = await aiosqlite.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA busy_timeout=5000")
            if not readonly:
                await _prepare(db, path)
            seq = await _meta(db, "seq")
        except BaseException:
            await db.close()
            raise
        return cls(db, seq or 0)

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> QueryView:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- writing ------------------------------------------------------------------------------

    async def update(self, state: State, records: Sequence[Record]) -> None:
        """Bring the view to ``state``, which has folded ``records`` since the last update."""
        last = self._seq
        entries = job_events(state, records)
        named = {e.job_id for e in entries}
        events = [msgspec.structs.astuple(e) for e in entries]
        # Jobs a record names, and jobs the fold changed without naming them (a lost node
        # interrupts every job on it): the fold stamps every change with ``updated_seq``.
        ids = named | {j.id for j in state.jobs.values() if j.updated_seq > last}
        jobs = [_job_row(state.jobs[i]) for i in sorted(ids) if i in state.jobs]
        node_rows = {name: _node_row(n) for name, n in state.nodes.items()}
        nodes = [row for name, row in node_rows.items() if self._node_rows.get(name) != row]
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.executemany(_UPSERT_JOB, jobs)
            await db.executemany(_UPSERT_NODE, nodes)
            await db.executemany(_ADD_EVENT, events)
            await db.execute(_SET_SEQ, (state.seq,))
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        self._seq = state.seq
        self._node_rows = node_rows

    # -- reading ------------------------------------------------------------------------------

    async def jobs(self, tenant: str | None = None, phase: str | None = None) -> list[JobRow]:
        """Jobs in submit order, of one tenant and/or in one phase if given."""
        where, args = [], []
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if phase is not None:
            where.append("phase = ?")
            args.append(phase)
        sql = f"SELECT {', '.join(_JOB_COLUMNS)} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._db.execute_fetchall(sql + " ORDER BY submitted_seq", args)
        return [_to_job(r) for r in rows]

    async def job(self, job_id: str) -> JobRow | None:
        rows = await self._db.execute_fetchall(
            f"SELECT {', '.join(_JOB_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)
        )
        return _to_job(next(iter(rows))) if rows else None

    async def nodes(self) -> list[NodeRow]:
        rows = await self._db.execute_fetchall(f"SELECT {', '.join(_NODE_COLUMNS)} FROM nodes ORDER BY name")
        return [_to_node(r) for r in rows]

    async def job_events(self, job_id: str) -> list[JobEvent]:
        """Everything the log says about one job, oldest first."""
        rows = await self._db.execute_fetchall(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM job_events WHERE job_id = ? ORDER BY seq",
            (job_id,),
        )
        return [JobEvent(*r) for r in rows]

    async def seq(self) -> int:
        """The stream sequence the view reflects, as committed (a reader sees the writer's)."""
        return await _meta(self._db, "seq") or 0


async def _prepare(db: aiosqlite.Connection, path: str) -> None:
    if path != ":memory:":
        await db.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    await db.execute("BEGIN IMMEDIATE")
    try:
        if await _meta(db, "format") not in (None, FORMAT):
            for table in _TABLES:
                await db.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                await db.execute(statement)
        await db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('format', ?)", (FORMAT,))
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise


async def _meta(db: aiosqlite.Connection, key: str) -> int | None:
    try:
        rows = list(await db.execute_fetchall("SELECT value FROM meta WHERE key = ?", (key,)))
    except aiosqlite.OperationalError:
        return None  # no meta table yet
    return int(rows[0][0]) if rows else None


# -- rows -------------------------------------------------------------------------------------


def _job_row(job: JobState) -> tuple[Any, ...]:
    spec = job.spec
    nodes: list[str] = []
    if job.placement is not None:
        for w in sorted(job.placement.workers, key=lambda w: w.rank):
            if w.node not in nodes:
                nodes.append(w.node)
    return (
        job.id,
        job.tenant,
        spec.queue,
        spec.name,
        job.phase,
        job.attempt,
        job.priority,
        spec.priority_class,
        spec.replicas,
        gpus_per_worker(spec.resources),
        spec.resources.mig,
        job.submitted_seq,
        job.submitted_at,
        job.phase_since,
        job.updated_seq,
        job.restarts,
        job.preemptions,
        _json.encode(job.reasons).decode(),
        _json.encode(nodes).decode(),
    )


def _node_row(node: NodeState) -> tuple[Any, ...]:
    models = sorted({g.info.model for g in node.gpus})
    healthy = sum(1 for g in node.gpus if g.healthy)
    free = sum(1 for g in node.gpus if g.healthy and not g.holders)
    inv = node.inventory
    return (
        node.name,
        node.condition,
        int(node.cordoned),
        int(node.draining),
        _json.encode(models).decode(),
        len(node.gpus),
        free,
        healthy,
        node.cpu_used,
        inv.cpu_milli,
        node.memory_used,
        inv.memory_mib,
    )


def _to_job(r: Iterable[Any]) -> JobRow:
    row = list(r)
    row[-2] = _reasons.decode(row[-2])
    row[-1] = _names.decode(row[-1])
    return JobRow(*row)


def _to_node(r: Iterable[Any]) -> NodeRow:
    row = list(r)
    row[2], row[3] = bool(row[2]), bool(row[3])
    row[4] = _names.decode(row[4])
    return NodeRow(*row)
