"""The consumer's inbox (relay/inbox/, docs/inbox.md) against the real servers: a handler runs once
per message however often the message is delivered, its writes commit or roll back with the
inbox record, a failing handler is requeued or rejected as configured, and the table is made,
counted and pruned by `relay inbox`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from relay.inbox import ConsumerConfig, InboxConsumer, InboxError, migrate
from tests.helpers import RELAY_BIN, Env, pg_execute, pg_fetch, pg_fetchval, pg_session, wait_until
from tests.kit.inbox_consumer import BUSINESS_TABLE, POISON_EXIT, record_order
from tests.kit.producer import insert_rows
from tests.kit.proxy import proxy_for, via_proxy


@pytest.fixture
async def consumer_db(empty_db: str) -> str:
    """The consumer's own database: its business table and the inbox."""
    async with pg_session(empty_db) as conn:
        await conn.execute(BUSINESS_TABLE)
        await migrate(conn)
    return empty_db


@asynccontextmanager
async def running(env: Env, dsn: str, handler: Callable[..., Awaitable[None]],
                  **config: Any) -> AsyncIterator[InboxConsumer]:
    """An InboxConsumer of the test's queue, running until the block ends."""
    consumer = InboxConsumer(env.amqp_url, dsn, handler, ConsumerConfig(queue=env.queue, **config))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield consumer
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def publish(env: Env, *messages: aio_pika.Message, routing_key: str | None = None) -> None:
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        x = await channel.get_exchange(env.exchange)
        for m in messages:
            await x.publish(m, routing_key=routing_key or env.routing_key)
    finally:
        await conn.close()


def outbox_message(row_id: str, occurrence: str | None = None, body: bytes = b"{}",
                   ) -> aio_pika.Message:
    headers: dict[str, Any] = {"x-outbox-id": row_id}
    if occurrence:
        headers["x-outbox-occurrence"] = occurrence
    return aio_pika.Message(body, headers=headers, message_id=row_id)


async def queue_depth(env: Env, queue: str | None = None) -> int:
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        q = await channel.declare_queue(queue or env.queue, passive=True)
        return q.declaration_result.message_count or 0
    finally:
        await conn.close()


async def test_inbox__rows_through_a_real_relay_each_handled_once(
    env: Env, consumer_db: str, start_relay
) -> None:
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                            [{"n": i} for i in range(300)])
    start_relay()
    async with running(env, consumer_db, record_order) as consumer:
        await wait_until(lambda: consumer.handled == 300, timeout_s=60,
                         what="300 messages handled")
    rows = await pg_fetch(consumer_db, "SELECT message_id, count(*) AS n FROM orders "
                          "GROUP BY message_id")
    assert {r["message_id"] for r in rows} == set(ids)
    assert {r["n"] for r in rows} == {1}
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM relay_inbox "
                             "WHERE consumer = $1", env.queue) == 300


async def test_inbox__a_message_delivered_again_is_acked_without_running_the_handler(
    env: Env, consumer_db: str
) -> None:
    """What the relay does after a crash between the broker's confirm and its commit: the same
    row published twice, same id."""
    row_id = str(uuid.uuid4())
    async with running(env, consumer_db, record_order) as consumer:
        await publish(env, outbox_message(row_id), outbox_message(row_id))
        await wait_until(lambda: consumer.handled + consumer.duplicates == 2, timeout_s=20,
                         what="both deliveries answered")
    assert (consumer.handled, consumer.duplicates) == (1, 1)
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 1
    assert await queue_depth(env) == 0, "the duplicate is acked, not left in the queue"


