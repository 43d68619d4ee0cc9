"""Files the agent reads and writes in directories its workers own, without being led elsewhere.

A worker may write its job's checkpoint directories (the job's run's, and everything below it):
it can put a symbolic link, a FIFO or a directory where the agent expects ``REQUEST``, ``DONE``
or the next attempt's directory. The agent often runs as root while workers run as an
unprivileged user (``worker_user``), so following such a link would let a worker have the agent
write, truncate, read or chown a file of its choosing. Here every directory below a ``top`` the
worker cannot write (the parent of the job's run directory) is opened one component at a time
without following a link, the files are opened relative to it without following one either,
and only a regular file is read, never more than asked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Escaped(OSError):
    """A path below ``top`` is not the plain directory or file it should be (a link, a FIFO)."""


@contextlib.contextmanager
def directory(top: Path, path: Path, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``path`` (below ``top``), each component below ``top`` opened
    without following a link; with ``create``, the missing ones made (mode 0o755)."""
    parts = Path(path).relative_to(top).parts
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                below = os.open(part, _DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link; not a directory
                    raise Escaped(e.errno, f"{path}: {part} is not a directory of its own") from None
                raise
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


def read(dir_fd: int, name: str, most: int) -> bytes | None:
    """The first ``most`` + 1 bytes at most of the regular file ``name`` (None if there is none);
    a link, a hard link of another file, or anything but a regular file raises ``Escaped``.
    What it names is looked at before it is opened for reading (``O_PATH``, then that same file
    opened again): a FIFO, a device or a terminal is never opened, so never waited on, never
    asked to do anything by being opened, never made the agent's terminal."""
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(path_fd)
        if stat.S_ISLNK(st.st_mode):
            raise Escaped(errno.ELOOP, f"{name} is a link")
        if not stat.S_ISREG(st.st_mode):
            raise Escaped(0, f"{name} is not a regular file")
        if st.st_nlink != 1:
            raise Escaped(0, f"{name} is a hard link of another file")
        fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(path_fd)
    try:
        chunks, left = [], most + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write(dir_fd: int, name: str, data: bytes) -> None:
    """Replace ``name`` by a file holding ``data``, written first under a name of its own that is
    made new (whatever was there is removed, a link is never followed)."""
    tmp = name + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(tmp, _NEW, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def remove(dir_fd: int, name: str) -> bool:
    """Remove ``name`` (a link itself, never what it names), if it is there; False if it cannot
    be (a directory of that name)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True
