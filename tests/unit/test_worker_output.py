"""What an agent makes of what its workers print before it ships it (``services/agent/output.py``)
and the output stream's limits (``services/runtime/output.py``): whole lines, long ones cut with
a mark, bytes that are not text or would drive a terminal shown safely, a bounded stream."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from nats.js import api

from corral.services.agent.decide import WorkerKey, run_dir
from corral.services.agent.output import (
    MAX_BACKLOG,
    QUIET_S,
    Lines,
    Shipper,
    cut_mark,
    messages,
    safe_text,
)
from corral.services.agent.worker import job_logs, log_path, log_path_before_runs
from corral.services.query.decide import Ask, OutputScope, output_scope
from corral.services.runtime import output
from tests.builders import LogBuilder, job


def test_bytes_become_whole_lines_however_they_arrive() -> None:
    lines = Lines()
    assert lines.feed(b"step 1\nstep") == ["step 1"]
    assert lines.feed(b" 2\n\nstep 3") == ["step 2", ""]
    assert lines.flush() == ["step 3"]
    assert lines.flush() == []


def test_a_huge_line_is_cut_with_a_visible_mark_and_the_next_line_is_whole() -> None:
    lines = Lines(limit=10)
    got = lines.feed(b"x" * 25)
    assert got == ["x" * 10 + cut_mark(10)]
    assert lines.feed(b"y" * 1000) == []  # the rest of the cut line is dropped, as it comes
    assert lines.feed(b"yy\nnext\n") == ["next"]


def test_a_line_exactly_at_the_limit_is_not_cut() -> None:
    assert Lines(limit=4).feed(b"abcd\n") == ["abcd"]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"caf\xc3\xa9", "café"),
        (b"\xff\xfe binary \x00", "\ufffd\ufffd binary \\x00"),
        (b"\x1b[2J\x1b]0;pwned\x07", "\\x1b[2J\\x1b]0;pwned\\x07"),
        (b"progress 10%\rprogress 99%", "progress 10%\\x0dprogress 99%"),
        (b"tab\tstays", "tab\tstays"),
        ("\u009b31m".encode(), "\\x9b31m"),
    ],
    ids=["utf8", "binary", "escapes", "carriage-return", "tab", "c1"],
)
def test_output_is_shown_safely(raw: bytes, shown: str) -> None:
    assert safe_text(raw) == shown


def test_messages_keep_lines_whole_and_small() -> None:
    lines = [f"line {i} " + "z" * 100 for i in range(50)]
    batches = messages(lines, limit=1000)
    assert all(len(b) <= 1000 for b in batches)
    assert b"".join(batches).decode().splitlines() == lines


def test_the_stream_forgets_the_oldest_within_limits_a_platform_engineer_sets() -> None:
    cfg = output.config(replicas=3)
    assert cfg.discard == api.DiscardPolicy.OLD
    assert cfg.num_replicas == 3
    assert cfg.max_msgs_per_subject == output.MAX_MSGS_PER_WORKER
    assert cfg.max_age == output.MAX_AGE and cfg.max_bytes == output.MAX_BYTES
    assert cfg.max_msg_size is not None and cfg.max_msg_size >= output.MAX_MESSAGE
    # one worker's subject can hold no more than this, however long it prints
    assert output.MAX_MSGS_PER_WORKER * output.MAX_MESSAGE <= 64 * 1024 * 1024


def test_subjects_carry_node_job_run_attempt_and_rank() -> None:
    s = output.subject("node-01", "train", 41, 2, 7)
    assert s == "corral.out.node-01.train.41.2.7"
    assert output.parse(s) == output.Source("node-01", "train", 41, 2, 7)
    assert output.job_filter("train", 41, 7) == "corral.out.*.train.41.*.7"
    assert output.job_filter("train", 41) == "corral.out.*.train.41.*.*"
    assert output.job_filter("train", 41, node="node-01") == "corral.out.node-01.train.41.*.*"
    assert output.parse("corral.out.node-01.train.41.x.7") is None
    assert output.parse("corral.out.node-01.train.x.2.7") is None
    # as an older agent wrote them: which run it was, nobody can tell
    assert output.parse("corral.out.node-01.train.2.7") is None


def test_a_run_of_a_job_id_is_read_apart_from_the_others() -> None:
    """A job id is free again once its job was let go: the filter of one run takes none of
    another run's subjects, nor another job's whose id begins alike."""

    def matches(filt: str, subj: str) -> bool:
        f, t = filt.split("."), subj.split(".")
        return len(f) == len(t) and all(a in ("*", b) for a, b in zip(f, t, strict=True))

    mine = output.job_filter("x", 9)
    assert matches(mine, output.subject("n0", "x", 9, 0, 0))
    assert matches(mine, output.subject("n1", "x", 9, 3, 2))
    assert not matches(mine, output.subject("n0", "x", 5, 0, 0))  # the earlier job of the id
    assert not matches(mine, output.subject("n0", "x", 90, 0, 0))
    assert not matches(mine, output.subject("n0", "xy", 9, 0, 0))
    assert not matches(mine, "corral.out.n0.x.9.0")


def test_another_tenants_job_and_a_wildcard_read_as_no_job() -> None:
    state = LogBuilder().queue("q").submit("a", "mine", job("q")).fold()
    assert isinstance(output_scope(state, "a", Ask(job="mine"), {}), OutputScope)
    assert isinstance(output_scope(state, "admin", Ask(job="mine"), {}), OutputScope)
    for asker, job_id in (("b", "mine"), ("a", "nope"), ("a", "*"), ("a", ">"), ("a", "mine.>")):
        told = output_scope(state, asker, Ask(job=job_id), {})
        assert isinstance(told, dict) and told["error"].startswith("no job "), (asker, job_id)
    assert isinstance(output_scope(state, "a", Ask(job="mine", rank=-2), {}), dict)


class Kept:
    """An ``OutputSink`` in memory: what a stream would keep, per subject."""

    def __init__(self) -> None:
        self.sent: dict[str, list[tuple[bytes, int]]] = {}

    async def send(self, subj: str, data: bytes, offset: int) -> None:
        self.sent.setdefault(subj, []).append((data, offset))

    async def shipped(self, subj: str) -> int | None:
        got = self.sent.get(subj)
        return got[-1][1] if got else None

    def text(self, subj: str) -> str:
        return b"".join(d for d, _ in self.sent.get(subj, [])).decode()


def _worker_file(root: Path, job_id: str = "train", attempt: int = 0, rank: int = 0, run: int = 3) -> Path:
    path = log_path(root, WorkerKey(job_id, attempt, rank), run)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_workers_file_is_in_its_jobs_run() -> None:
    """A job id is free again once its job was let go: each submission of it (its run, the log
    position of the submission) has files of its own, as it has directories of its own."""
    key = WorkerKey("train", 2, 7)
    assert log_path("/w", key, 41) == Path("/w/logs/train/run-41/attempt-2.rank-7.log")
    assert log_path("/w", key, 41).parent.relative_to("/w/logs").as_posix() == run_dir("train", 41)
    assert log_path("/w", key, 41) != log_path("/w", key, 90)
    assert log_path_before_runs("/w", key) == Path("/w/logs/train/attempt-2.rank-7.log")


def test_a_jobs_files_are_one_runs_in_order_the_newest_run_unless_asked(tmp_path: Path) -> None:
    for run, attempt, rank in [(5, 0, 1), (5, 1, 0), (5, 0, 0), (5, 10, 0), (12, 0, 0)]:
        _worker_file(tmp_path, "x", attempt, rank, run).write_text("")
    (tmp_path / "logs" / "x" / "attempt-0.rank-0.log").write_text("")  # an older agent's: no run's
    (tmp_path / "logs" / "x" / "run-5" / "notes.txt").write_text("")
    (tmp_path / "logs" / "x" / "run-7").write_text("")  # a file, not a run's directory
    names = [p.relative_to(tmp_path / "logs" / "x").as_posix() for p in job_logs(tmp_path, "x", 5)]
    assert names == [
        "run-5/attempt-0.rank-0.log",
        "run-5/attempt-0.rank-1.log",
        "run-5/attempt-1.rank-0.log",
        "run-5/attempt-10.rank-0.log",
    ]
    assert job_logs(tmp_path, "x") == [_worker_file(tmp_path, "x", 0, 0, 12)]
    assert job_logs(tmp_path, "x", 6) == [] and job_logs(tmp_path, "never") == []


async def test_the_shipper_sends_new_lines_once_and_a_new_agent_resumes(tmp_path: Path) -> None:
    path = _worker_file(tmp_path, rank=1)
    path.write_bytes(b"one\ntw")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    subj = output.subject("n0", "train", 3, 0, 1)
    assert await shipper.ship() == 1 and kept.text(subj) == "one\n"
    assert await shipper.ship() == 1 and kept.text(subj) == "one\ntw\n"  # the file stopped: as it stands
    with path.open("ab") as f:
        f.write(b"three\n")
    again = Shipper("n0", tmp_path, kept)  # an agent restarted: resumes where the stream says
    await again.ship()
    assert kept.text(subj) == "one\ntw\nthree\n"


async def test_a_worker_printing_faster_than_shipping_is_skipped_ahead_with_a_mark(tmp_path: Path) -> None:
    path = _worker_file(tmp_path)
    path.write_bytes(b"old line\n" * (MAX_BACKLOG // 9 + 1000) + b"newest\n")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    while await shipper.ship():
        pass
    text = kept.text(output.subject("n0", "train", 3, 0, 0))
    assert text.startswith("[... ") and "bytes skipped" in text.splitlines()[0]
    assert text.endswith("old line\nnewest\n")
    assert len(text) <= MAX_BACKLOG + 200


async def test_quiet_files_are_looked_at_only_on_the_full_scan_and_new_files_are_found(
    tmp_path: Path,
) -> None:
    old, new = _worker_file(tmp_path, "old"), _worker_file(tmp_path, "new")
    old.write_bytes(b"done\n")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    assert await shipper.ship() == 1
    shipper._files[old].grew -= QUIET_S + 1  # it has not grown for a while: quiet
    with old.open("ab") as f:
        f.write(b"late\n")
    new.write_bytes(b"hello\n")
    shipper._scanned = time.monotonic()  # the full scan was just now, however slow this machine
    assert await shipper.ship() == 0  # between full scans: neither the quiet file nor new ones
    assert await shipper.ship(everything=True) == 2
    assert kept.text(output.subject("n0", "old", 3, 0, 0)) == "done\nlate\n"
    assert kept.text(output.subject("n0", "new", 3, 0, 0)) == "hello\n"


async def test_a_started_workers_file_is_looked_at_before_the_next_full_scan(tmp_path: Path) -> None:
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    assert await shipper.ship() == 0  # the full scan: nothing yet
    path = _worker_file(tmp_path, "short")
    shipper.expect([path])  # the agent starts its worker
    path.write_bytes(b"done at once\n")
    shipper._scanned = time.monotonic()  # the full scan was just now, however slow this machine
    assert await shipper.ship() == 1
    assert kept.text(output.subject("n0", "short", 3, 0, 0)) == "done at once\n"


async def test_an_ended_workers_file_is_drained_whole_its_last_line_too(tmp_path: Path) -> None:
    path = _worker_file(tmp_path, "ended")
    path.write_bytes(b"x" * (3 * 256 * 1024) + b"\nlast words, no newline")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    await shipper.drain([path])  # before the agent reports the worker's exit
    text = kept.text(output.subject("n0", "ended", 3, 0, 0))
    assert text.endswith("\nlast words, no newline\n")
    assert await shipper.ship(everything=True) == 0  # nothing left, nothing sent twice


async def test_files_an_older_agent_left_outside_any_run_are_not_shipped(tmp_path: Path) -> None:
    """Which run such a file is of, its path does not say: it is left on the node, unread,
    whether a full scan finds it or an exit names it, and nothing breaks."""
    old = log_path_before_runs(tmp_path, WorkerKey("train", 0, 0))
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier job's line\n")
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    assert await shipper.ship(everything=True) == 0
    await shipper.drain([old])
    assert kept.sent == {}


async def test_each_run_of_a_job_id_is_shipped_on_its_own_subjects(tmp_path: Path) -> None:
    """The job that had an id before and the one that has it now, on the same node: each file
    is shipped on its run's subject, from its own start, and neither resumes at the other's."""
    first, second = _worker_file(tmp_path, "x", run=5), _worker_file(tmp_path, "x", run=9)
    first.write_bytes(b"the first job's secret\n" * 10)
    kept = Kept()
    shipper = Shipper("n0", tmp_path, kept)
    assert await shipper.ship(everything=True) == 1
    second.write_bytes(b"the second job's line\n")
    again = Shipper("n0", tmp_path, kept)  # an agent restarted meanwhile
    assert await again.ship(everything=True) == 1
    assert kept.text(output.subject("n0", "x", 5, 0, 0)) == "the first job's secret\n" * 10
    assert kept.text(output.subject("n0", "x", 9, 0, 0)) == "the second job's line\n"


class Counting(Kept):
    """``Kept``, counting what the shipper asks of the stream."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def shipped(self, subj: str) -> int | None:
        self.asked += 1
        return await super().shipped(subj)


