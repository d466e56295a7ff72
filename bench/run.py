"""One command for the whole suite: `python -m bench.run --full` (by hand) or `--smoke` (CI).

Writes RESULTS.md (machine, date, versions, command, median and spread of every figure)
and results.json into --out (default: bench/ for --full, a temporary folder for --smoke).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import AMQP_URL, PG_ADMIN_DSN, BenchEnv, create_env, drop_env, reset_env
from bench.drain import drain_once
from bench.latency import latency_once
from bench.limits import aio_pika_limit, bulk_frame_limit, classic_relay, pg_claim_delete_limit


@dataclass(frozen=True)
class Plan:
    """Sizes of one suite run."""

    runs: int
    drain_rows: int
    simple_rows: int
    batch_sizes: tuple[int, ...]
    processes: tuple[int, ...]
    latency_rates: tuple[int, ...]
    latency_s: float
    aio_pika_msgs: int
    bulk_msgs: int
    pg_rows: int
    classic_rows: int


FULL = Plan(3, 200_000, 50_000, (100, 500, 1000), (1, 2), (1000, 5000), 10.0,
            50_000, 200_000, 200_000, 1_000)
SMOKE = Plan(1, 3_000, 1_000, (500,), (1, 2), (1000,), 1.5, 2_000, 3_000, 3_000, 100)


Figure = dict[str, Any]


async def servers_answer(timeout_s: float = 120.0) -> None:
    """Wait until both servers accept connections (others on this machine restart them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
            await conn.close()
            amqp = await aio_pika.connect(AMQP_URL, timeout=5)
            await amqp.close()
            return
        except (OSError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)


async def repeat(
    env: BenchEnv, runs: int, label: str, once: Callable[[], Awaitable[Figure]]
) -> list[Figure]:
    """Run one scenario `runs` times, printing each result as it comes.

    A run that fails because a server went away (restarted by other work on this shared
    machine) is repeated once the servers answer again, at most twice; the figure records it.
    """
    out = []
    for i in range(runs):
        for attempt in range(3):
            try:
                result = await once()
                break
            except Exception as exc:
                if attempt == 2:
                    raise
                print(f"{label} run {i + 1}/{runs} failed ({exc!r}); retrying", flush=True)
                await servers_answer()
                await reset_env(env)
        result["retried"] = attempt
        print(f"{label} run {i + 1}/{runs}: {json.dumps(result)}", flush=True)
        out.append(result)
    return out


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and spread ((max-min)/median) of a figure over runs."""
    med = statistics.median(values)
    return {
        "median": round(med, 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "spread_pct": round((max(values) - min(values)) / med * 100, 1) if med else 0.0,
        "n": len(values),
    }


async def run_suite(plan: Plan) -> dict[str, Any]:
    """Every scenario in one process, each on a database and queue of its own."""
    env = await create_env("suite")
    results: dict[str, Any] = {"drain": [], "latency": [], "limits": {}}
    try:
        results["limits"]["classic_relay"] = await repeat(
            env, plan.runs, "classic", lambda: classic_relay(env, plan.classic_rows))
        results["limits"]["aio_pika_pipelined"] = await repeat(
            env, plan.runs, "aio-pika", lambda: aio_pika_limit(env, plan.aio_pika_msgs))
        results["limits"]["bulk_frames"] = await repeat(
            env, plan.runs, "bulk-frames", lambda: bulk_frame_limit(env, plan.bulk_msgs))
        results["limits"]["pg_claim_delete"] = await repeat(
            env, plan.runs, "pg", lambda: pg_claim_delete_limit(env, plan.pg_rows))
        for procs in plan.processes:
            for batch in plan.batch_sizes:
                runs = await repeat(
                    env, plan.runs, f"drain p={procs} b={batch}",
                    lambda p=procs, b=batch: drain_once(  # type: ignore[misc]
                        env, plan.drain_rows, processes=p, batch_size=b))
                results["drain"].append({"processes": procs, "batch_size": batch,
                                         "publisher": "bulk", "runs": runs})
        runs = await repeat(env, plan.runs, "drain simple", lambda: drain_once(
            env, plan.simple_rows, processes=1, batch_size=500, publisher="simple"))
        results["drain"].append({"processes": 1, "batch_size": 500, "publisher": "simple",
                                 "runs": runs})
        for rate in plan.latency_rates:
            runs = await repeat(env, plan.runs, f"latency {rate}/s",
                                lambda r=rate: latency_once(env, r, plan.latency_s))  # type: ignore[misc]
            results["latency"].append({"rate_per_s": rate, "runs": runs})
    finally:
        await servers_answer()
        await drop_env(env)
    return results


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads, and the ratios the issue asks for (all from this one run)."""
    limits = {k: summary([r["msg_per_s"] for r in v]) for k, v in results["limits"].items()}
    drains = []
    for d in results["drain"]:
        drains.append({**{k: d[k] for k in ("processes", "batch_size", "publisher")},
                       "rows": d["runs"][0]["rows"],
                       "msg_per_s": summary([r["msg_per_s"] for r in d["runs"]]),
                       "cpu_cores": {k: round(statistics.median(r["cpu_cores"][k]
                                                                for r in d["runs"]), 2)
                                     for k in d["runs"][0]["cpu_cores"]}})
    lat = []
    for entry in results["latency"]:
        lat.append({"rate_per_s": entry["rate_per_s"],
                    **{k: summary([r[k] for r in entry["runs"]])
                       for k in ("achieved_per_s", "p50_ms", "p95_ms", "p99_ms")}})
    head = next((d for d in drains if d["processes"] == 1 and d["batch_size"] == 500
                 and d["publisher"] == "bulk"), drains[0])
    two = next((d for d in drains if d["processes"] == 2 and d["batch_size"] == 500), None)
    simple = next((d for d in drains if d["publisher"] == "simple"), None)
    one = head["msg_per_s"]["median"]
    ratios = {
        "relay_1p_vs_bulk_frame_limit": round(one / limits["bulk_frames"]["median"], 2),
        "relay_1p_vs_classic": round(one / limits["classic_relay"]["median"], 1),
        "relay_1p_vs_aio_pika_limit": round(one / limits["aio_pika_pipelined"]["median"], 2),
        "relay_1p_vs_pg_limit": round(one / limits["pg_claim_delete"]["median"], 2),
        "bulk_frames_vs_aio_pika": round(limits["bulk_frames"]["median"]
                                         / limits["aio_pika_pipelined"]["median"], 2),
    }
    if two is not None:
        ratios["relay_2p_vs_1p"] = round(two["msg_per_s"]["median"] / one, 2)
    if simple is not None:
        ratios["relay_bulk_vs_simple_publisher"] = round(one / simple["msg_per_s"]["median"], 2)
    return {"limits": limits, "drain": drains, "latency": lat, "ratios": ratios,
            "headline": head}


async def versions() -> dict[str, str]:
    """Client libraries, servers and interpreter."""
    out = {"python": platform.python_version()}
    for dist in ("aio-pika", "aiormq", "pamqp", "asyncpg", "uvloop"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "-"
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        out["postgresql"] = str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        props = amqp.transport.connection.server_properties  # type: ignore[union-attr]
        out["rabbitmq"] = str(props.get("version", "?"))
    finally:
        await amqp.close()
    return out


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, load at the start."""
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {"cpu": model, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 1e6, 1),
            "kernel": platform.release(), "load_avg_at_start": os.getloadavg()}


def _range(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f}, ±{s['spread_pct'] / 2:.0f}%)"


def _ms(s: dict[str, float]) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"


def render_markdown(report: dict[str, Any]) -> str:
    """RESULTS.md: what ran where, then every figure with its median and spread."""
    s = report["summary"]
    m, v = report["machine"], report["versions"]
    lines = [
        "# Benchmark results",
        "",
        f"- date: {report['date']}  ·  mode: {report['mode']}  ·  wall time: "
        f"{report['elapsed_s']:.0f} s",
        f"- command: `{report['command']}`",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, Linux {m['kernel']}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in m['load_avg_at_start'])} "
        "(the machine is shared with other work: absolute figures are noisy, compare ratios "
        "from this one run)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- every figure: median (min–max, ± half the spread) over "
        f"{report['plan']['runs']} run(s); bodies ~200 bytes of JSON, persistent messages, "
        "durable queue, nothing consuming during drains",
        "",
        "## Ratios (this run)",
        "",
        "| ratio | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {val} |" for k, val in s["ratios"].items()]
    lines += ["", "## Drain throughput (`relay run`, backlog committed at once)", "",
              "| processes | batch | publisher | rows | msg/s | CPU cores: relay / postgres / "
              "rabbitmq / other |", "|---|---|---|---|---|---|"]
    for d in s["drain"]:
        c = d["cpu_cores"]
        lines.append(
            f"| {d['processes']} | {d['batch_size']} | {d['publisher']} | {d['rows']:,} | "
            f"{_range(d['msg_per_s'])} | {c['relay']} / {c['postgres']} / {c['rabbitmq']} / "
            f"{c['other']} |")
    lines += ["", "## Ceilings and baseline (same run)", "", "| path | msg/s |", "|---|---|"]
    names = {"classic_relay": "classic per-row relay (1 tx + 1 confirm channel per row)",
             "aio_pika_pipelined": "aio-pika, confirms pipelined (1,000 in flight)",
             "bulk_frames": "bulk frames (relay/amqp/bulk.py, 3 × 500 in flight, no DB)",
             "pg_claim_delete": "PostgreSQL DELETE … FOR UPDATE SKIP LOCKED, 3 × 500"}
    lines += [f"| {names[k]} | {_range(val)} |" for k, val in s["limits"].items()]
    lines += ["", "## Latency, producer commit → consumer receipt (ms)", "",
              "| rate msg/s | achieved | p50 | p95 | p99 |", "|---|---|---|---|---|"]
    for entry in s["latency"]:
        lines.append(f"| {entry['rate_per_s']:,} | {entry['achieved_per_s']['median']:,.0f} | "
                     f"{_ms(entry['p50_ms'])} | {_ms(entry['p95_ms'])} | "
                     f"{_ms(entry['p99_ms'])} |")
    lines += ["", "Raw runs: results.json (same folder).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the suite, write RESULTS.md and results.json."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the full suite (default)")
    mode.add_argument("--smoke", action="store_true", help="a few thousand rows, < 60 s")
    parser.add_argument("--runs", type=int, help="repetitions of every figure")
    parser.add_argument("--out", type=Path, help="folder for RESULTS.md and results.json")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    if args.runs:
        plan = Plan(args.runs, *list(plan.__dict__.values())[1:])
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-smoke-")) if args.smoke
                       else Path(__file__).parent)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    results = runner(run_suite(plan))
    report = {
        "mode": "smoke" if args.smoke else "full",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "-m",
                                                      "bench.run", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "versions": runner(versions()),
        "plan": plan.__dict__,
        "elapsed_s": time.monotonic() - started,
        "summary": summarise(results),
        "raw": results,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "RESULTS.md").write_text(render_markdown(report))
    print(f"wrote {out / 'RESULTS.md'} and {out / 'results.json'}")
    print(json.dumps(report["summary"]["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
