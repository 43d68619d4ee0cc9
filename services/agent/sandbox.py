"""Runs a worker in its own mount and PID namespace with bubblewrap (``bwrap``), where it exists.

The sandbox's root is a read-only view of the host's, entry by entry, so that data mounts can
land at new top-level paths (a narrow view, for multi-tenant corrals, shows only the system's
directories, ``SYSTEM``, the interpreter's environment and the command's own files); ``/proc``,
``/dev`` and ``/tmp`` are its own (with what the command needs from the host's ``/tmp`` bound
back read-only); the worker's working directory and its
job's checkpoint directory are writable; each data mount is bound at its target, read-only when
asked. bwrap reports the sandboxed process on a status pipe (``--json-status-fd``), and its own
complaints start with ``bwrap: `` in the worker's log.

What corral keeps for itself is hidden: each of the agent's ``hidden`` directories (the data
directory, with its credentials, the NATS store, every node's and job's files) is an empty
directory in the sandbox, with the worker's own working and checkpoint directories bound back
into it. Run as root, the worker keeps no capability (``--cap-drop ALL``), so it cannot unmount
what hides them. Given a user (``RunAs``: multi-tenant corrals give ``nobody``), bwrap builds
the sandbox as root and the command runs in it as that unprivileged host user (``setpriv``
switches to it, with no groups and no way to regain privileges), its own directories handed to
it; bwrap, not the user, opens what is bound, so the user need not reach the host's paths.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import sys
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any, Literal, NamedTuple

from corral.events.jobs import Mount, mount_problem

SandboxMode = Literal["auto", "bwrap", "none"]
WORKER_USER = "nobody"  # whom workers run as where tenants share nodes, unless told otherwise


class Isolation(NamedTuple):
    """How an agent keeps its workers from the host and from each other (``NodeAgent``'s
    arguments of these names)."""

    sandbox: SandboxMode
    worker_user: str | None
    narrow_view: bool


def isolation(
    logins: bool, sandbox: SandboxMode = "auto", worker_user: str | None = WORKER_USER
) -> Isolation:
    """The isolation of an agent whose corral has logins (``logins``: its tenants share nodes)
    or not, whoever starts it (``corral up``, ``corral serve agent``). With logins a worker runs
    sandboxed or not at all (``auto`` becomes ``bwrap``), as ``worker_user``, shown only the
    host's system directories and what it runs from: run as the agent's own user with the
    host's whole root shown, a job could read whatever the agent may (its login's password
    among it) and speak for the node; ``none`` is passed on as asked (a test's choice: the CLI
    refuses it with a login). Without, workers run as the agent's user, shown the host's root,
    sandboxed where bwrap works."""
    if not logins:
        return Isolation(sandbox, None, False)
    return Isolation("bwrap" if sandbox == "auto" else sandbox, worker_user, True)


class BindError(Exception):
    """A data mount that cannot be bound where the job asked, and why."""


class RunAs(NamedTuple):
    """The unprivileged host user a worker runs as (uid and gid; no supplementary groups)."""

    uid: int
    gid: int

    @classmethod
    def named(cls, name: str) -> RunAs:
        entry = pwd.getpwnam(name)
        return cls(entry.pw_uid, entry.pw_gid)


def as_user(user: RunAs | None) -> dict[str, Any]:
    """``subprocess`` arguments that start a process as ``user`` (none: as the agent)."""
    return {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}


def become(user: RunAs) -> list[str]:
    """The command prefix that, run as root inside the sandbox, becomes ``user`` for good; raises
    BindError when the host has no ``setpriv`` (then no worker may run: none would drop root)."""
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if setpriv is None:
        raise BindError("setpriv (util-linux) is missing: workers cannot run as an unprivileged user")
    return [
        setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--",
    ]  # fmt: skip


def args(
    workdir: str,
    job_checkpoint_dir: str,
    command: Sequence[str],
    mounts: Sequence[Mount],
    status_fd: int,
    hidden: Sequence[str] = (),
    privileged: bool = False,
    narrow: bool = False,
    as_user: bool = False,
) -> list[str]:
    """bwrap's arguments for one worker, before ``--`` and its command; raises BindError when a
    data mount cannot be bound where the job asked."""
    # No --new-session: the sandbox stays in the process group the agent started, so that a
    # kill of the group reaches every process even before bwrap's own parent-death signal
    # is armed. Workers have no terminal (stdin is /dev/null) to hijack.
    args = ["--unshare-pid", "--die-with-parent", "--tmpfs", "/"]
    bound: list[str] = []  # host directories shown as they are, their owners' modes and all
    # The host's root, read-only, one top-level entry at a time, so that data mounts can
    # land at new top-level paths (a bind of / itself would leave nowhere to create them);
    # ``narrow``: only the system's directories, and what the command runs from.
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in ("proc", "dev", "tmp") or (narrow and name not in SYSTEM):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind", path, path]
            bound.append(path)
    if narrow:
        shown = runs_from(command)
        if as_user:
            # What the command runs from lies below directories the sandbox's root lacks (/var,
            # /home, /root/.pyenv), which bwrap makes only its creator may enter: a worker run as
            # another user could open neither its script nor its interpreter.
            for d in _leading(shown, bound):
                args += ["--perms", "0755", "--dir", d]
        for path in shown:
            args += ["--ro-bind", path, path]
            bound.append(path)
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in needed_under_tmp(command):
        args += ["--ro-bind", path, path]
        bound.append(path)
    for path in hidden:
        if os.path.isdir(path):
            args += ["--tmpfs", os.path.realpath(path)]
    if privileged:  # a worker left as root keeps no capability (one run as a user has none)
        args += ["--cap-drop", "ALL"]
    writable = [workdir, job_checkpoint_dir]
    if as_user:
        # bwrap makes the directories leading to a bind with their host modes (pytest's, say,
        # root's alone): a worker that is not root could not reach its own directories.
        for d in _leading(writable, bound, [os.path.realpath(h) for h in hidden if os.path.isdir(h)]):
            args += ["--perms", "0755", "--dir", d]
    for d in writable:
        args += ["--bind", d, d]
    for m in mounts:
        problem = target_problem(m, writable)
        if problem:
            raise BindError(problem)
        args += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
    args += ["--remount-ro", "/", "--chdir", workdir, "--json-status-fd", str(status_fd)]
    return args


def _leading(dirs: Sequence[str], bound: Sequence[str], hidden: Sequence[str] = ()) -> list[str]:
    """The directories leading to ``dirs`` that the sandbox makes itself, outermost first: those
    not inside anything ``bound``, and those below a ``hidden`` directory, whose empty tmpfs
    hides what the host has there even where a bound directory holds it."""
    out: list[str] = []
    for d in dirs:
        for parent in reversed(PurePosixPath(d).parents):
            p = str(parent)
            inside = any(p == b or p.startswith(b.rstrip("/") + "/") for b in bound)
            under_hidden = any(p.startswith(h.rstrip("/") + "/") for h in hidden)
            if p != "/" and (under_hidden or not inside) and p not in out:
                out.append(p)
    return out


async def probe() -> str | None:
    """bwrap's path if it can build a sandbox here, else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            path, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        code = await asyncio.wait_for(proc.wait(), 10.0)
    except (OSError, TimeoutError):
        return None
    return path if code == 0 else None


