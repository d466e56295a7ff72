"""The one row producer of the tests: `insert_rows` writes rows as an application would (one
INSERT, one transaction), `add_dead_letters` parks rows as the relay would, `produce` writes
chunks at a steady pace, and `ProducerProcess` does the same in a process of its own, so that
nothing a test does (a blocking call, a frozen relay, a fault) pauses it.

A hand-written INSERT stays in a test only where the statement itself is the subject (a
column's range, a trigger, the server's own refusal), with a comment saying so.

The producer process inserts chunks of rows with client-side ids at a steady rate, and after
each commit appends the chunk's ids to a file: the file is the exact set of rows that exist.
SIGTERM ends it after the chunk in progress, so that file and table agree.

    python -m tests.kit.producer DSN EXCHANGE ROUTING_KEY IDS_FILE --rate 3000 --chunk 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[2]


def fresh_ids(n: int) -> list[str]:
    """Client-side row ids, so a test knows every id it produced even across faults."""
    return [str(uuid.uuid4()) for _ in range(n)]


def insert_statement(table: str = "queue_message", *, ids: bool = False,
                     ordering_keys: bool = False, repeat: bool = False) -> str:
    """The INSERT of `insert_rows` (for tests that run it on a connection of their own): $1
    exchange, $2 routing key, $3 bodies (text[]), $4 options, $5 fairness key, $6 delay in
    seconds, then $7 ids (uuid[]), $8 ordering keys (text[]) and $9 repeat where asked for
    (numbered in that order among those present)."""
    columns = ["c"]
    arrays = ["$3::text[]"]
    if ids:
        columns.append("i")
        arrays.append("$7::uuid[]")
    if ordering_keys:
        columns.append("k")
        arrays.append(f"${8 if ids else 7}::text[]")
    repeat_arg = f", ${7 + ids + ordering_keys}::text" if repeat else ""
    return (
        f"INSERT INTO {table} (exchange, routing_key, content, options, fairness_key, "
        f"available_at{', id' if ids else ''}{', ordering_key' if ordering_keys else ''}"
        f"{', repeat' if repeat else ''}) "
        "SELECT $1, $2, c::jsonb, $4::jsonb, $5, now() + make_interval(secs => $6)"
        f"{', i' if ids else ''}{', k' if ordering_keys else ''}{repeat_arg} "
        f"FROM unnest({', '.join(arrays)}) WITH ORDINALITY AS t({', '.join(columns)}, n) "
        "ORDER BY n RETURNING id::text"
    )


async def insert_rows(
    dsn: str | asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
    exchange: str,
    routing_key: str,
    bodies: Iterable[Any],
    *,
    ids: Sequence[str] | None = None,
    ordering_keys: Sequence[str | None] | str | None = None,
    options: dict[str, Any] | None = None,
    fairness_key: str | None = None,
    delay_s: float = 0.0,
    repeat: str | None = None,
    table: str = "queue_message",
) -> list[str]:
    """Insert one row per body (JSON-encoded) in one statement, in order (their seq follows the
    bodies), the rest of the columns as given (one ordering key for all, or one per row);
    return the rows' ids in order.

    `dsn` may be an open connection: the rows then join its transaction, if any."""
    contents = [json.dumps(b) for b in bodies]
    keys = [ordering_keys] * len(contents) if isinstance(ordering_keys, str) else ordering_keys
    args: list[Any] = [exchange, routing_key, contents,
                       None if options is None else json.dumps(options), fairness_key,
                       delay_s]
    if ids is not None:
        args.append(list(ids))
    if keys is not None:
        args.append(list(keys))
    if repeat is not None:
        args.append(repeat)
    sql = insert_statement(table, ids=ids is not None, ordering_keys=keys is not None,
                           repeat=repeat is not None)
    if not isinstance(dsn, str):
        return [r[0] for r in await dsn.fetch(sql, *args)]
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def insert_with_ids(dsn: str, exchange: str, routing_key: str, ids: list[str], *,
                          pad: int = 0) -> None:
    """Rows with the given ids, each body {"id": id, "pad": "x" repeated pad times}."""
    await insert_rows(dsn, exchange, routing_key, ({"id": i, "pad": "x" * pad} for i in ids),
                      ids=ids)


async def produce(dsn: str, exchange: str, routing_key: str, total: int, *, chunk: int,
                  interval_s: float) -> list[str]:
    """Insert `total` rows in chunks at a steady pace; return their ids in order."""
    ids = fresh_ids(total)
    for start in range(0, total, chunk):
        await insert_with_ids(dsn, exchange, routing_key, ids[start:start + chunk])
        await asyncio.sleep(interval_s)
    return ids


async def add_dead_letters(dsn: str, n: int, *, exchange: str = "x", reason: str = "r",
                           age: str = "0 s", table: str = "queue_message_dead") -> None:
    """n dead letters as the relay parks them, dead for `age` (an interval, each a second
    apart), publishable to `exchange`."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"INSERT INTO {table} (id, seq, exchange, routing_key, content, created_at, "
            "available_at, attempts, reason, dead_at) "
            "SELECT gen_random_uuid(), g, $1, 'rk', '{}'::jsonb, now(), now(), 1, $2, "
            "now() - $3::text::interval - make_interval(secs => g) "
            "FROM generate_series(1, $4) AS g",
            exchange, reason, age, n)
    finally:
        await conn.close()