@pytest.mark.timing
async def test_inbox__a_database_that_goes_silent_is_given_up_and_the_message_handled_once_after(
    env: Env, consumer_db: str
) -> None:
    """A database link that goes silent mid-transaction (nothing reset, nothing refused: a
    black hole, as a hung pooler or a cut that nothing reports) is given up within
    command_timeout_s while it is still silent, and the message requeued; once the link is
    back, the message is handled once. Without the bound, the handler's COMMIT waited on the
    silent link for as long as it stayed silent."""
    proxy = await proxy_for(consumer_db)
    in_transaction = asyncio.Event()

    async def handler(message: Any, conn: Any) -> None:
        await record_order(message, conn)
        if not in_transaction.is_set():
            in_transaction.set()
            await asyncio.sleep(1.0)  # the link goes silent meanwhile; the COMMIT goes into it

    bound_s = 4.0
    try:
        async with running(env, via_proxy(consumer_db, proxy.port), handler, concurrency=1,
                           prefetch=1, command_timeout_s=bound_s) as consumer:
            await publish(env, outbox_message(str(uuid.uuid4())))
            await asyncio.wait_for(in_transaction.wait(), 20)
            proxy.black_hole()
            cut = time.monotonic()
            await wait_until(lambda: consumer.database_away >= 1, timeout_s=bound_s * 5 + 5,
                             what="the consumer to give the silent database link up")
            noticed_s = time.monotonic() - cut
            assert consumer.handled == 0, "nothing can commit through a black hole"
            await proxy.restore()
            await wait_until(lambda: consumer.handled == 1, timeout_s=30,
                             what="the requeued message handled once the link is back")
    finally:
        await proxy.close()
    assert noticed_s <= bound_s * 5, noticed_s
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 1
    assert await queue_depth(env) == 0


async def test_inbox__work_that_outlasts_the_bound_while_the_database_answers_counts_an_attempt(
    env: Env, consumer_db: str, dead_letter_queue: str
) -> None:
    """A handler's statement that runs past command_timeout_s while the database answers (a
    slow query, a lock held elsewhere) was requeued uncounted, as if the database were away:
    the message came back for ever. It is a counted attempt, rejected after max_attempts."""
    calls = 0

    async def slow(message: Any, conn: Any) -> None:
        nonlocal calls
        calls += 1
        await record_order(message, conn)
        await conn.execute("SELECT pg_sleep(60)")

    async with running(env, consumer_db, slow, max_attempts=2, command_timeout_s=3.0,
                       ) as consumer:
        await publish(env, outbox_message(str(uuid.uuid4())))
        await wait_until(lambda: queue_depth(env, dead_letter_queue), timeout_s=30,
                         what="the message rejected to the dead-letter queue")
    assert (calls, consumer.failed, consumer.database_away) == (2, 2, 0)
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 0
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM relay_inbox") == 0


async def test_inbox__two_consumers_racing_on_one_message_run_the_handler_once(
    env: Env, consumer_db: str
) -> None:
    """Two deliveries of one id handled at the same instant (two consumer processes, or two
    handlers of one): the second insert of the key waits for the first transaction and finds
    it committed."""
    row_id = str(uuid.uuid4())
    entered = 0

    async def slow(message: Any, conn: Any) -> None:
        nonlocal entered
        entered += 1
        await asyncio.sleep(0.5)
        await record_order(message, conn)

    async with running(env, consumer_db, slow, concurrency=4) as one, \
            running(env, consumer_db, slow, concurrency=4) as two:
        await publish(env, *(outbox_message(row_id) for _ in range(4)))
        await wait_until(lambda: sum(c.handled + c.duplicates for c in (one, two)) == 4,
                         timeout_s=20, what="four deliveries answered")
    assert entered == 1
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 1


async def test_inbox__occurrences_of_a_recurring_row_are_each_handled(
    env: Env, consumer_db: str
) -> None:
    row_id = str(uuid.uuid4())
    first, second = "2026-11-27T10:00:00+00:00", "2026-11-27T10:01:00+00:00"
    async with running(env, consumer_db, record_order) as consumer:
        await publish(env, outbox_message(row_id, first), outbox_message(row_id, second),
                      outbox_message(row_id, first))
        await wait_until(lambda: consumer.handled + consumer.duplicates == 3, timeout_s=20,
                         what="three deliveries answered")
    assert (consumer.handled, consumer.duplicates) == (2, 1)
    keys = {r["message_id"] for r in await pg_fetch(consumer_db,
                                                   "SELECT message_id FROM relay_inbox")}
    assert keys == {f"{row_id}@{first}", f"{row_id}@{second}"}


