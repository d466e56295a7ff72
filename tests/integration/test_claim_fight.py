"""Claims that do not fight: a relay's claim does not walk the rows its other lanes hold, nor
those other relays hold (relay/pg/seqfloor.py, the fill's frontiers). Rows in flight are
locked until their batch commits, and each claim below them read and skipped every one: with
12 batches of 500 in flight a claim of 500 read 6,064 rows. While a backlog drains, the fill
starts above the highest row the relay's fill took and above the table's shared frontier
(the highest row any relay's full claim took); a short claim or rows given back set the shared
frontier back, so that the next fills start at their floors."""

from __future__ import annotations

import contextlib

from relay.app import database_config
from relay.pg.seqfloor import FROM_START, SeqFloor
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.helpers import pg_fetchval
from tests.kit.producer import insert_rows

LANES = 12
RELAYS = 4
LIMIT = 500
BACKLOG = 20_000
# Rows a claim of 500 may read: its batch, the fair round's look at the transaction's first
# rows (64), room to spare; the claims this replaced read every row the other lanes held.
READ_BOUND = 2 * LIMIT
FRONTIER = "SELECT last_value FROM queue_message_fill_frontier"
READ = ("SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) "
        "FROM pg_stat_xact_user_tables WHERE relid = 'queue_message'::regclass")


async def test_claims__a_lane_does_not_walk_the_rows_the_relays_other_lanes_hold(db: str) -> None:
    await insert_rows(db, "x", "rk", ({"g": g} for g in range(BACKLOG)))
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db)), size=LANES)
    # No rescan from the start during the test (one every second otherwise, by design).
    outbox.floor = SeqFloor(rescan_every_s=3600)
    read: list[int] = []
    claimed: set[str] = set()
    try:
        async with contextlib.AsyncExitStack() as lanes:
            for _ in range(LANES):
                batch = await lanes.enter_async_context(outbox.claim(LIMIT))
                assert len(batch.rows) == LIMIT
                claimed |= {r.id for r in batch.rows}
                # this transaction's own reads: the claim's
                read.append(int(await batch._conn.fetchval(READ)))
    finally:
        await outbox.close()
    print(f"\n[claims] rows read per claim with 0..{LANES - 1} batches held: {read}")
    assert len(claimed) == LANES * LIMIT, "a row claimed twice"
    assert max(read[1:]) <= READ_BOUND, (
        f"a claim read {max(read[1:]):,} rows with up to {(LANES - 1) * LIMIT:,} held: {read}")


async def _relay(db: str) -> Outbox:
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db)), size=LANES // RELAYS)
    outbox.floor = SeqFloor(rescan_every_s=3600)  # only the first claim rescans
    return outbox


async def test_claims__a_relay_does_not_walk_the_rows_the_other_relays_hold(db: str) -> None:
    """4 relays of 3 lanes claim in turn, each batch held: past each relay's first claim (a
    rescan from the start, by design), no claim reads more than its batch and the fair
    round's look, however many rows the others hold (up to 5,500)."""
    await insert_rows(db, "x", "rk", ({"g": g} for g in range(BACKLOG)))
    relays = [await _relay(db) for _ in range(RELAYS)]
    read: list[int] = []
    claimed: set[str] = set()
    try:
        async with contextlib.AsyncExitStack() as held:
            for _ in range(LANES // RELAYS):
                for outbox in relays:
                    batch = await held.enter_async_context(outbox.claim(LIMIT))
                    assert len(batch.rows) == LIMIT
                    claimed |= {r.id for r in batch.rows}
                    read.append(int(await batch._conn.fetchval(READ)))
            assert await pg_fetchval(db, FRONTIER) > 0, "full claims moved the shared frontier"
    finally:
        for outbox in relays:
            await outbox.close()
    print(f"\n[claims] rows read per claim, {RELAYS} relays in turn: {read}")
    assert len(claimed) == LANES * LIMIT, "a row claimed twice"
    after_first = read[RELAYS:]
    assert max(after_first) <= READ_BOUND, (
        f"a claim read {max(after_first):,} rows with up to {(LANES - 1) * LIMIT:,} held by "
        f"{RELAYS} relays: {read}")


async def test_claims__rows_given_back_or_a_short_claim_set_the_shared_frontier_back(
    db: str,
) -> None:
    await insert_rows(db, "x", "rk", ({"g": g} for g in range(3 * LIMIT)))
    first, second = await _relay(db), await _relay(db)
    try:
        async with first.claim(LIMIT) as batch:
            assert len(batch.rows) == LIMIT
            assert await pg_fetchval(db, FRONTIER) > 0
        # Not committed: rolled back, its rows below the frontier again.
        assert await pg_fetchval(db, FRONTIER) == FROM_START, "rows given back: frontier back"
        async with first.claim(LIMIT) as batch:
            await batch.commit()
        assert await pg_fetchval(db, FRONTIER) > 0
        async with second.claim(4 * LIMIT) as batch:  # more than is left: a short claim
            assert len(batch.rows) < 4 * LIMIT
            assert await pg_fetchval(db, FRONTIER) == FROM_START, "short claim: frontier back"
            await batch.commit()
    finally:
        await first.close()
        await second.close()
