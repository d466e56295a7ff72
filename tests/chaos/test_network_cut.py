"""The link between a relay and one server is reset (through the test's TCP proxy) while the
relay holds claimed rows and a producer process keeps inserting: nothing is lost, duplicates
stay within the rows in flight, the relay holds no claim while RabbitMQ is away, the outage is
logged once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.chaos.flow import chaos_flow
from tests.chaos.harness import events_since
from tests.chaos.inflight import LockProbe, caught_holding_rows
from tests.helpers import Env, RelayProcess, count_rows, pg_fetch, wait_until
from tests.kit.proxy import TcpProxy, proxy_for, via_proxy

pytestmark = pytest.mark.chaos

BACKLOG = 5_000
RATE = 1_000
AWAY_S = 2.0  # how long RabbitMQ stays away once the relay noticed



@pytest.mark.parametrize("server", [
    "rabbitmq",
    "postgres",
])
async def test_network_cut__link_reset_mid_batch_loses_nothing(
    server: str, env: Env, tmp_path: Path
) -> None:
    url = env.pg_dsn if server == "postgres" else env.amqp_url
    proxy = await proxy_for(url)
    via = {"pg_dsn": via_proxy(env.pg_dsn, proxy.port)} if server == "postgres" else {
        "amqp_url": via_proxy(env.amqp_url, proxy.port)}
    try:
        # The producer talks to PostgreSQL directly: rows keep arriving during the cut.
        async with chaos_flow(env, tmp_path, f"network cut ({server})", backlog=BACKLOG,
                              rate=RATE, reconnect_max_s=2, poll_interval_s=1, **via) as flow:
            relay = flow.group.start()
            await wait_until(lambda: '"relay_started"' in relay.log_text(), what="start")
            await flow.start_producer()
            async with caught_holding_rows([relay], flow.probe) as held:
                cut_at = time.time()
                await proxy.cut()
            flow.tally.record(held)
            if server == "postgres":
                lost, back = await _database_outage(flow.group, proxy)
            else:
                lost, back = await _broker_outage(flow.group, proxy, relay, flow.probe, env,
                                                  cut_at=cut_at)
            await flow.settle(f"network cut ({server})", in_flight=1)
            assert relay.alive()
            assert (len(lost()), len(back())) == (1, 1), "the outage logged once"
            # The proxy runs on this event loop: wait for the exit without blocking it.
            assert await relay.stop() == 0
    finally:
        await proxy.close()


async def _database_outage(group: object, proxy: TcpProxy) -> tuple[object, object]:
    def events(name: str) -> list[object]:
        return group.events(name, connection="database")  # type: ignore[attr-defined, no-any-return]

    await wait_until(lambda: events("connection_lost"), what="connection_lost (database)")
    await proxy.restore()
    await wait_until(lambda: events("connection_restored"), timeout_s=60,
                     what="connection_restored (database)")
    return (lambda: events("connection_lost")), (lambda: events("connection_restored"))


async def _broker_outage(group: object, proxy: TcpProxy, relay: RelayProcess,
                         probe: LockProbe, env: Env, *, cut_at: float
                         ) -> tuple[object, object]:
    def events(name: str) -> list[object]:
        return group.events(name, connection="broker")  # type: ignore[attr-defined, no-any-return]

    try:
        await wait_until(lambda: events("connection_lost"), what="connection_lost (broker)")

        # While RabbitMQ is away the relay claims nothing, and rows keep coming.
        async def holds_nothing() -> bool:
            h = await probe.held([relay.pid])
            return h is not None and not h.in_flight

        await wait_until(holds_nothing, timeout_s=20, what="claims released")
        away_until = time.monotonic() + AWAY_S
        before = await count_rows(env.pg_dsn)
        exact, unsettled = 0, []
        while time.monotonic() < away_until:
            h = await probe.held([relay.pid])
            if h is None:
                # A worker session's statement still ran after the probe's settle time (not a
                # claim: a look or a figure on a loaded machine): no exact sample now.
                unsettled.append(probe.last_busy)
            elif h.in_flight:
                raise AssertionError(f"a claim while the broker is away: {h.sessions}; a "
                                     f"moment later: {await _holders(env, relay.pid)}; "
                                     f"the relay's log since "
                                     f"the cut: {events_since(relay, cut_at)}")
            else:
                exact += 1
            await asyncio.sleep(0.05)
        assert exact >= 5, f"{exact} exact samples in {AWAY_S:g} s; busy: {unsettled}"
        assert await count_rows(env.pg_dsn) > before, "rows kept coming meanwhile"
    finally:
        await proxy.restore()
    await wait_until(lambda: events("connection_restored"), timeout_s=60,
                     what="connection_restored (broker)")
    # The express lane's own connection comes back too (the backlog of the outage drains).
    await wait_until(lambda: group.events(  # type: ignore[attr-defined]
        "connection_restored", connection="broker-express"), timeout_s=60,
        what="connection_restored (broker-express)")
    return (lambda: events("connection_lost")), (lambda: events("connection_restored"))


async def _holders(env: Env, relay_pid: int) -> list[dict[str, object]]:
    """The relay's sessions in a transaction that has an id (a claim), for a failure message."""
    rows = await pg_fetch(
        env.pg_dsn, "SELECT application_name, state, backend_xid::text AS xid, "
        "now() - xact_start AS in_transaction, left(query, 80) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_xid IS NOT NULL AND application_name LIKE 'outbox-relay % ' || $1::text",
        str(relay_pid))
    return [dict(r) for r in rows]
