"""The express lane's loop (relay/loop/express.py), driven with fakes: it claims only when a
transaction newer than the last it saw appears, and only transactions newer than the drain's
start; drains what it finds, backs off on a database failure, and ends with the drain."""

from __future__ import annotations

import asyncio

from relay.errors import DatabaseError
from relay.interfaces import ExpressStore, Publisher
from relay.loop.express import ExpressLane
from tests.helpers import wait_until


class _Store:
    """newest_transaction() answers from `newest`; claims are counted by the runner below."""

    def __init__(self) -> None:
        self.newest: int | None = None
        self.after: int | None = None
        self.looks = 0
        self.fail = False

    async def newest_transaction(self) -> int | None:
        self.looks += 1
        if self.fail:
            raise DatabaseError("gone")
        return self.newest

    def claim(self, limit: int, *, max_bytes: int | None = None):  # type: ignore[no-untyped-def]  # never called: see _Runner
        raise AssertionError

    async def seconds_until_next_due(self) -> float | None:
        return None


class _Publisher:
    ready = True


class _Runner:
    """One batch: takes up to 2 of `pending` rows and returns how many."""

    def __init__(self) -> None:
        self.pending = 0
        self.batches = 0

    async def __call__(self, store: ExpressStore, publisher: Publisher) -> int:
        self.batches += 1
        taken = min(2, self.pending)
        self.pending -= taken
        return taken


async def _lane(store: _Store, runner: _Runner) -> tuple[asyncio.Event, asyncio.Task[None]]:
    lane = ExpressLane(store, _Publisher(), poll_s=0.001)  # type: ignore[arg-type]
    done = asyncio.Event()
    return done, asyncio.ensure_future(lane.run_until(done, runner))


async def test_express__claims_only_when_a_newer_transaction_appears_and_drains_it() -> None:
    store, runner = _Store(), _Runner()
    store.newest, runner.pending = 10, 5
    done, task = await _lane(store, runner)
    await wait_until(lambda: store.looks > 20, timeout_s=5, what="looks")
    assert (runner.batches, store.after) == (0, 10), "what was there at the start is left"
    store.newest = 11
    await wait_until(lambda: runner.pending == 0, timeout_s=5, what="the new rows claimed")
    # 2 + 2 + 1: a claim of one row ends the burst.
    looks = store.looks
    await wait_until(lambda: store.looks > looks + 20, timeout_s=5, what="more looks")
    assert runner.batches == 3, "no claim while the newest transaction stays the same"
    store.newest, runner.pending = 12, 1
    await wait_until(lambda: runner.batches == 4, timeout_s=5, what="the next claim")
    assert store.after == 10
    done.set()
    await asyncio.wait_for(task, timeout=5)


async def test_express__a_database_failure_pauses_the_lane_and_the_drain_end_stops_it() -> None:
    store, runner = _Store(), _Runner()
    store.fail = True
    done, task = await _lane(store, runner)
    await wait_until(lambda: store.looks >= 1, timeout_s=5, what="a first look")
    await asyncio.sleep(0.2)
    assert store.looks == 1, "a failed look is not retried at once"
    done.set()
    await asyncio.wait_for(task, timeout=5)
    assert runner.batches == 0
