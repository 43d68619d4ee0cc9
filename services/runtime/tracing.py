"""OpenTelemetry at the edge of every service: the decision cores and the fold never import it.

Each role has a tracer provider of its own, so its spans carry its own ``service.name``
(``corral-placer``, ``corral-agent``, ...) also when ``corral up`` runs every role in one process.

A job's spans are not made as things happen but from the log once the fold accepted what they
describe (``traces.py``): with the trace and span ids every reader derives alike
(``projections/trace_ids.py``) and the log's own times as start and end. ``emit`` makes such a
span: chosen ids, chosen parent, explicit start and end.

Export is OTLP over HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces variant) is set;
otherwise nothing is made at all. A dead collector must never hold a process up: each export
gives up after a short timeout, and ``shutdown`` (also at exit) waits a moment for what is
queued, then abandons it, never sitting out the exporter's retries.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags

# How long one export may take before it is given up (unless the OTLP timeout is set shorter).
EXPORT_TIMEOUT_S = 2.0
# How long ``shutdown`` waits for the spans still queued before abandoning them.
SHUTDOWN_WAIT_S = 0.5
INSTANCE = "service.instance.id"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_TIMEOUTS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class _ChosenIds(IdGenerator):
    """Random ids, unless a span is being made with ids derived from the log (``emit``)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    def choose(self, trace_id: int | None, span_id: int | None) -> None:
        self._local.ids = (trace_id, span_id)

    def generate_span_id(self) -> int:
        chosen = getattr(self._local, "ids", (None, None))[1]
        return chosen if chosen else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen = getattr(self._local, "ids", (None, None))[0]
        return chosen if chosen else self._random.generate_trace_id()


class _StopOnce(SpanExporter):
    """The OTLP exporter, shut down once: ``shutdown`` stops it before its provider does."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.stopped = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export(spans)

    def shutdown(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _Role(NamedTuple):
    provider: TracerProvider
    tracer: trace.Tracer
    exporter: SpanExporter | None
    exports: bool  # its spans go somewhere


_ids = _ChosenIds()
_roles: dict[str, _Role] = {}
_lock = threading.Lock()
_at_exit = False


def exporting() -> bool:
    """Whether spans go anywhere: without a collector configured none are made."""
    return any(os.environ.get(name) for name in _ENDPOINTS)


def _timeout() -> float:
    for name in _TIMEOUTS:
        raw = os.environ.get(name)
        if raw:
            with contextlib.suppress(ValueError):
                return min(float(raw), EXPORT_TIMEOUT_S)
    return EXPORT_TIMEOUT_S


def _identity(role: str) -> dict[str, str]:
    """The resource of role ``role``'s spans: its service, and which process of it (replicas of one
    role are told apart by ``service.instance.id``: the host and pid, as in the log's producer ids,
    unless the operator names the instance in ``OTEL_RESOURCE_ATTRIBUTES``)."""
    attributes = {"service.name": f"corral-{role}", "service.namespace": "corral"}
    if INSTANCE not in OTELResourceDetector().detect().attributes:
        attributes[INSTANCE] = f"{socket.gethostname()}:{os.getpid()}"
    return attributes


def setup(role: str, processor: SpanProcessor | None = None) -> None:
    """Make role ``role``'s tracer provider (once), exporting over OTLP when configured.
    ``processor``: where its spans go instead (tests)."""
    global _at_exit
    with _lock:
        if role in _roles:
            return
        resource = Resource.create(_identity(role))
        provider = TracerProvider(resource=resource, id_generator=_ids, shutdown_on_exit=False)
        exporter: SpanExporter | None = None
        if processor is None and exporting():
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            exporter = _StopOnce(OTLPSpanExporter(timeout=_timeout()))
            processor = BatchSpanProcessor(exporter, schedule_delay_millis=500)
        if processor is not None:
            provider.add_span_processor(processor)
        tracer_ = provider.get_tracer(f"corral.{role}")
        _roles[role] = _Role(provider, tracer_, exporter, processor is not None)
        if not _at_exit:
            atexit.register(shutdown)  # the SDK's own would wait out a dead collector's retries
            _at_exit = True


def enabled(role: str) -> bool:
    """Whether role ``role``'s spans go anywhere (``setup`` made it an exporter or a processor)."""
    got = _roles.get(role)
    return got is not None and got.exports


def tracer(role: str) -> trace.Tracer:
    setup(role)
    return _roles[role].tracer


def flush(role: str, timeout_s: float = EXPORT_TIMEOUT_S) -> bool:
    """Wait until role ``role``'s spans so far are exported (blocks: call it from a thread).
    Whether the collector took them within ``timeout_s``."""
    got = _roles.get(role)
    return got is None or got.provider.force_flush(int(timeout_s * 1000))


def shutdown(wait_s: float = SHUTDOWN_WAIT_S) -> list[str]:
    """Send what is queued if the collector takes it within ``wait_s``; then stop, abandoning
    the rest: the exporter is shut down, which ends its retries' back-offs at once, so no
    process ever sits out a dead collector. Returns the roles whose spans were abandoned."""
    with _lock:
        roles = list(_roles.items())
        _roles.clear()
    flushes = []
    for name, role in roles:
        # force_flush blocks on the export, retries included: in a thread of its own, waited on
        # for a moment only.
        t = threading.Thread(target=role.provider.force_flush, daemon=True, name=f"corral-trace-{name}")
        t.start()
        flushes.append((name, t))
    abandoned = []
    for name, t in flushes:
        t.join(wait_s)
        if t.is_alive():
            abandoned.append(name)
    for _, role in roles:
        if role.exporter is not None:
            role.exporter.shutdown()
        role.provider.shutdown()
    return abandoned


# -- spans ---------------------------------------------------------------------------------------


class Event(NamedTuple):
    name: str
    time: float
    attributes: dict[str, Any] = {}


class LinkTo(NamedTuple):
    trace_id: int
    span_id: int
    attributes: dict[str, Any] = {}


def _ns(t: float) -> int:
    return int(t * 1e9)


def _remote(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)


def emit(
    role: str,
    name: str,
    *,
    trace_id: int,
    span_id: int,
    parent: int = 0,
    start: float,
    end: float,
    attributes: dict[str, Any] | None = None,
    events: Iterable[Event] = (),
    links: Sequence[LinkTo] = (),
    error: str = "",
) -> None:
    """One finished span of role ``role`` with the given ids (``parent`` 0: the trace's root),
    from ``start`` to ``end`` (seconds since the epoch); ``error``: the span failed, and why."""
    got = _roles.get(role)
    if got is None:
        return
    context = trace.set_span_in_context(NonRecordingSpan(_remote(trace_id, parent))) if parent else Context()
    _ids.choose(trace_id, span_id)
    try:
        span = got.tracer.start_span(
            name,
            context=context,
            attributes=attributes,
            links=[Link(_remote(lk.trace_id, lk.span_id), lk.attributes) for lk in links],
            start_time=_ns(start),
        )
    finally:
        _ids.choose(None, None)
    for ev in events:
        span.add_event(ev.name, ev.attributes, timestamp=_ns(ev.time))
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=_ns(max(end, start)))


def traceparent_of(span: Span) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


@contextmanager
def span(name: str, attributes: dict[str, Any] | None = None, service: str = "corral") -> Iterator[Span]:
    """A span as it happens, a new root: a client's request (the trace its job joins)."""
    with tracer(service).start_as_current_span(name, attributes=attributes or {}) as s:
        yield s
