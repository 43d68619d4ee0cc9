"""OpenTelemetry at the edge of every service: the decision cores and the fold never import it.

A job's trace starts with the span the client opened around its submit (its W3C ``traceparent``
travels in the NATS headers and the fold keeps it on the job); every event a service later writes
about that job is a child span of it, so one job's whole life is one trace across services.

Export is OTLP over HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Otherwise no span is made
per event: ``event_traceparent`` writes the child's traceparent straight (the job's trace id, a
new span id), so trace ids still flow through the log. A span of the SDK costs about a third of a
millisecond, and a cycle that places a thousand jobs would spend a third of a second making spans
nobody receives.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
_configured = False
_exporting = False


def setup(service: str) -> None:
    """Install a tracer provider for this process, exporting over OTLP when configured."""
    global _configured, _exporting
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"corral-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _exporting = True
    trace.set_tracer_provider(provider)
    _configured = True


def exporting() -> bool:
    """Whether spans leave this process (else only their traceparents travel, in the log)."""
    return _exporting


@functools.cache  # the SDK builds a tracer anew at every call
def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(f"corral.{name}")


def child_traceparent(parent: str | None) -> str:
    """The traceparent of a new span under ``parent`` (a new trace without a valid one), made
    without a span: as the SDK would write it (random ids, the parent's sampled flag)."""
    fields = parent.split("-") if parent else ()
    if len(fields) == 4 and len(fields[1]) == 32 and fields[1] != "0" * 32:
        trace_id, flags = fields[1], fields[3]
    else:
        trace_id, flags = f"{random.getrandbits(128) or 1:032x}", "01"
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-{flags}"


def event_traceparent(name: str, parent: str | None, attributes: dict[str, Any], service: str) -> str | None:
    """The traceparent an event about a job carries: a span ``name`` in the job's trace when
    spans are exported, else only its traceparent (``child_traceparent``)."""
    if not _exporting:
        return child_traceparent(parent)
    with span(name, parent, attributes, service) as s:
        return traceparent_of(s)


def _context_of(traceparent: str | None) -> Any:
    return _propagator.extract({"traceparent": traceparent}) if traceparent else None


def traceparent_of(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


@contextmanager
def span(
    name: str, parent: str | None = None, attributes: dict[str, Any] | None = None, service: str = "corral"
) -> Iterator[Span]:
    """A span whose parent is the given traceparent (a job's trace), or a new root."""
    with tracer(service).start_as_current_span(
        name, context=_context_of(parent), attributes=attributes or {}
    ) as s:
        yield s