# What every process needs of the host: programs, libraries, configuration. In a narrow view the
# worker sees these, its interpreter's environment and its command's files, nothing else.
SYSTEM = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt"})


def _environment() -> set[str]:
    """This interpreter's environment, where it is: a virtualenv reached through a link
    (``proj/.venv`` made a link to a shared one) is the directory the link names, and shown only
    as the link, the worker's ``python`` was "No such file or directory"."""
    return {p for prefix in (sys.prefix, sys.base_prefix) for p in (prefix, os.path.realpath(prefix))}


def runs_from(command: Sequence[str]) -> list[str]:
    """What outside ``SYSTEM`` and ``/tmp`` the command runs from: this interpreter's
    environment (a virtualenv and the Python it was made from), and the directory of each file
    the command names by its absolute path (its program, its script), the one it names through
    a linked directory too (the kernel follows the path as named, link by link)."""
    wanted = _environment()
    program = shutil.which(command[0]) if command else None
    for path in [*(a for a in command if a.startswith("/")), *([program] if program else [])]:
        real = os.path.realpath(path)
        wanted.add(real if os.path.isdir(real) else os.path.dirname(real))
        wanted.add(os.path.realpath(os.path.dirname(path)))
    out = []
    for path in sorted(wanted):
        parts = PurePosixPath(path).parts
        if len(parts) > 1 and parts[1] not in SYSTEM and parts[1] != "tmp" and os.path.exists(path):
            out.append(path)
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


def needed_under_tmp(command: Sequence[str]) -> list[str]:
    """What the worker needs from the host's ``/tmp``, which its private ``/tmp`` hides: the
    top-level directories there holding the command's files or this interpreter's environment
    (a checkout or virtualenv may well live in ``/tmp``). Not the agent's working directory: a
    worker runs in its own, relative paths are made absolute at submission, and where ``corral
    up`` was started (its log exports, job and queue files) was shown to every tenant's jobs."""
    candidates = [*_environment(), *(a for a in command if a.startswith("/"))]
    tops = set()
    for c in candidates:
        parts = PurePosixPath(c).parts
        if len(parts) > 2 and parts[1] == "tmp" and os.path.exists(c):
            tops.add(f"/tmp/{parts[2]}")
    return sorted(tops)


def target_problem(m: Mount, writable: list[str]) -> str:
    """Why bwrap could not bind ``m`` at its target, or ``""``. The sandbox's root is a read-only
    view of the host's, so a target must exist there already, or lie where the sandbox can
    create it: a new top-level path, /tmp, or the worker's own directories."""
    problem = mount_problem(m, container=False)
    if problem:
        return problem
    target = PurePosixPath(m.target)
    top = target.parts[1]
    if os.path.exists(m.target) or top == "tmp" or not os.path.exists("/" + top):
        return ""
    if any(str(target).startswith(d.rstrip("/") + "/") for d in writable):
        return ""
    parent = target.parent
    while not os.path.exists(parent):
        parent = parent.parent
    return (
        f"mount target {m.target}: {parent} is part of the read-only root and has no "
        f"{target.relative_to(parent)}; use a path that exists, or a new top-level one such as /data"
    )


def bwrap_error(output: str) -> str:
    """bwrap's own complaint among the last lines of a worker's log (``bwrap: Can't mkdir …``),
    or ``""``."""
    lines = output.splitlines()
    return next((line for line in reversed(lines[-20:]) if line.startswith("bwrap: ")), "")
