"""End to end: rows inserted with the classic INSERT reach a consumer, with the right ids."""

from __future__ import annotations

from tests.helpers import Consumer, Env, count_rows, insert_rows, wait_until


async def test_startup_sweep__delivers_rows_inserted_while_no_relay_ran(
    env: Env, consumer: Consumer, start_relay
) -> None:
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": i} for i in range(50)])
    relay = start_relay()
    await consumer.wait_for(50)
    assert sorted(consumer.ids()) == sorted(ids)
    await wait_until(lambda: count_rows(env.pg_dsn) == 0 if False else _empty(env), what="empty table")
    assert relay.terminate() == 0


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0