async def test_the_files_of_ended_workers_and_old_ones_are_not_looked_at_again(tmp_path: Path) -> None:
    """A node keeps every file its workers wrote: the shipper held on to each and read them all
    on every full scan, some 4.7 s a scan with 100,000 files. An ended worker's file, once shipped
    whole, and a file untouched for longer than the stream keeps anything, are left alone."""
    import os

    from corral.services.runtime.output import MAX_AGE

    kept = Counting()
    shipper = Shipper("n0", tmp_path, kept)
    ended = [_worker_file(tmp_path, f"e{i}") for i in range(20)]
    for path in ended:
        path.write_bytes(b"all it said\n")
    old = _worker_file(tmp_path, "old")
    old.write_bytes(b"long ago\n")
    aged = time.time() - MAX_AGE - 3600
    os.utime(old, (aged, aged))
    live = _worker_file(tmp_path, "live")
    live.write_bytes(b"line 1\n")
    assert await shipper.ship(everything=True) == 21  # the ended ones and the live one
    await shipper.drain(ended)  # their workers ended: all of them is out
    asked = kept.asked
    assert set(shipper._files) == {live}
    live.write_bytes(b"line 1\nline 2\n")
    assert await shipper.ship(everything=True) == 1
    assert kept.asked == asked  # nothing found anew, nothing asked of the stream
    assert kept.text(output.subject("n0", "old", 3, 0, 0)) == ""
    ended[0].unlink()
    await shipper.ship(everything=True)
    assert ended[0] not in shipper._done  # what is gone from the disk is not remembered


