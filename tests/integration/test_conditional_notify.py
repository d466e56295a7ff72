"""Conditional notify (docs/notify.md): producers notify only while a relay sleeps, and no
row waits for the periodic sweep. Real PostgreSQL, real RabbitMQ, real `relay run` processes.

The relays here poll every 5 minutes, so a lost wake-up shows as a delay of minutes; the
tests check a minute end to end (BOUND_S: far above a wake-up on a loaded machine; the stated
bound, docs/notify.md, is on when the relay's sweep starts, and the rest is publish, broker,
consumer and this shared machine's scheduling noise, reported in the printed distribution).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay.pg.migrate import migrate
from relay.pg.queries import WAKEUP_LOCK_CLASS, Queries, TableNames
from relay.settings import NotifyMode
from tests.helpers import (
    RELAY_BIN,
    Env,
    RelayProcess,
    count_rows,
    pg_fetchval,
    pg_session,
    wait_until,
)
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

NAMES = TableNames(None, "queue_message", "queue_message_notify")
Q = Queries(NAMES)
POLL_S = 300  # a missed wake-up would wait this long
# A wake-up takes milliseconds; this bound is far above that on a loaded machine (the slowest
# seen: 11.5 s, a new relay's first wake-up beside the Spark and fault tests) and far below
# POLL_S, which only a missed wake-up waits.
BOUND_S = 60.0
# A burst's rows, each sent within 30 ms: shorter, as the mutation check (tests/mutations) waits
# it out on every run.
BURST_TIMEOUT_S = 20.0


class NotifyCounter:
    """A second LISTEN connection that counts notifications on the outbox channel."""

    def __init__(self) -> None:
        self.count = 0
        self._conn: asyncpg.Connection | None = None

    async def start(self, dsn: str) -> NotifyCounter:
        self._conn = await asyncpg.connect(dsn)
        await self._conn.add_listener(NAMES.channel, self._on_notify)
        return self

    def _on_notify(self, *_: object) -> None:
        self.count += 1

    async def settle(self) -> int:
        """The count once every notification sent so far has arrived (a round trip on the
        listening connection delivers what was queued before it)."""
        assert self._conn is not None
        await self._conn.execute(f"NOTIFY {NAMES.channel}_settle")
        await asyncio.sleep(0.05)
        return self.count

    async def stop(self) -> None:
        assert self._conn is not None
        await self._conn.close()


@pytest.fixture
async def cond_env(env: Env) -> Env:
    """The test's database switched to conditional mode (the template has `always`)."""
    async with pg_session(env.pg_dsn) as conn:
        await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
    return env


@pytest.fixture
async def timed(cond_env: Env) -> AsyncIterator[Consumer]:
    c = await Consumer(cond_env.amqp_url, cond_env.queue).start()  # records arrival times
    yield c
    await c.stop()


@pytest.fixture
async def notifications(cond_env: Env) -> AsyncIterator[NotifyCounter]:
    c = await NotifyCounter().start(cond_env.pg_dsn)
    yield c
    await c.stop()


async def sleepers(dsn: str) -> int:
    """Relays asleep on the table (holding the wake-up lock)."""
    return int(await pg_fetchval(dsn, Q["wakeup_sleepers"]))


async def wait_sleepers(dsn: str, n: int, timeout_s: float = 30.0) -> float:
    """Wait until exactly n relays sleep; return the seconds it took."""
    started = time.monotonic()

    async def check() -> bool:
        return await sleepers(dsn) == n

    await wait_until(check, timeout_s=timeout_s, what=f"{n} relays asleep")
    return time.monotonic() - started


# Just before COMMIT: did this transaction skip the NOTIFY (it holds the wake-up lock shared),
# and is a relay waiting for it to end (it straddles the relay going to sleep)?
STRADDLE = """
SELECT bool_or(pid = pg_backend_pid() AND mode = 'ShareLock') AS skipped,
       bool_or(mode = 'ExclusiveLock' AND NOT granted) AS relay_waiting
FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::oid AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


async def produce_one(
    pool: asyncpg.Pool, env: Env, think_s: float = 0.0, straddlers: list[str] | None = None
) -> tuple[str, float]:
    """One producer transaction: insert, think, commit; return (id, time just before COMMIT).
    With `straddlers`, record the id when it skipped the NOTIFY while a relay waited for it."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        [row_id] = await insert_rows(conn, env.exchange, "rk", [{"t": think_s}])
        if think_s:
            await asyncio.sleep(think_s)
        if straddlers is not None:
            state = await conn.fetchrow(STRADDLE, WAKEUP_LOCK_CLASS)
            if state["skipped"] and state["relay_waiting"]:
                straddlers.append(str(row_id))
        committed = time.monotonic()
        await tx.commit()
    return str(row_id), committed


