"""A drain with the xmin horizon pinned, two builds back to back, on a private cluster.

    python -m bench.horizon --before-src /tmp/relay-before --rows 500000 \
        --out bench/compare/pinned-horizon.md

Another session holds a REPEATABLE READ snapshot taken before the backlog's insert until the
drain ends, so no row the relay deletes can be cleaned up (bench/drain.py `pinned`). For each
build (`--before-src`: another checkout; after: this tree), one drain with the horizon free and
one with it pinned, alternating builds, on a private initdb cluster with the server's defaults
(bench/server.py). Writes a Markdown report with the machine, the command, the date and the
load average before every drain.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import OneOff, builds, one_off, one_off_env, wait_quiet
from bench.compare import _revision
from bench.drain import drain_once
from bench.server import run_on_private_server


async def horizon(before_src: str, rows: int, runs: int, quiet_below: float,
                  ) -> list[dict[str, Any]]:
    """Alternate the builds; within each, the horizon free then pinned."""
    async with one_off_env("horizon") as (env, records):
        for i in range(runs):
            for build in builds(before_src):
                for pinned in (False, True):
                    await wait_quiet(quiet_below)
                    result = await drain_once(env, rows, pinned=pinned)
                    records.add({"build": build, "run": i + 1, "pinned": pinned,
                                 "rows": rows, "msg_per_s": result["msg_per_s"],
                                 "seconds": result["seconds"],
                                 "load_before": result["load_before"]})
    return records


def report(records: list[dict[str, Any]], run: OneOff, before_src: str) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "Drain with the xmin horizon pinned, before and after",
            f"builds: before = {_revision(before_src)}, after = {_revision()}",
            "PostgreSQL: a private initdb cluster with the server's defaults (autovacuum on); "
            "one `relay run` with default settings; pinned = another session holds a "
            "REPEATABLE READ snapshot from before the insert until the drain ends"),
        "| build | run | xmin horizon | rows | msg/s | seconds | load before |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {r['build']} | {r['run']} | {'pinned' if r['pinned'] else 'free'} | "
                     f"{r['rows']:,} | {r['msg_per_s']:,.0f} | {r['seconds']} | "
                     f"{r['load_before']} |")
    lines += ["", "## Medians", "", "| build | free msg/s | pinned msg/s | pinned / free |",
              "|---|---|---|---|"]
    for build in ("before", "after"):
        free = statistics.median(r["msg_per_s"] for r in records
                                 if r["build"] == build and not r["pinned"])
        pinned = statistics.median(r["msg_per_s"] for r in records
                                   if r["build"] == build and r["pinned"])
        lines.append(f"| {build} | {free:,.0f} | {pinned:,.0f} | {pinned / free:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.horizon", runs=1,
                        options={"--before-src": {"required": True},
                                 "--rows": {"type": int, "default": 500_000}})
    records = run_on_private_server(
        lambda: horizon(args.before_src, args.rows, args.runs, args.quiet_below))
    run.write(args.out, report(records, run, args.before_src))


if __name__ == "__main__":
    main()
