"""Where the tail of a latency run comes from: each row's latency beside the producers' commit
rate and the machine's CPU, 100 ms at a time, and the CPU each process took.

    python -m bench.latency_tail --rates 3000:16 --runs 3 --out bench/compare/latency-tail.md

One latency run per rate and round (bench/latency.py: producers in their own process, one
`relay run`, this process as the consumer). Meanwhile this process samples the machine's CPU
(/proc/stat, every 50 ms) and every process's CPU time (/proc/<pid>/stat, every 250 ms),
PostgreSQL's backends told apart by application_name (the relay's worker, listener and
wake-up sessions; the rest are the producers' or the server's own). The report gives, per run:
the percentiles; the share of the rows at or above the p99 that were committed in a 100 ms
window where the producers committed at 1.5 times their rate or more (they fell behind their
schedule and caught up) or in the window after one; the machine's CPU in those windows and in
the others; and the cores each kind of process used while the producers ran.
"""

from __future__ import annotations

import asyncio
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import uvloop

from bench.common import (
    OneOff,
    cpu_s,
    machine_cpu_s,
    one_off,
    one_off_env,
    percentile,
    wait_quiet,
)
from bench.compare import _revision
from bench.latency import latency_once

WINDOW_S = 0.1
BURST = 1.5  # a window whose commits reach this many times the rate is a catch-up burst


