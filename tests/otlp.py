"""An OTLP/HTTP trace receiver in the test's own process: what a collector would be given.

It decodes each ``ExportTraceServiceRequest`` (protobuf, as corral's exporter sends it) into
plain ``Span`` records a test can read: which service said it, its ids, times, attributes,
events, links and status.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Span:
    service: str
    resource: dict[str, Any]
    name: str
    trace_id: str
    span_id: str
    parent: str  # "" for a root
    start: int  # ns
    end: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)
    error: bool
    message: str = ""

    @property
    def duration(self) -> float:
        return (self.end - self.start) / 1e9


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            service=str(resource.get("service.name", "")),
                            resource=resource,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent=s.parent_span_id.hex(),
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            attributes=_attrs(s.attributes),
                            events=[(e.name, _attrs(e.attributes)) for e in s.events],
                            links=[
                                (lk.trace_id.hex(), lk.span_id.hex(), _attrs(lk.attributes)) for lk in s.links
                            ],
                            error=s.status.code == Status.STATUS_CODE_ERROR,
                            message=s.status.message,
                        )
                    )
        with self.lock:
            self.spans.extend(got)
            self.requests += 1

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port; ``url`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path.rstrip("/").endswith("/v1/traces"):
                got.take(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


def tree(spans: list[Span], trace_id: str) -> str:
    """One trace as an indented tree, as a trace viewer draws it: name, service, duration."""
    mine = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: (s.start, s.name))
    ids = {s.span_id for s in mine}
    children: dict[str, list[Span]] = {}
    for s in mine:
        children.setdefault(s.parent if s.parent in ids else "", []).append(s)
    t0 = min((s.start for s in mine), default=0)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in children.get(parent, []):
            marks = " ERROR" if s.error else ""
            marks += f" links={len(s.links)}" if s.links else ""
            events = ", ".join(name for name, _ in s.events[:4]) + (" …" if len(s.events) > 4 else "")
            lines.append(
                f"{'  ' * depth}{s.name}  [{s.service}]  +{(s.start - t0) / 1e9:.3f}s "
                f"{s.duration * 1000:.1f} ms{marks}" + (f"  ({events})" if events else "")
            )
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
