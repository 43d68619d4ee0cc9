"""The keeper: one small process per worker, so that a worker outlives the agent that started it.

The agent starts ``python -I keeper.py STATE_DIR [--bwrap-status] [--user UID --group GID] --
ARGV...``; the keeper runs ARGV (the command itself, bwrap with the command, or a container
engine's client) as its child, in a session of its own, and waits for it. The agent is not the
worker's parent, so an agent that restarts leaves its workers running: the next agent on the
same work directory reads the keepers' state directories (``handover.kept``) and takes them
back (``workers.Runtime.reattach``).

The state directory protocol (every file written whole: written aside, then renamed):

- ``keeper.json``: ``{"boot": <boot id>, "keeper": [pid, start], "worker": [pid, start]}``,
  written once the child runs; ``"sandbox": [pid, start]`` is added for bwrap, whose first
  process inside the sandbox it names on its status pipe (``--bwrap-status``: the keeper makes
  that pipe and puts its end in place of the number after ``--json-status-fd``). ``start`` is
  the process's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot): a pid with
  another start time, or any pid after a reboot, is another process.
- ``keeper.json`` with ``{"error": "..."}``: the child could not be run (the keeper exits 127).
- ``exit``: ``{"code": N}`` once the child has ended: its status, or 128+N when signal N ended it.

The keeper has no exit file to write when it is killed itself: its child dies with it (parent
death signal; bwrap's ``--die-with-parent``), and an agent that finds a keeper gone without an
exit reports the worker gone, as for a node that rebooted. SIGTERM, SIGINT and SIGHUP sent to
the keeper go on to the child's process group; SIGUSR1 (a checkpoint request, which the agent
sends to the worker itself) is caught and dropped, never inherited as ignored.

Standard library only, and run as a file, not as a module of corral: it starts in a few
milliseconds and runs whatever environment the worker was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

STATE = "keeper.json"
EXIT = "exit"
_PR_SET_PDEATHSIG = 1
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when no such process lives
    (a zombie is not alive: it only waits for its parent to read its status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])  # field 22 of stat: fields[0] here is field 3
    except (IndexError, ValueError):
        return None


def identity(pid: int) -> list[int]:
    return [pid, start_time(pid) or 0]


def write_json(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def _parse(argv: list[str]) -> tuple[Path, bool, int | None, int | None, list[str]]:
    if "--" not in argv or argv.index("--") < 1:
        raise SystemExit("usage: keeper.py STATE_DIR [--bwrap-status] [--user UID --group GID] -- ARGV...")
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    state_dir, opts = Path(opts[0]), opts[1:]
    bwrap = "--bwrap-status" in opts
    user = int(opts[opts.index("--user") + 1]) if "--user" in opts else None
    group = int(opts[opts.index("--group") + 1]) if "--group" in opts else None
    return state_dir, bwrap, user, group, command


def main(argv: list[str]) -> int:
    state_dir, bwrap, user, group, command = _parse(argv)
    keeper = os.getpid()
    child: subprocess.Popen[bytes] | None = None
    owed: list[int] = []  # signals that came before the child ran

    def forward(signum: int, _frame: Any) -> None:
        if child is None:
            owed.append(signum)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # caught, so reset to its default in the child

    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_keeper() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != keeper:  # the keeper died before the line above: so must the child
            os._exit(137)

    read_fd = write_fd = -1
    pass_fds: tuple[int, ...] = ()
    if bwrap and "--json-status-fd" in command:
        read_fd, write_fd = os.pipe()
        command[command.index("--json-status-fd") + 1] = str(write_fd)
        pass_fds = (write_fd,)
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user, "group": group, "extra_groups": []}
    try:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: a stop reaches its children
            pass_fds=pass_fds,
            preexec_fn=die_with_keeper,
            **as_user,
        )
    except OSError as e:
        write_json(state_dir / STATE, {"error": e.strerror or str(e)})
        return 127
    finally:
        if write_fd >= 0:
            os.close(write_fd)
    for signum in owed:
        forward(signum, None)
    state: dict[str, Any] = {"boot": boot_id(), "keeper": identity(keeper), "worker": identity(child.pid)}
    write_json(state_dir / STATE, state)
    if read_fd >= 0:
        # bwrap names its first process in the sandbox, then its exit code as it ends: the pipe
        # stays open until then, or bwrap would die writing that last line.
        with os.fdopen(read_fd, "rb", 0) as status:
            for line in status:
                with contextlib.suppress(ValueError, AttributeError):
                    pid = json.loads(line).get("child-pid")
                    if isinstance(pid, int) and "sandbox" not in state:
                        state["sandbox"] = identity(pid)
                        write_json(state_dir / STATE, state)
    returncode = child.wait()
    code = 128 - returncode if returncode < 0 else returncode
    write_json(state_dir / EXIT, {"code": code})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
