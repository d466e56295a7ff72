"""Effectively once at the broker: rows for a RabbitMQ stream through two relays killed with
SIGKILL about every second (once rows moved since the last kill) and restarted. A relay killed
after the broker stored a batch and before it deleted the rows leaves them with their
publishing ids; whoever sends them next sends the same ids and the broker drops them. Read from
offset `first`, the stream holds every row exactly once. The run is sized by faults, not rows:
it starts with 30,000 rows and goes on (20,000 rows more at a time) until at least five kills
were made and one landed in that window, so that it always tests the duplicates it is about."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.harness import relays
from tests.helpers import Env, RelayProcess, count_rows, pg_fetch
from tests.kit.stream import a_stream, read_stream

ROWS = 30_000
MIN_KILLS = 5
# A guard against a hang, not a speed: 5x what a CI run with another fault test beside it took
# (99 s).
DEADLINE_S = 500.0
MORE = 20_000
STREAM_TABLE = "queue_message_stream"

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(int(DEADLINE_S) + 150)]


async def _insert(env: Env, stream: str, n: int) -> list[str]:
    return [r["id"] for r in await pg_fetch(
        env.pg_dsn, "INSERT INTO queue_message_stream (stream, content) "
        "SELECT $1, jsonb_build_object('n', g, 'pad', repeat('x', 120)) "
        "FROM generate_series(1, $2) AS g RETURNING id::text", stream, n)]


@pytest.mark.timing
async def test_stream_chaos__relays_killed_every_second_every_row_once_in_the_stream(
    env: Env, tmp_path: Path
) -> None:
    async with a_stream(f"relay-test-{secrets.token_hex(5)}") as stream:
        ids = await _insert(env, stream, ROWS)
        rng = random.Random(41)
        kills = 0
        with relays(env, tmp_path, streams="true", stream_lease_s=2) as group:
            replicas: list[RelayProcess] = [group.start(), group.start()]
            started = time.monotonic()
            next_kill = started + 1.0
            # A kill is due about a second after the last one and only once rows moved since:
            # on a loaded machine a relay can take longer than a second to start, and kills
            # that land before any relay works would prove nothing (and never end).
            left_at_kill: int | None = None
            while True:
                left = await count_rows(env.pg_dsn, STREAM_TABLE)
                settled = sum(e.get("rows", 0)
                              for e in group.events("stream_rows_stored_before"))
                if left == 0 and settled and kills >= MIN_KILLS:
                    break
                if left == 0:
                    # No kill landed between the broker's store and the relay's delete yet, or
                    # too few kills were made: the run would prove little about duplicates.
                    # More rows, more kills.
                    ids += await _insert(env, stream, MORE)
                    # The next kill once these rows move: a kill at once would land on relays
                    # still waking up, never between a store and a delete (a quiet machine
                    # drained 1,960,000 rows that way, 10,000 at a time, in 500 s).
                    left = left_at_kill = MORE
                now = time.monotonic()
                assert now - started < DEADLINE_S, (
                    f"after {DEADLINE_S:.0f} s, {left} of {len(ids)} rows still in the stream "
                    f"table, {settled} settled by a takeover")
                if now >= next_kill and (left_at_kill is None or left < left_at_kill):
                    left_at_kill = left
                    victim = kills % 2
                    os.kill(replicas[victim].pid, signal.SIGKILL)
                    replicas[victim].kill()  # reap it
                    replicas[victim] = group.start()
                    kills += 1
                    next_kill = now + rng.uniform(0.7, 1.3)
                await asyncio.sleep(0.2)
            elapsed = time.monotonic() - started
        got = await read_stream(stream, at_least=len(ids), timeout_s=120, quiet_s=2.0)
    counts = Counter(m["id"] for m in got)
    twice = [i for i, n in counts.items() if n > 1]
    assert twice == [], f"{len(twice)} rows written more than once, e.g. {twice[:5]}"
    assert set(counts) == set(ids), f"missing: {len(set(ids) - set(counts))}"
    assert len(got) == len(ids)
    print(f"[chaos] stream: {len(ids)} rows in {elapsed:.0f} s, {kills} relay kills, "
          f"{settled} rows found stored by a takeover (sent by a relay that died before "
          "deleting them)")
    assert kills >= MIN_KILLS, "the relays were killed while rows flowed"
