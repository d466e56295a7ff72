"""Producers in a process of their own: N connections commit 1-row transactions at a rate.

    python -m bench.producer --dsn DSN --exchange X --rate 1000 --connections 4 --seconds 10 \\
        --out ids.txt

Each connection runs an open-loop Poisson schedule (rate / N per second): a commit that falls
behind is sent at once, never skipped. After each commit returns, the row id and the
monotonic time (CLOCK_MONOTONIC: one clock for every process on the machine) go to --out, one
`id time` line per row; a JSON line with the achieved rate goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import ROUTING_KEY, BenchEnv

INSERT = (
    "INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, $2, $3::jsonb) "
    "RETURNING id::text"
)
BODY = (
    '{"order_id": 123456, "customer": "customer-12", "sku": "SKU-012345", "qty": 3, '
    '"amount_cents": 45678, "currency": "EUR", "note": "' + "x" * 64 + '", '
    '"created": "2026-01-01T00:00:00Z"}'
)


async def produce(dsn: str, exchange: str, rate: float, connections: int,
                  seconds: float, *, routing_key: str = ROUTING_KEY,
                  ) -> tuple[list[tuple[str, float]], float]:
    """Commit at `rate` per second over `connections` for `seconds`; (id, commit time) pairs."""
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    out: list[tuple[str, float]] = []
    per_conn = rate / connections
    start = time.monotonic() + 0.05
    end = start + seconds

    async def one(conn: asyncpg.Connection, seed: int) -> None:
        rnd = random.Random(seed)
        due = start + rnd.expovariate(per_conn)
        while due < end:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            row_id = await conn.fetchval(INSERT, exchange, routing_key, BODY)
            out.append((row_id, time.monotonic()))
            due += rnd.expovariate(per_conn)

    try:
        await asyncio.gather(*(one(c, i) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    last = max((t for _, t in out), default=start + seconds)
    return out, max(last - start, seconds)


@dataclass
class ProducerProcess:
    """This module in a process of its own, as a scenario starts it: `rate` commits a second
    for `seconds` on `connections` to `env`'s exchange; each row's id and commit time in `out`."""

    env: BenchEnv
    rate: int
    seconds: float
    out: Path
    connections: int = 1
    routing_key: str = ROUTING_KEY
    proc: asyncio.subprocess.Process | None = None
    report: dict[str, Any] | None = None  # its JSON line: commits, achieved_per_s

    async def start(self) -> None:
        """Start producing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.producer", "--dsn", self.env.dsn,
            "--exchange", self.env.exchange, "--rate", str(self.rate),
            "--connections", str(self.connections), "--seconds", str(self.seconds),
            "--routing-key", self.routing_key, "--out", str(self.out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def committed(self) -> dict[str, float]:
        """Wait for the producer to end; each row's commit time (CLOCK_MONOTONIC), by id."""
        assert self.proc is not None
        stdout, stderr = await self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"producer failed: {stderr.decode()[-2000:]}")
        self.report = json.loads(stdout.decode().strip().splitlines()[-1])
        pairs = (line.split() for line in self.out.read_text().splitlines())
        return {row_id: float(t) for row_id, t in pairs}


def main(argv: list[str] | None = None) -> int:
    """Parse flags, produce, write the ids and times."""
    parser = argparse.ArgumentParser(prog="python -m bench.producer", description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--rate", type=float, required=True, help="commits per second")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--routing-key", default=ROUTING_KEY)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    rows, elapsed = runner(produce(args.dsn, args.exchange, args.rate, args.connections,
                                   args.seconds, routing_key=args.routing_key))
    args.out.write_text("".join(f"{i} {t!r}\n" for i, t in rows))
    print(json.dumps({"commits": len(rows), "achieved_per_s": round(len(rows) / elapsed, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