class Flaky(Kept):
    """``Kept``, refusing the next message once when told to (the server reconnecting)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = False

    async def send(self, subj: str, data: bytes, offset: int) -> None:
        if self.refuse:
            self.refuse = False
            raise ConnectionError("nats: connection reconnecting")
        await super().send(subj, data, offset)


def _looks_at_the_disk(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directories the shipper lists, as it lists them."""
    listed: list[Path] = []
    glob = Path.glob

    def counted(self: Path, pattern: str, *args: Any, **kw: Any) -> Any:
        listed.append(self)
        return glob(self, pattern, *args, **kw)

    monkeypatch.setattr(Path, "glob", counted)
    return listed


@pytest.mark.parametrize("life", ["outlives_two_passes", "ends_before_the_second_pass", "drain_cut_short"])
async def test_a_node_of_thousands_of_workers_holds_and_lists_only_its_recent_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, life: str
) -> None:
    """A node keeps the file of every worker it ran within a week. The shipper held each one shipped
    whole and listed them all every 2 s: 3,000 workers one after the other, 3,000 held and
    200 ms a look, a month of ten-minute jobs on eight GPUs 2.3 s of the agent's loop every 2 s.
    Now what it holds and what a look goes through are the recent workers' files, whether a
    worker ends at once, outlives the shipper's passes, or ends while the server is away."""
    from corral.services.agent import output as shipping

    kept = Flaky()
    shipper = Shipper("n0", tmp_path, kept)
    listed = _looks_at_the_disk(monkeypatch)
    paths = []
    for i in range(3000):
        path = _worker_file(tmp_path, f"j{i}")
        paths.append(path)
        shipper.expect([path])  # the agent starts the worker
        path.write_bytes(b"step 1\nstep 2\n")
        await shipper.ship()
        if life != "ends_before_the_second_pass":
            await shipper.ship()
        with path.open("ab") as f:
            f.write(b"done\n")
        kept.refuse = life == "drain_cut_short"
        await shipper.drain([path])  # the worker ended: before its exit is reported
        await shipper.ship()
        if i % 500 == 499:
            shipper._scanned = -shipping.SCAN_EVERY  # the look at every file being read is due
            await shipper.ship()
            await shipper.ship()
            assert len(listed) == 1  # the first look only: the workers an earlier agent left
            assert len(shipper._files) <= 2
            assert len(shipper._done) <= shipping.DONE_KEPT
            assert len(shipper._expected) <= 1
    for i in (0, 1234, 2999):  # nothing lost, nothing twice, in order
        assert kept.text(output.subject("n0", f"j{i}", 3, 0, 0)) == "step 1\nstep 2\ndone\n"
    visited: list[Path] = []
    found = shipper._found

    async def counted(path: Path) -> Any:
        visited.append(path)
        return await found(path)

    monkeypatch.setattr(shipper, "_found", counted)
    shipper._scanned = -shipping.SCAN_EVERY
    await shipper.ship()
    assert visited == [] and len(listed) == 1


