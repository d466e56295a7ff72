"""A row producer in a process of its own, so that nothing a test does (a blocking call, a
frozen relay, a fault) pauses it.

It inserts chunks of rows with client-side ids at a steady rate, and after each commit appends
the chunk's ids to a file: the file is the exact set of rows that exist. SIGTERM ends it after
the chunk in progress, so that file and table agree.

    python -m tests.chaos.producer DSN EXCHANGE ROUTING_KEY IDS_FILE --rate 3000 --chunk 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
import uuid
from pathlib import Path

import asyncpg

INSERT = (
    "INSERT INTO queue_message (id, exchange, routing_key, content) "
    "SELECT i, $1, $2, jsonb_build_object('id', i::text) FROM unnest($3::uuid[]) AS i"
)
REPO = Path(__file__).resolve().parents[2]


async def _produce(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    conn = await asyncpg.connect(args.dsn)
    try:
        start, sent = time.monotonic(), 0
        while not stop.is_set() and (args.total <= 0 or sent < args.total):
            ids = [str(uuid.uuid4()) for _ in range(args.chunk)]
            await conn.execute(INSERT, args.exchange, args.routing_key, ids)
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


class ProducerProcess:
    """The producer as a child process of the test; `stop()` returns the ids it committed."""

    def __init__(self, dsn: str, exchange: str, routing_key: str, ids_file: Path, *,
                 rate: float, chunk: int = 100) -> None:
        self.ids_file = ids_file
        self._argv = [sys.executable, "-m", "tests.chaos.producer", dsn, exchange, routing_key,
                      str(ids_file), "--rate", str(rate), "--chunk", str(chunk)]
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> ProducerProcess:
        """Start producing."""
        self.ids_file.touch()
        self._proc = await asyncio.create_subprocess_exec(*self._argv, cwd=REPO)
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
