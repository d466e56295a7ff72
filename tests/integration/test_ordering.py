"""Per-key ordering across replicas, failing heads, single-active failover (real relays)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import pytest

from relay.settings import Settings
from tests.helpers import Env, RelayProcess, count_rows, pg_fetchval, pg_session, wait_until
from tests.integration.test_conditional_notify import sleepers
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

KEYS = 50
VALUES_PER_KEY = 600  # 30,000 rows
PRODUCERS = 5


@dataclass
class OrderedConsumer:
    """Two kit consumers on one single-active-consumer queue, manual acks, recording into the
    same lists in arrival order.

    The active one is stopped half-way so that the standby consumer takes over: the broker hands
    the queue, unacked deliveries first, to the next consumer in order.
    """

    consumers: list[Consumer]

    @classmethod
    async def start(cls, amqp_url: str, queue: str, exchange: str,
                    routing_key: str) -> OrderedConsumer:
        conn = await aio_pika.connect(amqp_url)
        channel = await conn.channel()
        declared = await channel.declare_queue(
            queue, durable=True, arguments={"x-single-active-consumer": True})
        await declared.bind(exchange, routing_key)
        await conn.close()
        first = Consumer(amqp_url, queue, robust=True, manual_ack=True, prefetch=200)
        # The second consumer records into the first one's lists.
        second = Consumer(amqp_url, queue, robust=True, manual_ack=True, prefetch=200,
                          messages=first.messages, ids=first.ids,
                          redelivered=first.redelivered)
        return cls([await first.start(), await second.start()])

    @property
    def received(self) -> list[tuple[str, int, str]]:
        """(key, value, message id) of every receipt, in order."""
        return [(b["k"], b["v"], i) for b, i in zip(self.consumers[0].bodies(),
                                                    self.consumers[0].ids, strict=True)]

    @property
    def redelivered(self) -> int:
        """Receipts the broker flagged as its own redeliveries."""
        return len(self.consumers[0].redelivered)

    def distinct(self) -> int:
        return self.consumers[0].distinct()

    async def close_active(self) -> None:
        """Stop the first consumer (the active one: it subscribed first)."""
        await self.consumers[0].stop()

    async def stop(self, amqp_url: str) -> None:
        for consumer in self.consumers:
            await consumer.stop()
        conn = await aio_pika.connect(amqp_url)
        channel = await conn.channel()
        await channel.queue_delete(self.consumers[0].queue)
        await conn.close()


def order_violations(received: list[tuple[str, int, str]]) -> list[str]:
    """Per key, every receipt must be a new highest value or a repeat of one seen before."""
    seen: dict[str, set[int]] = defaultdict(set)
    high: dict[str, int] = defaultdict(lambda: -1)
    problems = []
    for key, v, _ in received:
        if v > high[key]:
            high[key] = v
        elif v not in seen[key]:
            problems.append(f"key {key}: {v} arrived after {high[key]}")
        seen[key].add(v)
    return problems


@pytest.fixture
async def ordered_consumer(env: Env) -> AsyncIterator[OrderedConsumer]:
    c = await OrderedConsumer.start(env.amqp_url, env.queue + "-sac", env.exchange, "ord")
    try:
        yield c
    finally:
        await c.stop(env.amqp_url)


async def produce(dsn: str, exchange: str, keys: list[str], chunk: int, pause_s: float) -> None:
    """Write each key's values 0..VALUES_PER_KEY-1 in order, `chunk` per key per transaction."""
    async with pg_session(dsn) as conn:
        for start in range(0, VALUES_PER_KEY, chunk):
            rows = [(k, v) for k in keys for v in range(start, start + chunk)]
            await insert_rows(conn, exchange, "ord", ({"k": k, "v": v} for k, v in rows),
                              ordering_keys=[k for k, _ in rows], options={"persistent": True})
            await asyncio.sleep(pause_s)


