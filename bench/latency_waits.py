"""Where the sessions wait during a latency run: pg_stat_activity sampled every few ms while
producers commit at a rate and one relay follows them (bench/latency.py).

    python -m bench.latency_waits --rates 1000:4,3000:16 --out bench/compare/latency-waits.md

Each sample reads every session of the run's database: who it is (the relay's worker, wake-up
and listener sessions by their application_name, the producers' sessions by elimination),
its state and its wait event ("running" when active and not waiting). The report gives, per
rate, each (who, state, wait) pair's share of the samples of that kind of session, beside
the run's latency; on the shared server (the fresh database of each run).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import asyncpg
import uvloop

from bench.common import NAMES, OneOff, create_env, drop_env, one_off, wait_quiet
from bench.compare import _revision
from bench.latency import latency_once

SAMPLE = """
SELECT application_name, state, wait_event_type, wait_event
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def _who(application_name: str) -> str:
    if application_name.startswith("outbox-relay "):
        return "relay " + application_name.split()[1]
    return application_name or "producer"


async def _sample(dsn: str, stop: asyncio.Event, every_s: float) -> collections.Counter[Any]:
    conn = await asyncpg.connect(dsn)
    seen: collections.Counter[Any] = collections.Counter()
    try:
        while not stop.is_set():
            for r in await conn.fetch(SAMPLE):
                state = r["state"] or "-"
                wait = (f"{r['wait_event_type']}:{r['wait_event']}" if r["wait_event_type"]
                        else ("running" if state == "active" else "-"))
                seen[(_who(r["application_name"] or ""), state, wait)] += 1
            await asyncio.sleep(every_s)
    finally:
        await conn.close()
    return seen


class _Count:
    """A LISTEN callback that counts notifications."""

    def __init__(self, into: collections.Counter[str]) -> None:
        self.into = into

    def __call__(self, *_: object) -> None:
        self.into["n"] += 1


async def measure(rates: list[tuple[int, int]], seconds: float,
                  quiet_below: float) -> list[dict[str, Any]]:
    """One sampled latency run per rate."""
    out = []
    for rate, connections in rates:
        env = await create_env("waits")
        try:
            await wait_quiet(quiet_below)
            stop = asyncio.Event()
            listen = await asyncpg.connect(env.dsn)
            notifies = collections.Counter[str]()
            await listen.add_listener(NAMES.channel, _Count(notifies))
            sampler = asyncio.ensure_future(_sample(env.dsn, stop, 0.005))
            result = await latency_once(env, rate, seconds, connections=connections)
            stop.set()
            seen = await sampler
            await listen.close()
        finally:
            await drop_env(env)
        out.append({"rate": rate, "connections": connections, "latency": result,
                     "samples": seen, "notifies": notifies["n"]})
        print(rate, {k: result[k] for k in ("p50_ms", "p99_ms", "achieved_per_s")}, flush=True)
    return out


def report(runs: list[dict[str, Any]], this: OneOff) -> str:
    """The Markdown results file."""
    lines = this.header(
        "Where the sessions wait during a latency run", f"build: {_revision()}",
        "pg_stat_activity of the run's database sampled every 5 ms (the sampler's own "
        "session left out); shared server; default relay settings and notify mode")
    for run in runs:
        lat = run["latency"]
        lines += [f"## {run['rate']:,} commits/s from {run['connections']} connections", "",
                  f"p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, p99 {lat['p99_ms']} ms, "
                  f"max {lat['max_ms']} ms; producers reached {lat['achieved_per_s']}/s; "
                  f"load before {lat['load_before']}; NOTIFYs received during the run: "
                  f"{run['notifies']:,} (for {lat['messages']:,} messages)", "",
                  "| session | state | wait | share of that session kind's samples |",
                  "|---|---|---|---|"]
        samples: collections.Counter[Any] = run["samples"]
        totals: collections.Counter[str] = collections.Counter()
        for (who, _, _), n in samples.items():
            totals[who] += n
        for (who, state, wait), n in sorted(samples.items(),
                                            key=lambda kv: (kv[0][0], -kv[1])):
            share = n / totals[who]
            if share >= 0.005:
                lines.append(f"| {who} | {state} | {wait} | {share:.1%} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run, write the report."""
    args, run = one_off("bench.latency_waits", rates="1000:4,3000:16", seconds=10.0)
    runs = uvloop.run(measure(args.rates, args.seconds, args.quiet_below))
    run.write(args.out, report(runs, run))


if __name__ == "__main__":
    main()