def _kind(pid: str, apps: dict[str, str]) -> str:
    """What process `pid` is, for the CPU table."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        comm = cmd = ""
    kinds = {"beam.smp": "rabbitmq"}
    if comm == "postgres":
        app = apps.get(pid, "")
        kind = ("postgres: producers' sessions and the server's own processes"
                if not app.startswith("outbox-relay ") else
                f"postgres: relay {app.split()[1]} sessions")
    elif "bench.producer" in cmd:
        kind = "producers (bench/producer.py)"
    elif int(pid) == os.getpid():
        kind = "consumer (this process)"
    elif "relay" in cmd and " run" in cmd:
        kind = "relay"
    else:
        kind = kinds.get(comm, "other")
    return kind


class Sampler:
    """Machine CPU every 50 ms; per-process CPU every 250 ms (first and last reading)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.busy: list[tuple[float, float]] = []  # (monotonic, share of both cores busy)
        self.first: dict[str, tuple[float, float]] = {}  # (monotonic, CPU-seconds so far)
        self.last: dict[str, tuple[float, float]] = {}
        self.apps: dict[str, str] = {}
        self.kinds: dict[str, str] = {}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            total0, idle0 = machine_cpu_s()
            n = 0
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
                total, idle = machine_cpu_s()
                if total > total0:
                    self.busy.append((time.monotonic(), 1 - (idle - idle0) / (total - total0)))
                total0, idle0 = total, idle
                n += 1
                if n % 5 == 0:
                    rows = await conn.fetch("SELECT pid::text, application_name "
                                            "FROM pg_stat_activity")
                    self.apps.update({r["pid"]: r["application_name"] or "" for r in rows})
                    self._processes()
        finally:
            await conn.close()

    def _processes(self) -> None:
        now = time.monotonic()
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            used = cpu_s(int(pid))
            if used == 0.0 and pid in self.last:
                continue  # gone since listdir (cpu_s reads 0.0 then)
            self.first.setdefault(pid, (now, used))
            self.last[pid] = (now, used)
            self.kinds[pid] = _kind(pid, self.apps)

    def stop(self) -> None:
        self._stop.set()

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Cores used per kind of process between the monotonic times start and end."""
        used: collections.Counter[str] = collections.Counter()
        for pid, (t1, used1) in self.last.items():
            t0, used0 = self.first[pid]
            if t1 < start or t0 > end:
                continue
            used[self.kinds[pid]] += used1 - used0
        return {k: round(v / max(end - start, 1e-6), 2) for k, v in used.most_common()}


def analyse(rate: int, log_dir: Path, sampler: Sampler) -> dict[str, Any]:
    """The run's rows by 100 ms window of commit time, beside the machine's CPU."""
    times = [float(line.split()[1]) for line in (log_dir / "ids.txt").read_text().splitlines()]
    start = min(times)
    rows = [tuple(map(float, line.split()))
            for line in (log_dir / "latencies.txt").read_text().splitlines()]
    rows = [(t, lat) for t, lat in rows if t >= 1.0]  # the warm-up second, as in latency.py
    p99 = percentile([lat for _, lat in rows], 99)
    per_window: collections.Counter[int] = collections.Counter(int(t / WINDOW_S) for t, _ in rows)
    burst = {w for w, n in per_window.items() if n >= BURST * rate * WINDOW_S}
    near_burst = burst | {w + 1 for w in burst}
    tail = [int(t / WINDOW_S) for t, lat in rows if lat >= p99]
    busy_in, busy_out = [], []
    for at, busy in sampler.busy:
        w = int((at - start) / WINDOW_S)
        if 10 <= w < max(per_window) + 1:
            (busy_in if w in near_burst else busy_out).append(busy)
    end = max(times)
    return {
        "windows": len(per_window), "burst_windows": len(burst),
        "burst_rate_max": max(per_window.values()) / WINDOW_S,
        "tail_rows": len(tail), "tail_in_or_after_burst": sum(w in near_burst for w in tail),
        "busy_near_burst": round(statistics.median(busy_in), 2) if busy_in else None,
        "busy_other": round(statistics.median(busy_out), 2) if busy_out else None,
        "cores": sampler.cores(start + 1.0, end),
    }


async def measure(rates: list[tuple[int, int]], runs: int, seconds: float,
                  quiet_below: float) -> list[dict[str, Any]]:
    """One sampled latency run per rate and round."""
    async with one_off_env("tail") as (env, records):
        for rate, connections in rates:
            for i in range(runs):
                await wait_quiet(quiet_below)
                log_dir = Path(tempfile.mkdtemp(prefix="bench-tail-"))
                sampler = Sampler(env.dsn)
                sampling = asyncio.ensure_future(sampler.run())
                try:
                    result = await latency_once(env, rate, seconds, connections=connections,
                                                log_dir=log_dir)
                finally:
                    sampler.stop()
                    await sampling
                records.add({"rate": rate, "connections": connections, "run": i + 1,
                             **result, **analyse(rate, log_dir, sampler)})
    return records


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = run.header(
        "Where a latency run's tail comes from", f"build: {_revision()}",
        "default relay settings and notify mode, the shared server; a burst window: 100 ms "
        f"in which the producers committed {BURST} times their rate or more")
    lines += ["| commits/s | conns | run | p50 / p99 / max ms | reached | burst windows "
              "(peak rate) | rows ≥ p99 in or right after a burst | CPU busy near bursts / "
              "elsewhere | load before |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(
            f"| {r['rate']} | {r['connections']} | {r['run']} | {r['p50_ms']} / {r['p99_ms']} / "
            f"{r['max_ms']} | {r['achieved_per_s']} | {r['burst_windows']} of {r['windows']} "
            f"({r['burst_rate_max']:,.0f}/s) | {r['tail_in_or_after_burst']} of "
            f"{r['tail_rows']} | {r['busy_near_burst']} / {r['busy_other']} | "
            f"{r['load_before']} |")
    lines += ["", "## Cores used while the producers ran (of 2)", ""]
    for r in records:
        cells = ", ".join(f"{k} {v}" for k, v in r["cores"].items() if v >= 0.01)
        lines.append(f"- {r['rate']}/s run {r['run']}: {cells}; all: "
                     f"{round(sum(r['cores'].values()), 2)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run, write the report."""
    args, run = one_off("bench.latency_tail", rates="3000:16", runs=3, seconds=10.0,
                        quiet_below=1.5)
    records = uvloop.run(measure(args.rates, args.runs, args.seconds, args.quiet_below))
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