async def test_keyed_rows__arrive_in_key_order_with_three_replicas_killed_every_2s(
    env: Env, ordered_consumer: OrderedConsumer, start_relay: Callable[..., RelayProcess]
) -> None:
    replicas = [start_relay(concurrency=3) for _ in range(3)]
    keys = [f"order-{i}" for i in range(KEYS)]
    producers = [
        asyncio.ensure_future(
            produce(env.pg_dsn, env.exchange, keys[i::PRODUCERS], chunk=20, pause_s=0.25)
        )
        for i in range(PRODUCERS)
    ]
    total = KEYS * VALUES_PER_KEY
    kills = 0
    switched = False
    deadline = time.monotonic() + 100
    rng = random.Random(8)
    while ordered_consumer.distinct() < total or not all(p.done() for p in producers):
        assert time.monotonic() < deadline, f"only {ordered_consumer.distinct()}/{total} arrived"
        await asyncio.sleep(2.0)
        if ordered_consumer.distinct() >= total:
            break
        victim = rng.randrange(3)
        replicas[victim].kill()
        replicas[victim] = start_relay(concurrency=3)
        kills += 1
        if not switched and ordered_consumer.distinct() > total // 2:
            await ordered_consumer.close_active()
            switched = True
    await asyncio.gather(*producers)
    await wait_until(lambda: _drained(env),
                     timeout_s=30, what="an empty outbox")

    assert kills >= 3
    assert order_violations(ordered_consumer.received) == []
    by_key: dict[str, set[int]] = defaultdict(set)
    for key, v, _ in ordered_consumer.received:
        by_key[key].add(v)
    assert {k: len(v) for k, v in by_key.items()} == dict.fromkeys(keys, VALUES_PER_KEY)
    duplicates = len(ordered_consumer.received) - total
    republished = duplicates - ordered_consumer.redelivered
    print(f"kills={kills} duplicates={duplicates} (redelivered to the consumer="
          f"{ordered_consumer.redelivered}) consumer_switched={switched}")
    # The relays' own duplicates: at most the batches in flight (concurrency 3) of each kill.
    assert republished <= Settings.model_fields["batch_size"].default * 3 * kills


