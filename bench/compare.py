"""Commit-to-consumer latency (and, with --drain-rows, drain speed) of two builds of the
relay, back to back in one run.

    python -m bench --scenario compare -- --before-src /tmp/relay-before --label "pool reset cut" \
        --rates 1000:4,3000:16 --runs 3 --seconds 10 --drain-rows 100000

`--before-src` is another checkout of the relay (e.g. `git worktree add /tmp/relay-before
HEAD~1`); the after build is this tree. Runs alternate (before, after, before, after...) on one
database with the default notify mode, so both see the same machine; every run records the
load average before it. Writes a Markdown report (machine, command, date, versions, every run
and the medians) into its block of bench/RESULTS.md (or to --out), and prints one JSON line per
run. With --drain-rows, drains of that many rows (the default settings, one relay) alternate the
same way after the latency runs, on a private cluster with the server's defaults
(bench/common.py) like the suite's drains.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

import uvloop

from bench.common import (
    DEFAULT_MODE,
    OneOff,
    alternation_table,
    builds,
    one_off,
    one_off_env,
    run_on_private_server,
    wait_quiet,
)
from bench.drain import drain_once
from bench.latency import brief_floor, latency_once


async def compare(before_src: str, rates: list[tuple[int, int]], runs: int,
                  seconds: float, quiet_below: float) -> list[dict[str, Any]]:
    """Alternate before/after latency runs; one record per run."""
    async with one_off_env("compare", DEFAULT_MODE) as (env, records):
        for rate, connections in rates:
            for i in range(runs):
                for build in builds(before_src):
                    await wait_quiet(quiet_below)
                    result = await latency_once(env, rate, seconds, connections=connections)
                    records.add({"build": build, "run": i + 1, "rate": rate,
                                 "connections": connections, **result})
    return records


async def compare_drains(before_src: str, rows: int, runs: int, quiet_below: float,
                         ) -> list[dict[str, Any]]:
    """Alternate before/after drains of `rows` rows; one record per run."""
    async with one_off_env("compare_drain", DEFAULT_MODE) as (env, records):
        for i in range(runs):
            for build in builds(before_src):
                await wait_quiet(quiet_below)
                result = await drain_once(env, rows)
                records.add({"build": build, "run": i + 1, "rows": rows, **result})
    return records


def _revision(folder: str | None = None) -> str:
    """The git commit of a source tree (and whether it has uncommitted changes)."""
    cwd = folder or str(Path(__file__).resolve().parents[1])
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return rev + (" with uncommitted changes" if dirty.strip() else "")


def latency_tables(records: list[dict[str, Any]], key: str, groups: tuple[str, ...]
                   ) -> list[str]:
    """Every run's latency, then the medians per rate and group (`key`: build or server)."""
    lines = [f"| {key} | commits/s | connections | run | p50 ms | p95 ms | p99 ms | "
             "rate reached | load before | floor p50 ms: commit / confirm / timer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(
            f"| {r[key]} | {r['rate']} | {r['connections']} | {r['run']} | "
            f"{r.get('p50_ms')} | {r.get('p95_ms')} | {r.get('p99_ms')} | "
            f"{r.get('achieved_per_s')} | {r.get('load_before')} | "
            f"{brief_floor(r.get('floor'))} |")
    lines += ["", "### Medians", "", f"| commits/s | {key} | p50 ms | p99 ms |",
              "|---|---|---|---|"]
    for rate in sorted({r["rate"] for r in records}):
        for group in groups:
            runs = [r for r in records if r["rate"] == rate and r[key] == group]
            if not runs:
                continue
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            lines.append(f"| {rate} | {group} | {p50:.2f} | {p99:.2f} |")
    return lines


def report(records: list[dict[str, Any]], label: str, run: OneOff, *,
           before_src: str = "", drains: list[dict[str, Any]] | None = None) -> str:
    """The Markdown results file."""
    lines = run.header(
        f"Latency, before and after: {label}",
        f"builds: before = {_revision(before_src)}, after = {_revision()}",
        f"notify mode: {DEFAULT_MODE.value} (the default); default relay settings",
        "floor: the machine's own latency right before each run (bench/latency.py): a "
        "committed transaction on the run's PostgreSQL, a persistent publish's confirm, "
        "how late a 1 ms timer wakes")
    lines += latency_tables(records, "build", ("before", "after"))
    if drains:
        lines += ["", "### Drains", "",
                  *alternation_table(drains, "build", "rows", "before", "after")]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run, write the report."""
    args, run = one_off("bench.compare", scenario="compare", rates="1000:4,3000:16", runs=3,
                        seconds=10.0,
                        options={"--before-src": {"required": True},
                                 "--label": {"required": True},
                                 "--drain-rows": {"type": int, "default": 0}})
    records = uvloop.run(compare(args.before_src, args.rates, args.runs, args.seconds,
                                 args.quiet_below))
    drains = run_on_private_server(lambda: compare_drains(
        args.before_src, args.drain_rows, args.runs, args.quiet_below)) if args.drain_rows else []
    run.write(args.out, report(records, args.label, run, before_src=args.before_src,
                               drains=drains))


if __name__ == "__main__":
    main()