async def test_inbox__a_handler_error_rolls_its_writes_back_and_the_message_is_retried(
    env: Env, consumer_db: str
) -> None:
    row_id = str(uuid.uuid4())
    calls = 0

    async def flaky(message: Any, conn: Any) -> None:
        nonlocal calls
        calls += 1
        await record_order(message, conn)  # written, then rolled back while it fails
        if calls < 3:
            raise RuntimeError("downstream not ready")

    async with running(env, consumer_db, flaky, max_attempts=5) as consumer:
        await publish(env, outbox_message(row_id))
        await wait_until(lambda: consumer.handled == 1, timeout_s=20,
                         what="handled on the third attempt")
    assert (calls, consumer.failed) == (3, 2)
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 1
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM relay_inbox") == 1


@pytest.fixture
async def dead_letter_queue(env: Env) -> AsyncIterator[str]:
    """The test's queue again, declared with a dead-letter exchange, and the queue its rejected
    messages reach."""
    conn = await aio_pika.connect(env.amqp_url)
    channel = await conn.channel()
    dlq = f"{env.queue}-dead"
    await channel.queue_delete(env.queue)
    dead = await channel.declare_queue(dlq, durable=True)
    await dead.bind(env.exchange, "dead")
    q = await channel.declare_queue(env.queue, durable=True, arguments={
        "x-dead-letter-exchange": env.exchange, "x-dead-letter-routing-key": "dead"})
    await q.bind(env.exchange, env.routing_key)
    await conn.close()
    try:
        yield dlq
    finally:
        conn = await aio_pika.connect(env.amqp_url)
        await (await conn.channel()).queue_delete(dlq)
        await conn.close()


@pytest.mark.parametrize(("on_error", "attempts"), [("requeue", 3), ("reject", 1)])
async def test_inbox__a_message_that_keeps_failing_is_rejected_to_the_dead_letter_exchange(
    env: Env, consumer_db: str, dead_letter_queue: str, on_error: str, attempts: int
) -> None:
    calls = 0

    async def broken(message: Any, conn: Any) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("cannot parse this order")

    async with running(env, consumer_db, broken, on_error=on_error, max_attempts=3):
        await publish(env, outbox_message(str(uuid.uuid4())))
        await wait_until(lambda: queue_depth(env, dead_letter_queue), timeout_s=20,
                         what="the message in the dead-letter queue")
    assert calls == attempts
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM relay_inbox") == 0
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 0


async def test_inbox__a_message_that_kills_the_process_is_parked_after_its_attempts(
    env: Env, consumer_db: str, tmp_path: Path
) -> None:
    """A handler that ends the process (os._exit, as an out-of-memory kill or a crash would) on
    one message of 40, the consumer restarted each time by its supervisor (here, the test): the
    message runs max_attempts (3) times, each death counted in the inbox's own table before
    the handler ran, then it is parked there whole with its reason, without running again;
    every other message is handled once, none of them parked for dying beside it (a message
    delivered again runs alone). Counted in the consumer's memory, the message came back for
    ever."""
    ids = [str(uuid.uuid4()) for _ in range(40)]
    poison = ids[5]
    await publish(env, *(outbox_message(i, body=b'{"n": 1}') for i in ids))
    command = [sys.executable, "-m", "tests.kit.inbox_consumer", "--amqp", env.amqp_url,
               "--dsn", consumer_db, "--queue", env.queue, "--concurrency", "8",
               "--max-attempts", "3", "--poison", poison]
    log = tmp_path / "consumer.log"
    deaths = 0
    deadline = time.monotonic() + 120
    while True:
        proc = _start(command, log)
        try:
            while proc.poll() is None and not await _all_settled(consumer_db, env):
                assert time.monotonic() < deadline, (
                    f"after {deaths} deaths, not every message handled or parked:\n"
                    + log.read_text()[-3000:])
                await asyncio.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.terminate()
            status = proc.wait(timeout=60)
        if status != POISON_EXIT:
            break
        deaths += 1
        assert deaths <= 10, "the poison message keeps ending the consumer"
    assert deaths == 3, "the handler ran max_attempts times on the poison message"
    rows = await pg_fetch(consumer_db, "SELECT message_id, count(*) AS n FROM orders "
                          "GROUP BY message_id")
    assert {r["message_id"] for r in rows} == set(ids) - {poison}
    assert {r["n"] for r in rows} == {1}
    parked = await pg_fetch(consumer_db, "SELECT message_id, attempts, reason, body, "
                            "headers->>'x-outbox-id' AS header FROM relay_inbox_parked")
    assert [(p["message_id"], p["attempts"], p["header"], bytes(p["body"])) for p in parked] == [
        (poison, 4, poison, b'{"n": 1}')]
    assert "delivered 4 times without an outcome" in parked[0]["reason"]
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM relay_inbox_attempts") == 0
    assert await queue_depth(env) == 0


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A process running `command`, its output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


