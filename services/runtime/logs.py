"""Logging, configured once per process: JSON lines for machines, readable lines for people.

``configure`` installs one handler on the root logger: JSON lines when the stream is not a
terminal (a container's output, a file: what a log collector reads), text when it is. Every line
carries what is known where it was logged, so a line can be found from a job and a trace from a
line:

- ``role``: the service whose task logged it (``set_role``, held in a context variable, so the
  roles ``corral up`` runs in one process each log as themselves: an asyncio task keeps the
  context it was started in);
- ``seq``: the log sequence the service's state was folded to (``set_seq``, per cycle);
- ``job``: the job it is about, given by the call (``extra={"job": ...}``);
- ``trace_id`` and ``span_id``: of the span current where it was logged (OpenTelemetry), so a
  line leads to its trace and a trace to its lines.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import IO, Any

from opentelemetry import trace

_role: contextvars.ContextVar[str] = contextvars.ContextVar("corral_role", default="")
_seq: contextvars.ContextVar[int] = contextvars.ContextVar("corral_seq", default=0)

LEVELS = ("debug", "info", "warning", "error")


def set_role(role: str) -> None:
    """The role the current task (and the tasks it starts) logs as."""
    _role.set(role)


def set_seq(seq: int) -> None:
    """The log sequence the current task's state is folded to."""
    _seq.set(seq)


class Context(logging.Filter):
    """Puts role, log sequence and the current span's trace on every record (a value the call
    gave in ``extra`` is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "role", ""):
            record.role = _role.get()
        if not getattr(record, "seq", 0):
            record.seq = _seq.get()
        if not hasattr(record, "job"):
            record.job = ""
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else ""
        record.span_id = f"{ctx.span_id:016x}" if ctx.is_valid else ""
        return True


class JsonLines(logging.Formatter):
    """One JSON object a line; empty fields left out."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("role", "job", "seq", "trace_id", "span_id"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class Readable(logging.Formatter):
    """``time level [role seq=N job=J trace=T] logger: message`` for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        where = [str(getattr(record, "role", "") or "")]
        for key, name in (("seq", "seq"), ("job", "job"), ("trace_id", "trace")):
            value = getattr(record, key, "")
            if value:
                where.append(f"{name}={value}")
        tag = " ".join(w for w in where if w)
        text = f"{_iso(record.created)} {record.levelname:<7} {f'[{tag}] ' if tag else ''}{record.name}: "
        text += record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _iso(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def configure(level: str = "info", stream: IO[str] | None = None, json_lines: bool | None = None) -> None:
    """Log at ``level`` and above to ``stream`` (stderr), JSON unless it is a terminal. Once per
    process: a second call replaces the first's handler."""
    if level.lower() not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; levels: {', '.join(LEVELS)}")
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(out, "isatty") and out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines() if json_lines else Readable())
    handler.addFilter(Context())
    handler.set_name("corral")
    root = logging.getLogger()
    for h in list(root.handlers):
        if h.get_name() == "corral":
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
