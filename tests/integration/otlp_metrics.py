"""An OTLP/HTTP metrics receiver in the test's own process: what a collector would be sent.

A real HTTP server on a free loopback port (``http.server`` in a thread) decoding each
``ExportMetricsServiceRequest`` with opentelemetry-proto, as an OpenTelemetry collector does;
the test waits on a condition over what arrived, which each request wakes."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

Points = dict[str, list[tuple[dict[str, str], float]]]  # metric -> (attributes, value) of the latest export


class MetricsReceiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    with receiver._arrived:
                        receiver.requests.append(request)
                        receiver._arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MetricsReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def latest(self) -> Points:
        """Every data point of the newest request (cumulative: it holds every total so far)."""
        with self._arrived:
            request = self.requests[-1] if self.requests else None
        return points(request) if request is not None else {}

    async def until(self, predicate: Callable[[Points], bool], timeout: float) -> Points:
        """Wait for a request whose points satisfy ``predicate``."""

        def wait() -> Points:
            with self._arrived:
                ok = self._arrived.wait_for(
                    lambda: bool(self.requests) and predicate(points(self.requests[-1])), timeout
                )
            if not ok:
                raise TimeoutError(f"no OTLP export satisfied the test in {timeout}s")
            return self.latest()

        return await asyncio.to_thread(wait)


def points(request: ExportMetricsServiceRequest) -> Points:
    out: Points = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                for p in getattr(m, kind).data_points:
                    attrs = {a.key: a.value.string_value for a in p.attributes}
                    if kind == "histogram":
                        value = float(p.count)
                    else:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                    out.setdefault(m.name, []).append((attrs, value))
    return out
