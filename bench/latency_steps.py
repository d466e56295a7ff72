"""Where a batch's time goes while producers commit at a rate: the relay's own spans, step by
step, beside the run's commit-to-consumer latency.

    python -m bench.latency_steps --rates 1000:4 --seconds 10 --out bench/compare/latency-steps.md

One `relay run` with tracing on (OTLP/HTTP to a receiver in this process, every span sampled,
exported every 200 ms) follows the producers of bench/latency.py. Each batch span carries its
start (before the claim's connection is taken) and the events claimed, publish, confirmed,
settled, then its end (the commit). Per rate the report gives, over the batches that found
rows, the median and p90 of: claim (start to claimed: connection, BEGIN, the claim), build
(claimed to publish), confirm (publish to confirmed: the broker's round trip and fsync),
settle (confirmed to settled: the DELETE, where a batch has retries or dead rows; a batch
whose rows were all published sends its DELETE with the COMMIT), commit (settled to end), the
whole batch, the gap
from one batch's end to the next one's start (the sleep check, the wait for a NOTIFY, the
next wake-up), and rows per batch. Tracing costs the relay some CPU: the latency figures of
this run are for reading beside the steps, not for the results table.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
from typing import Any

import uvloop

from bench.common import (
    RELAY_SRC,
    OneOff,
    one_off,
    one_off_env,
    percentile,
    wait_quiet,
)
from bench.compare import _revision
from bench.latency import latency_once
from tests.servers.otlp_receiver import OtlpReceiver, ReceivedSpan

STEPS = ("claim", "build", "confirm", "settle", "commit", "batch", "gap")


def batch_steps(spans: list[ReceivedSpan]) -> dict[str, Any]:
    """Per-step medians and p90s (ms) over the batch spans that found rows."""
    batches = []
    for span in spans:
        events = dict(span.events)
        if not {"claimed", "publish", "confirmed", "settled"} <= events.keys():
            continue
        batches.append(span)
    batches.sort(key=lambda s: s.start_ns)
    steps: dict[str, list[float]] = {name: [] for name in STEPS}
    for span in batches:
        ev = dict(span.events)
        for name, start, end in (("claim", span.start_ns, ev["claimed"]),
                                 ("build", ev["claimed"], ev["publish"]),
                                 ("confirm", ev["publish"], ev["confirmed"]),
                                 ("settle", ev["confirmed"], ev["settled"]),
                                 ("commit", ev["settled"], span.end_ns),
                                 ("batch", span.start_ns, span.end_ns)):
            steps[name].append((end - start) / 1e6)
    for before, after in itertools.pairwise(batches):
        if after.start_ns >= before.end_ns:
            steps["gap"].append((after.start_ns - before.end_ns) / 1e6)
    rows = [int(s.attributes.get("messaging.batch.message_count", 0)) for s in batches]
    overlapping = sum(1 for b, a in itertools.pairwise(batches)
                      if a.start_ns < b.end_ns)
    return {"batches": len(batches), "overlapping": overlapping,
            "rows_median": statistics.median(rows) if rows else 0,
            "rows_p90": percentile([float(r) for r in rows], 90) if rows else 0,
            "steps": {name: {"median": round(statistics.median(v), 3) if v else None,
                             "p90": round(percentile(v, 90), 3) if v else None,
                             "p99": round(percentile(v, 99), 3) if v else None,
                             "max": round(max(v), 3) if v else None, "n": len(v)}
                      for name, v in steps.items()}}


async def steps_runs(rates: list[tuple[int, int]], seconds: float,
                     quiet_below: float) -> list[dict[str, Any]]:
    """One traced latency run per rate."""
    otel = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BSP_MAX_QUEUE_SIZE": "65536", "OTEL_SERVICE_NAME": "outbox-relay-bench"}
    async with one_off_env("latsteps") as (env, records):
        try:
            with OtlpReceiver() as receiver:
                os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **otel})
                for rate, connections in rates:
                    await wait_quiet(quiet_below)
                    seen = len(receiver.spans)
                    result = await latency_once(env, rate, seconds, connections=connections)
                    await asyncio.sleep(1.0)  # the relay's last export
                    records.add({"rate": rate, "connections": connections, **result,
                                 **batch_steps(list(receiver.spans)[seen:])})
        finally:
            for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", *otel):
                os.environ.pop(key, None)
    return records


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = run.header(
        "Where a batch's time goes at a steady rate (the relay's own spans)",
        f"build: {_revision(RELAY_SRC or None)}",
        "tracing on (every span, OTLP/HTTP to a local receiver); default relay settings, "
        "default notify mode; steps in ms, median / p90 over the batches that found rows")
    lines += ["| commits/s | conns | latency p50 / p99 | batches | rows per batch (med / p90) | "
              + " | ".join(STEPS) + " | floor: commit / confirm |",
              "|---|---|---|---|---|" + "---|" * len(STEPS) + "---|"]
    for r in records:
        cells = " | ".join(
            f"{r['steps'][n]['median']} / {r['steps'][n]['p90']}" for n in STEPS)
        floor = r.get("floor") or {}
        lines.append(
            f"| {r['rate']} | {r['connections']} | {r['p50_ms']} / {r['p99_ms']} | "
            f"{r['batches']} ({r['overlapping']} overlapping) | "
            f"{r['rows_median']} / {r['rows_p90']} | {cells} | "
            f"{floor.get('pg_commit', {}).get('p50_ms')} / "
            f"{floor.get('amqp_confirm', {}).get('p50_ms')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run, write the report."""
    args, run = one_off("bench.latency_steps", rates="1000:4", seconds=10.0)
    records = uvloop.run(steps_runs(args.rates, args.seconds, args.quiet_below))
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
