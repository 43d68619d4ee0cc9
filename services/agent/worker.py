"""One worker as the agent's runtime holds it: what it runs, its keeper, its phase and what the log
is known to hold of it (``Worker``), where its files lie (``log_path``, ``job_logs``, the
checkpoint contract's ``REQUEST`` and ``DONE``: each in its job's run, ``decide.run_dir``) and the
process helpers the runtime's parts share.

What one agent leaves beside each keeper for the next is ``handover.py``'s; the runtime
(``workers.py``) drives the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from pathlib import Path

from corral.services.agent import handover
from corral.services.agent.container import EngineInfo
from corral.services.agent.decide import STOP_GRACE, StartWorker, WorkerKey, WorkerPhase, run_dir
from corral.services.agent.handover import WorkerRecord, keeper_dir

REQUEST = "REQUEST"
DONE = "DONE"

# The runtime's one logger, whichever of its modules logs: operators filter its lines by name.
log = logging.getLogger("corral.services.agent.workers")


class StartError(Exception):
    """A worker could not be started; the message says why in an operator's words. ``node``: the
    node is at fault, not the job, and would fail any job so (its directories cannot be made,
    the sandbox it is set to use cannot run, a device is missing): the job is not charged, and
    the node is taken out of placement if it keeps failing so. Only what is plainly the node's
    is said so: a command, image or mount the job names that cannot be run is the job's, and so
    is what the job asks of a node that does not offer it (an image where no container engine
    runs, a data mount where no sandbox does), which every other job may still start there."""

    def __init__(self, message: str, *, node: bool = False) -> None:
        super().__init__(message)
        self.node = node


# A worker's file in its run's directory: ``attempt-<a>.rank-<r>.log``.
LOG_FILE = re.compile(r"attempt-(0|[1-9][0-9]*)\.rank-(0|[1-9][0-9]*)\.log")
RUN = re.compile(r"run-(0|[1-9][0-9]*)")  # a run's directory (``run_dir``)


def log_path(root: str | Path, key: WorkerKey, run: int) -> Path:
    """Where the worker writes its stdout and stderr: ``logs/<job>/run-<n>/attempt-<a>.rank-<r>.log``.
    In its job's run (``run_dir``), as its directories are: a job id is free again once its job
    was let go, and a later job of the id must neither append to the earlier one's file nor
    have it read back as its own (a start's failure quotes its tail; the agent ships it)."""
    return Path(root) / "logs" / run_dir(key.job_id, run) / f"attempt-{key.attempt}.rank-{key.rank}.log"


# A start's failure is told from the end of its worker's file: only so much of it is read, as
# the file may be large (a worker that printed for days before a restart failed; the agent frees
# the disk under an old part of it, whose size stays).
TAIL_BYTES = 64 * 1024


def log_tail(path: Path) -> str:
    """The last ``TAIL_BYTES`` of a worker's file as text (its first line maybe cut), or ``""``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            return f.read(TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""


def log_path_before_runs(root: str | Path, key: WorkerKey) -> Path:
    """Where an older agent, before log files were kept per run, had the worker write: a worker
    it started writes there still when a newer agent takes it back (``Runtime.reattach``)."""
    return Path(root) / "logs" / key.job_id / f"attempt-{key.attempt}.rank-{key.rank}.log"


def job_logs(root: str | Path, job_id: str, run: int | None = None) -> list[Path]:
    """The log files of one run of a job on this node (None: the newest run here), oldest
    attempt first, then by rank."""
    d = Path(root) / "logs" / job_id
    if run is None:
        runs = [int(m[1]) for p in _listed(d) if (m := RUN.fullmatch(p.name)) and p.is_dir()]
        if not runs:
            return []
        run = max(runs)
    found = [(m, p) for p in _listed(d / f"run-{run}") if (m := LOG_FILE.fullmatch(p.name))]
    return [p for _, p in sorted(found, key=lambda x: (int(x[0][1]), int(x[0][2])))]


def _listed(d: Path) -> list[Path]:
    try:
        return list(d.iterdir())
    except OSError:
        return []


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Worker:
    def __init__(self, spec: StartWorker, root: Path) -> None:
        self.spec = spec
        self.key = spec.key
        self.phase: WorkerPhase = "starting"
        self.workdir = (
            root / "work" / run_dir(spec.job_id, spec.run) / f"attempt-{spec.attempt}" / f"rank-{spec.rank}"
        )
        self.log = log_path(root, self.key, spec.run)
        self.dir = keeper_dir(root, self.key)
        self.checkpoints = Path(spec.checkpoint_dir)
        # Below it the job's workers may write, so the agent goes down from here without
        # following links (``confined``): the parent of the job's run directory.
        self.checkpoint_top = Path(spec.job_checkpoint_dir).parent
        self.keeper: asyncio.subprocess.Process | None = None  # a keeper this agent started
        self.keeper_id: tuple[int, int] | None = None  # its pid and start time
        self.boot = ""  # the boot the keeper ran in: after a reboot no pid is its
        self.pid: int | None = None  # the keeper's child: the command, bwrap or the engine's client
        self.pid_start = 0
        self.appended: set[str] = set()  # "start", "exit": what the log is known to hold
        # bwrap's init process, pid 1 of the worker's namespace; or the container's init, seen
        # from the host once the container runs
        self.sandbox_pid: int | None = None
        self.container: str | None = None  # the container's name, for a worker in one
        self.sandboxed = False  # run by bwrap
        self.engine: EngineInfo | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.killer: asyncio.Task[None] | None = None
        self.killed_at: float | None = None  # when SIGKILL was first sent (monotonic)
        self.done_unreadable = False  # its DONE is no file the agent reads, and stays (said once)
        # its last checkpoint reported: when (monotonic) and its step (``checkpoints``)
        self.checkpoint_reported_at: float | None = None
        self.checkpoint_step: int | None = None
        self.settled = asyncio.Event()  # the start barrier has decided about this worker
        self.announced = False  # its start was reported: its exit and checkpoints are reported too
        self.stop_requested = False
        self.stop_grace = STOP_GRACE
        self.reported_pid = 0  # the pid its start was reported with, and its exit is
        self.signal_owed = False  # asked to checkpoint, not yet signalled: it had no handler yet
        self.done = asyncio.Event()
        self.code: int | None = None

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            spec=self.spec,
            container=self.container,
            engine=self.engine,
            container_pid=self.sandbox_pid if self.container is not None else None,
            sandboxed=self.sandboxed,
            announced=self.announced,
            reported_pid=self.reported_pid,
            stop_grace=self.stop_grace if self.stop_requested else None,
            start_appended="start" in self.appended,
            exit_appended="exit" in self.appended,
            killed_at=None if self.killed_at is None else time.time() - (time.monotonic() - self.killed_at),
        )

    def save(self) -> None:
        """Write the record, whole, where the next agent looks for it."""
        handover.save(self.dir, self.record())

    def drop(self) -> None:
        """Forget the worker on disk: nothing of it is left to take back."""
        handover.drop(self.dir)


def kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out
