"""A session that lands on a read-only server (a standby, here a database whose sessions are
read-only) is dropped and retried, never used to claim, lock or LISTEN."""

from __future__ import annotations

import pytest

from relay.app import database_config
from relay.errors import DatabaseUnavailable
from relay.pg.connection import connect
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.helpers import Env, RelayProcess, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


def _any_server(dsn: str) -> str:
    """The DSN, telling the driver that any server will do (so only the relay's check is left)."""
    return dsn + ("&" if "?" in dsn else "?") + "target_session_attrs=any"


async def _set_read_only(dsn: str, on: bool) -> None:
    async with pg_session(dsn, server_settings={"default_transaction_read_only": "off"}) as conn:
        name = await conn.fetchval("SELECT current_database()")
        action = "SET default_transaction_read_only = on" if on else (
            "RESET default_transaction_read_only")
        await conn.execute(f'ALTER DATABASE "{name}" {action}')


async def test_connect__refuses_a_read_only_server(db: str) -> None:
    await _set_read_only(db, True)
    settings = Settings(pg_dsn=_any_server(db))
    with pytest.raises(DatabaseUnavailable, match="read-only"):
        await connect(database_config(settings), "listener")
    with pytest.raises(DatabaseUnavailable, match="read-only"):
        await Outbox.open(database_config(settings))


async def test_run__waits_while_the_server_is_read_only_then_delivers(
    env: Env, consumer: Consumer, relays: list[RelayProcess], start_relay
) -> None:
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(10))
    await _set_read_only(env.pg_dsn, True)
    relay = start_relay(pg_dsn=_any_server(env.pg_dsn), reconnect_max_s=0.5)
    await wait_until(
        lambda: any(e.get("event") == "connection_waiting" and "read-only" in str(e.get("error"))
                    for e in relay.log_events()),
        what="connection_waiting for a read-only server",
    )
    assert consumer.ids == []
    await _set_read_only(env.pg_dsn, False)
    await consumer.wait_for(len(ids))
    assert set(consumer.ids) == set(ids)
    assert relay.terminate() == 0
