"""Deletes the working directories of this node's ended workers, ``KEEP_S`` after they ended.

Each worker runs in ``<root>/work/<job>/run-<n>/attempt-<a>/rank-<r>`` (``Worker.workdir``), which
is scratch: a later attempt gets a directory of its own, and what a job keeps goes to its
checkpoint directory (never deleted here: a checkpoint is its owner's data). Kept, a node held
the scratch of every worker it ever ran. A day after its worker ended, long enough for a person
to look at what a failed attempt left there, the directory goes, and its attempt's, run's and
job's once empty.

When a worker ended is written into its directory's mtime as the runtime forgets it (``ended``),
so an agent starting on the node (``listed``) tells from the directory alone how long ago the
workers that ended under an earlier agent did. A directory of a worker the runtime knows is
never deleted, nor any before the agent's first view of its node: a worker lost with an earlier
agent, which the log still has live, is known only once reported gone, and its directory's mtime
may be days older than its end. At most ``DELETE_AT_ONCE`` go in one ``sweep``, in a thread: a
tree of millions of files does not stall the agent's loop; each is moved aside first, on the
loop, so that a rank started again in its directory meanwhile (an elastic job growing back into
the same attempt) writes into a new one, not one the thread is emptying (one that cannot be
moved, on another filesystem, is deleted in place rather than kept for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

log = logging.getLogger(__name__)

KEEP_S = 24 * 3600.0  # how long an ended worker's working directory stays
DELETE_AT_ONCE = 100


class Workdirs:
    """The ended workers' directories under ``root`` (an agent's work directory) still kept, the
    first due first. ``clock``: seconds since the epoch, as mtimes."""

    def __init__(self, root: Path, *, keep_s: float = KEEP_S, clock: Callable[[], float] = time.time) -> None:
        self.work = Path(root) / "work"
        self.keep_s = keep_s
        self.clock = clock
        self._kept: dict[Path, float] = {}  # directory -> when its worker last ended
        self._due: list[tuple[float, Path]] = []  # the same as a heap, the first due first
        self._sweeping: asyncio.Task[None] | None = None
        self._trash_read = False

    def __len__(self) -> int:
        return len(self._kept)

    def ended(self, workdir: Path) -> None:
        """The worker of ``workdir`` ended and the runtime forgets it: delete it after ``KEEP_S``."""
        now = self.clock()
        with contextlib.suppress(OSError):  # never made (a worker that did not start), or gone
            os.utime(workdir, (now, now), follow_symlinks=False)
            self._remember(workdir, now)

    def listed(self, known: Collection[Path]) -> None:
        """Remember every worker's directory on the node but ``known`` (the runtime's), by when it
        last changed: those of workers that ended under earlier agents."""
        for d in self.work.glob("*/run-*/attempt-*/rank-*"):
            if d not in known:
                with contextlib.suppress(OSError):
                    self._remember(d, d.lstat().st_mtime)

    def _remember(self, workdir: Path, ended: float) -> None:
        if self._kept.get(workdir, -1.0) < ended:
            self._kept[workdir] = ended
            heapq.heappush(self._due, (ended, workdir))

    def due(self, known: Collection[Path]) -> list[Path]:
        """The directories kept ``KEEP_S`` and of no worker in ``known``, at most
        ``DELETE_AT_ONCE``; no longer remembered. One a worker runs in again (the same attempt
        started anew) is remembered again when that worker ends."""
        now = self.clock()
        out: list[Path] = []
        while self._due and now - self._due[0][0] > self.keep_s and len(out) < DELETE_AT_ONCE:
            ended, d = heapq.heappop(self._due)
            if self._kept.get(d) != ended:
                continue  # its worker ran again since, and ended later
            del self._kept[d]
            if d not in known:
                out.append(d)
        return out

    def sweep(self, known: Collection[Path]) -> None:
        """Delete the directories due, in a thread; one sweep at a time. Each is first moved
        aside (``set_aside``) here, on the agent's loop, where workers start: a rank started
        again in its directory (an elastic job growing back) after the thread began gets a new
        one, never one the thread is emptying."""
        if self._sweeping is not None and not self._sweeping.done():
            return
        aside = self.set_aside(self.due(known))
        if aside:
            self._sweeping = asyncio.get_running_loop().create_task(asyncio.to_thread(self._remove, aside))

    async def wait(self) -> None:
        if self._sweeping is not None:
            await asyncio.gather(self._sweeping, return_exceptions=True)

    def delete(self, workdirs: Collection[Path]) -> None:
        """Delete each directory at once (``set_aside``, then removed)."""
        self._remove(self.set_aside(workdirs))

    def set_aside(self, workdirs: Collection[Path]) -> list[Path]:
        """Move each worker's directory (a link is moved, not followed) into a directory of its
        own in ``.deleting``, and remove its attempt's, run's and job's directories once empty;
        what is there to delete. What an agent stopped before deleting is deleted by the next
        one's first sweep. One that cannot be moved there (on another filesystem than ``work``,
        as under a job's directory mounted apart; ``.deleting`` not a directory this agent may
        write in) is deleted where it is, as before directories were moved aside: left, it
        would stay for good, and every worker's scratch after it too."""
        trash = self.work / ".deleting"
        out: list[Path] = []
        for d in workdirs:
            if d.parent.parent.parent.parent != self.work:
                continue  # not a worker's directory
            try:
                with contextlib.suppress(FileExistsError):
                    trash.mkdir()
                if not stat.S_ISDIR(trash.lstat().st_mode):  # a link: not ours to empty
                    raise NotADirectoryError(f"{trash} is not a directory")
                if not self._trash_read:  # what an agent stopped mid-deletion left there
                    self._trash_read = True
                    out.extend(trash.iterdir())
                aside = Path(tempfile.mkdtemp(dir=trash))  # a name of its own
            except OSError as e:
                log.warning("cannot move an ended worker's directory %s aside, deleted in place: %s", d, e)
                out.append(d)
                continue
            try:
                os.rename(d, aside / d.name)
            except OSError as e:
                aside.rmdir()
                if not isinstance(e, FileNotFoundError):
                    log.warning(
                        "cannot move an ended worker's directory %s aside, deleted in place: %s", d, e
                    )
                    out.append(d)
                continue
            out.append(aside)
            self._prune(d)
        return out

    def _prune(self, workdir: Path) -> None:
        """Remove the attempt's, run's and job's directories of ``workdir``, once gone, if empty."""
        for parent in (workdir.parent, workdir.parent.parent, workdir.parent.parent.parent):
            try:
                parent.rmdir()
            except OSError:  # not empty: another rank, attempt or run of the job
                break

    def _remove(self, aside: Collection[Path]) -> None:
        """Delete what ``set_aside`` moved, or could not move, without following links
        (``shutil.rmtree``)."""
        for d in aside:
            try:
                shutil.rmtree(d)
            except FileNotFoundError:
                pass
            except OSError as e:  # files a container's user owns, say: said, and left
                log.warning("cannot delete an ended worker's directory %s: %s", d, e)
                continue
            if d.parent.parent.parent.parent == self.work:  # a worker's, deleted in place
                self._prune(d)
        with contextlib.suppress(OSError):  # not empty: what could not be deleted
            (self.work / ".deleting").rmdir()
