"""The single-active claim's cost does not grow with rows it cannot take (query
claim_single_active, relay/pg/store.py SingleActiveWalk): a key whose head is retrying, with
tens of thousands of due rows behind it, costs each claim two bounded windows; the rows past
the stretch are reached by claims that follow one another at once, in seq order, and each key
keeps its order even where the walk passed over one of its rows."""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from relay.interfaces import ClaimOptions
from relay.pg.queries import Queries, TableNames
from relay.pg.store import SingleActiveWalk, claim_records
from tests.helpers import pg_session
from tests.kit.producer import insert_rows

Q = Queries(TableNames(None, "queue_message", "queue_message_notify"))
LIMIT = 100
BEHIND_BLOCKED = 50_000
OTHER_KEYS = 40
# Rows one claim may read: two windows of 4 x 100 + 64 rows, each keyed row's probes and the
# rows it takes, with room to spare; the claim this replaced read every row behind the head.
READ_BOUND = 6_000
# Claims to cross the stretch: one per window of it, and a few more.
CLAIMS_BOUND = BEHIND_BLOCKED // SingleActiveWalk.window(LIMIT) + 20
OPTIONS = ClaimOptions(fence=True)


class Taken(NamedTuple):
    ordering_key: str | None
    seq: int


READ = ("SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) "
        "FROM pg_stat_xact_user_tables WHERE relid = 'queue_message'::regclass")


async def _fill(conn: asyncpg.Connection) -> None:
    await insert_rows(conn, "x", "rk", ({"early": g} for g in range(1, 4)),
                      ordering_keys="early")
    # The blocked key: its head retries in an hour, every row behind it is due.
    await insert_rows(conn, "x", "rk", [{"head": True}], ordering_keys="blocked", delay_s=3600)
    half = range(1, BEHIND_BLOCKED // 2 + 1)
    await insert_rows(conn, "x", "rk", ({"behind": g} for g in half), ordering_keys="blocked")
    # A key with one row amid the stretch (which a test locks from outside) and one after it.
    await insert_rows(conn, "x", "rk", [{"amid": 1}], ordering_keys="amid")
    await insert_rows(conn, "x", "rk", ({"behind": g} for g in half), ordering_keys="blocked")
    others = range(1, 2 * OTHER_KEYS + 1)
    await insert_rows(conn, "x", "rk", ({"g": g} for g in others), ordering_keys=[
        None if g % 5 == 0 else "amid" if g == 7 else f"k{g % OTHER_KEYS}" for g in others])
    await conn.execute("ANALYZE queue_message")


async def _claim(conn: asyncpg.Connection, walk: SingleActiveWalk,
                 ) -> tuple[list[Taken], bool, int]:
    """One claim whose rows are deleted as published: the rows (key, seq) in the order the
    claim gave them, whether more may be due, and how many rows it read from the table."""
    async with conn.transaction():
        before = await conn.fetchval(READ)
        rows, more = await claim_records(conn, Q, OPTIONS, LIMIT, walker=walk)
        read = int(await conn.fetchval(READ) - before)
        seqs = await conn.fetch("DELETE FROM queue_message WHERE id = ANY($1::uuid[]) "
                                "RETURNING id::text, seq", [r.id for r in rows])
    seq_of = {r["id"]: r["seq"] for r in seqs}
    return [Taken(r.ordering_key, seq_of[r.id]) for r in rows], more, read


async def _drain(conn: asyncpg.Connection, walk: SingleActiveWalk, bound: int = CLAIMS_BOUND,
                 ) -> tuple[list[Taken], int, int]:
    """Claims one after another until one comes back empty and says nothing more may be due:
    every row taken, the claims run and the most one claim read."""
    taken: list[Taken] = []
    claims = most = 0
    while claims < bound:
        rows, more, read = await _claim(conn, walk)
        claims, most = claims + 1, max(most, read)
        taken += rows
        if not rows and not more:
            return taken, claims, most
    raise AssertionError(f"still claiming after {claims} claims: the walk does not move on")


def _seqs_by_key(rows: list[Taken]) -> dict[str | None, list[int]]:
    out: dict[str | None, list[int]] = {}
    for r in rows:
        out.setdefault(r.ordering_key, []).append(r.seq)
    return out


async def test_single_active_claim__a_blocked_stretch_costs_bounded_claims_in_seq_order(
    db: str,
) -> None:
    async with pg_session(db) as conn:
        await _fill(conn)
        total = await conn.fetchval("SELECT count(*) FROM queue_message")
        taken, claims, most = await _drain(conn, SingleActiveWalk())
        left = await conn.fetch("SELECT ordering_key, count(*) AS n FROM queue_message "
                                "GROUP BY ordering_key")
    assert most < READ_BOUND, f"a claim read {most} rows"
    assert claims <= CLAIMS_BOUND
    assert {r["ordering_key"]: r["n"] for r in left} == {"blocked": BEHIND_BLOCKED + 1}
    assert len(taken) == total - BEHIND_BLOCKED - 1
    seqs = [r.seq for r in taken]
    assert seqs == sorted(seqs), "first deliveries left seq order"
    assert len(_seqs_by_key(taken)[None]) == 2 * OTHER_KEYS // 5


async def test_single_active_claim__a_key_passed_over_amid_the_stretch_keeps_its_order(
    db: str,
) -> None:
    """The 'amid' key's first row is locked by another session while the walk passes over it:
    its second row, past the stretch, waits; once the lock is gone and the walk starts again
    from the table's start, the first row goes before the second."""
    async with pg_session(db) as conn, pg_session(db) as holder:
        await _fill(conn)
        walk = SingleActiveWalk()
        locked = holder.transaction()
        await locked.start()
        await holder.execute("SELECT 1 FROM queue_message WHERE content = '{\"amid\": 1}' "
                             "FOR UPDATE")
        held, claims, _ = await _drain(conn, walk)
        await locked.rollback()
        # At rest at the table's end; from now on each claim at rest walks from the start:
        # the walk crosses the stretch (taking the first row), rests, and crosses it again.
        walk.rewalk_s = 0
        after, more_claims, most = await _drain(conn, walk, 2 * CLAIMS_BOUND)
    assert "amid" not in _seqs_by_key(held), "a row of the key went before its held first row"
    amid = _seqs_by_key(after)["amid"]
    assert len(amid) == 2
    assert amid == sorted(amid)
    assert most < READ_BOUND
    assert claims + more_claims <= 3 * CLAIMS_BOUND
