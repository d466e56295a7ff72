"""PostgreSQL failover: two relays (one with the multi-host URL, one with the keyword form) drain
a private primary; the primary is killed with -9 and its streaming standby promoted. Nothing is
lost, the relays settle batches on the new primary within seconds of the promotion, and their
duplicates never exceed the rows they held at the kill (read from the server while they were
frozen)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.chaos.harness import assert_exactly_delivered, relays, report
from tests.chaos.inflight import LockProbe, caught_holding_rows
from tests.ha.pgpair import PrimaryStandby
from tests.helpers import RELAY_BIN, Env, count_rows, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import fresh_ids, insert_with_ids

pytestmark = [pytest.mark.ha, pytest.mark.timeout(600)]

ROWS = int(os.environ.get("RELAY_TEST_HA_ROWS", "30000"))
LATE_ROWS = 100  # committed on the promoted standby
RECONNECT_MAX_S = 1.0
POLL_INTERVAL_S = 1.0
# After a promotion each relay finds the new primary at its next reconnect attempt (backoff
# capped at RECONNECT_MAX_S, one per session), then sweeps: a few of those steps, with room for
# a loaded CI machine.
RESUME_BOUND_S = 10 * (RECONNECT_MAX_S + POLL_INTERVAL_S)


@pytest.fixture
def pg_pair() -> Iterator[PrimaryStandby]:
    """A started primary and streaming standby, destroyed (processes and folders) after."""
    pair = PrimaryStandby()
    try:
        yield pair.start()
    finally:
        pair.destroy()


async def _replayed(primary_dsn: str, standby_dsn: str) -> bool:
    """The standby has replayed every WAL record the primary has inserted so far (the insert
    position: the relay's commits do not wait for their flush, relay/pg/connection.py)."""
    primary, standby = await asyncpg.connect(primary_dsn), await asyncpg.connect(standby_dsn)
    try:
        lsn = await primary.fetchval("SELECT pg_current_wal_insert_lsn()")
        return bool(await standby.fetchval(
            "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn))
    finally:
        await primary.close()
        await standby.close()


@pytest.mark.timing
async def test_pg_failover__primary_killed_standby_promoted_loses_nothing_and_resumes(
    pg_pair: PrimaryStandby, amqp_url: str, broker_names: tuple[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary_dsn, standby_dsn = pg_pair.primary.dsn, pg_pair.standby.dsn
    env = Env(pg_dsn=pg_pair.hosts_url(), amqp_url=amqp_url, exchange=broker_names[0],
              queue=broker_names[1])
    await asyncio.to_thread(subprocess.run, [RELAY_BIN, "migrate"], env=env.relay_env(),
                            check=True, capture_output=True, timeout=60)
    ids = fresh_ids(ROWS)
    late_ids = set(fresh_ids(LATE_ROWS))
    for start in range(0, ROWS, 10_000):
        await insert_with_ids(primary_dsn, env.exchange, env.routing_key, ids[start:start + 10_000])
    # Rows the primary had not yet shipped would die with it: that is the database's loss, not
    # the relay's. Every row is on the standby before the relays start.
    await wait_until(lambda: _replayed(primary_dsn, standby_dsn), timeout_s=60,
                     what="the standby to replay the backlog")
    consumer = await Consumer(env.amqp_url, env.queue, robust=True, manual_ack=True).start()
    try:
        with relays(env, tmp_path, reconnect_max_s=RECONNECT_MAX_S,
                    poll_interval_s=POLL_INTERVAL_S, batch_size=100, concurrency=2) as group:
            group.start()
            group.start(pg_dsn=pg_pair.hosts_keywords())
            await wait_until(lambda: consumer.distinct() > ROWS // 5, timeout_s=60,
                             what="flow before the failover")
            probe = LockProbe(primary_dsn)
            async with caught_holding_rows(group.procs, probe) as held:
                # The relays are frozen: nothing commits. Once the standby has replayed every
                # DELETE already committed, what the failover can send twice is exactly what
                # the relays hold now.
                await wait_until(lambda: _replayed(primary_dsn, standby_dsn), timeout_s=60,
                                 what="the standby to replay every committed DELETE")
                await probe.close()
                pg_pair.kill_primary()
            await asyncio.to_thread(pg_pair.promote)
            promoted_at, before = time.monotonic(), len(consumer.ids)
            # What proves the relays resumed: a batch settled (deleted) on the promoted standby,
            # its outbox below what it held at the promotion plus the rows committed on it
            # after. (Not the late rows' delivery: behind what is left of the backlog, that
            # measures the drain, 25 s on a loaded CI machine. The old primary's backlog may
            # also be gone before the relays are caught holding rows.)
            at_promotion = await count_rows(standby_dsn)
            await insert_with_ids(standby_dsn, env.exchange, env.routing_key, sorted(late_ids))
            await wait_until(lambda: _fewer_than(standby_dsn, at_promotion + LATE_ROWS),
                             timeout_s=60,
                             what="a relay's first batch settled on the promoted standby")
            resumed_s = time.monotonic() - promoted_at
            await wait_until(lambda: not late_ids.isdisjoint(consumer.ids), timeout_s=120,
                             what="a row committed on the promoted standby to be delivered")
            late_s = time.monotonic() - promoted_at
            ids += sorted(late_ids)
            await consumer.wait_all(ids, timeout_s=120, dsn=standby_dsn)
            await wait_until(lambda: _empty(standby_dsn), timeout_s=60, what="an empty outbox")
            outcome = report("postgres failover (kill -9 primary, promote standby)", ids,
                             consumer)
            with capsys.disabled():  # in the suite's output, passed or not
                print(f"\n[ha] postgres failover: lost={outcome.lost}, relay republished="
                      f"{outcome.republished} (bound: {held.rows} rows held at the kill, "
                      f"in flight: {held.in_flight}); {at_promotion} rows left at the promotion, "
                      f"the first batch settled on the new primary {resumed_s:.1f}s after it, "
                      f"a row committed there delivered {late_s:.1f}s after it; {before} "
                      f"receipts before it; rows={ROWS}+{LATE_ROWS}")
            assert (outcome.lost, outcome.unexpected) == (0, 0)
            assert_exactly_delivered(ids, consumer, outcome, held.rows)
            assert resumed_s < RESUME_BOUND_S
            assert all(p.alive() for p in group.procs)
            # Each relay's LISTEN session logged the outage once and the recovery once; its pool
            # at most once each (a pool that had no statement in flight may not notice at all).
            # The listener comes back on its own backoff, which the drain need not wait for:
            # its recovery is waited for before the counts (once it failed on "0 == 1").
            def listeners_back() -> bool:
                return all(any(e.get("event") == "connection_restored"
                               and e.get("connection") == "listener" for e in p.log_events())
                           for p in group.procs)

            await wait_until(listeners_back, timeout_s=60,
                             what="each relay's listener to log its recovery")
            for proc in group.procs:
                events = [(e["event"], e.get("connection")) for e in proc.log_events()]
                said = [e for e in proc.log_events()
                        if str(e.get("event", "")).startswith(("connection_", "drain_"))]
                assert events.count(("connection_lost", "listener")) == 1, said
                assert events.count(("connection_restored", "listener")) == 1, said
                assert events.count(("connection_lost", "database")) <= 1, said
                assert ("drain_failed", None) not in events, said
            codes = await asyncio.gather(*(asyncio.to_thread(p.terminate, 20)
                                           for p in group.procs))
            assert codes == [0, 0]
    finally:
        await consumer.stop()


async def _empty(dsn: str) -> bool:
    return await count_rows(dsn) == 0


async def _fewer_than(dsn: str, rows: int) -> bool:
    return await count_rows(dsn) < rows