def distribution(latencies_s: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies_s)
    q = statistics.quantiles(ms, n=100)
    return (f"n={len(ms)} p50={q[49]:.1f}ms p90={q[89]:.1f}ms p99={q[98]:.1f}ms "
            f"max={ms[-1]:.1f}ms")


@pytest.mark.timing
async def test_conditional__race_straddling_sleep_delivers_every_row_within_bound(
    cond_env: Env, timed: Consumer, notifications: NotifyCounter, start_relay
) -> None:
    env = cond_env
    start_relay(poll_interval_s=POLL_S)
    await wait_sleepers(env.pg_dsn, 1)
    pool = await asyncpg.create_pool(env.pg_dsn, min_size=45, max_size=45)
    commits: dict[str, float] = {}
    straddlers: list[str] = []
    rng = random.Random(9)

    async def tx(start_in_s: float) -> None:
        await asyncio.sleep(start_in_s)
        row_id, committed = await produce_one(pool, env, rng.uniform(0, 0.05), straddlers)
        commits[row_id] = committed

    # Bursts of 5-45 transactions starting within 30 ms: the first NOTIFY wakes the relay,
    # later ones insert while it is awake (and skip the NOTIFY), and the relay goes to sleep
    # while their slower commits (up to 50 ms) are still pending. The next burst starts only
    # once this one is delivered (then after 0-30 ms), so nothing but the relay's own
    # wake-up rule can deliver a row: a missed one would wait for the periodic sweep.
    done = 0
    while done < 2000:
        size = min(rng.randint(5, 45), 2000 - done)
        before = set(commits)
        await asyncio.gather(*(tx(rng.uniform(0, 0.03)) for _ in range(size)))
        burst = [i for i in commits if i not in before]
        await timed.wait_all(burst, timeout_s=BURST_TIMEOUT_S)
        done += size
        await asyncio.sleep(rng.uniform(0, 0.03))
    await pool.close()
    await timed.wait_all(list(commits), timeout_s=60)
    latencies = [timed.arrivals[i] - t for i, t in commits.items()]
    sent = await notifications.settle()
    straddled = [timed.arrivals[i] - commits[i] for i in straddlers]
    print(f"\nrace: {distribution(latencies)}; notifications={sent} for 2000 transactions; "
          f"{len(straddlers)} skipped the NOTIFY while the relay waited to sleep: "
          f"{distribution(straddled) if len(straddled) > 1 else straddled}")
    assert len(commits) == 2000
    assert max(latencies) < BOUND_S, distribution(latencies)
    # The race was exercised: the relay slept (producers notified), and many transactions
    # skipped the NOTIFY and committed while the relay was on its way to sleep.
    assert 0 < sent < 2000
    assert len(straddlers) >= 10


async def test_conditional__no_notifications_while_relay_drains_backlog(
    cond_env: Env, notifications: NotifyCounter, start_relay
) -> None:
    env = cond_env
    async with pg_session(env.pg_dsn) as conn:
        await insert_rows(conn, env.exchange, "rk", ({"n": g} for g in range(1, 10_001)))
        backlog_sent = await notifications.settle()  # no relay sleeps: the bulk insert is silent
        start_relay(poll_interval_s=POLL_S, batch_size=100, concurrency=1)
        await wait_until(lambda: _below(env.pg_dsn, 9_500), what="relay draining")
        pool = await asyncpg.create_pool(env.pg_dsn, min_size=8, max_size=8)
        await asyncio.gather(*(produce_one(pool, env) for _ in range(400)))
        left = await count_rows(env.pg_dsn)
        during = await notifications.settle() - backlog_sent
        print(f"\nbacklog: {during} notifications for 400 producer commits; {left} rows left")
        assert left > 400, "the relay finished the backlog before the producers did"
        assert during == 0
        # Control: once the relay sleeps, the same producer transaction does notify.
        await wait_sleepers(env.pg_dsn, 1, timeout_s=60)
        await produce_one(pool, env)
        await pool.close()
        await wait_until(lambda: _notified_beyond(notifications, backlog_sent), what="a NOTIFY")