async def _all_settled(dsn: str, env: Env) -> bool:
    """Every message handled or parked, and the queue empty."""
    done = await pg_fetchval(dsn, "SELECT (SELECT count(*) FROM orders) "
                             "+ (SELECT count(*) FROM relay_inbox_parked)")
    return done == 40 and await queue_depth(env) == 0


async def test_inbox__a_handler_past_its_time_bound_is_cancelled_and_counted(
    env: Env, consumer_db: str
) -> None:
    """A handler that hangs (awaits something that never comes) is cancelled after
    handler_timeout_s, its writes rolled back, and the message parked after max_attempts."""
    async def hangs(message: Any, conn: Any) -> None:
        await record_order(message, conn)
        await asyncio.Event().wait()

    row_id = str(uuid.uuid4())
    async with running(env, consumer_db, hangs, max_attempts=2,
                       handler_timeout_s=0.5) as consumer:
        await publish(env, outbox_message(row_id))
        await wait_until(lambda: _parked(consumer), timeout_s=30,
                         what="the hanging message parked")
    assert consumer.failed == 2
    assert await pg_fetchval(consumer_db, "SELECT count(*) FROM orders") == 0
    reason = await pg_fetchval(consumer_db, "SELECT reason FROM relay_inbox_parked "
                               "WHERE message_id = $1", row_id)
    assert "handler_timeout_s=0.5s" in reason


async def _parked(consumer: InboxConsumer) -> bool:
    return consumer.parked == 1


async def test_inbox__the_consumer_refuses_to_start_without_its_table(
    env: Env, empty_db: str
) -> None:
    consumer = InboxConsumer(env.amqp_url, empty_db, record_order,
                             ConsumerConfig(queue=env.queue))
    with pytest.raises(InboxError, match="relay inbox migrate"):
        await asyncio.wait_for(consumer.run(asyncio.Event()), 20)


def relay_inbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELAY_BIN, "inbox", *args], capture_output=True, text=True,
                          timeout=60, check=False)


async def test_relay_inbox__migrate_status_and_prune(consumer_db: str) -> None:
    assert relay_inbox("migrate", "--dsn", consumer_db).returncode == 0, "idempotent"
    await pg_execute(consumer_db, "INSERT INTO relay_inbox (consumer, message_id, received_at) "
                     "SELECT 'orders', 'm' || g, now() - g * interval '1 day' "
                     "FROM generate_series(1, 10) AS g")  # forged receipt times: the subject
    status = relay_inbox("status", "--dsn", consumer_db)
    assert status.returncode == 0, status.stderr
    assert "10 messages" in status.stdout
    assert "orders" in status.stdout
    pruned = relay_inbox("prune", "--dsn", consumer_db, "--older-than", "7d", "--batch", "2")
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 4 inbox rows" in pruned.stdout  # days 7.x..10 (day 7 is 7 days + a moment)
    left = await pg_fetch(consumer_db, "SELECT message_id FROM relay_inbox ORDER BY 1")
    assert [r["message_id"] for r in left] == ["m1", "m2", "m3", "m4", "m5", "m6"]


async def test_relay_inbox__user_errors_name_what_to_change(consumer_db: str) -> None:
    for args, said in ((("status", "--dsn", consumer_db, "--table", "Orders-Inbox"),
                        "lower-case"),
                       (("status", "--dsn", consumer_db, "--table", "missing"),
                        "relay inbox migrate"),
                       (("prune", "--dsn", consumer_db, "--older-than", "soon"),
                        "invalid duration"),
                       (("status", "--dsn", "postgresql://nobody:secret@127.0.0.1:1/x"),
                        "cannot connect")):
        out = relay_inbox(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert said in out.stderr + out.stdout, (args, out.stderr)
        assert "Traceback" not in out.stderr
        assert "secret" not in out.stderr
