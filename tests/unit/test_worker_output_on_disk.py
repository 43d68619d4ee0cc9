"""What a node's disk holds of its workers' output (``services/agent/output.py``): a worker that
prints without end holds its newest ``FILE_KEEP`` bytes of the disk, with its file's size and
every offset as they were, and an ended worker's file goes once the stream keeps nothing of it,
never the file of a worker that runs."""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from corral.services.agent import output as shipping
from corral.services.agent.decide import WorkerKey
from corral.services.agent.output import (
    FILE_KEEP,
    FREE_STEP,
    MAX_BACKLOG,
    Shipper,
    expired,
    to_free,
)
from corral.services.agent.worker import log_path, log_path_before_runs
from corral.services.runtime.output import MAX_AGE, subject
from tests.unit.test_worker_output import Kept, _looks_at_the_disk, _worker_file

MiB = 1024 * 1024


def _aged(path: Path, seconds: float, now: float | None = None) -> Path:
    """``path`` as if last written ``seconds`` before ``now``."""
    then = (time.time() if now is None else now) - seconds
    os.utime(path, (then, then))
    return path


def _write(path: Path) -> Path:
    path.write_bytes(b"a line\n")
    return path


def _on_disk(path: Path) -> int:
    return path.stat().st_blocks * 512


# -- which part of a file is freed, which files are deleted (pure) ---------------------------------


def test_what_the_shipper_still_reads_is_never_freed() -> None:
    # It reads at most MAX_BACKLOG behind a file's end, skipping ahead when further behind.
    assert FILE_KEEP >= MAX_BACKLOG
    assert FILE_KEEP % FREE_STEP == 0


@pytest.mark.parametrize(
    ("size", "freed", "part"),
    [
        (0, 0, None),
        (FILE_KEEP, 0, None),
        (FILE_KEEP + FREE_STEP - 1, 0, None),
        (FILE_KEEP + FREE_STEP, 0, (0, FREE_STEP)),
        (FILE_KEEP + FREE_STEP + 3 * MiB, FREE_STEP, None),
        (FILE_KEEP + 2 * FREE_STEP + 5, FREE_STEP, (FREE_STEP, 2 * FREE_STEP)),
        (FILE_KEEP + 10 * FREE_STEP + 7, 0, (0, 10 * FREE_STEP)),
        (FILE_KEEP, 2 * FREE_STEP, None),
    ],
    ids=[
        "empty",
        "just-kept",
        "short-of-a-step",
        "a-step",
        "short-of-the-next-step",
        "the-next-step",
        "found-by-a-restarted-agent",
        "replaced-by-a-smaller-file",
    ],
)
def test_which_part_of_a_workers_file_is_freed(size: int, freed: int, part: tuple[int, int] | None) -> None:
    assert to_free(size, freed) == part


@pytest.mark.parametrize("size", [0, 1, FILE_KEEP - 1, FILE_KEEP + 1, 3 * FILE_KEEP + 12345, 10**12 + 7])
def test_the_newest_bytes_are_kept_and_whole_steps_freed(size: int) -> None:
    part = to_free(size, 0)
    if part is not None:
        start, end = part
        assert start == 0 and end % FREE_STEP == 0
        assert size - end >= FILE_KEEP
        assert size - end < FILE_KEEP + FREE_STEP


def test_which_files_are_old_enough_to_delete() -> None:
    now = 1_000_000_000.0
    ended_long_ago, running_silent, recent, at_the_limit = (Path(n) for n in ("a", "b", "c", "d"))
    changed = {
        ended_long_ago: now - MAX_AGE - 1,
        running_silent: now - MAX_AGE - 3600,
        recent: now - 60,
        at_the_limit: now - MAX_AGE,
    }
    assert expired(changed, {running_silent}, now) == [ended_long_ago]
    assert expired(changed, set(), now + 3600) == [ended_long_ago, running_silent, at_the_limit]
    assert expired({}, set(), now) == []


# -- a worker printing without end -----------------------------------------------------------------


