"""The keeper's state-file protocol and taking workers back, with real processes.

- the keeper names its child by pid and start time, writes its exit (128+N for signal N), says
  why a command could not run, and passes SIGTERM on to its child;
- a runtime that leaves its workers running and a new one on the same directory that takes them
  back: a running worker is watched and stopped by the new one; one that ended meanwhile is
  reported once; one whose keeper is another process now (a reused pid) or was killed is not
  taken back.

Nothing sleeps to let things happen: every wait looks for what it expects, with a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.services.agent import keeper
from corral.services.agent.decide import Exited, Started, StartWorker, WorkerKey
from corral.services.agent.handover import RECORD, keeper_dir
from corral.services.agent.worker import log_path, log_path_before_runs
from corral.services.agent.workers import Runtime, SandboxMode
from tests.integration import polling
from tests.integration.test_agent_runtime import LOOP, PY, WAIT, bwrap_works, spec_for

MODES: list[SandboxMode] = ["none", "bwrap"]


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    await polling.until(predicate, timeout)


def run_keeper(state: Path, *argv: str) -> subprocess.Popen[bytes]:
    state.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([PY, "-I", keeper.__file__, str(state), "--", *argv])


def read(path: Path) -> dict[str, object]:
    body = json.loads(path.read_text())
    assert isinstance(body, dict)
    return body


# -- the keeper alone ------------------------------------------------------------------------------


def test_the_keeper_names_its_worker_and_writes_its_exit(tmp_path: Path) -> None:
    k = run_keeper(tmp_path, PY, "-c", "import sys; sys.exit(7)")
    assert k.wait(WAIT) == 0
    state = read(tmp_path / keeper.STATE)
    assert state["boot"] == keeper.boot_id() and state["keeper"] == [k.pid, state["keeper"][1]]  # type: ignore[index]
    pid, start = state["worker"]  # type: ignore[misc]
    assert pid != k.pid and start > 0
    assert read(tmp_path / keeper.EXIT) == {"code": 7}


def test_a_command_that_cannot_run_is_said_so_and_has_no_exit(tmp_path: Path) -> None:
    k = run_keeper(tmp_path, "/no/such/program")
    assert k.wait(WAIT) == 127
    assert read(tmp_path / keeper.STATE) == {"error": "No such file or directory"}
    assert not (tmp_path / keeper.EXIT).exists()


def test_sigterm_to_the_keeper_reaches_the_worker_and_its_exit_says_so(tmp_path: Path) -> None:
    k = run_keeper(tmp_path, PY, "-c", LOOP)
    asyncio.run(until(lambda: (tmp_path / keeper.STATE).exists()))
    k.send_signal(signal.SIGTERM)
    assert k.wait(WAIT) == 0
    assert read(tmp_path / keeper.EXIT) == {"code": 128 + signal.SIGTERM}


def test_a_worker_dies_with_its_keeper(tmp_path: Path) -> None:
    k = run_keeper(tmp_path, PY, "-c", LOOP)
    asyncio.run(until(lambda: (tmp_path / keeper.STATE).exists()))
    pid = read(tmp_path / keeper.STATE)["worker"][0]  # type: ignore[index]
    assert keeper.start_time(pid) is not None
    k.kill()
    k.wait(WAIT)
    asyncio.run(until(lambda: keeper.start_time(pid) is None))
    assert not (tmp_path / keeper.EXIT).exists()


def test_start_time_tells_a_live_process_from_none() -> None:
    assert keeper.start_time(os.getpid()) == keeper.start_time(os.getpid()) is not None
    assert keeper.start_time(0) is None and keeper.start_time(2**22 + 1) is None


# -- leaving and taking back ------------------------------------------------------------------------


@pytest.fixture(params=MODES)
async def mode(request: pytest.FixtureRequest) -> SandboxMode:
    if request.param == "bwrap" and not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    return request.param  # type: ignore[no-any-return]


async def started_then_left(root: Path, spec: StartWorker, mode: SandboxMode) -> int:
    """Start ``spec`` in a runtime that then leaves it running; its pid."""
    first = Runtime(root, sandbox=mode, poll_interval=0.02)
    result = await first.start_gang([spec], timeout=WAIT)
    assert result.started == (spec.key,)
    started = await first.next_report(WAIT)
    assert isinstance(started, Started)
    first.appended(spec.key, "start")  # as the agent does once the log holds it
    await first.leave()
    assert first.workers() == {}
    return started.pid


async def test_a_running_worker_is_taken_back_and_stopped_by_the_new_runtime(
    tmp_path: Path, mode: SandboxMode
) -> None:
    root = tmp_path / "agent"
    s = spec_for(tmp_path, "kept", [PY, "-c", LOOP])
    pid = await started_then_left(root, s, mode)
    assert keeper.start_time(pid) is not None  # the worker outlived its runtime
    second = Runtime(root, sandbox=mode, poll_interval=0.02)
    try:
        assert second.reattach() == [s.key]
        assert second.workers() == {s.key: "running"} and second.pid(s.key) == pid
        assert second.reports.empty()  # its start is in the log already: not reported again
        await second.stop(s.key, grace=5.0)
        assert await second.next_report(WAIT) == Exited(s.key, 128 + signal.SIGTERM, True, pid)
    finally:
        await second.close(grace=1.0)


async def test_a_worker_an_older_agent_started_writes_on_into_its_runs_file(tmp_path: Path) -> None:
    """Before log files were kept per run, a worker wrote to ``logs/<job>/attempt-<a>.rank-<r>.log``:
    a newer agent taking it back moves that file into the worker's run, where it reads and ships
    it, and the worker writes on into it."""
    root = tmp_path / "agent"
    flag = tmp_path / "go-on"
    script = (
        f"import os, time\nprint('before', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\nprint('after', flush=True)\n"
    )
    s = spec_for(tmp_path, "upgraded", [PY, "-c", script], run=7)
    now = log_path(root, s.key, s.run)
    await started_then_left(root, s, "none")
    await until(lambda: now.exists() and now.read_text() == "before\n")
    old = log_path_before_runs(root, s.key)
    now.rename(old)  # where an older agent had it write (its open file goes with it)
    now.parent.rmdir()
    second = Runtime(root, sandbox="none", poll_interval=0.02)
    try:
        assert second.reattach() == [s.key]
        assert second.log_of(s.key) == now and not old.exists()
        flag.touch()
        exited = await second.next_report(WAIT)
        assert isinstance(exited, Exited) and exited.code == 0
        assert now.read_text() == "before\nafter\n"
    finally:
        await second.close(grace=1.0)


async def test_a_worker_that_ended_meanwhile_is_reported_once(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    flag = tmp_path / "finish"
    script = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
    s = spec_for(tmp_path, "away", [PY, "-c", script])
    pid = await started_then_left(root, s, "none")
    flag.touch()
    await until((keeper_dir(root, s.key) / keeper.EXIT).exists)
    second = Runtime(root, sandbox="none", poll_interval=0.02)
    assert second.reattach() == [s.key]
    assert await second.next_report(WAIT) == Exited(s.key, 0, False, pid)
    assert second.workers() == {s.key: "exited"}
    second.appended(s.key, "exit")
    # A third runtime (the agent restarted again before the log caught up) says nothing more.
    third = Runtime(root, sandbox="none", poll_interval=0.02)
    assert third.reattach() == [s.key] and third.reports.empty()
    third.forget(s.key)
    assert not keeper_dir(root, s.key).exists()


async def test_a_keeper_whose_pid_is_another_process_now_is_not_taken_back(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    s = spec_for(tmp_path, "reused", [PY, "-c", LOOP])
    pid = await started_then_left(root, s, "none")
    state_file = keeper_dir(root, s.key) / keeper.STATE
    state = read(state_file)
    keeper_pid = state["keeper"][0]  # type: ignore[index]
    # The keeper ends (its worker with it) and its pid goes to another process: this one,
    # whose start time is not the keeper's.
    os.kill(keeper_pid, signal.SIGKILL)
    await until(lambda: keeper.start_time(pid) is None)
    state["keeper"] = [os.getpid(), keeper.start_time(os.getpid())]
    state["keeper"][1] += 1  # type: ignore[index]
    state_file.write_text(json.dumps(state))
    second = Runtime(root, sandbox="none", poll_interval=0.02)
    assert second.reattach() == [] and second.workers() == {}
    assert not keeper_dir(root, s.key).exists()
    assert keeper.start_time(os.getpid()) is not None  # the process with that pid was left alone


async def test_a_worker_whose_keeper_was_killed_is_not_taken_back(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    s = spec_for(tmp_path, "killed", [PY, "-c", LOOP])
    pid = await started_then_left(root, s, "none")
    os.kill(read(keeper_dir(root, s.key) / keeper.STATE)["keeper"][0], signal.SIGKILL)  # type: ignore[index]
    await until(lambda: keeper.start_time(pid) is None)  # the worker died with it
    second = Runtime(root, sandbox="none", poll_interval=0.02)
    assert second.reattach() == [] and second.workers() == {}
    assert second.reports.empty()  # ``decide`` reports it gone, from the log's view
    assert not (root / "keepers" / "killed").exists()


async def test_a_record_without_a_keeper_state_is_dropped(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    d = keeper_dir(root, WorkerKey("never", 0, 0))
    d.mkdir(parents=True)
    (d / RECORD).write_text("not json")
    assert Runtime(root, sandbox="none").reattach() == []
    assert not d.exists()


def test_the_keeper_runs_as_a_file_with_the_standard_library_only() -> None:
    out = subprocess.run(
        [
            PY,
            "-I",
            "-c",
            f"import runpy, sys; runpy.run_path({keeper.__file__!r}); print(sorted(sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    loaded = json.loads(out.stdout.replace("'", '"'))
    assert not [m for m in loaded if m.split(".")[0] in ("corral", "msgspec", "nats")]
