"""One trace through the relay, drawn from real spans: a producer's request that writes an
outbox row, the relay's wake-up and batch spans, and a consumer that continues the trace.

    python -m bench --scenario trace-picture -- --update-readme

Runs against the machine's servers: a fresh database and queue, one `relay run` exporting to a
local OTLP/HTTP receiver (OTEL_EXPORTER_OTLP_ENDPOINT), a producer span in this process that
inserts one row with relay.tracing.producer.outbox_options, and a consumer here that extracts
the context from the message's headers. Prints the picture (times relative to the producer's
span) and, with --update-readme, writes it into README.md's tracing block.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aio_pika
import asyncpg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bench.common import AMQP_URL, ROUTING_KEY, Relay, create_env, drop_env, with_block
from relay.tracing.producer import outbox_options
from tests.servers.otlp_receiver import OtlpReceiver, ReceivedSpan

WARM_UP = 50  # untraced rows first, one every 10 ms


async def one_trace() -> tuple[list[ReadableSpan], list[ReceivedSpan], str]:
    """Produce one traced row through a real relay; the producer's and consumer's spans, the
    relay's spans and the exchange name."""
    env = await create_env("trace")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("shop")
    handled = asyncio.Event()
    try:
        with OtlpReceiver() as receiver:
            relay = Relay({**env.relay_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                           "OTEL_BSP_SCHEDULE_DELAY": "100",
                           "OTEL_SERVICE_NAME": "outbox-relay"},
                          Path(tempfile.mkdtemp()) / "relay.log")
            amqp = await aio_pika.connect(AMQP_URL)
            try:
                await relay.wait_started()
                channel = await amqp.channel()
                queue = await channel.get_queue(env.queue)

                warmed = asyncio.Event()

                async def consume(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    headers = {k: str(v) for k, v in (message.headers or {}).items()}
                    if "traceparent" not in headers:  # a warm-up row
                        await message.ack()
                        if json.loads(message.body)["warm"] == WARM_UP - 1:
                            warmed.set()
                        return
                    context = TraceContextTextMapPropagator().extract(headers)
                    with tracer.start_as_current_span(f"process {env.exchange}",
                                                      context=context, kind=SpanKind.CONSUMER):
                        await message.ack()
                    handled.set()

                await queue.consume(consume)
                conn = await asyncpg.connect(env.dsn)
                try:
                    # A relay that has run a while: its statements prepared, its pool warm.
                    for i in range(WARM_UP):
                        await conn.execute(
                            "INSERT INTO queue_message (exchange, routing_key, content) "
                            "VALUES ($1, $2, $3)", env.exchange, ROUTING_KEY,
                            json.dumps({"warm": i}))
                        await asyncio.sleep(0.01)
                    await asyncio.wait_for(warmed.wait(), timeout=30)
                    await asyncio.sleep(0.5)  # the relay is asleep: a wake-up by the NOTIFY
                    with tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER):
                        await conn.execute(
                            "INSERT INTO queue_message (exchange, routing_key, content, options)"
                            " VALUES ($1, $2, $3, $4)", env.exchange, ROUTING_KEY,
                            json.dumps({"order": 1}), outbox_options())
                finally:
                    await conn.close()
                await asyncio.wait_for(handled.wait(), timeout=30)
                deadline = time.monotonic() + 30
                while not any(s.name.startswith("publish") and s.links for s in receiver.spans):
                    if time.monotonic() > deadline:
                        raise TimeoutError("no batch span reached the receiver in 30 s")
                    await asyncio.sleep(0.1)
            finally:
                await amqp.close()
                relay.stop()
            relay_spans = list(receiver.spans)
    finally:
        await drop_env(env)
    return list(exporter.get_finished_spans()), relay_spans, env.exchange


def picture(app: list[ReadableSpan], relay: list[ReceivedSpan], exchange: str) -> str:
    """The trace as text: each span's start and end in ms from the producer span's start."""
    producer = next(s for s in app if s.name == "POST /orders")
    consumer = next(s for s in app if s.name.startswith("process"))
    trace_id = f"{producer.context.trace_id:032x}"
    batch = next(s for s in relay if s.name.startswith("publish") and trace_id in s.links)
    wakeup = next((s for s in relay if s.span_id == batch.parent_span_id), None)
    assert producer.start_time is not None
    assert producer.end_time is not None
    assert consumer.start_time is not None
    assert consumer.end_time is not None
    t0 = producer.start_time

    def ms(ns: int) -> str:
        return f"{(ns - t0) / 1e6:7.2f}"

    width = max(len(consumer.name), len(batch.name)) + 4
    lines = [
        f"producer's trace {trace_id[:8]}…   (ms from the request's start)",
        f"  {ms(producer.start_time)} – {ms(producer.end_time)}  {'POST /orders':<{width + 3}}"
        "the web handler; the outbox INSERT commits inside it",
        f"  {ms(consumer.start_time)} – {ms(consumer.end_time)}  └─ {consumer.name:<{width}}"
        "consumer, child of POST /orders (the traceparent rode in the message's headers)",
        "",
        f"relay's trace {batch.trace_id[:8]}…",
    ]
    if wakeup is not None:
        lines.append(f"  {ms(wakeup.start_ns)} – {ms(wakeup.end_ns)}  relay wakeup")
    lines.append(f"  {ms(batch.start_ns)} – {ms(batch.end_ns)}  └─ {batch.name:<{width}}"
                 + "links to POST /orders")
    for name, at in batch.events:
        lines.append(f"  {ms(at)}            · {name}")
    return "\n".join(lines)


def update_readme(readme: Path, text: str) -> None:
    """Write the picture into README's trace block."""
    block = (f"`python -m bench --scenario trace-picture -- --update-readme`, "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, the machine's own "
             f"servers:\n\n```\n{text}\n```")
    readme.write_text(with_block(readme.read_text(), "trace picture", block, append=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()
    app, relay, exchange = asyncio.run(one_trace())
    text = picture(app, relay, exchange)
    print(text)
    if args.update_readme:
        update_readme(Path(__file__).resolve().parents[1] / "README.md", text)
        print("README.md updated")


if __name__ == "__main__":
    main()
