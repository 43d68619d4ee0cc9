"""The log lines of a corral process: JSON off a terminal, text on one, each line with the role,
log sequence, job and trace known where it was logged."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from corral.services.runtime import logs

log = logging.getLogger("corral.test")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_off_a_terminal_each_line_is_json_with_role_seq_job_and_trace() -> None:
    out = io.StringIO()
    logs.configure("info", out)
    logs.set_role("placer")
    logs.set_seq(42)
    span = TracerProvider().get_tracer("test").start_span("placer.decide")
    with trace.use_span(span, end_on_exit=True):
        log.warning("cycle failed on %s", "job-7", extra={"job": "job-7"})
    log.info("no span now")
    log.debug("below the level")
    first, second = lines(out)
    ctx = span.get_span_context()
    assert first["message"] == "cycle failed on job-7"
    assert (first["level"], first["logger"], first["role"], first["seq"], first["job"]) == (
        "warning",
        "corral.test",
        "placer",
        42,
        "job-7",
    )
    assert (first["trace_id"], first["span_id"]) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert "trace_id" not in second and "job" not in second and second["role"] == "placer"


def test_on_a_terminal_lines_are_text_a_person_reads() -> None:
    out = Terminal()
    logs.configure("debug", out)
    logs.set_role("admission")
    logs.set_seq(0)
    log.error("quota ledger off", extra={"job": "j1", "seq": 9})
    [line] = out.getvalue().splitlines()
    assert line.endswith("ERROR   [admission seq=9 job=j1] corral.test: quota ledger off"), line
    assert not line.startswith("{")


def test_an_exception_is_kept_in_the_line() -> None:
    out = io.StringIO()
    logs.configure("info", out)
    try:
        raise KeyError("gpu-3")
    except KeyError:
        log.exception("fold fault")
    [line] = lines(out)
    assert "KeyError: 'gpu-3'" in str(line["error"])


async def test_roles_run_in_one_process_each_log_as_themselves() -> None:
    out = io.StringIO()
    logs.configure("info", out)

    async def role(name: str) -> None:
        logs.set_role(name)
        await asyncio.sleep(0)
        log.info("deciding")

    await asyncio.gather(asyncio.create_task(role("placer")), asyncio.create_task(role("preemptor")))
    assert sorted(str(line["role"]) for line in lines(out)) == ["placer", "preemptor"]


def test_configuring_twice_keeps_one_handler_and_a_bad_level_is_refused() -> None:
    out = io.StringIO()
    logs.configure("info", io.StringIO())
    logs.configure("info", out)
    log.info("once")
    assert len(lines(out)) == 1
    assert sum(h.get_name() == "corral" for h in logging.getLogger().handlers) == 1
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        logs.configure("loud", out)
