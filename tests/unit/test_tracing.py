"""Tracing never holds a process up: a CLI command with a collector configured but down ends at
once, its span abandoned, instead of sitting out the exporter's retries."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from corral.projections import trace_ids
from corral.services.runtime import tracing


@pytest.fixture
def fresh() -> Iterator[None]:
    tracing.shutdown()  # providers made earlier in this process were made without a collector
    try:
        yield
    finally:
        tracing.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connection there is refused, as by a collector that is down


def test_shutdown_with_a_dead_collector_abandons_the_spans_instead_of_retrying(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    # A patient exporter: left to itself it would retry with back-off for half a minute.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    tracing.setup("cli")
    assert tracing.enabled("cli")
    with tracing.span("corral.submit", {"corral.tenant": "team-a"}, service="cli"):
        pass
    result: list[list[str]] = []
    ended = threading.Event()

    def stop() -> None:
        result.append(tracing.shutdown(wait_s=0.2))
        ended.set()

    threading.Thread(target=stop, daemon=True).start()
    # Generous: only a shutdown that waits out the retries (tens of seconds) misses it.
    assert ended.wait(10.0), "shutdown waited on the dead collector"
    assert result == [["cli"]]  # given up, not delivered
    assert not tracing.enabled("cli")


def test_without_a_collector_no_span_is_made_and_nothing_is_waited_on(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing.setup("cli")
    assert not tracing.enabled("cli")
    assert tracing.shutdown() == []


def test_every_reader_derives_the_same_trace_for_a_job() -> None:
    sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    under = trace_ids.job_trace("j1", 7, sent)
    assert (f"{under.trace_id:032x}", f"{under.submit_span:016x}") == (sent[3:35], sent[36:52])
    derived = trace_ids.job_trace("j1", 7)
    assert derived == trace_ids.job_trace("j1", 7) and derived.submit_span == 0
    assert derived.trace_id != trace_ids.job_trace("j1", 8).trace_id  # the id reused later: a new trace
    # An agent, from the job's span alone, names the same attempt and worker spans.
    seen = trace_ids.from_traceparent("j1", derived.traceparent)
    assert seen is not None
    assert (seen.attempt_span(2), seen.worker_span(2, 1)) == (
        derived.attempt_span(2),
        derived.worker_span(2, 1),
    )
    assert trace_ids.parse("00-nothex-1-01") is None
