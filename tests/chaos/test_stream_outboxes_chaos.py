"""No row lost to the broker's deduplication, under SIGKILL: two outboxes with the default table
name (two databases cloned from one template) write to one stream through a relay each, the
relays killed about every half second and restarted; then one database's ids given are set
back to none, as a restore from before them would leave them, and more rows come through
relays still being killed. Read from offset `first`, the stream holds every row of both
databases: none dropped as a duplicate of another outbox's or of the time before the restore
(duplicates of rows whose fate a restore hid are allowed, and counted)."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.chaos.harness import Relays, relays
from tests.helpers import Env, count_rows, pg_execute, pg_fetch
from tests.kit.stream import a_stream, insert_stream_rows, read_stream

pytestmark = pytest.mark.chaos

FIRST = 10_000
AFTER_RESTORE = 5_000
DEADLINE_S = 240.0
# Kills per phase: the test is sized by faults, not by wall time. Killing on a clock until the
# tables were empty made a loaded machine slower still (a relay killed before it had started
# sends nothing): 67 kills and 137 s in one CI run, against 12 s on a quiet machine.
MAX_KILLS = 15


# And at least this many: a table drained before that (a quiet, fast machine drains 15,000
# rows in a couple of seconds) gets REFILL rows more in each database, and the kills go on.
MIN_KILLS = 3
REFILL = 2_000
T = TypeVar("T")


async def _drain_while_killing(groups: list[Relays], dsns: list[str], rng: random.Random,
                               what: str, *, stream: str, ids: list[str]) -> int:
    """Run one relay per database, kill one of them about every half second (in turn) and start it
    again, MAX_KILLS times or until every stream table is empty, and at least MIN_KILLS times
    (rows added to `ids` as needed); then let the relays drain what is left; how many kills."""
    procs = [group.start() for group in groups]
    kills = 0
    started = time.monotonic()
    next_kill = started + 1.0
    slow: list[str] = []  # the test's own steps that took long: said if the deadline passes
    while True:
        left = [await _timed(slow, f"count {i}", count_rows(dsn, "queue_message_stream"))
                for i, dsn in enumerate(dsns)]
        drained = not any(left)
        if drained and kills >= MIN_KILLS:
            break
        now = time.monotonic()
        if now - started >= DEADLINE_S:
            raise AssertionError(
                f"{what}: after {DEADLINE_S:.0f} s, rows still in the stream tables: {left}; "
                f"{kills} kills; slow steps of the test: {slow or 'none'}; the databases' "
                f"busy sessions: {await _busy(dsns)}")
        if drained:
            # Rows flow again, and a relay is killed at once: waiting for the next kill's time
            # let a fast machine drain each refill before it, and refill again for ever.
            for i, dsn in enumerate(dsns):
                ids += await _timed(slow, f"refill {i}", insert_stream_rows(dsn, stream, REFILL))
        if (drained or now >= next_kill) and kills < MAX_KILLS:
            victim = kills % len(procs)
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].kill()  # reap it
            procs[victim] = groups[victim].start()
            kills += 1
            next_kill = now + rng.uniform(0.3, 0.6)
        await asyncio.sleep(0.2)
    for proc in procs:
        proc.kill()
    return kills


async def _timed(slow: list[str], what: str, step: Awaitable[T]) -> T:
    """`step`'s result; noted in `slow` when it took over 5 s."""
    began = time.monotonic()
    try:
        return await step
    finally:
        if (took := time.monotonic() - began) > 5.0:
            slow.append(f"{what} {took:.1f} s")


async def _busy(dsns: list[str]) -> list[str]:
    """The sessions of these databases that are not idle: what they wait for and run."""
    names = [dsn.rsplit("/", 1)[1] for dsn in dsns]
    rows = await pg_fetch(dsns[0], "SELECT datname, pid, state, wait_event_type, wait_event, "
                          "round(extract(epoch FROM now() - xact_start)) AS xact_s, "
                          "left(query, 80) AS query FROM pg_stat_activity "
                          "WHERE datname = ANY($1) AND state <> 'idle' "
                          "AND pid <> pg_backend_pid()", names)
    return [str(dict(r)) for r in rows]


@pytest.mark.timing
async def test_stream_outboxes_chaos__two_outboxes_and_a_restore_relays_killed_lose_no_row(
    env: Env, other_db: str, tmp_path: Path
) -> None:
    rng = random.Random(57)
    dsns = [env.pg_dsn, other_db]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with a_stream(f"relay-test-{secrets.token_hex(5)}") as stream:
        ids = []
        for dsn in dsns:
            ids += await insert_stream_rows(dsn, stream, FIRST)
        with relays(env, tmp_path / "a", streams="true", stream_lease_s=2) as a, \
                relays(env, tmp_path / "b", streams="true", stream_lease_s=2,
                       pg_dsn=other_db) as b:
            kills = await _drain_while_killing([a, b], dsns, rng, "two outboxes", stream=stream,
                                                ids=ids)
            await pg_execute(env.pg_dsn, "UPDATE queue_message_stream_seq SET last_id = 0")
            for dsn in dsns:
                ids += await insert_stream_rows(dsn, stream, AFTER_RESTORE)
            kills += await _drain_while_killing([a, b], dsns, rng, "after the restore",
                                                stream=stream, ids=ids)
            sent_again = sum(int(e.get("rows_sent_again", 0))
                             for e in a.events("stream_mark_ahead_of_database")
                             + b.events("stream_mark_ahead_of_database"))
        got = await read_stream(stream, at_least=len(ids), timeout_s=120, quiet_s=2.0)
    counts = Counter(m["id"] for m in got)
    missing = set(ids) - set(counts)
    assert not missing, f"{len(missing)} of {len(ids)} rows never reached the stream"
    twice = sum(n - 1 for n in counts.values() if n > 1)
    print(f"[chaos] two outboxes, one stream, a restore: {len(ids)} rows, {kills} relay kills, "
          f"{twice} duplicates in the stream, {sent_again} rows sent again after a mark ahead "
          "of the database")
    assert twice <= sent_again, "a duplicate only where the relay said it sent a row again"
    assert kills >= 2 * MIN_KILLS, "the relays were killed while rows flowed"
