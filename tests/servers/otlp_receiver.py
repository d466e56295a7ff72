"""A local OTLP/HTTP trace receiver: what a collector would get from `relay run` with tracing on.

It accepts POST /v1/traces (protobuf), decodes each request with the OTLP protobuf classes and
keeps the spans' names, trace ids and attributes; anything else gets 404. Runs in its own
thread so a relay subprocess or the in-process SDK can export to it.

    with OtlpReceiver() as receiver:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...
        receiver.spans  # [ReceivedSpan(name=..., trace_id=..., attributes={...}), ...]
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, as the collector sees it."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # trace ids of the links
    link_spans: tuple[str, ...] = ()  # span ids of the links
    start_ns: int = 0
    end_ns: int = 0
    events: tuple[tuple[str, int], ...] = ()  # (name, epoch ns)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    """An OTLP/HTTP endpoint on 127.0.0.1 (a free port) that records what it receives."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._record(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _record(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = [
            ReceivedSpan(
                name=span.name,
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                attributes={a.key: _value(a.value) for a in span.attributes},
                links=tuple(link.trace_id.hex() for link in span.links),
                link_spans=tuple(link.span_id.hex() for link in span.links),
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
                events=tuple((e.name, e.time_unix_nano) for e in span.events),
            )
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
