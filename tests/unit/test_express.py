"""The express lane's loop (relay/loop/express.py), driven with fakes: it claims only when a
transaction newer than the last it saw appears, and only transactions newer than the drain's
start; drains what it finds, ends at a database failure (until the next drain), and ends with
the drain. Of a table's relays only the sleeper (or one whose role is undecided) runs it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from relay.errors import DatabaseError
from relay.interfaces import (
    ExpressStore,
    LockState,
    Message,
    Newest,
    Publisher,
    PublishResult,
)
from relay.loop.batch import Stage
from relay.loop.express import ExpressLane
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.kit.fakes import FakeLock, FakePublisher, FakeStore, rows


class _Store:
    """newest_transaction() answers from `newest`; claims are counted by the runner below."""

    def __init__(self) -> None:
        self.newest: int | None = None
        self.after: int | None = None
        self.floor: int | None = None
        self.running_from = 1_000
        self.looks = 0
        self.fail = False
        self.asked: list[int] = []

    async def newest_transaction(self, newer_than: int = 0) -> Newest:
        self.looks += 1
        self.asked.append(newer_than)
        if self.fail:
            raise DatabaseError("gone")
        newest = self.newest if self.newest is not None and self.newest > newer_than else None
        return Newest(newest, self.running_from)

    def claim(self, limit: int, *, max_bytes: int | None = None):  # type: ignore[no-untyped-def]  # never called: see _Runner
        raise AssertionError

    async def seconds_until_next_due(self) -> float | None:
        return None


class _Publisher:
    """`wait_ready` (the reconnect) ends connected once `back` is set."""

    def __init__(self) -> None:
        self.ready = True
        self.reconnects = 0
        self.back = asyncio.Event()
        self.blocked = False  # not ready, yet connected (flow control)

    @property
    def connected(self) -> bool:
        return self.ready or self.blocked

    async def wait_ready(self) -> None:
        self.reconnects += 1
        await self.back.wait()
        self.ready = True


class _Runner:
    """One batch: takes up to 2 of `pending` rows and returns how many."""

    def __init__(self) -> None:
        self.pending = 0
        self.batches = 0

    async def __call__(self, store: ExpressStore, publisher: Publisher, stage: Stage) -> int:
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


async def test_express__a_burst_stops_claiming_when_the_broker_is_lost() -> None:
    """A batch whose broker connection drops leaves its rows untouched and returns them as
    claimed: the burst went on claiming the same rows while the broker was away (the
    network-cut chaos test saw row locks then)."""
    store, runner, publisher = _Store(), _Runner(), _Publisher()
    lane = ExpressLane(store, publisher, poll_s=0.001)  # type: ignore[arg-type]

    async def broker_lost_in_batch(s: ExpressStore, p: Publisher, stage: Stage) -> int:
        publisher.ready = False  # the connection dropped while this batch published
        runner.batches += 1
        await asyncio.sleep(0.001)
        return 2  # its rows claimed (and left untouched)

    store.newest = 10
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, broker_lost_in_batch))
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    store.newest = 11
    await wait_until(lambda: runner.batches >= 1, timeout_s=5, what="the claim")
    await asyncio.sleep(0.05)  # time for more claims, if the burst went on
    assert runner.batches == 1, "claimed again while the broker was away"
    done.set()
    await asyncio.wait_for(task, timeout=5)


async def test_express__its_lost_connection_reconnects_once_across_drains_then_claims() -> None:
    """Nothing else reconnects the lane's own broker connection: without its reconnect one
    outage turned the lane off for the rest of the process's life. One reconnect at a time,
    kept across drains (a connect cancelled half-way could leave it half open)."""
    store, runner, publisher = _Store(), _Runner(), _Publisher()
    publisher.ready = False
    lane = ExpressLane(store, publisher, poll_s=0.001)  # type: ignore[arg-type]
    store.newest = 10
    for _ in range(2):  # two drains while the broker is away
        done = asyncio.Event()
        task = asyncio.ensure_future(lane.run_until(done, runner))
        await wait_until(lambda: publisher.reconnects == 1, timeout_s=5, what="the reconnect")
        await asyncio.sleep(0.02)
        done.set()
        await asyncio.wait_for(task, timeout=5)
    assert (publisher.reconnects, store.looks, runner.batches) == (1, 0, 0), \
        "one reconnect under way, no look and no claim while the broker is away"
    publisher.back.set()
    await wait_until(lambda: publisher.ready, timeout_s=5, what="reconnected")
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, runner))
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    store.newest, runner.pending = 11, 1
    await wait_until(lambda: runner.batches == 1, timeout_s=5, what="a claim once it is back")
    done.set()
    await asyncio.wait_for(task, timeout=5)


async def test_express__reconnects_its_connection_only_once_the_main_one_is_back() -> None:
    """A broker that is away or refuses logins sees the main connection's attempts only: the
    lane's reconnect waits for the main connection first (rotated credentials: 12 logins in
    6 s with both reconnecting, the bound is 10)."""
    store, runner, publisher, main = _Store(), _Runner(), _Publisher(), _Publisher()
    publisher.ready = main.ready = False
    lane = ExpressLane(store, publisher, poll_s=0.001, main=main)  # type: ignore[arg-type]
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, runner))
    await wait_until(lambda: main.reconnects == 1, timeout_s=5, what="the wait for the main")
    await asyncio.sleep(0.02)
    assert publisher.reconnects == 0, "the lane logged in while the main connection was away"
    main.back.set()
    await wait_until(lambda: publisher.reconnects == 1, timeout_s=5, what="the lane's own")
    publisher.back.set()
    await wait_until(lambda: publisher.ready, timeout_s=5, what="the lane reconnected")
    done.set()
    await asyncio.wait_for(task, timeout=5)


async def test_express__a_blocked_connection_is_not_reconnected() -> None:
    """Flow control (connection.blocked) ends in place: a reconnect's wait would only log the
    episode a second time."""
    store, runner, publisher = _Store(), _Runner(), _Publisher()
    publisher.ready, publisher.blocked = False, True
    lane = ExpressLane(store, publisher, poll_s=0.001)  # type: ignore[arg-type]
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, runner))
    await asyncio.sleep(0.05)
    done.set()
    await asyncio.wait_for(task, timeout=5)
    assert (publisher.reconnects, store.looks, runner.batches) == (0, 0, 0)


async def test_express__each_look_asks_only_for_a_transaction_newer_than_it_saw() -> None:
    """The look's bound: while the xmin horizon is pinned, the index entries of every row the
    lane claimed stay in the index, and a look without it walked all of them. Kept across
    drains; forgotten after a database failure (the next look may reach another server)."""
    store, runner = _Store(), _Runner()
    store.newest = 10
    lane = ExpressLane(store, _Publisher(), poll_s=0.001)  # type: ignore[arg-type]
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, runner))
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    store.newest, runner.pending = 11, 1
    await wait_until(lambda: runner.batches == 1, timeout_s=5, what="the new row claimed")
    looks = store.looks
    await wait_until(lambda: store.looks > looks + 5, timeout_s=5, what="more looks")
    done.set()
    await asyncio.wait_for(task, timeout=5)
    assert store.asked[0] == 0
    assert set(store.asked[1:]) <= {10, 11}
    assert store.asked[-1] == 11
    # The next drain starts from what this one saw.
    store.asked.clear()
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, runner))
    await wait_until(lambda: len(store.asked) > 5, timeout_s=5, what="the next drain's looks")
    assert store.after == 11
    store.fail = True
    await asyncio.wait_for(task, timeout=5)
    assert set(store.asked) == {11}
    assert lane.seen == 0


async def test_express__a_burst_that_found_nothing_left_moves_the_claims_floor_to_what_ended(
) -> None:
    """The lane's claims walk the (xact, seq) index from its end down to their bound; under a
    pinned horizon the entries of every row the lane claimed stay there. A burst whose last
    claim came back empty raises the bound to the newest transaction its look saw, or to the
    one before the oldest still running (which may commit later); one whose last claim
    brought one row (that transaction may have more) leaves it."""
    store, runner = _Store(), _Runner()
    store.newest = 10
    done, task = await _lane(store, runner)
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    assert store.floor is None
    store.newest, runner.pending = 12, 4  # 2 + 2 + 0: the last claim found nothing
    await wait_until(lambda: store.floor is not None, timeout_s=5, what="the floor moved")
    assert store.floor == 12
    store.running_from = 14  # transaction 14 still runs: the floor stops below it
    store.newest, runner.pending = 20, 4
    await wait_until(lambda: store.floor == 13, timeout_s=5, what="the floor below 14")
    store.running_from = 1_000
    store.newest, runner.pending = 21, 1  # one row: maybe more of it left
    await wait_until(lambda: runner.pending == 0, timeout_s=5, what="the row claimed")
    looks = store.looks
    await wait_until(lambda: store.looks > looks + 5, timeout_s=5, what="more looks")
    assert store.floor == 13
    done.set()
    await asyncio.wait_for(task, timeout=5)


async def test_express__a_batch_that_failed_on_the_database_is_raised_to_the_drain() -> None:
    """The drain's lanes done before a silent cut, live rows still coming: the express lane's
    batch was the drain's last statement. Its failure was logged and swallowed, the drain
    ended as if all was well, and the relay noticed the outage only at its next statement, a
    command timeout later (70 s for a 35 s command timeout in a black-hole chaos run)."""
    store = _Store()
    lane = ExpressLane(store, _Publisher(), poll_s=0.001)  # type: ignore[arg-type]
    batches = 0

    async def fails(s: ExpressStore, p: Publisher, stage: Stage) -> int:
        nonlocal batches
        batches += 1
        raise DatabaseError("commit failed: timed out")

    store.newest = 10
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, fails))
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    store.newest = 11
    with pytest.raises(DatabaseError, match="commit failed"):
        await asyncio.wait_for(task, timeout=5)  # without the drain's end
    assert batches == 1
    assert not done.is_set()


async def test_express__a_database_failure_ends_the_lane_until_the_next_drain() -> None:
    store, runner = _Store(), _Runner()
    store.fail = True
    done, task = await _lane(store, runner)
    await asyncio.wait_for(task, timeout=5)  # ended without the drain's end
    assert store.looks == 1, "a failed look is not tried again in this drain"
    assert runner.batches == 0
    assert not done.is_set()


async def test_express__a_database_failure_ends_the_lane__the_drain_reports_without_waiting_for_it(
) -> None:
    """A silent cut: the express lane's look times out, and the drain's lanes a little later
    (their statements started later). The express lane used to pause 1 s and look again, on a
    pooled connection as dead as the others, and the drain (and with it the outage's notice)
    waited for that look too: the relay noticed the cut after twice its command timeout. Now a
    database failure ends the express lane for the rest of the drain."""
    from contextlib import asynccontextmanager

    from relay.loop.worker import Worker, WorkerConfig
    from tests.kit.fakes import FakePublisher, FakeStore
    from tests.unit.test_worker_wakeup import row

    class CutAfterFirstClaim(FakeStore):
        @asynccontextmanager
        async def claim(self, limit, *, max_bytes=None):  # type: ignore[no-untyped-def,override]
            if self.claims:
                await asyncio.sleep(1.5)  # the command timeout, after the express lane's
                raise DatabaseError("claiming rows failed: TimeoutError()")
            async with super().claim(limit, max_bytes=max_bytes) as batch:
                yield batch

    class DeadLinkStore(_Store):
        async def newest_transaction(self, newer_than: int = 0) -> Newest:
            self.looks += 1
            if self.looks == 1:
                return Newest(None, 1)
            if self.looks == 2:
                await asyncio.sleep(0.1)
                raise DatabaseError("reading the newest transaction failed: TimeoutError()")
            await asyncio.Event().wait()  # another dead connection: no answer
            return Newest(None, 1)

    store = CutAfterFirstClaim(rows=[row(1), row(2)])
    express = ExpressLane(DeadLinkStore(), FakePublisher(), poll_s=0.001)  # type: ignore[arg-type]
    worker = Worker(store, FakePublisher(), WorkerConfig(batch_size=2, concurrency=2),
                    express=express)
    started = asyncio.get_running_loop().time()
    try:
        await asyncio.wait_for(worker.drain(), timeout=5)
    except DatabaseError:
        pass
    else:
        raise AssertionError("the drain did not report the failure")
    assert asyncio.get_running_loop().time() - started < 3.0


async def test_express__a_look_still_waiting_when_the_drains_lanes_failed_is_given_up() -> None:
    """A silent cut while the express lane looks: its look waited out the command timeout, then
    a new connection's check another one, and the drain (and the outage's notice) waited for
    it: noticed after 70 s for a 35 s command timeout, in a CI run. The drain's lanes fail at
    their command timeout; the look still under way is then cancelled (it claims nothing)."""
    from contextlib import asynccontextmanager

    from tests.unit.test_worker_wakeup import row

    class CutAfterFirstClaim(FakeStore):
        @asynccontextmanager
        async def claim(self, limit, *, max_bytes=None):  # type: ignore[no-untyped-def,override]
            if self.claims:
                await asyncio.sleep(1.0)  # the command timeout
                raise DatabaseError("claiming rows failed: TimeoutError()")
            async with super().claim(limit, max_bytes=max_bytes) as batch:
                yield batch

    class SilentStore(_Store):
        cancelled = False

        async def newest_transaction(self, newer_than: int = 0) -> Newest:
            self.looks += 1
            if self.looks == 1:
                return Newest(None, 1)
            try:
                await asyncio.Event().wait()  # no answer, ever
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return Newest(None, 1)

    look = SilentStore()
    express = ExpressLane(look, FakePublisher(), poll_s=0.001)  # type: ignore[arg-type]
    worker = Worker(CutAfterFirstClaim(rows=[row(1), row(2)]), FakePublisher(),
                    WorkerConfig(batch_size=2, concurrency=2), express=express)
    started = asyncio.get_running_loop().time()
    with pytest.raises(DatabaseError):
        await asyncio.wait_for(worker.drain(), timeout=10)
    assert asyncio.get_running_loop().time() - started < 3.0
    assert look.cancelled, "the look under way was cancelled"


class _SlowPublisher(FakePublisher):
    """Each publish takes 10 ms: a drain long enough for the express lane to look."""

    async def publish(self, messages: Sequence[Message], *,
                      deadline: float | None = None) -> PublishResult:
        await asyncio.sleep(0.01)
        return await super().publish(messages, deadline=deadline)


@pytest.mark.parametrize(("role", "runs"), [("sleeper", True), ("waiter", False), (None, True)])
async def test_drain__of_a_tables_relays_only_the_sleeper_runs_the_express_lane(
    role: str | None, runs: bool
) -> None:
    """N relays draining together look at the newest transaction as often as one does."""
    lock = FakeLock()
    lock.current = LockState(role=role, mode="conditional")
    looks = _Store()
    lane = ExpressLane(looks, _Publisher(), poll_s=0.001)  # type: ignore[arg-type]
    store, publisher = FakeStore(rows(95)), _SlowPublisher()
    config = WorkerConfig(batch_size=10, concurrency=3, poll_interval_s=30)
    await Worker(store, publisher, config, lock=lock, express=lane).drain()
    assert store.rows == []
    assert (looks.looks > 0) is runs, looks.looks



@pytest.mark.parametrize("sending", [False, True])
async def test_express__on_the_drains_end_a_burst_still_claiming_is_cancelled_one_sending_ends(
    sending: bool,
) -> None:
    """A burst waiting for its claim (a silent server: a new connection's checks, then the
    claim, each a command timeout) held the drain's end, and the notice of the outage, for
    as long; it holds nothing the broker has, so it is cancelled. One that sends finishes."""
    store = _Store()
    lane = ExpressLane(store, _Publisher(), poll_s=0.001)  # type: ignore[arg-type]
    started, release, cancelled = asyncio.Event(), asyncio.Event(), []

    async def stuck(s: ExpressStore, p: Publisher, stage: Stage) -> int:
        stage.sending = sending
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 1

    store.newest = 10
    done = asyncio.Event()
    task = asyncio.ensure_future(lane.run_until(done, stuck))
    await wait_until(lambda: store.looks > 5, timeout_s=5, what="looks")
    store.newest = 11
    await asyncio.wait_for(started.wait(), timeout=5)
    done.set()
    if sending:
        await asyncio.sleep(0.1)
        assert not task.done(), "a burst that sends is waited for"
        release.set()
    await asyncio.wait_for(task, timeout=5)
    assert cancelled == ([] if sending else [True])