@pytest.mark.parametrize("shipping_keeps_up", [True, False], ids=["keeping-up", "falling-behind"])
async def test_a_worker_printing_without_end_holds_its_newest_output_on_disk_at_every_offset(
    tmp_path: Path, shipping_keeps_up: bool
) -> None:
    """A job printing in a loop filled its node's disk, and every other job there failed. The
    disk under its old output is given back as it is shipped: its file keeps its size, the
    worker appends where it did, the stream's offsets are the file's, and its newest output is
    shipped whole."""
    path = _worker_file(tmp_path, "loop")
    subj = subject("n0", "loop", 3, 0, 0)
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [path])
    line = b"%09d " + b"x" * 89 + b"\n"  # 100 bytes, numbered
    written = 0
    with path.open("ab") as worker:  # as the agent gives a worker its file
        for chunk in range(48):
            worker.write(b"".join(line % (chunk * 10_000 + i) for i in range(10_000)))  # 1 MB
            worker.flush()
            written += 1_000_000
            if shipping_keeps_up or chunk == 47:
                while await shipper.ship():
                    pass
    assert path.stat().st_size == written  # every offset as it was
    assert _on_disk(path) <= FILE_KEEP + FREE_STEP + MiB  # without: all 48 MB
    assert shipper._files[path].offset == written
    assert kept.sent[subj][-1][1] == written  # where a restarted agent resumes
    text = kept.text(subj)
    newest = path.read_bytes()[-MAX_BACKLOG:].decode().split("\n", 1)[1]  # its whole lines
    assert text.endswith(newest)  # shipped whole: nothing read from what was freed
    assert "\x00" not in text
    if shipping_keeps_up:
        assert text == "".join((line % i).decode() for i in range(480_000))
    else:
        assert text.startswith("[... ") and "bytes skipped" in text.splitlines()[0]
    with path.open("rb") as f:
        assert f.read(16) == b"\0" * 16  # the oldest is a hole now
    with path.open("ab") as worker:  # the worker prints on, after what it printed
        worker.write(b"last words\n")
    assert await shipper.ship() == 1
    assert text + "last words\n" == kept.text(subj)
    assert kept.sent[subj][-1][1] == written + len(b"last words\n")


async def test_a_file_written_while_the_server_is_away_is_bounded_too(tmp_path: Path) -> None:
    """The shipper reads no more of a file while the stream does not take what it read; the
    worker prints on all the same."""

    class Away(Kept):
        away = False

        async def send(self, subj: str, data: bytes, offset: int) -> None:
            if self.away:
                raise ConnectionError("nats: connection reconnecting")
            await super().send(subj, data, offset)

    path = _worker_file(tmp_path, "loop")
    path.write_bytes(b"before\n")
    kept = Away()
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [path])
    await shipper._pass()
    kept.away = True
    with path.open("ab") as worker:
        worker.write(b"read, not taken\n")
        worker.flush()
        await shipper._pass()
        for _ in range(40):
            worker.write((b"z" * 99 + b"\n") * 10_000)
        worker.flush()
    shipper._scanned = time.monotonic() - 60  # the look at every file being read is due
    await shipper._pass()
    assert _on_disk(path) <= FILE_KEEP + FREE_STEP + MiB
    kept.away = False
    while await shipper.ship():
        pass
    text = kept.text(subject("n0", "loop", 3, 0, 0))
    assert text.startswith("before\nread, not taken\n[... ")
    assert text.endswith("z" * 99 + "\n") and "\x00" not in text


