"""The OpenTelemetry side of relay/tracing: imported only when tracing is on.

One span per batch that found rows (`publish <exchange>`, kind PRODUCER, the messaging
semantic conventions' batch publish), a child of one span per wake-up that found work
(`relay wakeup`). A batch span carries the steps as events (claimed, publish, confirmed,
settled; it ends at the commit), the row and verdict counts as attributes, each parked or
retried row as an event with its reason code (at most MAX_ROW_EVENTS), and links to the
producer contexts of its rows (the `traceparent` in options.headers; at most MAX_LINKS).
While a batch span is open, log lines of that batch carry its trace_id and span_id.

The SDK reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and the
OTEL_BSP_* variables itself; the OTLP exporter (HTTP/protobuf) reads OTEL_EXPORTER_OTLP_*.
Spans leave through a BatchSpanProcessor: its own thread, a bounded queue, spans dropped (never
rows) when the collector is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import structlog
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relay.errors import ConfigError
from relay.interfaces import Kind
from relay.tracing import NO_BATCH, TRACE_HEADERS, BatchTrace, SweepTrace

if TYPE_CHECKING:
    from relay.interfaces import Message, OutboxRow, Verdict

log = structlog.get_logger("relay.tracing")

# Bounds per batch span: the links to producer contexts, and the per-row events of parked or
# retried rows (their counts by reason are attributes, unbounded by this).
MAX_LINKS = 32
MAX_ROW_EVENTS = 32
# How long close() waits for the last spans to leave.
CLOSE_TIMEOUT_S = 5.0
INSTRUMENTATION = "outbox-relay"

_PROPAGATOR = TraceContextTextMapPropagator()


def producer_link(message: Message) -> Link | None:
    """A link to the producer context a message carries in its headers, if a valid one."""
    headers = message.properties.headers
    if not headers or "traceparent" not in headers:
        return None
    carrier = {name: str(headers[name]) for name in TRACE_HEADERS if name in headers}
    context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    if not context.is_valid:
        return None
    return Link(context, {"messaging.message.id": message.id})


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not supported "
                          "(use otlp, console or none)")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                           environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    if protocol.strip() != "http/protobuf":
        variable = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
                    if "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" in environ
                    else "OTEL_EXPORTER_OTLP_PROTOCOL")
        raise ConfigError(f"{variable}: {protocol!r} is not supported (use http/protobuf)")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError("OTEL_TRACES_EXPORTER: the OTLP exporter is not installed "
                          "(pip install 'outbox-relay[tracing]')") from None
    return OTLPSpanExporter()


class OtelTracing:
    """Spans through an SDK TracerProvider (the process's own; the global one is left alone)."""

    enabled = True

    def __init__(self, provider: TracerProvider, *, table: str) -> None:
        self.provider = provider
        self.table = table
        self.tracer = provider.get_tracer(INSTRUMENTATION)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, table: str) -> OtelTracing:
        """A provider configured by the OTEL_* variables, exporting in batches."""
        provider = TracerProvider(resource=Resource.create(
            {"service.name": environ.get("OTEL_SERVICE_NAME") or "outbox-relay"}))
        provider.add_span_processor(BatchSpanProcessor(_exporter(environ)))
        log.info("tracing_on", exporter=environ.get("OTEL_TRACES_EXPORTER", "otlp"),
                 endpoint=environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                 or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
        return cls(provider, table=table)

    def sweep(self) -> SweepTrace:
        return _Sweep(self, time.time_ns())

    async def close(self) -> None:
        # shutdown() blocks while the processor exports what is queued: off the event loop,
        # and not longer than CLOSE_TIMEOUT_S (a collector that is away must not hold a stop).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self.provider.shutdown),
                                   timeout=CLOSE_TIMEOUT_S)


class _Sweep:
    """A wake-up; its span starts (back-dated) when its first batch finds rows."""

    def __init__(self, tracing: OtelTracing, started_ns: int) -> None:
        self.tracing = tracing
        self.started_ns = started_ns
        self.span: trace.Span | None = None
        self.rows = 0
        self.batches = 0

    def batch(self, started_ns: int, claimed_ns: int, rows: Sequence[OutboxRow],
              messages: Sequence[Message]) -> BatchTrace:
        if not rows:
            return NO_BATCH
        tracer = self.tracing.tracer
        if self.span is None:
            self.span = tracer.start_span("relay wakeup", start_time=self.started_ns,
                                          attributes={"relay.table": self.tracing.table})
        self.rows += len(rows)
        self.batches += 1
        return _Batch(self.tracing, trace.set_span_in_context(self.span),
                      started_ns=started_ns, claimed_ns=claimed_ns, rows=rows, messages=messages)

    def end(self) -> None:
        if self.span is not None:
            self.span.set_attributes({"relay.wakeup.rows": self.rows,
                                      "relay.wakeup.batches": self.batches})
            self.span.end()
            self.span = None


class _Batch:
    """One batch's span; its ids are bound to the log context until it ends."""

    def __init__(self, tracing: OtelTracing, parent: Context, *, started_ns: int,
                 claimed_ns: int, rows: Sequence[OutboxRow], messages: Sequence[Message]) -> None:
        exchanges = {r.exchange for r in rows}
        exchange = next(iter(exchanges)) if len(exchanges) == 1 else None
        if exchange == "":
            exchange = "amq.default"  # the semantic conventions' name of the default exchange
        links: list[Link] = []
        for message in messages:
            link = producer_link(message)
            if link is not None:
                links.append(link)
                if len(links) == MAX_LINKS:
                    break
        attributes: dict[str, str | int] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.batch.message_count": len(rows),
            "relay.table": tracing.table,
        }
        if exchange is not None:
            attributes["messaging.destination.name"] = exchange
        self.span = tracing.tracer.start_span(
            f"publish {exchange}" if exchange else "publish",
            context=parent,
            kind=SpanKind.PRODUCER, attributes=attributes, links=links, start_time=started_ns)
        self.span.add_event("claimed", {"relay.rows": len(rows)}, timestamp=claimed_ns)
        context = self.span.get_span_context()
        structlog.contextvars.bind_contextvars(trace_id=f"{context.trace_id:032x}",
                                               span_id=f"{context.span_id:016x}")

    def event(self, name: str) -> None:
        self.span.add_event(name)

    def finish(self, verdicts: Sequence[Verdict], held: int) -> None:
        kinds = Counter(v.kind for v in verdicts)
        reasons = Counter(v.code for v in verdicts if v.kind in (Kind.RETRY, Kind.DEAD))
        attributes: dict[str, int] = {f"relay.verdicts.{kind.value}": kinds.get(kind, 0)
                                      for kind in Kind}
        attributes["relay.held"] = held
        attributes.update({f"relay.reasons.{code}": n for code, n in reasons.items()})
        self.span.set_attributes(attributes)
        recorded = 0
        for v in verdicts:
            if v.kind not in (Kind.RETRY, Kind.DEAD) or recorded == MAX_ROW_EVENTS:
                continue
            recorded += 1
            self.span.add_event("row_parked" if v.kind is Kind.DEAD else "row_retried", {
                "messaging.message.id": v.row_id, "relay.reason": v.code,
                "relay.detail": v.text[:200]})
        self._end()

    def fail(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._end()

    def _end(self) -> None:
        self.span.end()
        structlog.contextvars.unbind_contextvars("trace_id", "span_id")
