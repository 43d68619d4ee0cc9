"""Snapshots of a service's State in SQLite, so a restart replays only the tail of the log.

Invariants:

- A snapshot row holds the State (msgpack) and the stream sequence it reflects, written in one
  row of one transaction: the position is never stored apart from the data it describes.
- A snapshot is only an accelerator. Anything doubtful (an undecodable blob, a format other than
  this build's, a sequence that disagrees with its data, a log shorter than the snapshot) is
  ignored and the State is refolded from the log, which is always correct.
- A snapshot file SQLite says is damaged or not a database (truncated, overwritten) is set aside
  (renamed ``<file>.unreadable-<time>``, with a warning) and a new one started: a service that
  stopped on it would stop again at every restart until someone removed it by hand.
- The format is ``FORMAT``, the fold's ``RULES`` and a fingerprint of State's schema. Any change
  to State's shape changes it, so a snapshot taken before a new derived field existed is never
  loaded with that field at its default; a change to what the fold derives (same shape, new
  meaning) is a new ``RULES``, so a snapshot folded under other rules is never loaded either.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
from types import TracebackType

import aiosqlite
import msgspec

from corral.events.log import EventLog
from corral.projections.fold import fold
from corral.projections.rules import RULES
from corral.projections.state import State

FORMAT = 1
KEEP = 3  # the newest few: one bad write still leaves an older snapshot to start from


def _fingerprint() -> str:
    schema = msgspec.json.encode(msgspec.json.schema(State))
    return f"{FORMAT}.{RULES}:{hashlib.sha256(schema).hexdigest()[:16]}"


FORMAT_ID = _fingerprint()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    seq INTEGER PRIMARY KEY,
    format TEXT NOT NULL,
    time REAL NOT NULL,
    state BLOB NOT NULL
)
"""

# The newest few of this build's, and of the build that wrote last before it (the one an upgrade
# rolled back goes back to): a rollback then starts from its own snapshot, not from the log's first
# record. A third build's are let go, so a file holds at most two builds' few. (Two builds'
# snapshots of one log position share its row: the later write takes it, the other build keeps
# its older ones.)
_PRUNE = """
DELETE FROM snapshots WHERE seq NOT IN (
    SELECT seq FROM (
        SELECT seq FROM snapshots WHERE format = :mine ORDER BY seq DESC LIMIT :keep
    )
    UNION
    SELECT seq FROM (
        SELECT seq FROM snapshots WHERE format = (
            SELECT format FROM snapshots WHERE format != :mine ORDER BY seq DESC LIMIT 1
        ) ORDER BY seq DESC LIMIT :keep
    )
)
"""

_decoder = msgspec.msgpack.Decoder(State)
_log = logging.getLogger("corral.snapshot")


