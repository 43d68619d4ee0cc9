"""The log as a JSON Lines file, for offline replay and bug reports.

One record per line: ``seq``, ``subject``, ``time``, ``headers`` and the payload, as text in
``data`` when it is UTF-8 (corral's payloads are JSON) or base64 in ``data_b64`` when it is not,
so that even garbage that reached the log replays byte for byte.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from corral.events import codec
from corral.events.log import Record


class LogFileError(ValueError):
    pass


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
    n = 0
    try:
        with open(path, "wb") as f:
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
    try:
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
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
