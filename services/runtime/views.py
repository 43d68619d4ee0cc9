"""Where node views live: the JetStream key-value bucket ``corral_assignments``, one key per node.

The assignments service writes a node's ``NodeView`` (``projections/assignments.py``) under the
node's name whenever it changes; the node's agent reads its own key and no other. The log stays
the truth: the bucket is derived, keeps one value per key (no history) and can be rebuilt from the
log at any time (a restarted assignments service rewrites every key).

How an agent watches without being able to read other nodes' keys: a JetStream KV watch is a
consumer whose create request names its filter only in its payload, which NATS permissions cannot
look into. So an agent subscribes, on core NATS, to its key's own subject
(``$KV.corral_assignments.<node>``: every put is a message there, heard by plain subscribers as
the stream stores it) and reads the key's last value with a direct get on a subject that names the
key (``$JS.API.DIRECT.GET.KV_corral_assignments.$KV.corral_assignments.<node>``); both can be
allowed per node. Each view carries the log position it was computed at, so the agent keeps the
newest whatever order a get and a message arrive in, and it reads the key again every
``refresh`` seconds and after a reconnect, so a message missed while disconnected is not missed
for long.

A view larger than one message may carry (a node of many jobs, each with a large environment)
is stored in parts: its pieces of ``PART_BYTES`` under ``<node>.part-<i>``, written first, then
under ``<node>`` a note naming how many there are and the whole's SHA-256 (``PARTS``). The agent
reads the parts by direct get (allowed on ``<node>.>``) and keeps the view only when the digest
matches: parts of two views written one over the other read as no view, and the next note
brings the newer one whole. Parts a smaller view no longer names are purged once its note or
value is written, so a node whose view was once large does not keep its old pieces for good.

Every write is conditional on the key being where this writer last saw it (its revision, read
before its first write there): a write another writer's followed, whatever its delay, is
refused (``Superseded``), never stored over the newer view. A replica of the assignments service
cut off with a write in flight (a network stall, a VM paused) loses its lease, the replica that
takes it over writes every key, and the late write then arrives as it was sent: a plain put
stored it over the newer view, and an agent starting then read a job that had moved away as
still its node's, and started it beside its new ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec
from nats import errors as nats_errors
from nats.js import errors as kv_errors

from corral.events.jetstream import answered
from corral.events.log import LogError
from corral.projections.assignments import NodeView, decode
from corral.services.runtime import buckets

log = logging.getLogger("corral.views")

BUCKET = "corral_assignments"
STREAM = f"KV_{BUCKET}"
REFRESH = 30.0  # seconds between an agent's reads of its key, besides the messages it hears


# Pieces of a view stored in parts: well under NATS's default 1 MiB message, headers and all.
PART_BYTES = 512 * 1024
PARTS = b"corral-view-parts "  # a note that the view is in parts, then its JSON


def key_subject(node: str) -> str:
    """The subject a node's key is stored on (and heard on)."""
    return f"$KV.{BUCKET}.{node}"


def part_key(node: str, i: int) -> str:
    return f"{node}.part-{i}"


def direct_get_subject(node: str) -> str:
    """The direct get of a node's key's last value, its key in the subject."""
    return f"$JS.API.DIRECT.GET.{STREAM}.{key_subject(node)}"


def parts_subject(node: str) -> str:
    """The direct gets of a node's view's parts (``part_key``)."""
    return f"{direct_get_subject(node)}.>"


def split(value: bytes) -> tuple[list[bytes], bytes]:
    """A view too large for one message as its parts, and the note stored under the node's key."""
    pieces = [value[i : i + PART_BYTES] for i in range(0, len(value), PART_BYTES)]
    note = PARTS + json.dumps({"parts": len(pieces), "sha256": hashlib.sha256(value).hexdigest()}).encode()
    return pieces, note


def parts_of(raw: bytes) -> tuple[int, str] | None:
    """(how many parts, the whole's SHA-256) if ``raw`` is a note of a view in parts, else None."""
    if not raw.startswith(PARTS):
        return None
    try:
        note = json.loads(raw[len(PARTS) :])
        n, digest = int(note["parts"]), str(note["sha256"])
    except (ValueError, KeyError, TypeError):
        return None
    return (n, digest) if 0 < n <= 1024 else None


class ViewStore(Protocol):
    """Where the assignments service writes node views."""

    async def put(self, node: str, value: bytes) -> None: ...

    async def remove(self, node: str) -> None:
        """Purge ``node``'s key and its view's parts, and keep nothing in memory about them (a
        node deleted from the cluster)."""
        ...

    async def nodes(self) -> set[str]:
        """The nodes with a key in the store: what a writer that takes over reconciles with."""
        ...


class NodeViews(Protocol):
    """Where an agent reads its node's view."""

    def watch(self, node: str) -> AsyncIterator[NodeView]:
        """The node's current view (once there is one), then each newer one."""
        ...


