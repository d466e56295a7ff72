"""When the OTEL_* variables turn tracing on, and the variables it refuses (with their name)."""

from __future__ import annotations

import json

import pytest

from relay.errors import ConfigError
from relay.tracing import NoTracing, from_environment, wanted
from relay.tracing.producer import outbox_options


@pytest.mark.parametrize(("environ", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "relay"}, False),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, True),
])
def test_wanted__follows_the_standard_variables(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


def test_off__no_tracing() -> None:
    assert isinstance(from_environment({}, table="queue_message"), NoTracing)


@pytest.mark.parametrize(("environ", "named"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
])
def test_unsupported__config_error_names_the_variable(environ: dict[str, str],
                                                       named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        from_environment(environ, table="queue_message")


def test_outbox_options__no_span__options_unchanged() -> None:
    assert json.loads(outbox_options({"priority": 3})) == {"priority": 3}
    assert json.loads(outbox_options()) == {}


def test_outbox_options__keeps_other_headers_and_adds_traceparent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        text = outbox_options({"headers": {"tenant": "a"}, "content_type": "application/json"})
    options = json.loads(text)
    context = span.get_span_context()
    assert options["content_type"] == "application/json"
    assert options["headers"]["tenant"] == "a"
    assert options["headers"]["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}")