async def test_a_worker_that_ends_before_the_next_pass_is_not_read_again(tmp_path: Path) -> None:
    """Drained, its file was found again through the start the agent had announced, and read
    on every look for as long as the agent ran."""
    kept = Counting()
    shipper = Shipper("n0", tmp_path, kept)
    path = _worker_file(tmp_path, "brief")
    shipper.expect([path])
    path.write_bytes(b"failed at once\n")
    await shipper.ship()
    await shipper.drain([path])
    asked = kept.asked
    assert await shipper.ship() == 0
    shipper._scanned = time.monotonic() - 60  # the look at every file being read too
    assert await shipper.ship() == 0
    assert path not in shipper._files and kept.asked == asked
    assert kept.text(output.subject("n0", "brief", 3, 0, 0)) == "failed at once\n"


async def test_an_ended_workers_file_whose_drain_was_cut_short_is_let_go_once_shipped(
    tmp_path: Path,
) -> None:
    """The server away during the drain before an exit's report: the passes ship the rest, in
    order and once, and then let the file go; it was read on every look before."""
    kept = Flaky()
    shipper = Shipper("n0", tmp_path, kept)
    path = _worker_file(tmp_path, "cut")
    path.write_bytes(b"one\n")
    assert await shipper.ship() == 1
    with path.open("ab") as f:
        f.write(b"two\nlast, unfinished")
    kept.refuse = True
    await shipper.drain([path])  # refused: the file keeps it
    assert path in shipper._files
    for _ in range(3):
        await shipper.ship()
    assert kept.text(output.subject("n0", "cut", 3, 0, 0)) == "one\ntwo\nlast, unfinished\n"
    assert path not in shipper._files and path in shipper._done


