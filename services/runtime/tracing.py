"""OpenTelemetry at the edge of every service: the decision cores and the fold never import it.

A job's trace starts with the span the client opened around its submit (its W3C ``traceparent``
travels in the NATS headers and the fold keeps it on the job); every event a service later writes
about that job is a child span of it, so one job's whole life is one trace across services.

Export is OTLP over HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; otherwise spans are made
(so trace ids still flow through the log) but not exported.
"""

from __future__ import annotations

import os
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


def setup(service: str) -> None:
    """Install a tracer provider for this process, exporting over OTLP when configured."""
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"corral-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(f"corral.{name}")


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