async def _drained(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


async def _insert(dsn: str, rows: list[tuple[str, str, str | None]], exchange: str) -> None:
    """Insert (routing_key, label, key) rows in order; label goes into the body as `v`."""
    async with pg_session(dsn) as conn:
        for rk, label, key in rows:
            await insert_rows(conn, exchange, rk, [{"k": key, "v": label}], ordering_keys=[key])


async def _fetch(dsn: str, sql: str, *args: Any) -> Any:
    return await pg_fetchval(dsn, sql, *args)


async def _failing_head_setup(env: Env, consumer: Any) -> tuple[str, list[str]]:
    """A1 goes to a missing exchange and fails once; then A2..A4, B1..B3 and U1 are written."""
    await _insert(env.pg_dsn, [("rk", "A1", "A")], "no-such-exchange-" + env.queue)
    await wait_until(
        lambda: _fetch(env.pg_dsn, "SELECT max(attempts) FROM queue_message"),
        what="A1's first failure",
    )
    rows = [("rk", f"A{i}", "A") for i in (2, 3, 4)] + [("rk", f"B{i}", "B") for i in (1, 2, 3)]
    for row in rows:
        await _insert(env.pg_dsn, [row], env.exchange)
    await _insert(env.pg_dsn, [("rk", "U1", None)], env.exchange)
    await consumer.wait_for(4)
    labels = [json.loads(m.body)["v"] for m in consumer.messages]
    return "A1", labels


async def test_failing_head_row__holds_back_its_key_and_not_others(
    env: Env, consumer: Any, start_relay: Callable[..., RelayProcess]
) -> None:
    start_relay(max_attempts=4, retry_base_s=1.0)
    _, labels = await _failing_head_setup(env, consumer)
    # B and the unkeyed row flowed while A1 was still retrying, and nothing of A did.
    assert await _fetch(env.pg_dsn, "SELECT count(*) FROM queue_message_dead") == 0
    assert sorted(labels) == ["B1", "B2", "B3", "U1"]
    assert [x for x in labels if x.startswith("B")] == ["B1", "B2", "B3"]
    # ordering_on_dead=skip (the default): once A1 is dead-lettered, A2..A4 follow in order.
    await consumer.wait_for(7, timeout_s=40)
    labels = [json.loads(m.body)["v"] for m in consumer.messages]
    assert [x for x in labels if x.startswith("A")] == ["A2", "A3", "A4"]
    assert await _fetch(env.pg_dsn, "SELECT count(*) FROM queue_message_dead") == 1


async def test_dead_head_with_block__holds_its_key_until_the_dead_letter_is_removed(
    env: Env, consumer: Any, start_relay: Callable[..., RelayProcess]
) -> None:
    start_relay(max_attempts=2, retry_base_s=0.5, ordering_on_dead="block")
    await _failing_head_setup(env, consumer)
    await wait_until(
        lambda: _fetch(env.pg_dsn, "SELECT count(*) = 1 FROM queue_message_dead"),
        timeout_s=20, what="A1 dead-lettered",
    )
    # Rows written after the dead letter still flow for other keys, and A stays blocked.
    await _insert(env.pg_dsn, [("rk", "B4", "B")], env.exchange)
    await consumer.wait_for(5)
    labels = [json.loads(m.body)["v"] for m in consumer.messages]
    assert not [x for x in labels if x.startswith("A")]
    left = "SELECT count(*) FROM queue_message WHERE ordering_key = 'A'"
    assert await _fetch(env.pg_dsn, left) == 3
    # The operator handles A1 (here: purges it); the key resumes, in order.
    await _fetch(env.pg_dsn, "DELETE FROM queue_message_dead RETURNING 1")
    await _insert(env.pg_dsn, [("rk", "U2", None)], env.exchange)  # a wake-up
    await consumer.wait_for(9, timeout_s=20)
    labels = [json.loads(m.body)["v"] for m in consumer.messages]
    assert [x for x in labels if x.startswith("A")] == ["A2", "A3", "A4"]


async def _elected_at(relay: RelayProcess) -> float | None:
    for event in relay.log_events():
        if event.get("event") == "leader_elected":
            from datetime import datetime

            return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
    return None


@pytest.mark.timing
async def test_single_active__standby_takes_over_within_the_bound_and_loses_nothing(
    env: Env, consumer: Any, start_relay: Callable[..., RelayProcess]
) -> None:
    poll_s = 0.5
    relays = [start_relay(mode="single-active", leader_poll_interval_s=poll_s) for _ in range(2)]
    await wait_until(
        lambda: any(r.log_text().count("leader_elected") for r in relays), what="a leader"
    )
    await wait_until(lambda: any("standing_by" in r.log_text() for r in relays),
                     what="the other one in its standby loop")
    leaders = [r for r in relays if "leader_elected" in r.log_text()]
    assert len(leaders) == 1
    leader, standby = leaders[0], next(r for r in relays if r is not leaders[0])
    assert "standing_by" in standby.log_text()

    async with pg_session(env.pg_dsn) as conn:
        async def write(start: int, n: int) -> None:
            numbers = range(start, start + n)
            await insert_rows(conn, env.exchange, "rk", ({"n": g} for g in numbers),
                              ordering_keys=[f"k{g % 7}" if g % 3 else None  # keyed and unkeyed
                                             for g in numbers])

        await write(0, 2000)
        await consumer.wait_for(1)
        leader.kill()
        killed_at = time.time()
        await write(2000, 2000)
        await wait_until(lambda: "leader_elected" in standby.log_text(), timeout_s=15,
                         what="the standby's takeover")
        elected_at = await _elected_at(standby)
        assert elected_at is not None, "leader_elected has no timestamp"
        takeover_s = elected_at - killed_at
        await consumer.wait_for(4000, timeout_s=40)
    # The standby's next poll after the lock went with the killed leader's session: 0.5 s and
    # a moment; 5x that covers a loaded machine.
    assert takeover_s < 5 * (poll_s + 0.5), takeover_s
    numbers = [b["n"] for b in consumer.bodies()]
    assert set(numbers) == set(range(4000))
    # One batch at a time in seq order: first receipts of each number are increasing.
    firsts: list[int] = []
    seen: set[int] = set()
    for n in numbers:
        if n not in seen:
            seen.add(n)
            firsts.append(n)
    assert firsts == sorted(firsts)
    duplicates = len(numbers) - 4000
    print(f"takeover_s={takeover_s:.2f} duplicates={duplicates}")
    # One batch in flight at a time (single-active): the killed leader can repeat one batch.
    assert duplicates <= Settings.model_fields["batch_size"].default


async def test_single_active__a_leader_that_loses_its_lock_connection_exits_and_is_replaced(
    env: Env, consumer: Any, start_relay: Callable[..., RelayProcess]
) -> None:
    poll_s = 0.5
    first = start_relay(mode="single-active", leader_poll_interval_s=poll_s)
    await wait_until(lambda: "leader_elected" in first.log_text(), what="a leader")
    second = start_relay(mode="single-active", leader_poll_interval_s=poll_s)
    await wait_until(lambda: "standing_by" in second.log_text(), what="a standby")
    await _fetch(
        env.pg_dsn,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE $1",
        f"outbox-relay leader % {first.pid}",
    )
    await wait_until(lambda: not first.alive(), timeout_s=10, what="the old leader's exit")
    assert first.proc is not None
    assert first.proc.returncode != 0
    assert "leadership_lost" in first.log_text()
    await wait_until(lambda: "leader_elected" in second.log_text(), timeout_s=10,
                     what="the standby's takeover")
    await _insert(env.pg_dsn, [("rk", "after", None)], env.exchange)
    await consumer.wait_for(1)


@pytest.mark.timing
async def test_keyed_claim__a_due_key_is_claimed_at_once_behind_20000_waiting_keys(
    env: Env, start_relay
) -> None:
    """The keyed claim visited at most 4 x keys-per-batch + 64 keys from a random point: with
    tens of thousands of keys whose head waits a day, a due key was found by chance."""
    consumer = await Consumer(env.amqp_url, env.queue).start()
    try:
        async with pg_session(env.pg_dsn) as conn:
            waiting = range(1, 20_001)
            await insert_rows(conn, env.exchange, env.routing_key, ({"w": g} for g in waiting),
                              ordering_keys=[f"waiting-{g}" for g in waiting], delay_s=86_400)
            await conn.execute("ANALYZE queue_message")
            relay = start_relay(poll_interval_s=60)
            await wait_until(lambda: _asleep(env.pg_dsn), timeout_s=30,
                             what="the relay asleep (holding the wake-up lock)")
            started = time.monotonic()
            [due] = await insert_rows(conn, env.exchange, env.routing_key, [{"due": 1}],
                                      ordering_keys="due-key")
            await consumer.wait_for(1, timeout_s=30)
            elapsed = time.monotonic() - started
            assert consumer.ids == [due]
            # One wake-up, not a poll (60 s here) or a lucky walk: well under either.
            assert elapsed < 15, f"the due key waited {elapsed:.2f}s"
            assert await count_rows(env.pg_dsn) == 20000
            assert relay.alive()
    finally:
        await consumer.stop()


async def _asleep(dsn: str) -> bool:
    return await sleepers(dsn) == 1


@pytest.mark.timing
async def test_single_active__a_leader_whose_lock_session_ends__stops_and_exits_at_once(
    env: Env, consumer: Any, start_relay: Callable[..., RelayProcess]
) -> None:
    """The lock's session ended under a living relay (an administrator, a failover): the lock
    is gone with it, so the leader must stop publishing and exit for its supervisor to
    restart it as a standby; noticed from the session's end, not only by the next ping."""
    relay = start_relay(mode="single-active", leader_poll_interval_s=60)
    await wait_until(lambda: "leader_elected" in relay.log_text(), what="the leader")
    async with pg_session(env.pg_dsn) as conn:
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'outbox-relay leader %'")
        assert ended == 1
        ended_at = time.monotonic()
        await wait_until(lambda: not relay.alive(), timeout_s=30,
                         what="the leader's exit after its lock session ended")
        exit_s = time.monotonic() - ended_at
    assert "leadership_lost" in relay.log_text()
    assert relay.proc is not None
    assert relay.proc.returncode != 0
    # Well under the 60 s ping interval: the session's end itself was noticed.
    assert exit_s < 20.0, exit_s
