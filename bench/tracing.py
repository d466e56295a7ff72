"""Drain with tracing off and on, back to back, on a private cluster.

    python -m bench.tracing --rows 100000 --runs 3 --out /tmp/tracing.md

One `relay run` with default settings drains a backlog committed in one transaction
(bench/drain.py), alternately with tracing off (no OTEL_* variable: the default) and on
(OTEL_EXPORTER_OTLP_ENDPOINT at a local OTLP/HTTP receiver in this process, every trace
sampled). Every row carries its own W3C traceparent in options.headers, in both modes, so the
batch spans link to producer contexts and the only difference between the modes is tracing;
a third mode drains rows without options (tracing off), the cost of per-row headers.
PostgreSQL: a private initdb cluster with the server's defaults (bench/server.py). Writes a
Markdown report with the machine, the command, the date and the load average before each run.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import TRACED_OPTIONS_SQL, OneOff, one_off, one_off_env, wait_quiet
from bench.compare import _revision
from bench.drain import drain_once
from bench.server import run_on_private_server
from tests.servers.otlp_receiver import OtlpReceiver


async def tracing_runs(rows: int, runs: int, quiet_below: float) -> list[dict[str, Any]]:
    """Alternate off and on, `runs` times."""
    async with one_off_env("tracing") as (env, records):
        with OtlpReceiver() as receiver:
            on_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                      "OTEL_TRACES_SAMPLER": "always_on",
                      "OTEL_SERVICE_NAME": "outbox-relay-bench"}
            modes = (("off", None, TRACED_OPTIONS_SQL), ("on", on_env, TRACED_OPTIONS_SQL),
                     ("off, rows without options", None, "NULL"))
            for i in range(runs):
                for mode, extra, options_sql in modes:
                    await wait_quiet(quiet_below)
                    spans_before = len(receiver.spans)
                    result = await drain_once(env, rows, extra_env=extra,
                                              options_sql=options_sql)
                    records.add({"tracing": mode, "run": i + 1, "rows": rows,
                                 "msg_per_s": result["msg_per_s"],
                                 "seconds": result["seconds"],
                                 "relay_cpu_s_per_1k": result["cpu_s_per_1k_msgs"]["relay"],
                                 "spans_received": len(receiver.spans) - spans_before,
                                 "load_before": result["load_before"]})
    return records


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "Drain with tracing off and on",
            f"build: {_revision()}",
            "PostgreSQL: a private initdb cluster with the server's defaults; one `relay run` "
            "with default settings; every row carries a traceparent; on = "
            "OTEL_EXPORTER_OTLP_ENDPOINT at a local OTLP/HTTP receiver (the bench process), "
            "OTEL_TRACES_SAMPLER=always_on; spans received = spans the receiver decoded "
            "during the run (the last export of a run may arrive in the next)",
        ),
        "| tracing | run | rows | msg/s | seconds | relay CPU-s per 1,000 | spans received | "
        "load before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {r['tracing']} | {r['run']} | {r['rows']:,} | {r['msg_per_s']:,.0f} | "
                     f"{r['seconds']} | {r['relay_cpu_s_per_1k']} | {r['spans_received']} | "
                     f"{r['load_before']} |")
    modes = list(dict.fromkeys(r["tracing"] for r in records))
    medians = {mode: statistics.median(r["msg_per_s"] for r in records if r["tracing"] == mode)
               for mode in modes}
    lines += ["", "## Medians", "", "| tracing | msg/s |", "|---|---|"]
    lines += [f"| {mode} | {value:,.0f} |" for mode, value in medians.items()]
    lines += ["", f"**on / off: {medians['on'] / medians['off']:.3f}** (target ≥ 0.95)",
              "", "Rows with a traceparent each (tracing off) vs rows without options: "
              f"{medians['off'] / medians['off, rows without options']:.3f}: the cost of "
              "per-row headers, paid whether tracing is on or off.", ""]
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.tracing", runs=3,
                        quiet_below=1.5, options={"--rows": {"type": int, "default": 100_000}})
    records = run_on_private_server(lambda: tracing_runs(args.rows, args.runs,
                                                         args.quiet_below))
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
