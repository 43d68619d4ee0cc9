"""An ended worker's working directory is scratch: a node deletes it a day after the worker
ended (``workdirs.KEEP_S``), never a directory of a worker it runs, never a checkpoint."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corral.services.agent import workdirs
from corral.services.agent.decide import WorkerKey
from corral.services.agent.workdirs import KEEP_S, Workdirs
from corral.services.agent.workers import Runtime

DAY = 24 * 3600.0


def _runtime(root: Path, now: list[float]) -> Runtime:
    rt = Runtime(root, sandbox="none", containers="none")
    rt.workdirs = Workdirs(root, clock=lambda: now[0])
    rt.reattach()  # as an agent starting: takes back nothing, lists the ended workers' directories
    return rt


def _ran(rt: Runtime, key: WorkerKey, run: int) -> Path:
    """A worker of ``key`` ran here (its directory holds what it wrote) and ended."""
    rt.report_gone(key, run)
    workdir = rt._workers[key].workdir
    (workdir / "scratch").mkdir(parents=True)
    (workdir / "scratch" / "data.bin").write_bytes(b"x" * 4096)
    return workdir


def _workdirs(root: Path) -> list[Path]:
    return sorted((root / "work").glob("*/run-*/attempt-*/rank-*"))


async def test_a_node_of_months_keeps_a_day_of_ended_workers_directories(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    rt = _runtime(tmp_path, now)
    running = _ran(rt, WorkerKey("long", 0, 0), 1)
    rt._workers[WorkerKey("long", 0, 0)].phase = "running"  # as if still running, for a month
    held = []
    for hour in range(5 * 24):  # days of a job an hour ending on this node, two ranks each
        for rank in (0, 1):
            key = WorkerKey(f"j{hour}", 0, rank)
            _ran(rt, key, 100 + hour)
            rt.forget(key)
        now[0] += 3600
        rt.sweep_workdirs()
        await rt.workdirs.wait()
        held.append(len(_workdirs(tmp_path)))
    # A day of them and the one that runs: days on, as many as after the first day.
    assert held[-1] == held[24] == 2 * 24 + 1
    assert running.is_dir()
    jobs = {p.name for p in (tmp_path / "work").iterdir()}
    assert len(jobs) == 25  # the emptied jobs' directories went too
    assert len(rt.workdirs) == 2 * 24


async def test_an_agent_starting_deletes_what_ended_a_day_ago_under_an_earlier_one(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    rt = _runtime(tmp_path, now)
    for job in ("old", "recent", "retried"):
        key = WorkerKey(job, 0, 0)
        _ran(rt, key, 7)
        rt.forget(key)  # the time it ended is written into its directory
        now[0] += DAY / 4
    ckpt = tmp_path / "checkpoints" / "old" / "run-7" / "attempt-0" / "rank-0"
    ckpt.mkdir(parents=True)
    os.utime(ckpt, (0, 0))
    now[0] += DAY / 4 + 60  # "old" ended a day and a minute ago, "recent" 18 hours ago
    restarted = Runtime(tmp_path, sandbox="none", containers="none")
    restarted.workdirs = Workdirs(tmp_path, clock=lambda: now[0])
    restarted.reattach()
    restarted.report_gone(WorkerKey("retried", 0, 0), 7)  # the log still has it live here
    assert restarted.workdirs.due({w.workdir for w in restarted._workers.values()}) == [
        tmp_path / "work" / "old" / "run-7" / "attempt-0" / "rank-0"
    ]


def test_only_workers_directories_are_deleted_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "users-data"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-0"
    d.mkdir(parents=True)
    (d / "link").symlink_to(outside)
    w = Workdirs(tmp_path)
    w.delete([d, tmp_path / "work" / "j" / "run-1", outside])
    assert (outside / "keep").read_text() == "mine"
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_a_directory_its_worker_ran_in_again_counts_from_its_later_end(tmp_path: Path) -> None:
    now = [1_000.0]
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-0"
    d.mkdir(parents=True)
    w = Workdirs(tmp_path, clock=lambda: now[0])
    w.ended(d)
    now[0] += KEEP_S / 2
    w.ended(d)  # started again in the same attempt, and ended again
    now[0] += KEEP_S / 2 + 1
    assert w.due(()) == []
    now[0] += KEEP_S / 2
    assert w.due(()) == [d]
    assert workdirs.DELETE_AT_ONCE >= 1


async def test_a_worker_lost_with_an_earlier_agent_keeps_its_directory_until_the_log_is_read(
    tmp_path: Path,
) -> None:
    # A node rebooted: a worker that ran two days, writing below its directory (which leaves the
    # directory's own mtime at its start), was lost with the agent. The log still has it live
    # here: the new agent reports it gone, and its directory stays a day from then. Until its
    # node's view arrives, the agent does not know that, and must not judge it ended long ago.
    import time

    from corral.events.log import InMemoryLog
    from corral.projections.assignments import Assignment, NodeView
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    lost = tmp_path / "work" / "lost" / "run-3" / "attempt-0" / "rank-0"
    (lost / "scratch").mkdir(parents=True)
    started = time.time() - 2 * DAY
    os.utime(lost, (started, started))
    agent = NodeAgent("node-00", InMemoryLog(), MemoryViews(), work_dir=tmp_path)
    agent.runtime = Runtime(tmp_path, sandbox="none", containers="none")
    agent.runtime.reattach()
    await agent.cycle()  # no view yet: the first one was late
    await agent.runtime.workdirs.wait()
    assert lost.is_dir()
    view = NodeView(
        "node-00",
        seq=5,
        time=time.time(),
        jobs=(Assignment("lost", 0, "running", run=3, held_attempt=0, live=(0,)),),
    )
    agent._saw(view)
    await agent.cycle()
    await agent.runtime.workdirs.wait()
    assert lost.is_dir()
    assert WorkerKey("lost", 0, 0) in agent.runtime._workers  # reported gone: kept as exited


async def test_a_rank_started_again_while_its_old_directory_is_deleted_keeps_what_it_writes(
    tmp_path: Path,
) -> None:
    # An elastic job shrank away from rank 1 and grows back a day later, in the same attempt: the
    # rank runs in the same directory. The sweep chose it while the rank was away; the deletion,
    # in a thread, must not take what the rank started again writes there meanwhile.
    now = [1_000.0]
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-1"
    (d / "scratch").mkdir(parents=True)
    w = Workdirs(tmp_path, clock=lambda: now[0])
    w.ended(d)
    now[0] += KEEP_S + 1
    w.sweep(())
    d.mkdir(parents=True, exist_ok=True)  # the rank started again, before the thread ran
    (d / "new").write_text("mine")
    await w.wait()
    assert (d / "new").read_text() == "mine"
    assert not (d / "scratch").exists()


async def test_what_an_agent_stopped_mid_deletion_left_goes_with_the_next_ones_first_sweep(
    tmp_path: Path,
) -> None:
    left = tmp_path / "work" / ".deleting" / "tmp1" / "rank-0"
    (left / "scratch").mkdir(parents=True)
    now = [1_000.0]
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-0"
    d.mkdir(parents=True)
    w = Workdirs(tmp_path, clock=lambda: now[0])
    w.ended(d)
    now[0] += KEEP_S + 1
    w.sweep(())
    await w.wait()
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_a_directory_that_cannot_be_moved_aside_is_deleted_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job's directory is on a filesystem of its own (a mount): the rename into .deleting
    # fails with EXDEV. Left where it is, the directory would stay for good: it is deleted in
    # place, as before directories were moved aside.
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-0"
    (d / "scratch").mkdir(parents=True)
    (d / "scratch" / "data.bin").write_bytes(b"x" * 4096)
    rename = os.rename

    def across(src: object, dst: object) -> None:
        if Path(str(src)) == d:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(workdirs.os, "rename", across)
    Workdirs(tmp_path).delete([d])
    assert not d.exists()
    assert not (tmp_path / "work" / "j").exists()


def test_a_deleting_that_is_not_a_directory_stops_no_deletion(tmp_path: Path) -> None:
    # A link (or file) named .deleting under work: nothing is moved into it, yet the scratch of
    # ended workers still goes.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / ".deleting").symlink_to(tmp_path / "elsewhere")
    d = tmp_path / "work" / "j" / "run-1" / "attempt-0" / "rank-0"
    (d / "scratch").mkdir(parents=True)
    Workdirs(tmp_path).delete([d])
    assert not d.exists()
    assert not any((tmp_path / "elsewhere").iterdir())