async def test_a_filesystem_that_cannot_free_part_of_a_file_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tried: list[Path] = []

    def cannot(path: Path, start: int, end: int) -> None:
        tried.append(path)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), str(path))

    monkeypatch.setattr(shipping.holes, "punch", cannot)
    first, second = _worker_file(tmp_path, "a"), _worker_file(tmp_path, "b")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    shipper.expect([first, second])
    with caplog.at_level(logging.WARNING, logger=shipping.__name__):
        for path in (first, second):
            with path.open("ab") as worker:
                for _ in range(3):
                    worker.write((b"y" * 99 + b"\n") * ((FILE_KEEP + FREE_STEP) // 100) + b"newest\n")
                    worker.flush()
                    while await shipper.ship():
                        pass
    assert tried == [first]  # once: the other files are on the same filesystem
    said = [r for r in caplog.records if "cannot free part" in r.getMessage()]
    assert len(said) == 1 and "n0" in said[0].getMessage()
    assert kept.text(subject("n0", "b", 3, 0, 0)).endswith("\nnewest\n")  # shipped as ever


# -- ended workers' files ----------------------------------------------------------------------------


async def test_the_start_up_listing_deletes_ended_workers_files_the_stream_keeps_nothing_of(
    tmp_path: Path,
) -> None:
    """A node kept the file of every worker it ever ran. The agent starting deletes those
    untouched for longer than the stream keeps anything, and their directories once empty;
    never the file of a worker it runs, however long that one was silent."""
    week = MAX_AGE + 3600
    ended = _aged(_write(_worker_file(tmp_path, "ended")), week)
    silent = _aged(_write(_worker_file(tmp_path, "silent")), week)  # runs, said nothing for a week
    recent = _aged(_write(_worker_file(tmp_path, "recent")), 86400)  # ended yesterday
    retried = _aged(_write(_worker_file(tmp_path, "retried")), week)  # its next attempt starts now
    starting = log_path(tmp_path, WorkerKey("retried", 1, 0), 3)  # its directory made, no file yet
    older_agents = log_path_before_runs(tmp_path, WorkerKey("ancient", 0, 0))  # not a run's
    older_agents.parent.mkdir(parents=True)
    _aged(_write(older_agents), week)
    running = [silent, starting]
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept, live=lambda: running)
    shipper.expect([starting])
    await shipper.ship()  # the first look: lists the node
    await shipper.ship(full=True)
    assert not ended.exists() and not (tmp_path / "logs" / "ended").exists()
    assert silent.exists() and recent.exists()
    assert not older_agents.exists() and not older_agents.parent.exists()
    assert not retried.exists() and starting.parent.is_dir()  # its next attempt's file goes there
    assert kept.sent == {subject("n0", "recent", 3, 0, 0): [(b"a line\n", 7)]}
    running.remove(silent)  # it ended, without a word more
    await shipper.drain([silent])
    await shipper.ship(full=True)
    assert not silent.exists() and not (tmp_path / "logs" / "silent").exists()
    assert recent.exists() and (tmp_path / "logs").is_dir()


async def test_an_ended_workers_file_is_deleted_once_the_stream_keeps_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that runs for months deletes the files of the workers that ended meanwhile, a
    week after their last line, without listing its directories again to find them."""
    now = [time.time()]
    running: list[Path] = []
    shipper = Shipper("n0", tmp_path, Kept(), live=lambda: running, clock=lambda: now[0])
    listed = _looks_at_the_disk(monkeypatch)
    await shipper.ship()  # the first look: an empty node
    brief, orphan = _worker_file(tmp_path, "brief"), _worker_file(tmp_path, "orphan")
    for path in (brief, orphan):
        running.append(path)
        shipper.expect([path])
        path.write_bytes(b"done\n")
    await shipper.ship()
    running.clear()  # both ended
    await shipper.drain([brief, orphan])
    assert brief not in shipper._files and orphan not in shipper._files  # let go
    now[0] += MAX_AGE - 60
    await shipper.ship(full=True)
    assert brief.exists() and orphan.exists()  # the stream may still keep their lines
    _aged(orphan, 0, now[0])  # a process it left wrote on since
    now[0] += 120
    await shipper.ship(full=True)
    assert not brief.exists() and not (tmp_path / "logs" / "brief").exists()
    assert orphan.exists()
    now[0] += MAX_AGE + 1
    await shipper.ship(full=True)
    assert not orphan.exists()
    assert len(listed) == 1  # the first look only
    assert not shipper._to_delete and not shipper._deletion_order


async def test_a_node_of_months_deletes_its_old_files_a_share_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shipping, "DELETE_AT_ONCE", 10)
    old = [_aged(_write(_worker_file(tmp_path, f"old{i:03d}")), MAX_AGE + 60) for i in range(25)]
    shipper = Shipper("n0", tmp_path, Kept(), live=lambda: [])
    await shipper.ship()
    left = []
    for _ in range(3):
        await shipper.ship(full=True)
        left.append(sum(p.exists() for p in old))
    assert left == [15, 5, 0]


async def test_files_older_agents_left_under_their_job_are_deleted_after_the_week_too(
    tmp_path: Path,
) -> None:
    """Before files were kept per run, a worker wrote ``logs/<job>/attempt-<a>.rank-<r>.log``.
    Those files are never shipped; a node that ran months before the change kept every one.
    The old are deleted with their job's directory, the recent kept, and ``logs`` stays."""
    old = [log_path_before_runs(tmp_path, WorkerKey(f"j{i:03d}", 0, r)) for i in range(40) for r in (0, 1)]
    for path in old:
        path.parent.mkdir(parents=True, exist_ok=True)
        _aged(_write(path), MAX_AGE + 60)
    recent = log_path_before_runs(tmp_path, WorkerKey("lately", 2, 0))
    recent.parent.mkdir(parents=True)
    _aged(_write(recent), 3600)
    before = sum(p.exists() for p in old)
    shipper = Shipper("n0", tmp_path, Kept(), live=lambda: [])
    await shipper.ship()  # the first look lists the node
    await shipper.ship(full=True)
    assert (before, sum(p.exists() for p in old)) == (80, 0)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["lately"]
    assert recent.exists() and not shipper._files  # not shipped, kept until its week is over


async def test_without_the_runtimes_word_no_file_is_deleted(tmp_path: Path) -> None:
    """Without ``live`` the shipper cannot tell a worker that runs, silent, from one that ended."""
    old = _aged(_write(_worker_file(tmp_path, "old")), MAX_AGE + 60)
    shipper = Shipper("n0", tmp_path, Kept())
    await shipper.ship()
    await shipper.ship(full=True)
    assert old.exists() and not shipper._to_delete


def test_a_failed_start_quotes_the_end_of_its_workers_file_reading_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start that fails quotes its worker's last lines: read from the end, not the whole file
    # into memory (a file of days, whose freed part still counts in its size, read as zeros).
    from corral.services.agent import worker

    path = tmp_path / "w.log"
    with open(path, "wb") as f:
        f.truncate(64 * MiB)  # a sparse start: what the shipper freed
        f.seek(0, os.SEEK_END)
        f.write(b"\n".join(b"line %d" % i for i in range(100)) + b"\nbwrap: Can't mkdir /x\n")
    read: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *_: object) -> None:
            self.f.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def read(self, n: int = -1) -> bytes:
            data: bytes = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(worker, "open", lambda p, m: Counting(real_open(p, m)), raising=False)
    text = worker.log_tail(path)
    assert sum(read) <= worker.TAIL_BYTES
    assert text.endswith("line 99\nbwrap: Can't mkdir /x\n")
    from corral.services.agent import sandbox

    assert sandbox.bwrap_error(text) == "bwrap: Can't mkdir /x"
    assert worker.log_tail(tmp_path / "none.log") == ""


