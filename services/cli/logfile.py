"""The log as a JSON Lines file, for offline replay and bug reports.

One record per line: ``seq``, ``subject``, ``time``, ``headers`` and the payload, as text in
``data`` when it is UTF-8 (corral's payloads are JSON) or base64 in ``data_b64`` when it is not,
so that even garbage that reached the log replays byte for byte.

What is read is a regular file of at most ``MAX_FILE`` bytes, lines of at most ``MAX_LINE``:
every record is held in memory at once, and a FIFO or a link to ``/dev/zero`` was read until
memory ran out (or, a FIFO, held the command until someone wrote to it).
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import msgspec

from corral.events import codec
from corral.events.log import Record


class LogFileError(ValueError):
    pass


# A line is one record: at most the stream's largest message (1 MiB unless set otherwise), its
# bytes escaped in JSON (up to 6 each) or in base64, and its headers.
MAX_LINE = 16 * 1024 * 1024
# The largest log read: its records are held in memory at once (about three times the file), and
# a log of a million jobs is some 2 GB.
MAX_FILE = 16 * 1024 * 1024 * 1024


class _Line(msgspec.Struct, omit_defaults=True):
    seq: int
    subject: str
    time: float = 0.0
    headers: dict[str, str] | None = None
    data: str | None = None
    data_b64: str | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Line)


def write(path: str | Path, records: Iterable[Record]) -> int:
    """Write ``records`` to ``path``, readable by its owner only, as the credentials are: the log
    is every tenant's jobs, commands and environments, and a job's sandbox shows the directory
    ``corral up`` runs from, where an export at the default mode was any tenant's to read. A
    file already there is made so too; what is not a file (``/dev/stdout``) keeps its mode."""
    n = 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            for r in records:
                try:
                    line = _Line(r.seq, r.subject, r.time, r.headers, data=r.data.decode())
                except UnicodeDecodeError:
                    line = _Line(
                        r.seq, r.subject, r.time, r.headers, data_b64=base64.b64encode(r.data).decode()
                    )
                f.write(_encoder.encode(line) + b"\n")
                n += 1
    except OSError as e:
        raise LogFileError(f"{path}: {e.strerror or e}") from None
    return n


def read(path: str | Path, progress: Callable[[int], object] | None = None) -> list[Record]:
    """The file's records; ``progress`` is told the bytes read as they are."""
    out: list[Record] = []
    read_so_far = 0
    try:
        with _opened(path) as f:
            for i, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
                if len(raw) > MAX_LINE:
                    raise LogFileError(
                        f"{path}:{i}: longer than any record's line ({MAX_LINE} bytes at most)"
                    )
                read_so_far += len(raw)
                if read_so_far > MAX_FILE:
                    raise LogFileError(f"{path}: larger than a log corral reads ({MAX_FILE} bytes at most)")
                if progress is not None:
                    progress(len(raw))
                if not raw.strip():
                    continue
                try:
                    line = _decoder.decode(raw)
                except codec.UNREADABLE as e:
                    raise LogFileError(f"{path}:{i}: not a corral log line: {e}") from None
                try:
                    data = (
                        base64.b64decode(line.data_b64, validate=True)
                        if line.data_b64 is not None
                        else (line.data or "").encode()
                    )
                except (binascii.Error, ValueError) as e:
                    raise LogFileError(f"{path}:{i}: data_b64 is not base64: {e}") from None
                if out and line.seq <= out[-1].seq:
                    raise LogFileError(f"{path}:{i}: seq {line.seq} after {out[-1].seq}: a log goes forward")
                out.append(Record(line.seq, line.subject, data, line.headers, line.time))
    except OSError as e:
        raise LogFileError(f"{path}: {e.strerror or e}") from None
    return out


def _opened(path: str | Path) -> BinaryIO:
    """``path`` opened to read, if it is a regular file of at most ``MAX_FILE`` bytes. Opened
    without blocking: a FIFO would hold the command until someone wrote to it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise LogFileError(f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogFileError(f"{path}: not a regular file")
        if st.st_size > MAX_FILE:
            raise LogFileError(f"{path}: larger than a log corral reads ({MAX_FILE} bytes at most)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
