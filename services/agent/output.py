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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.services.agent.worker import LOG_FILE, RUN
from corral.services.runtime.output import MAX_AGE, MAX_LINE, MAX_MESSAGE, safe_text, subject

log = logging.getLogger(__name__)

EVERY = 0.25  # seconds between looks at the files that are being written
# A node keeps the files of every worker it ever ran: listing them all is a look at each job's
# directory. Every ``SCAN_EVERY`` seconds the look is at all of them (new files, and quiet ones
# that grew again); in between, only at those that grew within ``QUIET_S``.
SCAN_EVERY = 2.0
QUIET_S = 10.0
# The agent says which files the workers it starts will write (``Shipper.expect``), so a new
# worker's output is looked at from its first pass, not from the next full scan.
READ_AT_ONCE = 256 * 1024  # bytes read from one file per look
DRAIN_LOOKS = 64  # looks at an ended worker's file before its exit is reported: 16 MiB at most
YIELD_EVERY = 256  # files a look goes through before it lets the agent's other tasks run
MAX_BACKLOG = 4 * 1024 * 1024  # bytes a file may be ahead of what was shipped before skipping


class OutputSink(Protocol):
    async def send(self, subj: str, data: bytes, offset: int) -> None: ...

    async def shipped(self, subj: str) -> int | None: ...


def cut_mark(kept: int) -> str:
    return f" [... line cut at {kept} bytes]"


def skip_mark(skipped: int) -> str:
    return f"[... {skipped} bytes skipped: the worker printed faster than its output is shipped]"


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


class Shipper:
    """Ships the output of the workers under ``root`` (an agent's work directory) for ``node``."""

    def __init__(self, node: str, root: Path, sink: OutputSink, *, every: float = EVERY) -> None:
        self.node, self.root, self.sink, self.every = node, Path(root), sink, every
        self._files: dict[Path, _File] = {}
        self._failing = False
        self._scanned = -SCAN_EVERY  # monotonic time of the last look at every file
        self._expected: dict[Path, float] = {}  # files of workers being started, since when
        # Files of ended workers, shipped to their end: no longer read, nor asked about, however
        # many a node's workers leave behind over months. Kept while the file is on disk.
        self._done: set[Path] = set()
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
        await self._pass(everything=True)

    async def _pass(self, *, everything: bool = False) -> None:
        try:
            await self.ship(everything=everything)
            if self._failing:
                log.info("%s: shipping workers' output again", self.node)
            self._failing = False
        except Exception as e:  # the server away: the files keep it; try again next look
            if not self._failing:
                log.warning("%s: cannot ship workers' output now: %s", self.node, e)
            self._failing = True

    async def ship(self, *, everything: bool = False) -> int:
        """One look at the files (all of them every ``SCAN_EVERY`` or when asked, else those
        that grew lately); the messages sent."""
        async with self._looking:
            return await self._ship(everything)

    async def _ship(self, everything: bool) -> int:
        now = time.monotonic()
        if everything or now - self._scanned >= SCAN_EVERY:
            self._scanned = now
            # Each run's files (``worker.log_path``); those an older agent left directly under
            # the job are not looked at (``Runtime.reattach`` moves a running worker's into its
            # run).
            found = self.root.glob("logs/*/run-*/attempt-*.rank-*.log")
            on_disk = set(found)
            self._done &= on_disk  # removed since: nothing to remember
            paths = sorted(on_disk - self._done)
        else:
            paths = [p for p, f in self._files.items() if f.unsent or now - f.grew < QUIET_S]
            paths += [p for p in self._expected if p not in self._files and p.exists()]
        for p, since in list(self._expected.items()):
            if p in self._files or now - since > QUIET_S:  # found, or its worker never started
                del self._expected[p]
        sent = 0
        for i, path in enumerate(paths):
            f = self._files.get(path) or await self._found(path)
            if f is not None:
                sent += await self._ship_file(f)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a look at many files leaves the agent's loop its turns
        return sent

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
            f = self._files.get(path) or await self._found(path)
            for _ in range(DRAIN_LOOKS):  # bounded: a file may still grow (an orphan writes)
                if f is None:
                    break
                sent = await self._ship_file(f)
                try:
                    unread = f.path.stat().st_size > f.offset
                except OSError:
                    break
                if not (sent or unread or f.lines.partial):
                    # Its worker ended and all of it went out: done with it.
                    self._files.pop(f.path, None)
                    self._done.add(f.path)
                    break

    async def _found(self, path: Path) -> _File | None:
        m, run = LOG_FILE.fullmatch(path.name), RUN.fullmatch(path.parent.name)
        if m is None or run is None or path.parent.parent.parent != self.root / "logs":
            return None  # not a worker's file in its run's directory (an older agent's)
        subj = subject(self.node, path.parent.parent.name, int(run[1]), int(m[1]), int(m[2]))
        try:
            st = path.stat()
        except OSError:
            return None
        if time.time() - st.st_mtime > MAX_AGE:
            # Untouched for longer than the stream keeps anything: shipped long ago or never to
            # be; not asked about, nor looked at again (an agent started on a node of months).
            self._done.add(path)
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
            f.offset, f.lines = 0, Lines()
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
        reached = f.offset - len(f.lines.partial)
        return [(m, reached) for m in messages(out)]
