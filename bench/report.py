"""RESULTS.md from a suite report (bench/run.py): what ran where, then every figure."""

from __future__ import annotations

from typing import Any


def _range(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f}, ±{s['spread_pct'] / 2:.0f}%)"


def _ms(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}, n={s['n']:.0f})"


def _loads(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}" if values else "-"


def _header(report: dict[str, Any]) -> list[str]:
    m, v = report["machine"], report["versions"]
    return [
        "# Benchmark results",
        "",
        "Written by `bench/run.py` (do not edit by hand); raw runs in results.json beside it.",
        "",
        f"- date: {report['date']}  ·  run: {report['mode']}  ·  wall time: "
        f"{report['elapsed_s']:.0f} s",
        f"- command: `{report['command']}`",
        f"- notify mode: **{report['notify_mode']}** (the default `relay migrate` installs) "
        "unless a row says otherwise",
        f"- machine: {m['cpu']}, nproc {m['nproc']}, {m['memory_gb']} GB, Linux {m['kernel']}; "
        f"load average before the suite {', '.join(f'{x:.1f}' for x in report['load_before'])};"
        " each table gives the 1-minute load average before each of its runs (the machine is "
        "shared with other work: compare ratios from this one run, not absolute figures)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- every figure: median (min–max) over the runs; bodies ~200 bytes of JSON, "
        "persistent messages, durable queue, PostgreSQL and RabbitMQ on loopback",
        "",
    ]


def _render_drains(s: dict[str, Any]) -> list[str]:
    lines = ["## Drain throughput (`relay run`, batch 500 × 3 lanes, backlog committed at once)",
             "", "| processes | publisher | rows | msg/s | load before | CPU cores: relay / "
             "postgres / rabbitmq / other |", "|---|---|---|---|---|---|"]
    for d in s["drain"]:
        c = d["cpu_cores"]
        lines.append(
            f"| {d['processes']} | {d['publisher']} | {d['rows']:,} | {_range(d['msg_per_s'])} "
            f"| {_loads(d['load_before'])} | {c['relay']} / {c['postgres']} / {c['rabbitmq']} / "
            f"{c['other']} |")
    lines += ["", "## Cost model: CPU-seconds per 1,000 messages while draining", "",
              "postgres (own sessions) = the backends serving this database (what the relay "
              "causes); postgres (all) and rabbitmq = every process of the server, so they include "
              "other work on this shared machine.", "",
              "| relay processes | rows | relay | postgres (own sessions) | postgres (all) | "
              "rabbitmq |", "|---|---|---|---|---|---|"]
    for c in s["cost"]:
        lines.append(f"| {c['processes']} | {c['rows']:,} | {c['relay']:.4f} | "
                     f"{c['postgres_own_sessions']:.4f} | {c['postgres']:.4f} | "
                     f"{c['rabbitmq']:.4f} |")
    return lines


def _render_latency(s: dict[str, Any]) -> list[str]:
    lines = ["", "## Latency, producer commit → consumer receipt (ms)", "",
             "Producers, relay and consumer in separate processes; producers commit 1-row "
             "transactions (Poisson arrivals) on N connections; first second left out.", "",
             "| mode | commits/s | connections | achieved | p50 | p95 | p99 | max | load before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in s["latency"]:
        lines.append(f"| {e['mode']} | {e['rate_per_s']:,} | {e['connections']} | "
                     f"{e['achieved_per_s']['median']:,.0f} | {_ms(e['p50_ms'])} | "
                     f"{_ms(e['p95_ms'])} | {_ms(e['p99_ms'])} | {_ms(e['max_ms'])} | "
                     f"{_loads(e['load_before'])} |")
    return lines


def _render_producers(s: dict[str, Any]) -> list[str]:
    lines = ["", "## Producers spared: pgbench, 8 clients, one 1-row INSERT per transaction", "",
             "Rounds alternate the modes on the live table; ratio = the mode's commits/s over no "
             "trigger (`off`) in the same round. backlog: one relay drains a backlog all along "
             "(rows left at the end > 0); live: two relays follow the producers from an empty "
             "table.", "",
             "| situation | mode | commits/s | ratio to no trigger | NOTIFYs per run | "
             "rows left | load before |", "|---|---|---|---|---|---|---|"]
    for e in s["producers"]:
        lines.append(f"| {e['situation']} | {e['mode']} | {_range(e['tps'])} | "
                     f"{_ratio(e['ratio_to_no_trigger'])} | "
                     f"{min(e['notifications'])}–{max(e['notifications'])} | "
                     f"{min(e['rows_left']):,}–{max(e['rows_left']):,} | "
                     f"{_loads(e['load_before'])} |")
    lines += ["", "## What a trigger costs a bulk insert (one INSERT … SELECT, no relay)", "",
              "| trigger | rows/s | ratio to no trigger | load before |", "|---|---|---|---|"]
    for e in s["triggers"]:
        lines.append(f"| {e['trigger']} | {_range(e['rows_per_s'])} | "
                     f"{_ratio(e['ratio_to_none'])} | {_loads(e['load_before'])} |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """RESULTS.md: what ran where, then every figure with its median and spread."""
    s = report["summary"]
    lines = _header(report)
    lines += ["## Ratios (this run)", "", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {val} |" for k, val in s["ratios"].items()]
    lines += ["", *_render_drains(s)]
    lines += ["", "## Ceilings and baseline (same run)", "", "| path | msg/s |", "|---|---|"]
    names = {"classic_relay": "classic per-row relay (1 tx + 1 confirm channel per row)",
             "aio_pika_pipelined": "aio-pika, confirms pipelined (1,000 in flight)",
             "bulk_frames": "bulk-frame publish limit (relay/amqp/bulk.py, 3 × 500 in flight, "
                            "no DB)",
             "pg_claim_delete": "PostgreSQL DELETE … FOR UPDATE SKIP LOCKED, 3 × 500"}
    lines += [f"| {names[k]} | {_range(val)} |" for k, val in s["limits"].items()]
    lines += _render_latency(s) + _render_producers(s) + [""]
    return "\n".join(lines)