async def test_an_agent_restarted_within_the_week_does_not_make_an_old_file_look_new(tmp_path: Path) -> None:
    """A restarted agent frees each file it reads from its start again, and a punch sets the
    file's mtime even where nothing was left to free: each restart kept a large file a week
    more, and on a node whose agent restarts within every week, never deleted."""
    from corral.services.agent import holes

    path = _worker_file(tmp_path, "big")
    path.write_bytes((b"x" * 99 + b"\n") * ((FILE_KEEP + 2 * FREE_STEP) // 100))
    size = path.stat().st_size
    holes.punch(path, 0, to_free(size, 0)[1])  # type: ignore[index]  # what the agent before freed
    kept = Kept()
    kept.sent[subject("n0", "big", 3, 0, 0)] = [(b"all of it\n", size)]
    now = [time.time()]
    written = _aged(path, 6 * 86400, now[0]).stat().st_mtime
    for _ in range(2):  # restarted six days after the worker's last line, then two days later
        shipper = Shipper("n0", tmp_path, kept, live=lambda: [], clock=lambda: now[0])
        await shipper.ship()
        await shipper.ship(full=True)
        assert not path.exists() or path.stat().st_mtime == written
        now[0] += 2 * 86400
    assert not path.exists()


async def test_a_file_not_found_before_the_server_went_away_is_bounded_too(tmp_path: Path) -> None:
    """The shipper reads a file once the stream said where it stands; while the server is away
    it cannot say, and a worker started just before it went filled the node's disk for as long
    as the server was away."""

    class Away(Kept):
        async def shipped(self, subj: str) -> int | None:
            raise ConnectionError("nats: connection reconnecting")

    path = _worker_file(tmp_path, "loop")
    kept = Away()
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [path])
    shipper.expect([path])
    await shipper._pass()
    with path.open("ab") as worker:
        for _ in range(6):
            for _ in range(8):
                worker.write((b"z" * 99 + b"\n") * 10_000)
            worker.flush()
            shipper._scanned = time.monotonic() - 60  # the look at every file is due
            await shipper._pass()
    assert path not in shipper._files
    assert _on_disk(path) <= FILE_KEEP + FREE_STEP + MiB
    Away.shipped = Kept.shipped  # type: ignore[method-assign]  # the server back
    while await shipper.ship():
        pass
    text = kept.text(subject("n0", "loop", 3, 0, 0))
    assert text.startswith("[... ") and text.endswith("z" * 99 + "\n") and "\x00" not in text
    await shipper.ship(full=True)
    assert not shipper._unread  # read now: forgotten at the next look at every file
