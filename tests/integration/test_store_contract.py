"""The unit tests' in-memory store (tests/kit/fakes.py FakeStore) against the real one: the same
cases, run against both, so that what the loop's unit tests assume of a store is what
PostgreSQL does. Real PostgreSQL for `postgres`."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from relay.app import database_config
from relay.interfaces import OutboxRow, Settlement, Store
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.kit.fakes import FakeStore
from tests.kit.producer import insert_rows

_ids = itertools.count()


@dataclass
class StoreKit:
    """A store and a way to add n plain rows to it (returning their ids, oldest first)."""

    store: Store
    add: Callable[[int], Awaitable[list[str]]]


@pytest.fixture(params=["memory", "postgres"])
async def kit(request: pytest.FixtureRequest, db: str) -> AsyncIterator[StoreKit]:
    if request.param == "memory":
        fake = FakeStore()

        async def add_fake(n: int) -> list[str]:
            new = [OutboxRow(f"row-{next(_ids)}", "x", "rk", "{}", None, 0) for _ in range(n)]
            fake.rows += new
            return [r.id for r in new]

        yield StoreKit(fake, add_fake)
        return
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db)))

    async def add_real(n: int) -> list[str]:
        return await insert_rows(db, "x", "rk", [{} for _ in range(n)])

    try:
        yield StoreKit(outbox, add_real)
    finally:
        await outbox.close()


async def _claimable(store: Store, limit: int = 100) -> list[OutboxRow]:
    async with store.claim(limit) as batch:
        return list(batch.rows)


async def test_a_claim_takes_at_most_its_limit_oldest_first(kit: StoreKit) -> None:
    ids = await kit.add(5)
    async with kit.store.claim(3) as batch:
        assert [r.id for r in batch.rows] == ids[:3]


async def test_a_claim_left_without_commit_gives_its_rows_back(kit: StoreKit) -> None:
    ids = await kit.add(4)
    async with kit.store.claim(10) as batch:
        await batch.settle(Settlement(published=[r.id for r in batch.rows]))
    assert [r.id for r in await _claimable(kit.store)] == ids


async def test_claims_in_flight_at_once_never_share_a_row(kit: StoreKit) -> None:
    ids = await kit.add(5)
    async with kit.store.claim(2) as first, kit.store.claim(10) as second:
        a, b = {r.id for r in first.rows}, {r.id for r in second.rows}
    assert not a & b
    assert a | b == set(ids)


async def test_published_rows_are_gone_once_committed(kit: StoreKit) -> None:
    ids = await kit.add(5)
    async with kit.store.claim(3) as batch:
        await batch.settle(Settlement(published=[r.id for r in batch.rows]))
        await batch.commit()
    assert [r.id for r in await _claimable(kit.store)] == ids[3:]


async def test_dead_rows_leave_the_outbox_once_committed(kit: StoreKit) -> None:
    ids = await kit.add(2)
    async with kit.store.claim(1) as batch:
        await batch.settle(Settlement(dead=[(ids[0], "unroutable", True)]))
        await batch.commit()
    assert [r.id for r in await _claimable(kit.store)] == ids[1:]


async def test_a_retry_counts_an_attempt_only_when_told_to(kit: StoreKit) -> None:
    ids = await kit.add(2)
    async with kit.store.claim(2) as batch:
        await batch.settle(Settlement(retry=[(ids[0], "refused", 0.0, True),
                                             (ids[1], "destination silent", 0.0, False)]))
        await batch.commit()
    attempts = {r.id: r.attempts for r in await _claimable(kit.store)}
    assert attempts == {ids[0]: 1, ids[1]: 0}
