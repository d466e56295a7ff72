"""Tracing against the real servers: the relay's batch and wake-up spans (the SDK's in-memory
exporter, a worker in this process), the producer's context carried to a consumer, a `relay run`
exporting to a local OTLP receiver, and one whose collector is away (spans dropped, rows not)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relay.app import database_config, make_publisher, worker_config
from relay.loop.worker import Worker
from relay.pg.store import Outbox
from relay.settings import Settings
from relay.supervise import Supervisor
from relay.tracing.otel import OtelTracing
from relay.tracing.producer import outbox_options
from tests.helpers import RELAY_BIN, Env, RelayProcess, count_rows, wait_until
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows
from tests.servers.otlp_receiver import OtlpReceiver

ROWS = 5
# A priority the relay refuses (AMQP priorities are 0..255): the row is parked, its reason kept.
BAD_OPTIONS = {"priority": 1000}


def _producer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _produce(env: Env, provider: TracerProvider) -> trace.SpanContext:
    """ROWS traced rows written inside a producer span, and one bad row; the span's context."""
    with provider.get_tracer("shop").start_as_current_span("place order") as span:
        options = json.loads(outbox_options({"content_type": "application/json"}))
        await insert_rows(env.pg_dsn, env.exchange, "rk", [{"n": i} for i in range(ROWS)],
                          options=options)
    await insert_rows(env.pg_dsn, env.exchange, "rk", [{"bad": True}], options=BAD_OPTIONS)
    return span.get_span_context()


async def _drain_in_process(env: Env, tracing: OtelTracing, consumer: Consumer) -> None:
    """A worker in this process (the relay's own store, publisher and loop) until the rows
    are out and the table is empty."""
    settings = Settings(pg_dsn=env.pg_dsn, amqp_url=env.amqp_url, poll_interval_s=0.2)
    outbox = await Outbox.open(database_config(settings))
    publisher = make_publisher(settings, Supervisor("broker"))
    await publisher.connect()
    worker = Worker(outbox, publisher, worker_config(settings), tracing=tracing)
    task = asyncio.ensure_future(worker.run())
    try:
        await consumer.wait_for(ROWS)
        await wait_until(lambda: _empty(env), timeout_s=30, what="the outbox emptied")
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=30)
        await publisher.close()
        await outbox.close()


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


@pytest.fixture
async def relay_spans(env: Env, consumer: Consumer) -> tuple[list[ReadableSpan],
                                                             trace.SpanContext]:
    """The relay's finished spans after it moved the traced rows, and the producer's span."""
    producer, _ = _producer()
    produced = await _produce(env, producer)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await _drain_in_process(env, OtelTracing(provider, table="queue_message"), consumer)
    return list(exporter.get_finished_spans()), produced


def _batches(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.kind is SpanKind.PRODUCER]


async def test_batch_span__counts_steps_and_parked_reason(
        env: Env, relay_spans: tuple[list[ReadableSpan], trace.SpanContext]) -> None:
    spans, _ = relay_spans
    batches = _batches(spans)
    assert batches, f"no batch span among {[s.name for s in spans]}"
    attrs = [dict(s.attributes or {}) for s in batches]
    assert {s.name for s in batches} == {f"publish {env.exchange}"}
    assert all(a["messaging.system"] == "rabbitmq" for a in attrs)
    assert all(a["messaging.operation.type"] == "send" for a in attrs)
    assert all(a["messaging.destination.name"] == env.exchange for a in attrs)
    assert sum(int(a["messaging.batch.message_count"]) for a in attrs) == ROWS + 1
    assert sum(int(a["relay.verdicts.published"]) for a in attrs) == ROWS
    assert sum(int(a["relay.verdicts.dead"]) for a in attrs) == 1
    assert sum(int(a.get("relay.reasons.invalid_option", 0)) for a in attrs) == 1
    for span in batches:
        steps = [e.name for e in span.events if not e.name.startswith("row_")]
        assert steps == ["claimed", "publish", "confirmed", "settled"], steps
    parked = [e for s in batches for e in s.events if e.name == "row_parked"]
    assert [dict(e.attributes or {})["relay.reason"] for e in parked] == ["invalid_option"]
    assert "priority" in str(dict(parked[0].attributes or {})["relay.detail"])


async def test_batch_span__child_of_the_wakeup_that_found_work(
        relay_spans: tuple[list[ReadableSpan], trace.SpanContext]) -> None:
    spans, _ = relay_spans
    wakeups = {s.context.span_id: s for s in spans if s.name == "relay wakeup"}
    batches = _batches(spans)
    assert wakeups
    assert batches
    for batch in batches:
        assert batch.parent is not None
        assert batch.parent.span_id in wakeups
        wakeup = wakeups[batch.parent.span_id]
        assert wakeup.start_time is not None
        assert batch.start_time is not None
        assert wakeup.start_time <= batch.start_time
    rows = sum(int(dict(w.attributes or {})["relay.wakeup.rows"]) for w in wakeups.values())
    assert rows == ROWS + 1


