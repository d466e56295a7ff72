"""For producers: the outbox row's `options` with the current trace context in its headers.

    from relay.tracing.producer import outbox_options

    with tracer.start_as_current_span("place order"):
        await conn.execute(
            "INSERT INTO queue_message (exchange, routing_key, content, options) "
            "VALUES ($1, $2, $3, $4)",
            "orders", "order.placed", body, outbox_options({"content_type": "application/json"}))

The relay publishes the headers unchanged, so a consumer that extracts the context from the
message's headers continues the producer's trace. Any language can do the same: put the W3C
`traceparent` (and `tracestate`) of the current span into `options.headers`.
Needs opentelemetry-api (the `tracing` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def trace_headers(context: Context | None = None) -> dict[str, str]:
    """The W3C Trace Context headers of `context` (default: the current one); empty when no
    span is recording there."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def outbox_options(options: Mapping[str, Any] | None = None, *,
                   context: Context | None = None) -> str:
    """`options` (the row's publish options) as JSON text, with the trace context of
    `context` (default: the current one) added to its headers; headers already there stay."""
    merged = dict(options or {})
    headers = dict(merged.get("headers") or {})
    headers.update(trace_headers(context))
    if headers:
        merged["headers"] = headers
    return json.dumps(merged)
