"""Ships what this node's workers print to the ``corral_output`` stream, so that ``corral logs``
and the Python client read it from any machine (``runtime/output.py``: subjects, limits).

Workers write to their files (``worker.log_path``: one per worker, in its job's run, stdout and
stderr together, in the order written), which outlive the agent as the workers do; a
``Shipper`` reads what each file gained since it last looked and publishes it as whole lines.
The files stay the truth on the node; the stream is a bounded copy of their newest output.
What a worker prints reaches readers as:

- text: bytes that are not UTF-8 become U+FFFD, and control characters (terminal escapes, a
  carriage return that would overwrite what a reader sees) are shown as ``\\x1b``, never sent
  to a reader's terminal;
- lines of at most ``MAX_LINE`` bytes: the rest of a longer one is dropped, with a mark saying
  so; a line still unfinished when its file stops growing is shipped as it stands;
- the newest output, when a worker prints faster than it can be shipped: at most
  ``MAX_BACKLOG`` bytes behind its file, with a mark saying how much was skipped. The stream's
  limits then bound what the server keeps (``runtime/output.py``).

A restarted agent resumes each file where the newest message of its subject says it reached
(``OutputSink.shipped``); a file older than the stream keeps anything and not yet shipped is
not shipped now.

The shipper lists the node's files once, when it starts (``walk``: the workers an earlier agent
left, running or ended while no agent watched); after that it reads only the files of the
workers the agent says it runs (``expect``, ``live``) and those not yet shipped whole, and lets
go of an ended worker's file once all of it went out. What a pass costs and what the shipper
holds is so that of the node's recent workers, not of all it ran in months.

While a file is read, the disk under all but its newest ``FILE_KEEP`` bytes is given back
(``holes``: a hole punched from its start, in ``FREE_STEP``s), or one worker printing in a loop
would fill the node's disk and take down every job there. The file's size and every offset stay,
so the worker appends on undisturbed and the stream's offsets hold; the shipper never reads what
was freed, being at most ``MAX_BACKLOG`` behind; so a file not read yet (the server away before the
stream said where it stands) is freed too. A filesystem that cannot punch is said once in
the agent's log, and its files grow as they did.

An ended worker's file is deleted, and its run's and job's directories once empty, when it has
been untouched for longer than the stream keeps anything (``MAX_AGE``): the old ones the start-up
listing meets (those older agents left directly under their job too, never shipped), and those
let go since, remembered with their time, at a look at every file once they are due
(``DELETE_AT_ONCE`` a look). The file of a worker the agent runs (``live``,
``expect``) is never deleted; without ``live`` the shipper cannot tell, and deletes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.services.agent import holes
from corral.services.agent.worker import LOG_FILE, RUN
from corral.services.runtime.output import MAX_AGE, MAX_LINE, MAX_MESSAGE, safe_text, subject

log = logging.getLogger(__name__)

EVERY = 0.25  # seconds between looks at the files that are being written
# Every ``SCAN_EVERY`` seconds the look is at every file being read (quiet ones that grew again)
# and at the files of the workers the agent runs that are not read yet; in between, only at
# those that grew within ``QUIET_S``. None of these lists the node's directories: a node keeps
# the file of every worker it ran in the last week, and a list of them all every 2 s cost 2 s
# of the agent's loop after a month of short jobs.
SCAN_EVERY = 2.0
QUIET_S = 10.0
# Files let go are remembered, the newest of them, so that a look soon after (an exit's drain
# tried again, a worker the runtime lists until the log holds its exit) does not ask the stream
# about them anew; past that it would ask once, and find them shipped.
DONE_KEPT = 1024
# The agent says which files the workers it starts will write (``Shipper.expect``), so a new
# worker's output is looked at from its first pass, not from the next full scan.
READ_AT_ONCE = 256 * 1024  # bytes read from one file per look
DRAIN_LOOKS = 64  # looks at an ended worker's file before its exit is reported: 16 MiB at most
YIELD_EVERY = 256  # files a look goes through before it lets the agent's other tasks run
MAX_BACKLOG = 4 * 1024 * 1024  # bytes a file may be ahead of what was shipped before skipping
# Ended workers' files deleted at one look at every file, at most: the old ones a node of months
# holds when its agent starts go over minutes, not in one long stall of the agent's loop.
DELETE_AT_ONCE = 1000
# Bytes of a worker's file kept on disk, its newest: the disk under older ones is given back.
# At least ``MAX_BACKLOG``, so the shipper never reads what was freed (it skips ahead to at most
# that far behind the file's end); 16 MiB, what the stream keeps of one worker.
FILE_KEEP = 16 * 1024 * 1024
# The disk is given back in steps of this many bytes, up to a multiple of it: not a call on every
# look, and whole blocks on any filesystem (4 KiB to 1 MiB), which a punch frees, not zeroes.
FREE_STEP = 4 * 1024 * 1024


class OutputSink(Protocol):
    async def send(self, subj: str, data: bytes, offset: int) -> None: ...

    async def shipped(self, subj: str) -> int | None: ...


def cut_mark(kept: int) -> str:
    return f" [... line cut at {kept} bytes]"


def skip_mark(skipped: int) -> str:
    return f"[... {skipped} bytes skipped: the worker printed faster than its output is shipped]"


def to_free(size: int, freed: int) -> tuple[int, int] | None:
    """The part of a worker's file of ``size`` bytes, its disk given back up to ``freed``, whose
    disk to give back now: up to its newest ``FILE_KEEP`` bytes, in whole ``FREE_STEP``s. None:
    not a step more yet."""
    end = max(0, size - FILE_KEEP) // FREE_STEP * FREE_STEP
    return (freed, end) if end > freed else None


def expired(changed: Mapping[Path, float], running: Collection[Path], now: float) -> list[Path]:
    """Of these workers' files (each with when it last changed), those to delete: untouched for
    longer than the stream keeps anything, so nothing of them is to be shipped or read, and not
    written by a worker the agent runs (a worker silent for a week still writes to its file)."""
    return [p for p, t in changed.items() if now - t > MAX_AGE and p not in running]


@dataclass
class Lines:
    """Bytes as they arrive, into whole lines of at most ``limit`` bytes (pure: no IO)."""

    limit: int = MAX_LINE
    partial: bytearray = field(default_factory=bytearray)
    cutting: bool = False  # the line under way was shipped cut: drop it up to its newline

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start : len(data) if end < 0 else end]
            if not self.cutting:
                room = self.limit - len(self.partial)
                self.partial += piece[:room]
                if len(piece) > room:
                    out.append(safe_text(bytes(self.partial)) + cut_mark(self.limit))
                    self.partial.clear()
                    self.cutting = True
            if end < 0:
                break
            if not self.cutting:
                out.append(safe_text(bytes(self.partial)))
            self.partial.clear()
            self.cutting = False
            start = end + 1
        return out

    def flush(self) -> list[str]:
        """The unfinished line, as it stands (its file stopped growing)."""
        if not self.partial:
            return []
        line = safe_text(bytes(self.partial))
        self.partial.clear()
        return [line]

    def skip(self) -> None:
        """Forget the line under way: what follows is not its continuation."""
        self.partial.clear()
        self.cutting = True


def messages(lines: list[str], limit: int = MAX_MESSAGE) -> list[bytes]:
    """``lines`` as messages of at most about ``limit`` bytes each, every line whole."""
    out: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for line in lines:
        b = line.encode() + b"\n"
        if batch and size + len(b) > limit:
            out.append(b"".join(batch))
            batch, size = [], 0
        batch.append(b)
        size += len(b)
    if batch:
        out.append(b"".join(batch))
    return out


@dataclass
class _File:
    path: Path
    subject: str
    offset: int  # bytes of the file read
    lines: Lines = field(default_factory=Lines)
    unsent: list[tuple[bytes, int]] = field(default_factory=list)  # (message, offset it reaches)
    grew: float = 0.0  # monotonic time it last gained bytes (or was found)
    ended: bool = False  # its worker ended (``drain``): let go once all of it went out
    freed: int = 0  # bytes from its start whose disk was given back (``to_free``)
    freeing: bool = True  # false once giving back its disk failed (said in the log once)


class Shipper:
    """Ships the output of the workers under ``root`` (an agent's work directory) for ``node``.

    ``live``: the files of the workers the agent's runtime knows (starting, running, or ended
    with their exit not yet in the log). A file not among them, once all of it went out, is let
    go. Without it the shipper cannot tell, and lets a file go only once its worker's exit was
    drained, and deletes no file. ``clock``: the time files' ages are told by (seconds since
    the epoch, as their mtimes)."""

    def __init__(
        self,
        node: str,
        root: Path,
        sink: OutputSink,
        *,
        every: float = EVERY,
        live: Callable[[], Iterable[Path]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node, self.root, self.sink, self.every, self.live = node, Path(root), sink, every, live
        self.clock = clock
        # The files being read: of the workers that run, and of those that ended until all of
        # it went out.
        self._files: dict[Path, _File] = {}
        self._failing = False
        # The node's files listed by the first look and not looked at yet (None: not listed):
        # a look the server cut short goes on from where it stopped, without listing again.
        self._unwalked: dict[Path, None] | None = None
        self._scanned = -SCAN_EVERY  # monotonic time of the last look at every file being read
        self._expected: dict[Path, float] = {}  # files of workers being started, since when
        self._done: dict[Path, None] = {}  # files let go, oldest first (``DONE_KEPT``)
        self._owed: dict[Path, None] = {}  # files drained (their worker ended), not yet let go
        # Files of ended workers to delete once untouched for ``MAX_AGE``, each with when it was
        # last known to change, and the same as a heap, the first due first: a look finds those
        # due without going through the week's others. Kept only with ``live``.
        self._to_delete: dict[Path, float] = {}
        self._deletion_order: list[tuple[float, Path]] = []
        self._freeing = True  # false once the filesystem turned out not to punch holes
        # Files of workers the agent runs or starts not read yet, for their disk to be freed
        # all the same (``_free_unread``).
        self._unread: dict[Path, _File] = {}
        # One look at a time: the passes and the agent's drains before it reports exits would
        # otherwise read and send one file's lines twice or out of order.
        self._looking = asyncio.Lock()

    def expect(self, paths: Iterable[Path]) -> None:
        """Workers are being started with these output files: look at them from the next pass
        on, not only once the next full scan finds them (a short job may be over by then)."""
        now = time.monotonic()
        for path in paths:
            self._expected.setdefault(Path(path), now)

    async def run(self, stop: asyncio.Event) -> None:
        """Ship until ``stop``, then once more: what workers printed last goes out too."""
        while not stop.is_set():
            await self._pass()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)
        await self._pass(full=True)

    async def _pass(self, *, full: bool = False) -> None:
        try:
            await self.ship(full=full)
            if self._failing:
                log.info("%s: shipping workers' output again", self.node)
            self._failing = False
        except Exception as e:  # the server away: the files keep it; try again next look
            if not self._failing:
                log.warning("%s: cannot ship workers' output now: %s", self.node, e)
            self._failing = True

    async def ship(self, *, everything: bool = False, full: bool = False) -> int:
        """One look at the files being read: those that grew lately, or all of them every
        ``SCAN_EVERY`` or when asked (``full``); with ``everything``, as on the first look, at
        every worker's file on the node too. The messages sent."""
        async with self._looking:
            return await self._ship(walk=everything or self._unwalked is None, full=full)

    async def _ship(self, *, walk: bool, full: bool) -> int:
        now = time.monotonic()
        full = full or walk or now - self._scanned >= SCAN_EVERY
        # Asked before the files are listed: a worker's file exists only once the runtime knows
        # the worker, so a file listed here and not among these has a worker that ended.
        alive = set(self.live()) if full and self.live is not None else None
        if alive is not None:
            self._delete_expired(alive)
        if full:
            self._scanned = now
            for held in self._files.values():
                if held.unsent:  # not read while the server does not take them, and still written
                    self._free(held)
            self._free_unread(alive)
            paths = list(self._files)
        else:
            paths = [p for p, f in self._files.items() if f.unsent or now - f.grew < QUIET_S]
        paths += [p for p in self._expected if self._new(p) and p.exists()]
        if alive is not None:
            paths += [p for p in alive if self._new(p)]  # a worker's file that came late
        paths += [p for p in self._owed if self._new(p)]  # drained before it was found
        if walk:
            # Each run's files (``worker.log_path``) are shipped; those an older agent left
            # directly under the job are only deleted once due (``Runtime.reattach`` moves a
            # running worker's into its run).
            on_disk, before_runs = self._listed()
            self._before_runs(before_runs)
            self._done = {p: None for p in self._done if p in on_disk}  # removed: forgotten
            self._unwalked = dict.fromkeys(sorted(on_disk))
        unwalked = self._unwalked or {}
        for p in [p for p in unwalked if not self._new(p)]:
            del unwalked[p]  # read, or let go, since
        paths += unwalked
        for p, since in list(self._expected.items()):
            if p in self._files or now - since > QUIET_S:  # found, or its worker never started
                del self._expected[p]
        sent = 0
        for i, path in enumerate(dict.fromkeys(paths)):
            f = self._files.get(path) or await self._found(path)
            unwalked.pop(path, None)
            if f is None:
                self._owed.pop(path, None)  # gone from the disk, or too old to read
            else:
                n = await self._ship_file(f)
                sent += n
                gone = alive is not None and path not in alive and path not in self._expected
                ended = f.ended or path in self._owed or gone
                if not n and ended and self._whole(f):
                    self._let_go(f)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a look at many files leaves the agent's loop its turns
        return sent

    def _new(self, path: Path) -> bool:
        return path not in self._files and path not in self._done

    async def drain(self, paths: Iterable[Path]) -> None:
        """Ship all that these files hold now, an unfinished last line too: their workers have
        ended. A server that does not take it leaves the rest to the next pass, as ever."""
        try:
            async with self._looking:
                await self._drain(paths)
        except Exception as e:  # the server away: the files keep it; the passes try again
            log.warning("%s: cannot ship ended workers' output now: %s", self.node, e)

    async def _drain(self, paths: Iterable[Path]) -> None:
        for path in paths:
            if path in self._done:  # an exit drained before (its report is tried again)
                continue
            self._owed[path] = None  # until let go: the passes find it if this drain fails
            f = self._files.get(path) or await self._found(path)
            if f is None:
                self._owed.pop(path, None)
                continue
            # Marked before anything is sent: a drain cut short leaves the rest to the passes,
            # which let the file go once all of it went out.
            f.ended = True
            for _ in range(DRAIN_LOOKS):  # bounded: a file may still grow (an orphan writes)
                if not await self._ship_file(f) and self._whole(f):
                    self._let_go(f)
                    break

    def _whole(self, f: _File) -> bool:
        """All that ``f`` holds went out, its last line too."""
        if f.unsent or f.lines.partial:
            return False
        try:
            return f.path.stat().st_size <= f.offset
        except OSError:
            return True  # removed: nothing more to ship

    def _let_go(self, f: _File) -> None:
        """Its worker ended and all of it went out: not read, nor asked about, again."""
        self._files.pop(f.path, None)
        self._expected.pop(f.path, None)  # else the next pass would find it anew
        self._owed.pop(f.path, None)
        self._done[f.path] = None
        while len(self._done) > DONE_KEPT:
            del self._done[next(iter(self._done))]
        self._delete_later(f.path, self.clock())

    def _delete_later(self, path: Path, changed: float) -> None:
        """Delete the file at ``path``, last known to change at ``changed``, once it is
        untouched for ``MAX_AGE`` and its worker is not running (``_delete_expired``)."""
        if self.live is not None and path not in self._to_delete:
            self._to_delete[path] = changed
            heapq.heappush(self._deletion_order, (changed, path))

    def _listed(self) -> tuple[set[Path], list[Path]]:
        """The workers' files on the node, in one listing: those in their run's directory
        (``worker.log_path``), and those older agents left directly under their job
        (``worker.log_path_before_runs``)."""
        logs = self.root / "logs"
        runs, before_runs = set(), []
        for path in logs.glob("*/**/attempt-*.rank-*.log"):
            if path.parent.parent.parent == logs and path.parent.name.startswith("run-"):
                runs.add(path)
            elif path.parent.parent == logs:
                before_runs.append(path)
        return runs, before_runs

    def _before_runs(self, paths: Iterable[Path]) -> None:
        """Files older agents left directly under their job are not shipped, but deleted as the
        others are, once untouched for ``MAX_AGE``: kept, a node's disk held every one of them
        for good. A worker still writing to one is among the runtime's (``Runtime.reattach``
        moves its file into its run, or leaves it its own)."""
        for path in paths:
            with contextlib.suppress(OSError):  # gone: nothing to delete
                self._delete_later(path, path.lstat().st_mtime)

    def _delete_expired(self, running: set[Path]) -> None:
        """Delete the files due (``_delete_later``) that ``expired`` says may go, and their run's
        and job's directories left empty; the others are remembered with their latest change."""
        now = self.clock()
        changed: dict[Path, float] = {}
        order = self._deletion_order
        while order and now - order[0][0] > MAX_AGE and len(changed) < DELETE_AT_ONCE:
            since, path = heapq.heappop(order)
            if self._to_delete.get(path) != since:
                continue  # remembered anew since, with a later time
            del self._to_delete[path]
            with contextlib.suppress(OSError):  # gone: nothing to delete
                changed[path] = path.lstat().st_mtime
        keep = running | self._expected.keys() | self._files.keys()
        gone = expired(changed, keep, now)
        deleting = set(gone)
        for path, since in changed.items():
            if path not in deleting:  # written since, or its worker runs
                self._delete_later(path, since)
        # A directory of a worker the agent runs or starts stays, though empty a moment (made
        # before the worker opens its file).
        busy = {p.parent for p in keep} | {p.parent.parent for p in keep}
        deleted = 0
        for path in gone:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("%s: cannot delete an ended worker's file: %s", self.node, e)
                continue
            deleted += 1
            self._done.pop(path, None)
            for d in (path.parent, path.parent.parent):  # its run's, then its job's
                if d in busy or d == self.root / "logs":  # an older agent's file has no run
                    break
                try:
                    d.rmdir()
                except OSError:  # not empty
                    break
        if deleted:
            log.info("%s: deleted %d ended workers' files untouched for a week or more", self.node, deleted)

    async def _found(self, path: Path) -> _File | None:
        m, run = LOG_FILE.fullmatch(path.name), RUN.fullmatch(path.parent.name)
        if m is None or run is None or path.parent.parent.parent != self.root / "logs":
            return None  # not a worker's file in its run's directory (an older agent's)
        subj = subject(self.node, path.parent.parent.name, int(run[1]), int(m[1]), int(m[2]))
        try:
            st = path.stat()
        except OSError:
            return None
        if self.clock() - st.st_mtime > MAX_AGE:
            # Untouched for longer than the stream keeps anything: shipped long ago or never to
            # be; not asked about (an agent started on a node of months), and to be deleted.
            self._delete_later(path, st.st_mtime)
            return None
        reached = await self.sink.shipped(subj)
        if reached is None:
            reached = 0  # nothing kept of it: new
        f = self._files[path] = _File(path, subj, reached, grew=time.monotonic())
        return f

    async def _ship_file(self, f: _File) -> int:
        if not f.unsent:
            f.unsent = self._read(f)
        sent = 0
        while f.unsent:  # in order; what the server did not take is sent first next time
            data, reached = f.unsent[0]
            await self.sink.send(f.subject, data, reached)
            f.unsent.pop(0)
            sent += 1
        return sent

    def _read(self, f: _File) -> list[tuple[bytes, int]]:
        """What ``f`` gained since the last look, as messages."""
        try:
            size = f.path.stat().st_size
        except OSError:
            self._files.pop(f.path, None)
            return []
        out: list[str] = []
        if size < f.offset:  # the file was replaced: start again
            f.offset, f.lines, f.freed = 0, Lines(), 0
        if size - f.offset > MAX_BACKLOG:
            out.append(skip_mark(size - MAX_BACKLOG - f.offset))
            f.offset = size - MAX_BACKLOG
            f.lines.skip()
        if size > f.offset:
            try:
                with f.path.open("rb") as fh:
                    fh.seek(f.offset)
                    data = fh.read(min(size - f.offset, READ_AT_ONCE))
            except OSError:
                return []
            f.offset += len(data)
            f.grew = time.monotonic()
            out += f.lines.feed(data)
        else:
            out += f.lines.flush()
        self._free(f, size)
        reached = f.offset - len(f.lines.partial)
        return [(m, reached) for m in messages(out)]

    def _free_unread(self, alive: set[Path] | None) -> None:
        """Give back the disk under the old output of the files of workers the agent runs or
        starts that are not read yet: one is found only once the stream says where it stands,
        and while the server is away that is never, its worker printing on. Whatever the stream
        says, the shipper reads none of a file further back than ``MAX_BACKLOG`` from its end."""
        wanted = {*(alive or ()), *self._expected}
        unread = self._unread
        for p in [p for p in unread if p not in wanted or p in self._files]:
            del unread[p]
        for p in wanted:
            if p not in self._files:
                self._free(unread.get(p) or unread.setdefault(p, _File(p, "", 0)))

    def _free(self, f: _File, size: int | None = None) -> None:
        """Give back the disk under ``f``'s old output (``to_free``), its ``size`` as just seen."""
        if not (self._freeing and f.freeing):
            return
        try:
            part = to_free(f.path.stat().st_size if size is None else size, f.freed)
            if part is not None:
                holes.punch(f.path, *part)
                f.freed = part[1]
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in holes.UNSUPPORTED:
                self._freeing = False
                why = e.strerror or e
                log.warning(
                    "%s: workers' files keep all they print: their filesystem cannot free part of one (%s)",
                    self.node,
                    why,
                )
            else:
                f.freeing = False
                log.warning("%s: a worker's file keeps all it prints on disk: %s", self.node, e)
