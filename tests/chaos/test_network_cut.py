"""The link between a relay and each server is reset (through the test's TCP proxy) while the
relay holds claimed rows and a producer process keeps inserting: nothing is lost, duplicates
stay within the rows in flight, the relay holds no claim while RabbitMQ is away, each outage
is logged once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    assert_exactly_delivered,
    fresh_ids,
    insert_with_ids,
    proxy_for,
    relays,
    report,
    stop_relay,
    via_proxy,
)
from tests.chaos.inflight import FaultTally, LockProbe, caught_holding_rows
from tests.chaos.producer import ProducerProcess
from tests.helpers import Env, count_rows, wait_until

pytestmark = pytest.mark.chaos

BACKLOG = 5_000
RATE = 1_000
AWAY_S = 2.0  # how long RabbitMQ stays away once the relay noticed


async def test_network_cut__links_reset_mid_batch_lose_nothing_and_claim_nothing_while_away(
    env: Env, tmp_path: Path
) -> None:
    pg_proxy = await proxy_for(env.pg_dsn)
    amqp_proxy = await proxy_for(env.amqp_url)
    backlog = fresh_ids(BACKLOG)
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, backlog)
    consumer = await RobustConsumer(env.amqp_url, env.queue, manual_ack=False).start()
    probe = LockProbe(env.pg_dsn)
    # The producer talks to PostgreSQL directly: rows keep arriving during both cuts.
    producer = ProducerProcess(env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids",
                               rate=RATE, chunk=50)
    tally = FaultTally("network cut")
    try:
        with relays(env, tmp_path, pg_dsn=via_proxy(env.pg_dsn, pg_proxy.port),
                    amqp_url=via_proxy(env.amqp_url, amqp_proxy.port), reconnect_max_s=2,
                    poll_interval_s=1) as group:
            relay = group.start()
            await wait_until(lambda: '"relay_started"' in relay.log_text(), what="start")
            await producer.start()

            async with caught_holding_rows([relay], probe) as held:
                await pg_proxy.cut()
            tally.record(held)
            await wait_until(lambda: _database_events(group, "connection_lost"), what="db outage")
            await pg_proxy.restore()
            await wait_until(lambda: _database_events(group, "connection_restored"), timeout_s=60,
                             what="database_reconnected")

            async with caught_holding_rows([relay], probe) as held:
                await amqp_proxy.cut()
            tally.record(held)
            try:
                await wait_until(lambda: _broker(group.events("connection_lost")),
                                 what="connection_lost (broker)")
                # While RabbitMQ is away the relay claims nothing, and rows keep coming.
                async def holds_nothing() -> bool:
                    h = await probe.held([relay.pid])
                    return h is not None and not h.in_flight
                await wait_until(holds_nothing, timeout_s=20, what="claims released")
                away_until = time.monotonic() + AWAY_S
                before = await count_rows(env.pg_dsn)
                while time.monotonic() < away_until:
                    assert await holds_nothing(), "a claim while the broker is away"
                    await asyncio.sleep(0.05)
                assert await count_rows(env.pg_dsn) > before, "rows kept coming meanwhile"
            finally:
                await amqp_proxy.restore()
            await wait_until(lambda: _broker(group.events("connection_restored")), timeout_s=60,
                             what="connection_restored (broker)")

            ids = backlog + await producer.stop()
            await consumer.wait_all(ids, timeout_s=120, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            outcome = report("network cut (pg, then amqp)", ids, consumer)
            print(f"[chaos] network cut: {tally.summary()}")
            assert tally.in_flight == 2, tally.summary()
            assert_exactly_delivered(ids, consumer, outcome, tally.rows_in_flight)
            assert relay.alive()
            for event in ("connection_lost", "connection_restored"):
                assert len(_database_events(group, event)) == 1, event
            for event in ("connection_lost", "connection_restored"):
                assert len(_broker(group.events(event))) == 1, event
            # The proxies run on this event loop: wait for the exit without blocking it.
            assert await stop_relay(relay) == 0
    finally:
        producer.kill()
        await probe.close()
        await consumer.stop()
        await pg_proxy.close()
        await amqp_proxy.close()


def _database_events(group: object, event: str) -> list[object]:
    """The worker pool's Supervisor events (the LISTEN session logs its own)."""
    found = group.events(event)  # type: ignore[attr-defined]
    return [e for e in found if e.get("connection") == "database"]


def _broker(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The supervisor's log lines about the broker connection (relay/supervise.py)."""
    return [e for e in events if e.get("connection") == "broker"]