async def test_a_restarted_agent_reads_its_running_workers_files_and_lets_the_ended_ones_go(
    tmp_path: Path,
) -> None:
    """Workers outlive their agent. The next one lists every file once: it ships what the
    ended workers' files hold that the stream lacks and lets them go; it reads on the running
    workers' files (the runtime took them back), also after a silence, without listing the
    node again."""
    kept = Counting()
    ended = [_worker_file(tmp_path, f"e{i}") for i in range(5)]
    for path in ended:
        path.write_bytes(b"all it said\n")
    running = _worker_file(tmp_path, "running")
    running.write_bytes(b"epoch 1\n")
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [running])
    assert await shipper.ship() == 6
    assert await shipper.ship(full=True) == 0
    assert set(shipper._files) == {running}
    shipper._files[running].grew -= QUIET_S + 1  # silent for a while: a long epoch
    with running.open("ab") as f:
        f.write(b"epoch 2\n")
    asked = kept.asked
    shipper._scanned = time.monotonic() - 60  # the look at every file being read is due
    assert await shipper.ship() == 1
    assert kept.text(output.subject("n0", "running", 3, 0, 0)) == "epoch 1\nepoch 2\n"
    assert kept.asked == asked  # the ended ones: not asked about again


async def test_a_file_the_runtime_no_longer_knows_is_let_go_once_shipped_whole(tmp_path: Path) -> None:
    """A gang that failed to start has no exit to drain: its files are let go once the runtime
    forgets its workers, with all they hold shipped; a worker's file that appears late (a slow
    start) is still found, the runtime knowing its worker."""
    kept = Kept()
    workers: list[Path] = []
    shipper = Shipper("n0", tmp_path, kept, live=lambda: workers)
    await shipper.ship()
    failed, slow = _worker_file(tmp_path, "failed"), _worker_file(tmp_path, "slow")
    workers += [failed, slow]
    shipper.expect(workers)
    failed.write_bytes(b"cannot run: no such file")
    await shipper.ship()
    assert failed in shipper._files
    workers.remove(failed)  # forgotten
    for _ in range(2):  # the line as it stands, then nothing more
        shipper._scanned = time.monotonic() - 60
        await shipper.ship()
    assert failed not in shipper._files
    assert kept.text(output.subject("n0", "failed", 3, 0, 0)) == "cannot run: no such file\n"
    shipper._expected.clear()  # long past: the start took its time
    slow.write_bytes(b"up at last\n")
    shipper._scanned = time.monotonic() - 60
    assert await shipper.ship() == 1 and slow in shipper._files


