"""The worker loop driven with the shared kit: draining, stopping, broker loss, lanes."""

from __future__ import annotations

import asyncio

import pytest

from relay.errors import DatabaseError
from relay.interfaces import OutboxRow
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.kit.fakes import FakePublisher, FakeStore, keyed, rows

CONFIG = WorkerConfig(batch_size=10, concurrency=3, poll_interval_s=30)


async def test_drain__keeps_claiming_until_the_backlog_is_empty() -> None:
    store, pub = FakeStore(rows(95)), FakePublisher()
    await Worker(store, pub, CONFIG).drain()
    assert store.rows == []
    assert sorted(pub.published) == sorted(r.id for r in rows(95))


async def test_run__sweeps_at_start_and_stops_when_asked_twice() -> None:
    store, pub = FakeStore(rows(5)), FakePublisher()
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    await wait_until(lambda: not store.rows, timeout_s=5, what="an empty store")
    worker.stop()
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert len(pub.published) == 5


async def test_run__a_wake_up_drains_rows_that_arrived_while_asleep() -> None:
    store, pub = FakeStore(), FakePublisher()
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    await wait_until(lambda: store.claims > 0, timeout_s=5, what="the start-up sweep")
    store.rows = rows(3)
    worker.wake()
    await wait_until(lambda: not store.rows, timeout_s=5, what="an empty store")
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert len(pub.published) == 3


async def test_broker_loss__unsent_rows_stay_and_are_published_after_reconnect() -> None:
    store, pub = FakeStore(rows(4)), FakePublisher(lose_broker_once=True)
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    await wait_until(lambda: not store.rows, timeout_s=5, what="an empty store")
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert sorted(pub.published) == sorted(r.id for r in rows(4))
    # the lost batch was settled with nothing: no attempts counted, nothing dead
    assert all(not s.retry and not s.dead for s in store.settlements)


async def test_drain__a_failing_lane_does_not_cancel_another_lanes_batch_in_flight() -> None:
    release = asyncio.Event()
    store, pub = FakeStore(rows(20)), FakePublisher()
    worker = Worker(store, pub, WorkerConfig(batch_size=10, concurrency=2, poll_interval_s=30))
    real_publish, real_claim = pub.publish, store.claim

    async def publish(messages, *, deadline=None):  # type: ignore[no-untyped-def]
        if len(pub.calls) == 1:  # the first lane's batch waits for its confirms
            await release.wait()
        return await real_publish(messages, deadline=deadline)

    def claim(limit: int, *, max_bytes: int | None = None):  # type: ignore[no-untyped-def]
        if store.claims == 2:  # the second lane's claim: its database connection is gone
            store.claims += 1
            raise DatabaseError("connection lost")
        return real_claim(limit)

    pub.publish = publish  # type: ignore[method-assign]
    store.claim = claim  # type: ignore[method-assign]
    # The sweep claims one batch alone (published at once); then lane 1 claims the next batch
    # and waits for its confirms while lane 2 fails.
    drain = asyncio.ensure_future(worker.drain())
    await wait_until(lambda: store.claims >= 3, timeout_s=5, what="the failing claim")
    await asyncio.sleep(0.05)
    assert not drain.done(), "the failure ended the drain while a batch was in flight"
    release.set()
    with pytest.raises(DatabaseError):
        await asyncio.wait_for(drain, timeout=5)
    # The batch in flight was not cancelled: it was published and committed.
    assert sorted(store.deleted) == sorted(r.id for r in rows(20))


async def test_run_batch__a_bug_in_one_rows_build_dead_letters_that_row_only() -> None:
    store, pub = FakeStore(rows(5)), FakePublisher()
    real_build = pub.build

    def build(row: OutboxRow):  # type: ignore[no-untyped-def]
        if row.id == "id-2":
            raise KeyError("a bug")
        return real_build(row)

    pub.build = build  # type: ignore[method-assign]
    await Worker(store, pub, CONFIG).drain()
    assert sorted(store.deleted) == ["id-0", "id-1", "id-3", "id-4"]
    assert [d[0] for d in store.dead] == ["id-2"]
    assert store.dead[0][1].startswith("internal: building the message failed: KeyError")


async def test_run_batch__a_publish_crash_is_pinned_on_the_row_that_causes_it() -> None:
    store, pub = FakeStore(rows(4)), FakePublisher()
    real_publish = pub.publish

    async def publish(messages, *, deadline=None):  # type: ignore[no-untyped-def]
        if any(m.id == "id-1" for m in messages):
            raise RuntimeError("a bug")
        return await real_publish(messages, deadline=deadline)

    pub.publish = publish  # type: ignore[method-assign]
    await Worker(store, pub, CONFIG).drain()
    assert sorted(store.deleted) == ["id-0", "id-2", "id-3"]
    assert [d[0] for d in store.dead] == ["id-1"]
    assert store.dead[0][1].startswith("internal: publishing failed")


async def test_run_batch__a_crash_in_the_second_wave_sends_no_confirmed_message_again(
) -> None:
    """A key whose head failed before goes in two waves; when the second crashed, every
    message of the batch was published again one by one, the first wave's confirmed ones
    included (duplicates)."""
    batch = [keyed("h", "k", attempts=1), keyed("t", "k"), *rows(2, prefix="plain")]
    store, pub = FakeStore(batch), FakePublisher()
    real_publish = pub.publish

    async def publish(messages, *, deadline=None):  # type: ignore[no-untyped-def]
        if len(pub.calls) == 1:  # the second wave
            pub.calls.append([m.id for m in messages])
            raise RuntimeError("a bug")
        return await real_publish(messages, deadline=deadline)

    pub.publish = publish  # type: ignore[method-assign]
    await Worker(store, pub, CONFIG).drain()
    assert pub.calls[0] == ["h", "plain-0", "plain-1"]
    assert pub.calls[1] == ["t"]
    assert pub.calls[2:] == [["t"]], "only the crashed wave's message is sent again"
    assert sorted(store.deleted) == ["h", "plain-0", "plain-1", "t"]


async def test_drain__after_a_lane_fails_the_others_claim_no_new_batch() -> None:
    """The failure surfaces after the batches in flight, not after the whole backlog: the
    loop backs off and reports the outage (liveness, /healthz) while rows keep coming."""
    store, pub = FakeStore(rows(200)), FakePublisher()
    worker = Worker(store, pub, WorkerConfig(batch_size=10, concurrency=3, poll_interval_s=30))
    real_claim = store.claim

    def claim(limit: int, *, max_bytes: int | None = None):  # type: ignore[no-untyped-def]
        if store.claims == 2:  # a lane's claim fails once; the database is fine after
            store.claims += 1
            raise DatabaseError("connection lost")
        return real_claim(limit)

    store.claim = claim  # type: ignore[method-assign]
    with pytest.raises(DatabaseError):
        await asyncio.wait_for(worker.drain(), timeout=5)
    # the sweep's batch, then at most one more batch per surviving lane
    assert len(store.deleted) <= 10 * 3
    assert len(store.rows) >= 170