async def test_batch_span__links_to_the_producer_context(
        relay_spans: tuple[list[ReadableSpan], trace.SpanContext]) -> None:
    spans, produced = relay_spans
    links = [link for s in _batches(spans) for link in s.links]
    assert len(links) == ROWS  # the traced rows; the bad row carries no context
    assert {(lk.context.trace_id, lk.context.span_id) for lk in links} == {
        (produced.trace_id, produced.span_id)}


async def test_consumer_continues_the_producer_trace(env: Env, consumer: Consumer) -> None:
    """The message carries the producer's traceparent unchanged: a consumer that extracts it
    with the W3C propagator starts a span in the producer's trace, a child of its span."""
    producer, exporter = _producer()
    produced = await _produce(env, producer)
    provider = TracerProvider()
    await _drain_in_process(env, OtelTracing(provider, table="queue_message"), consumer)
    message = consumer.messages[0]
    headers = {k: str(v) for k, v in (message.headers or {}).items()}
    context = TraceContextTextMapPropagator().extract(headers)
    with producer.get_tracer("consumer").start_as_current_span(
            "handle order", context=context, kind=SpanKind.CONSUMER):
        pass
    handled = next(s for s in exporter.get_finished_spans() if s.name == "handle order")
    assert handled.context.trace_id == produced.trace_id
    assert handled.parent is not None
    assert handled.parent.span_id == produced.span_id


def _traced_relay(env: Env, relays: list[RelayProcess], tmp_path: Path,
                  **otel: str) -> RelayProcess:
    """`relay run` for the test's env with these OTEL_* variables (killed at teardown)."""
    proc = RelayProcess({**env.relay_env(), **otel}, tmp_path / f"relay-{len(relays)}.log")
    relays.append(proc.start())
    return proc


async def test_relay_run__exports_spans_and_logs_carry_their_ids(
        env: Env, consumer: Consumer, relays: list[RelayProcess], tmp_path: Path) -> None:
    """`relay run` with OTEL_EXPORTER_OTLP_ENDPOINT: a local collector gets the wake-up and
    batch spans; the log line of the parked row names the batch span's trace."""
    producer, _ = _producer()
    produced = await _produce(env, producer)
    with OtlpReceiver() as receiver:
        relay = _traced_relay(env, relays, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                              OTEL_BSP_SCHEDULE_DELAY="100")
        await consumer.wait_for(ROWS)
        await wait_until(lambda: any(s.name.startswith("publish") for s in receiver.spans),
                         timeout_s=30, what="a batch span at the receiver")
        assert await asyncio.to_thread(relay.terminate, 30) == 0
    batches = [s for s in receiver.spans if s.name == f"publish {env.exchange}"]
    assert {produced.trace_id.to_bytes(16, "big").hex()} <= {t for s in batches
                                                            for t in s.links}
    parked = [e for e in relay.log_events() if e.get("event") == "rows_dead"]
    assert parked, relay.log_text()[-2000:]
    assert "trace_id" in parked[0], parked
    assert parked[0]["trace_id"] in {s.trace_id for s in batches}
    assert parked[0]["span_id"] in {s.span_id for s in batches}


async def test_relay_run__collector_away__rows_published_spans_dropped(
        env: Env, consumer: Consumer, relays: list[RelayProcess], tmp_path: Path) -> None:
    """Nothing listens at the OTLP endpoint: every row is published, the relay stops on time."""
    relay = _traced_relay(env, relays, tmp_path,
                          OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                          OTEL_BSP_SCHEDULE_DELAY="100", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    ids = await insert_rows(env.pg_dsn, env.exchange, "rk", [{"n": i} for i in range(300)])
    await consumer.wait_for(len(ids))
    await wait_until(lambda: _empty(env), timeout_s=30, what="the outbox emptied")
    assert await asyncio.to_thread(relay.terminate, 30) == 0
    assert "tracing_on" in relay.log_text()


def test_tracing_off__nothing_of_opentelemetry_imported() -> None:
    """Without OTEL_* variables the relay's modules and its tracing load no OpenTelemetry."""
    code = (
        "import sys\n"
        "import relay.app, relay.cli, relay.loop.worker\n"
        "from relay.tracing import from_environment\n"
        "t = from_environment({}, table='queue_message')\n"
        "assert not t.enabled\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]", out.stdout


def test_relay_run__unsupported_exporter__stops_naming_the_variable(env: Env) -> None:
    """A tracing variable the relay cannot serve stops start-up with its name, no traceback."""
    out = subprocess.run([RELAY_BIN, "run"], capture_output=True, text=True, timeout=60,
                         check=False, env={**env.relay_env(), "OTEL_TRACES_EXPORTER": "zipkin"})
    assert out.returncode == 2, out.stderr
    assert "OTEL_TRACES_EXPORTER" in out.stderr
    assert "Traceback" not in out.stderr