async def ensure_bucket(nc: Any, replicas: int = 1) -> None:
    """Create the views' bucket if it is missing, with ``replicas`` (the log's), or bring it to
    them (whoever sets the corral up, as for the leases' bucket: the services write it, the
    agents read it, nobody else makes it)."""
    await buckets.ensure(nc.jetstream(), BUCKET, replicas, history=1, direct=True)


class Superseded(Exception):
    """A write refused: another writer wrote the key since this one last saw it there."""


class KvViewStore:
    """The bucket, as the assignments service writes it."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        # Per key, its revision as this writer last wrote or read it: the condition of its next
        # write there. Not known (never read, or refused): read again before writing.
        self._revisions: dict[str, int] = {}
        self._parts: dict[str, int] = {}  # per node, how many parts its stored view has
        # ... and how many the bucket's keys named when last listed (``nodes``): parts no note
        # names any more (a writer stopped between them and its note, or a purge of a note whose
        # read failed) are purged with their node's key all the same.
        self._listed_parts: dict[str, int] = {}

    @classmethod
    async def open(cls, nc: Any) -> KvViewStore:
        return cls(await answered(lambda: nc.jetstream().key_value(BUCKET)))

    async def put(self, node: str, value: bytes) -> None:
        before = self._parts.get(node)
        if before is None:  # first written by this store: the bucket's note says (a restart)
            before = await self._stored_parts(node)
        if len(value) <= PART_BYTES:
            await self._write(node, value)
            now = 0
        else:
            pieces, note = split(value)
            for i, piece in enumerate(pieces):  # the parts before the note that names them
                await self._write(part_key(node, i), piece)
            await self._write(node, note)
            now = len(pieces)
        for i in range(now, before):  # named by no note now
            await self._purge(part_key(node, i))
        self._parts[node] = now

    async def _write(self, key: str, value: bytes) -> None:
        """Write ``key`` if no other writer has since this one last saw it (``Superseded``)."""
        last = self._revisions.pop(key, None)
        if last is None:
            last = await self._revision(key)
        try:
            self._revisions[key] = await self.kv.update(key, value, last=last)
        except kv_errors.KeyWrongLastSequenceError as e:
            raise Superseded(f"{key}: written by another writer since revision {last}") from e

    async def _revision(self, key: str) -> int:
        """The key's revision now: its last value's, or its purge marker's; 0 if never written."""
        try:
            return int((await self.kv.get(key)).revision)
        except kv_errors.KeyNotFoundError as e:  # none, or purged (the marker is the entry)
            return int(e.entry.revision) if e.entry is not None else 0

    async def _purge(self, key: str, strict: bool = False) -> None:
        """Purge ``key``; its revision is then the marker's, read before the next write."""
        self._revisions.pop(key, None)
        if strict:
            await self.kv.purge(key)
        else:
            with contextlib.suppress(nats_errors.Error):
                await self.kv.purge(key)

    async def remove(self, node: str) -> None:
        # Purged, not deleted: the key's last value goes, and what stays of it is one marker
        # without a value (a purge replaces the key's history; the bucket keeps one), which
        # reads as no key. The parts first, so that no note is left naming parts gone.
        parts = self._parts.get(node)
        if parts is None:
            parts = await self._stored_parts(node, strict=True)
        for i in range(max(parts, self._listed_parts.get(node, 0))):
            await self._purge(part_key(node, i), strict=True)
        await self._purge(node, strict=True)
        self._parts.pop(node, None)
        self._listed_parts.pop(node, None)

    async def nodes(self) -> set[str]:
        try:
            keys = await self.kv.keys()
        except kv_errors.NoKeysError:
            keys = []
        self._listed_parts = {}
        for key in keys:
            node, _, part = key.partition(".part-")
            if part.isdigit():
                self._listed_parts[node] = max(self._listed_parts.get(node, 0), int(part) + 1)
        return {key.split(".", 1)[0] for key in keys}

    async def _stored_parts(self, node: str, strict: bool = False) -> int:
        """How many parts the key's note names (0: a whole view, or none). ``strict``: a key
        that cannot be read now raises, rather than reading as one of no parts."""
        try:
            entry = await self.kv.get(node)
        except (kv_errors.KeyNotFoundError, kv_errors.KeyDeletedError) as e:  # none, or purged
            self._revisions[node] = int(e.entry.revision) if getattr(e, "entry", None) is not None else 0
            return 0
        except nats_errors.Error:  # not readable now
            if strict:
                raise
            return 0
        self._revisions[node] = int(entry.revision)  # read here, the condition of the next write
        found = parts_of(entry.value or b"")
        return 0 if found is None else found[0]


