"""Claims that do not fight: a relay's claim does not walk the rows its other lanes hold
(relay/pg/seqfloor.py, the fill's frontier). Rows in flight are locked until their batch
commits, and each claim below them read and skipped every one: with 12 batches of 500 in
flight a claim of 500 read 6,064 rows. While a backlog drains, the fill starts above the
highest row the relay's fill took."""

from __future__ import annotations

import contextlib

from relay.app import database_config
from relay.pg.seqfloor import SeqFloor
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.kit.producer import insert_rows

LANES = 12
LIMIT = 500
BACKLOG = 20_000
# Rows a claim of 500 may read: its batch, the fair round's look at the transaction's first
# rows (64), room to spare; the claims this replaced read every row the other lanes held.
READ_BOUND = 2 * LIMIT
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