async def _produce(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    # SIGTERM is handled from here on (an empty file, once: no need for a thread).
    Path(args.ids_file + READY).touch()  # noqa: ASYNC240
    conn = await asyncpg.connect(args.dsn)
    try:
        start, sent = time.monotonic(), 0
        while not stop.is_set() and (args.total <= 0 or sent < args.total):
            ids = fresh_ids(args.chunk)
            await insert_rows(conn, args.exchange, args.routing_key, ({"id": i} for i in ids),
                              ids=ids)
            _append(Path(args.ids_file), ids)
            sent += len(ids)
            # A fixed schedule (no drift): chunk n is due at n * chunk / rate.
            delay = start + sent / args.rate - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
    finally:
        await conn.close()


def _append(path: Path, ids: list[str]) -> None:
    """Record committed ids (a small write; the producer has nothing else to do meanwhile)."""
    with path.open("a") as out:
        out.write("\n".join(ids) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and produce until SIGTERM (or --total rows)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dsn")
    parser.add_argument("exchange")
    parser.add_argument("routing_key")
    parser.add_argument("ids_file")
    parser.add_argument("--rate", type=float, default=2000.0, help="rows per second")
    parser.add_argument("--chunk", type=int, default=100, help="rows per INSERT")
    parser.add_argument("--total", type=int, default=0, help="stop after this many (0: never)")
    asyncio.run(_produce(parser.parse_args(argv)))


READY = ".ready"  # beside the ids file: the producer handles SIGTERM


class ProducerProcess:
    """The producer as a child process of the test; `stop()` returns the ids it committed."""

    def __init__(self, dsn: str, exchange: str, routing_key: str, ids_file: Path, *,
                 rate: float, chunk: int = 100) -> None:
        self.ids_file = ids_file
        self._argv = [sys.executable, "-m", "tests.kit.producer", dsn, exchange, routing_key,
                      str(ids_file), "--rate", str(rate), "--chunk", str(chunk)]
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout_s: float = 60.0) -> ProducerProcess:
        """Start producing; return once the producer handles SIGTERM. A stop() before that
        (a loaded machine starts Python slowly, and a short fault ends soon) killed it with the
        signal's default action (exit -15) and lost the ids it had written."""
        self.ids_file.touch()
        ready = Path(str(self.ids_file) + READY)
        ready.unlink(missing_ok=True)  # noqa: ASYNC240 - a small file, once
        self._proc = await asyncio.create_subprocess_exec(*self._argv, cwd=REPO)
        deadline = time.monotonic() + timeout_s
        while not ready.exists():  # noqa: ASYNC240 - a stat every 20 ms
            if self._proc.returncode is not None:
                raise RuntimeError(f"the producer exited at start (exit {self._proc.returncode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the producer did not handle SIGTERM after {timeout_s:g} s")
            await asyncio.sleep(0.02)
        return self

    def produced(self) -> int:
        """Rows committed so far."""
        with self.ids_file.open() as f:
            return sum(1 for _ in f)

    async def stop(self, timeout_s: float = 30.0) -> list[str]:
        """SIGTERM, wait for the chunk in progress, and return every id committed."""
        assert self._proc is not None
        if self._proc.returncode is None:
            self._proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self._proc.wait(), timeout=timeout_s)
        assert code == 0, f"the producer failed (exit {code})"
        return self.ids_file.read_text().split()

    def kill(self) -> None:
        """Teardown: kill it if still running."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()


if __name__ == "__main__":
    main()
