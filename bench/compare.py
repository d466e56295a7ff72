"""Two builds of the relay back to back in one run: latency (and with --drain-rows, drains).

    python -m bench --scenario compare -- --before-src /tmp/relay-before --label "a cut" \
        [--rates 1000:4,3000:16] [--runs 3] [--seconds 10] [--drain-rows 100000] [--out FILE]

`--before-src` is another checkout (`git worktree add /tmp/relay-before HEAD~1`); "after" is
this tree. Runs alternate (before, after, ...) on one database in the default notify mode, each
after the load average fell under --quiet-below; drains run on a private cluster, as the
suite's. Writes the compare block of bench/RESULTS.md (or --out).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench import common
from bench.common import Provenance, builds, create_env, drop_env, wait_quiet
from bench.drain import drain_once
from bench.latency import latency_once


async def alternate(args: argparse.Namespace, drains: bool) -> list[dict[str, Any]]:
    """Before/after runs of each rate (or drains), one record per run, printed as it comes."""
    env = await create_env("compare")
    out: list[dict[str, Any]] = []
    try:
        for rate, connections in [(0, 0)] if drains else args.rates:
            for i in range(args.runs):
                for build in builds(args.before_src):
                    await wait_quiet(args.quiet_below)
                    result = await (drain_once(env, args.drain_rows) if drains else latency_once(
                        env, rate, args.seconds, connections=connections,
                        log_dir=common.log_dir("compare")))
                    out.append({"build": build, "run": i + 1, "rate": rate, **result})
                    print(out[-1], flush=True)
    finally:
        await drop_env(env)
    return out


def revision(folder: Path) -> str:
    """The git commit of a source tree, and whether it has uncommitted changes."""
    try:
        git = ["git", "-C", str(folder)]
        rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return rev + (" with uncommitted changes" if dirty else "")


def report(latency: list[dict[str, Any]], drains: list[dict[str, Any]], label: str,
           prov: Provenance, before_src: str = "") -> str:
    """Every run, then the medians of each rate and build."""
    lines = prov.header(
        f"Before and after: {label}", f"builds: before = {revision(Path(before_src or '.'))}, "
        f"after = {revision(Path(__file__).parents[1])}",
        f"notify mode: {common.DEFAULT_MODE.value} (the default); default relay settings",
        "floor: the machine's own p50 right before each run: a commit on the run's server / a "
        "persistent publish's confirm / how late a 1 ms timer wakes")
    lines += ["| build | commits/s | connections | run | p50 ms | p95 ms | p99 ms | rate "
              "reached | load before | floor p50 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['build']} | {r['rate']} | {r['connections']} | {r['run']} | {r['p50_ms']} | "
              f"{r['p95_ms']} | {r['p99_ms']} | {r['achieved_per_s']} | {r['load_before']} | "
              + (" / ".join(f"{r['floor'][p]['p50_ms']:.2f}" for p in (
                  "pg_commit", "amqp_confirm", "timer_late")) if r.get("floor") else "-") + " |"
              for r in latency]
    lines += ["", "| commits/s | build | median p50 ms | median p99 ms |", "|---|---|---|---|"]
    for rate in sorted({r["rate"] for r in latency}):
        for build in ("before", "after"):
            runs = [r for r in latency if r["rate"] == rate and r["build"] == build]
            if runs:
                lines.append(f"| {rate} | {build} | "
                             f"{statistics.median(r['p50_ms'] for r in runs):.2f} | "
                             f"{statistics.median(r['p99_ms'] for r in runs):.2f} |")
    if drains:
        lines += ["", "| run | build | rows | seconds | msg/s | load before |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['run']} | {r['build']} | {r['rows']:,} | {r['seconds']} | "
                  f"{r['msg_per_s']:,.0f} | {r['load_before'][0]} |" for r in drains]
        pairs = {r["run"]: {d["build"]: d["msg_per_s"] for d in drains if d["run"] == r["run"]}
                 for r in drains}
        ratios = [p["after"] / p["before"] for p in pairs.values() if len(p) == 2]
        lines += ["", "after over before, run by run: " + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    """Parse the options, run, write the report."""
    prov = Provenance(["--scenario", "compare", "--", *argv])
    parser = argparse.ArgumentParser(prog="python -m bench --scenario compare --",
                                     description=__doc__)
    parser.add_argument("--before-src", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--rates", default="1000:4,3000:16", type=lambda text: [
        tuple(int(x) for x in pair.split(":")) for pair in text.split(",")],
        help="commits per second and producer connections: 1000:4,3000:16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--drain-rows", type=int, default=0)
    parser.add_argument("--quiet-below", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="a file of its own (default: its block of "
                        "bench/RESULTS.md)")
    args = parser.parse_args(argv)
    latency = common.run(lambda: alternate(args, drains=False))
    drains: list[dict[str, Any]] = []
    if args.drain_rows:
        with common.private_server():
            drains = common.run(lambda: alternate(args, drains=True))
    prov.write("compare", args.out, report(latency, drains, args.label, prov, args.before_src))