async def _below(dsn: str, n: int) -> bool:
    return await count_rows(dsn) < n


async def _notified_beyond(counter: NotifyCounter, n: int) -> bool:
    return await counter.settle() > n


@pytest.mark.parametrize("state", ["asleep", "awake"])
@pytest.mark.timing
async def test_conditional__relay_killed_while_asleep_or_awake_then_new_relay_serves_producers(
    cond_env: Env, timed: Consumer, notifications: NotifyCounter, start_relay, state: str
) -> None:
    env = cond_env
    old = start_relay(poll_interval_s=POLL_S, batch_size=100, concurrency=1)
    if state == "asleep":
        await wait_sleepers(env.pg_dsn, 1)
    else:
        async with pg_session(env.pg_dsn) as conn:
            await insert_rows(conn, env.exchange, "rk", ({"n": g} for g in range(1, 10_001)))
        await wait_until(lambda: _below(env.pg_dsn, 9_500), what="relay draining")
        assert await sleepers(env.pg_dsn) == 0
    old.kill()
    # The dead relay's state goes with its session: the lock (if any) is released as soon as
    # PostgreSQL sees the socket close.
    released_s = await wait_sleepers(env.pg_dsn, 0, timeout_s=10)
    pool = await asyncpg.create_pool(env.pg_dsn, min_size=4, max_size=4)
    orphan, _ = await produce_one(pool, env)  # committed with no relay running
    new = start_relay(poll_interval_s=POLL_S)
    await timed.wait_all([orphan], timeout_s=60)
    await wait_sleepers(env.pg_dsn, 1, timeout_s=60)
    before = await notifications.settle()
    latencies = []
    for _ in range(20):
        row_id, committed = await produce_one(pool, env)
        await timed.wait_all([row_id], timeout_s=BOUND_S + 10)
        latencies.append(timed.arrivals[row_id] - committed)
        await wait_sleepers(env.pg_dsn, 1)
    await pool.close()
    sent = await notifications.settle() - before
    print(f"\nkilled {state}: lock released after {released_s * 1000:.0f} ms; "
          f"new relay: {distribution(latencies)}; notifications={sent}")
    assert released_s < 5
    assert sent == 20  # the relay was asleep before each of the 20 commits: one NOTIFY each
    assert max(latencies) < BOUND_S
    assert new.alive()


def run_migrate(env: Env, mode: str) -> None:
    """`relay migrate` with RELAY_NOTIFY=mode, as an operator would run it."""
    out = subprocess.run(
        [RELAY_BIN, "migrate"], env=env.relay_env(notify=mode), capture_output=True,
        timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert f"notify trigger: {mode}" in out.stdout.decode()


@pytest.mark.timing
async def test_migrate__switches_notify_mode_on_live_table_with_running_relay(
    cond_env: Env, timed: Consumer, notifications: NotifyCounter, start_relay
) -> None:
    env = cond_env
    relay: RelayProcess = start_relay(poll_interval_s=5, poll_min_interval_s=0.05)
    await wait_sleepers(env.pg_dsn, 1)
    pool = await asyncpg.create_pool(env.pg_dsn, min_size=2, max_size=2)

    async def delivered_within(bound_s: float) -> float:
        row_id, committed = await produce_one(pool, env)
        await timed.wait_all([row_id], timeout_s=30)
        latency = timed.arrivals[row_id] - committed
        assert latency < bound_s, f"{latency:.3f}s"
        return latency

    results = {}
    for mode, sleeping in (("always", 0), ("off", 0), ("conditional", 1)):
        run_migrate(env, mode)
        await wait_sleepers(env.pg_dsn, sleeping)
        before = await notifications.settle()
        results[mode] = []
        for _ in range(3):
            await wait_sleepers(env.pg_dsn, sleeping)
            # off: found by the relay's poll (every 5 s here), not woken.
            results[mode].append(await delivered_within(BOUND_S))
        sent = await notifications.settle() - before
        # off: no trigger, no NOTIFY; always and conditional (relay asleep): one per commit.
        assert sent == (0 if mode == "off" else 3), (mode, sent)
    print("\nmode switch latencies (s):", {k: [round(x, 3) for x in v] for k, v in results.items()})
    assert relay.alive()
    await pool.close()

