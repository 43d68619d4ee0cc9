"""Gives back the disk under the start of a file that is still being written: Linux's
fallocate(2) with ``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`` turns that part into a hole,
which reads as zeros and holds no blocks, while the file's size stays as it was, and so every
offset into it and the place the writer's next ``O_APPEND`` write lands. The writer need not
know or stop: nothing is moved, so nothing races it.

Python's ``os`` has ``posix_fallocate`` only, which cannot punch, and the one package wrapping
fallocate(2) is a C extension unreleased since 2018: libc's is called through ctypes. Where
there is none (not Linux) or the filesystem cannot punch, ``punch`` raises ``OSError`` with an
errno in ``UNSUPPORTED``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE (linux/falloc.h)
KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE: the kernel takes PUNCH_HOLE only with it
# The filesystem or the system cannot punch at all (ENOTSUP is EOPNOTSUPP on Linux), as opposed
# to this file, now.
UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS})


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    # fallocate64 takes 64-bit offsets on every ABI; fallocate does on 64-bit ones (musl's always).
    fn = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_FALLOCATE = _libc_fallocate()


def punch(path: Path, start: int, end: int) -> None:
    """Free the disk under bytes ``start`` to ``end`` of the regular file at ``path``, not reached
    through a link (the agent may run as root: a link put in a file's place must not have it
    zero another file). Those bytes read as zeros from now on."""
    if _FALLOCATE is None:
        raise OSError(errno.EOPNOTSUPP, "this system has no fallocate(2)", str(path))
    # Non-blocking: a FIFO put in a file's place fails the open rather than hang the agent.
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if not _has_data(fd, start, end):
            return  # freed already (by an agent before this one): a punch would touch its mtime
        if _FALLOCATE(fd, PUNCH_HOLE | KEEP_SIZE, start, end - start) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)


def _has_data(fd: int, start: int, end: int) -> bool:
    """Whether bytes ``start`` to ``end`` of the file hold any data, not only holes. A punch sets
    the file's mtime even where there was nothing left to free, and the agent tells a worker's
    file untouched for a week (to delete) by its mtime: a restarted agent, which punches each
    file again from its start, would keep every large file a week longer at each restart. A
    filesystem that cannot tell holes says all is data."""
    try:
        return os.lseek(fd, start, os.SEEK_DATA) < end
    except OSError as e:
        return e.errno != errno.ENXIO  # ENXIO: no data past ``start``
