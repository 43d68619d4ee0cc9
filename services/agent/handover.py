"""Handing workers from one agent to the next: the agent's side of the keeper protocol.

Every worker runs under a keeper of its own (``keeper.py``), so it outlives the agent that
started it. Each keeper has a directory ``<root>/keepers/<job>/attempt-<a>.rank-<r>``
(``keeper_dir``): the keeper writes there who runs (``keeper.STATE``) and how the worker ended
(``keeper.EXIT``); the agent writes beside them the worker's record (``RECORD``,
``WorkerRecord``): what it runs and which of its reports the log holds. ``workers.Runtime``
runs the workers; this module says what goes on disk for them and reads it back.

Invariants:

- A record is written whole (aside, then renamed): the next agent reads the last one written,
  never half of one.
- A keeper is taken back only if the same pid has the same start time in the same boot: a pid
  reused by another process, or any pid after a reboot, is never taken for a keeper.
- A directory that holds no readable record, or that is not where its record's worker belongs,
  has nothing to take back and is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Container, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from corral.services.agent.container import EngineInfo
from corral.services.agent.decide import StartWorker, WorkerKey
from corral.services.agent.keeper import EXIT, STATE, boot_id, start_time
from corral.services.agent.sandbox import RunAs

log = logging.getLogger(__name__)

RECORD = "worker.json"
KEEPER = str(Path(__file__).with_name("keeper.py"))


def keeper_dir(root: str | Path, key: WorkerKey) -> Path:
    """Where the worker's keeper keeps its state, and the agent what it needs to take it back."""
    return Path(root) / "keepers" / key.job_id / f"attempt-{key.attempt}.rank-{key.rank}"


class WorkerRecord(msgspec.Struct, omit_defaults=True):
    """What an agent needs to take a worker back from the agent before it (``RECORD`` in the
    keeper's directory): what it runs, and how much of it the log has been told."""

    spec: StartWorker
    container: str | None = None
    engine: EngineInfo | None = None
    container_pid: int | None = None
    sandboxed: bool = False
    announced: bool = False  # its start was reported: its exit must be too
    reported_pid: int = 0
    stop_grace: float | None = None  # corral asked it to stop, with this grace
    start_appended: bool = False  # the log has its start
    exit_appended: bool = False  # the log has its exit
    killed_at: float | None = None  # when it was sent SIGKILL (wall clock): it may be unkillable


def save(state_dir: Path, record: WorkerRecord) -> None:
    """Write the record, whole, where the next agent looks for it."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / (RECORD + ".tmp")
        tmp.write_bytes(msgspec.json.encode(record))
        os.replace(tmp, state_dir / RECORD)
    except OSError as e:
        log.warning("worker %s: cannot save its record: %s", record.spec.key, e)


def drop(state_dir: Path) -> None:
    """Forget the worker on disk: nothing of it is left to take back."""
    shutil.rmtree(state_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        state_dir.parent.rmdir()  # the job's, once its last worker here is dropped


def keeper_command(
    state_dir: Path, argv: Sequence[str], *, bwrap: bool = False, user: RunAs | None = None
) -> list[str]:
    """The command line that runs ``argv`` under a keeper writing into ``state_dir``; the files
    an earlier keeper of the same worker wrote there are removed first, so that what is read
    back is the new keeper's."""
    for stale in (STATE, EXIT):
        (state_dir / stale).unlink(missing_ok=True)
    opts = [str(state_dir)]
    if bwrap:
        opts.append("--bwrap-status")
    if user is not None:
        opts += ["--user", str(user.uid), "--group", str(user.gid)]
    return [sys.executable, "-I", KEEPER, *opts, "--", *argv]


def keeper_state(state_dir: Path) -> dict[str, Any] | None:
    """What the keeper last wrote of who runs (``keeper.STATE``), or None before it has."""
    return _read_json(state_dir / STATE)


def exit_of(state_dir: Path) -> int | None:
    """The worker's exit code as its keeper wrote it, or None while it has not ended."""
    body = _read_json(state_dir / EXIT)
    code = None if body is None else body.get("code")
    return code if isinstance(code, int) else None


def alive(keeper: tuple[int, int] | None, boot: str) -> bool:
    """Whether the keeper of this pid and start time still runs: after a reboot, or once its
    pid is another process's, it does not."""
    if keeper is None or (boot and boot != boot_id()):
        return False
    return start_time(keeper[0]) == keeper[1]


class Kept(NamedTuple):
    """A worker an earlier agent left here, as its record and its keeper's files tell it."""

    record: WorkerRecord
    keeper_id: tuple[int, int] | None  # the keeper's pid and start time
    boot: str  # the boot the keeper ran in
    pid: int | None  # the keeper's child: the command, bwrap or the engine's client
    pid_start: int
    sandbox_pid: int | None  # bwrap's init, or the container's as the host sees it
    code: int | None  # its exit, written while no agent watched
    running: bool  # no exit yet, and its keeper still runs


def kept(root: Path, known: Container[WorkerKey]) -> Iterator[Kept]:
    """Every worker an earlier agent left under ``root``, but those in ``known`` (taken back
    already); a directory with nothing to take back is removed. Lazily, one directory at a
    time: ``known`` may grow with the workers taken back."""
    for d in sorted((root / "keepers").glob("*/attempt-*.rank-*")):
        record = _read_record(d / RECORD)
        if record is None or record.spec.key in known or keeper_dir(root, record.spec.key) != d:
            shutil.rmtree(d, ignore_errors=True)
            continue
        state = keeper_state(d) or {}
        keeper_id, boot, pid, pid_start = None, "", None, 0
        if "keeper" in state and "worker" in state:
            keeper_id = (int(state["keeper"][0]), int(state["keeper"][1]))
            boot = str(state.get("boot", ""))
            pid, pid_start = int(state["worker"][0]), int(state["worker"][1])
        sandbox_pid = None
        if record.container is not None:
            sandbox_pid = record.container_pid
        elif "sandbox" in state:
            sandbox_pid = int(state["sandbox"][0])
        code = exit_of(d)
        running = code is None and alive(keeper_id, boot)
        yield Kept(record, keeper_id, boot, pid, pid_start, sandbox_pid, code, running)


def _read_record(path: Path) -> WorkerRecord | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=WorkerRecord)
    except (OSError, msgspec.DecodeError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None