class SnapshotStore:
    """Snapshots in one SQLite file (``":memory:"`` for tests). Open with ``await
    SnapshotStore.open(path)``; close with ``await store.close()`` or ``async with``."""

    def __init__(
        self,
        db: aiosqlite.Connection,
        keep: int = KEEP,
        format_id: str = FORMAT_ID,
        stream: str = "",
        path: str = ":memory:",
    ) -> None:
        self._db = db
        self._path = path
        self._keep = keep
        # A snapshot is of one stream: another stream of the same name (recreated, or another
        # cluster's) may be longer than the snapshot and still hold another history.
        self._format = f"{format_id}@{stream}" if stream else format_id

    @classmethod
    async def open(
        cls, path: str, keep: int = KEEP, format_id: str = FORMAT_ID, stream: str = ""
    ) -> SnapshotStore:
        """``stream``: the identity of the stream the snapshots fold (``JetStreamLog.identity``);
        a snapshot of any other is never loaded. A file SQLite cannot read is set aside."""
        try:
            db = await _connect(path)
        except sqlite3.DatabaseError as e:
            if not _unreadable(e):
                raise
            _set_aside(path, e)
            db = await _connect(path)
        return cls(db, keep, format_id, stream, path)

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> SnapshotStore:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def save(self, state: State) -> None:
        # Encode before the first await: the caller may go on folding into ``state`` meanwhile,
        # and the blob and its sequence must describe the same moment.
        seq, time, blob = state.seq, state.time, msgspec.msgpack.encode(state)
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.execute(
                "INSERT OR REPLACE INTO snapshots (seq, format, time, state) VALUES (?, ?, ?, ?)",
                (seq, self._format, time, blob),
            )
            await db.execute(_PRUNE, {"mine": self._format, "keep": self._keep})
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    async def load(self) -> State | None:
        """The newest snapshot this build can read, or None: the caller then folds from seq 1.
        A file SQLite cannot read is set aside, and a new one started."""
        try:
            return await self._newest()
        except sqlite3.DatabaseError as e:
            if self._path == ":memory:" or not _unreadable(e):
                raise
            await self._db.close()
            _set_aside(self._path, e)
            self._db = await _connect(self._path)
            return None

    async def _newest(self) -> State | None:
        async with self._db.execute(
            "SELECT seq, state FROM snapshots WHERE format = ? ORDER BY seq DESC", (self._format,)
        ) as cursor:
            async for seq, blob in cursor:
                try:
                    state = _decoder.decode(blob)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue  # a torn or foreign blob: an older snapshot still helps
                if state.seq == seq:
                    return state
        await self._say_passed_over()
        return None

    async def _say_passed_over(self) -> None:
        """After an upgrade (or a rollback) a replica's file holds only what another build wrote:
        it folds the whole log again, which on a long log takes a while, so it says why."""
        async with self._db.execute(
            "SELECT seq, format FROM snapshots WHERE format != ? ORDER BY seq DESC LIMIT 1", (self._format,)
        ) as cursor:
            row = await cursor.fetchone()
        if row is not None:
            seq, other = row
            _log.warning(
                "snapshot file %s: its newest snapshot (log seq %d) was written by another build or of "
                "another stream (%s; this one reads %s): folding the log from the start",
                self._path,
                seq,
                other,
                self._format,
            )

    async def seqs(self) -> list[int]:
        """Sequences of the stored snapshots, newest first (any format)."""
        async with self._db.execute("SELECT seq FROM snapshots ORDER BY seq DESC") as cursor:
            return [row[0] async for row in cursor]


async def _connect(path: str) -> aiosqlite.Connection:
    # Autocommit mode: every transaction is an explicit BEGIN ... COMMIT.
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA busy_timeout=5000")  # first: another holder waited for, not failed
        if path != ":memory:":
            await db.execute("PRAGMA journal_mode=WAL")
        await db.execute(_SCHEMA)
    except BaseException:
        await db.close()
        raise
    return db


# SQLite's answers that the file is not a database, or a damaged one: what is set aside. A
# locked, full or failing disk is not the file's fault, and its error stands.
_NOT_A_DATABASE = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def _unreadable(e: sqlite3.DatabaseError) -> bool:
    return getattr(e, "sqlite_errorcode", None) in _NOT_A_DATABASE


def _set_aside(path: str, why: Exception) -> None:
    """Rename a snapshot file SQLite cannot read, and its write-ahead log, out of the way."""
    if path == ":memory:":
        raise why
    aside = f"{path}.unreadable-{int(time.time())}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    _log.warning("snapshot file %s unreadable (%s): set aside as %s; folding from the log", path, why, aside)


async def restore(store: SnapshotStore, log: EventLog) -> State:
    """The State at the log's end: the newest usable snapshot, then the tail folded onto it."""
    state = await store.load()
    if state is None or state.seq > await log.last_seq():
        # No snapshot, or one from a longer log than this one (the stream was recreated): the
        # snapshot describes another history, so start over.
        state = State()
    async for batch in log.read(state.seq + 1):
        fold(batch, state)
    return state
