"""Two builds of the relay in one run: latency, and drains with --drain-rows; runs alternate
(before, after, ...) on one database in the default notify mode. --before-src is another
checkout (`git worktree add /tmp/relay-before HEAD~1`); "after" is this tree."""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench import common
from bench.common import builds, scenario_env, wait_quiet
from bench.drain import drain_once
from bench.latency import latency_once


def options(parser: argparse.ArgumentParser) -> None:
    """This scenario's own options."""
    parser.add_argument("--before-src", required=True)
    parser.add_argument("--label", required=True, help="what changed between the builds")
    parser.add_argument("--rates", default="1000:4,3000:16", help="commits per second and "
                        "producer connections of each latency run: 1000:4,3000:16 (none: no "
                        "latency runs)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--drain-rows", type=int, default=0, help="drains of this size too, on "
                        "a private cluster with the server's defaults")
    parser.add_argument("--relays", default="1", help="relay processes of each drain: 1,2,4")


async def alternate(args: argparse.Namespace, drains: bool) -> list[dict[str, Any]]:
    """Before/after runs of each rate (or drains), one record per run, printed as it comes."""
    rates = ([(n, 0) for n in map(int, args.relays.split(","))] if drains else
             [] if args.rates == "none" else
             [tuple(map(int, p.split(":"))) for p in args.rates.split(",")])
    out: list[dict[str, Any]] = []
    async with scenario_env("compare") as env:
        for rate, connections in rates:  # drains: (relays, 0)
            for i in range(args.runs):
                for build in builds(args.before_src):
                    await wait_quiet(args.quiet_below)
                    result = await (drain_once(env, args.drain_rows, processes=rate) if drains
                                    else latency_once(env, rate, args.seconds,
                                                      connections=connections))
                    out.append({"build": build, "run": i + 1, "rate": rate, **result})
                    print(out[-1], flush=True)
    return out


def revision(folder: Path) -> str:
    """The git commit of a source tree, `-dirty` with uncommitted changes."""
    return subprocess.run(["git", "-C", str(folder), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False).stdout.strip() or "?"


def report(latency: list[dict[str, Any]], drains: list[dict[str, Any]]) -> list[str]:
    """Every run, then the medians of each rate and build, and the drains' ratios."""
    lines = [] if not latency else [
        "| build | commits/s | connections | run | p50 ms | p95 ms | p99 ms | rate reached "
        "| load before |", "|---" * 9 + "|"]
    lines += [f"| {r['build']} | {r['rate']} | {r['connections']} | {r['run']} | {r['p50_ms']} | "
              f"{r['p95_ms']} | {r['p99_ms']} | {r['achieved_per_s']} | {r['load_before']} |"
              for r in latency]
    lines += [] if not latency else [
        "", "| commits/s | build | median p50 ms | median p99 ms |", "|---|---|---|---|"]
    lines += [f"| {rate} | {build} | {statistics.median(r['p50_ms'] for r in runs):.2f} | "
              f"{statistics.median(r['p99_ms'] for r in runs):.2f} |"
              for rate in sorted({r["rate"] for r in latency}) for build in ("before", "after")
              if (runs := [r for r in latency if r["rate"] == rate and r["build"] == build])]
    if drains:
        lines += ["", "| relays | run | build | rows | seconds | msg/s | CPU ms per 1,000 msgs: "
                  "PostgreSQL (its sessions) / relays | load before |", "|---" * 8 + "|"]
        lines += [f"| {r['rate']} | {r['run']} | {r['build']} | {r['rows']:,} | {r['seconds']} | "
                  f"{r['msg_per_s']:,.0f} | "
                  f"{r['cpu_s_per_1k_msgs']['postgres_own_sessions'] * 1000:.1f} / "
                  f"{r['cpu_s_per_1k_msgs']['relay'] * 1000:.1f} | {r['load_before'][0]} |"
                  for r in drains]
        pairs: dict[tuple[int, int], dict[str, float]] = {}
        for r in drains:
            pairs.setdefault((r["rate"], r["run"]), {})[r["build"]] = r["msg_per_s"]
        ratios = [(k[0], p["after"] / p["before"]) for k, p in pairs.items() if len(p) == 2]
        lines += ["", "after over before, msg/s, run by run: " + ", ".join(
            f"{n} relay(s) {x:.2f}" for n, x in ratios) + "."]
    return lines


def measure(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    """Run both builds; the report's title, details and body."""
    latency = common.run(lambda: alternate(args, drains=False))
    drains: list[dict[str, Any]] = []
    if args.drain_rows:
        with common.private_server():
            drains = common.run(lambda: alternate(args, drains=True))
    return (f"Before and after: {args.label}", [
        f"builds: before = {revision(Path(args.before_src))}, after = "
        f"{revision(Path(__file__).parents[1])}",
        f"notify mode: {common.DEFAULT_MODE.value} (the default); default relay settings"],
        report(latency, drains))