class KvNodeViews:
    """The bucket, as one node's agent reads it (its own key, nothing else)."""

    def __init__(self, nc: Any, refresh: float = REFRESH, timeout: float = 5.0) -> None:
        self.nc = nc
        self.refresh = refresh
        self.timeout = timeout

    async def get(self, node: str) -> NodeView | None:
        """The key's last value; None when it has none yet (or the server did not answer)."""
        try:
            msg = await self.nc.request(direct_get_subject(node), b"", timeout=self.timeout)
        except (nats_errors.Error, TimeoutError) as e:
            log.warning("%s: view not read: %s", node, e)
            return None
        headers = msg.headers or {}
        if headers.get("Status"):  # 404: nothing written yet
            return None
        return await self._resolved(node, msg.data)

    async def _resolved(self, node: str, raw: bytes) -> NodeView | None:
        """The view ``raw`` is, or the one it names the parts of (None where they do not add up
        to the digest: another view's were written over them meanwhile). A key purged (no
        value) is a node the cluster no longer has: a view of nothing (``gone``)."""
        if not raw:
            return gone(node)
        parts = parts_of(raw)
        if parts is None:
            return _decoded(node, raw)
        n, digest = parts
        pieces = []
        for i in range(n):
            subject = f"$JS.API.DIRECT.GET.{STREAM}.{key_subject(part_key(node, i))}"
            try:
                msg = await self.nc.request(subject, b"", timeout=self.timeout)
            except (nats_errors.Error, TimeoutError) as e:
                log.warning("%s: part %d of its view not read: %s", node, i, e)
                return None
            if (msg.headers or {}).get("Status"):
                return None
            pieces.append(msg.data)
        whole = b"".join(pieces)
        if hashlib.sha256(whole).hexdigest() != digest:
            log.info("%s: the parts of its view changed as they were read; waiting for the next", node)
            return None
        return _decoded(node, whole)

    async def watch(self, node: str) -> AsyncIterator[NodeView]:
        heard: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(msg: Any) -> None:
            heard.put_nowait(msg.data)

        sub = await self.nc.subscribe(key_subject(node), cb=on_message)
        newest = -1
        was_gone = False  # the last view yielded said the node is gone (it has no log position)
        try:
            while True:
                if getattr(self.nc, "lost", None) is not None and self.nc.lost.is_set():
                    # It gave up reconnecting: no view will come again. End, for the agent's
                    # supervisor to start it anew, rather than act on a view that stopped.
                    raise LogError(f"{node}: lost the connection to NATS for good")
                found = await self.get(node)  # after subscribing: nothing falls in between
                while True:
                    if found is not None and (found.seq > newest or _is_gone(found) and not was_gone):
                        newest = max(newest, found.seq)
                        was_gone = _is_gone(found)
                        yield found
                    try:
                        raw = await asyncio.wait_for(heard.get(), self.refresh)
                    except TimeoutError:
                        break  # read the key again: a message may have been missed
                    found = await self._resolved(node, raw)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def gone(node: str) -> NodeView:
    """What a purged key says to its agent: the cluster no longer has the node (deleted, perhaps
    while the agent was cut off and its jobs went elsewhere), so nothing runs there. Its workers
    stop, as the view of a lost node's would have stopped them: kept running on the view the
    agent had, they ran beside the ranks placed anew elsewhere for as long as the agent lived."""
    return NodeView(node)


def _is_gone(view: NodeView) -> bool:
    return view.seq == 0 and view.inventory is None and not view.jobs


class MemoryViews:
    """Node views kept in memory: the bucket's stand-in where there is no NATS (unit tests, one
    process), both sides of it."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.purged: set[str] = set()  # keys purged: the bucket keeps a marker of no value
        self.puts = 0
        self._changed = asyncio.Condition()

    async def put(self, node: str, value: bytes) -> None:
        async with self._changed:
            self.values[node] = value
            self.purged.discard(node)
            self.puts += 1
            self._changed.notify_all()

    async def remove(self, node: str) -> None:
        async with self._changed:
            if self.values.pop(node, None) is not None:
                self.purged.add(node)
            self._changed.notify_all()

    async def nodes(self) -> set[str]:
        return set(self.values)

    def get(self, node: str) -> NodeView | None:
        raw = self.values.get(node)
        if raw is None:
            return gone(node) if node in self.purged else None
        return _decoded(node, raw)

    async def watch(self, node: str) -> AsyncIterator[NodeView]:
        newest = -1
        was_gone = False

        def newer() -> bool:
            v = self.get(node)
            return v is not None and (v.seq > newest or _is_gone(v) and not was_gone)

        while True:
            async with self._changed:
                await self._changed.wait_for(newer)
                view = self.get(node)
            assert view is not None
            newest = max(newest, view.seq)
            was_gone = _is_gone(view)
            yield view


def _decoded(node: str, raw: bytes) -> NodeView | None:
    try:
        view = decode(raw)
    except msgspec.DecodeError as e:
        log.error("%s: unreadable view: %s", node, e)
        return None
    return view if view.node == node else None