class Away(Kept):
    """``Kept``, with the server away (every request fails) while ``away``."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False

    async def send(self, subj: str, data: bytes, offset: int) -> None:
        if self.away:
            raise ConnectionError("nats: connection reconnecting")
        await super().send(subj, data, offset)

    async def shipped(self, subj: str) -> int | None:
        if self.away:
            raise ConnectionError("nats: connection reconnecting")
        return await super().shipped(subj)


async def test_a_walk_the_server_cut_short_is_walked_again(tmp_path: Path) -> None:
    # An agent restarted while the server is away (or reconnecting): its first look lists the
    # node's files, and fails. The files of workers that ended while no agent watched (the
    # runtime does not know them: dropped by reattach, or forgotten by the agent before) were
    # listed by no later look: their output never reached the stream.
    ended = _worker_file(tmp_path, "ended-unwatched")
    ended.write_bytes(b"the last words before the agent restarted\n")
    kept = Away()
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [])
    kept.away = True
    await shipper._pass()  # the first look: the server is away
    kept.away = False
    for _ in range(3):
        shipper._scanned = time.monotonic() - 60  # the look at every file being read is due
        await shipper._pass()
    assert kept.text(output.subject("n0", "ended-unwatched", 3, 0, 0)) == (
        "the last words before the agent restarted\n"
    )


async def test_a_drain_that_failed_before_the_file_was_found_then_forgotten(tmp_path: Path) -> None:
    # The server away while a worker runs and ends: the passes and the drain before its exit
    # fail to find its file; the exit is appended (the log's connection came back first), the
    # runtime forgets the worker before a full pass. Nothing read its file again.
    kept = Away()
    workers: list[Path] = []
    shipper = Shipper("n0", tmp_path, kept, live=lambda: workers)
    await shipper._pass()  # the first walk, nothing on the node yet
    path = _worker_file(tmp_path, "brief")
    workers.append(path)
    shipper.expect([path])
    path.write_bytes(b"it ran and said this\n")
    kept.away = True
    await shipper._pass()
    await shipper.drain([path])  # fails: the file stays unread
    kept.away = False
    workers.remove(path)  # its exit is in the log: forgotten
    shipper._expected.clear()  # its start was announced more than QUIET_S ago (a long worker)
    for _ in range(3):
        shipper._scanned = time.monotonic() - 60
        await shipper._pass()
    assert kept.text(output.subject("n0", "brief", 3, 0, 0)) == "it ran and said this\n"


async def test_a_first_look_the_server_cut_short_goes_on_without_listing_the_node_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first look made again after the server cut it short listed the whole node every
    # 0.25 s, and looked at each old file again, for as long as the server stayed away.
    old = time.time() - output.MAX_AGE - 3600
    for i in range(300):  # a node of months: old files, never asked about
        p = _worker_file(tmp_path, f"old{i:05d}")
        p.write_bytes(b"x\n")
        os.utime(p, (old, old))
    _worker_file(tmp_path, "zz-recent").write_bytes(b"hello\n")  # the last the look meets
    kept = Away()
    kept.away = True
    shipper = Shipper("n0", tmp_path, kept, live=lambda: [])
    listed = _looks_at_the_disk(monkeypatch)
    for _ in range(8):
        await shipper._pass()
    assert len(listed) == 1, f"the node was listed {len(listed)} times in 8 passes"
    kept.away = False
    await shipper._pass()
    assert kept.text(output.subject("n0", "zz-recent", 3, 0, 0)) == "hello\n" and len(listed) == 1
