"""PostgreSQL restarts (a private cluster, never the shared one) while relays hold claimed rows
of a backlog still draining: nothing is lost, no row stays locked, the batches in flight are
rolled back, duplicates stay within the rows they held, each outage is logged once."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.flow import chaos_flow
from tests.chaos.inflight import FaultTally, Held, LockProbe, caught_holding_rows
from tests.chaos.pgcluster import PrivateCluster
from tests.helpers import RELAY_BIN, Env, RelayProcess, count_rows, pg_fetch, wait_until

pytestmark = pytest.mark.chaos

BACKLOG = 40_000
REPLICAS = 2


@pytest.fixture
def private_pg() -> Iterator[PrivateCluster]:
    """A started private cluster, destroyed after the test."""
    cluster = PrivateCluster().init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


async def _restart_mid_batch(cluster: PrivateCluster, procs: list[RelayProcess],
                             probe: LockProbe, dsn: str) -> tuple[Held, int]:
    """Freeze the relays at an instant they hold claimed rows, stop PostgreSQL (fast: open
    transactions roll back), thaw them into the outage, start PostgreSQL again."""
    async with caught_holding_rows(procs, probe, timeout_s=30) as held:
        left = await count_rows(dsn)
        await probe.close()
        await asyncio.to_thread(cluster.stop, "fast")
    await asyncio.to_thread(cluster.start)
    return held, left


async def test_postgres_restart__mid_batch_loses_nothing_and_rolls_back_what_was_in_flight(
    private_pg: PrivateCluster, amqp_url: str, broker_names: tuple[str, str], tmp_path: Path
) -> None:
    env = Env(pg_dsn=private_pg.dsn, amqp_url=amqp_url, exchange=broker_names[0],
              queue=broker_names[1])
    # `relay migrate` as users run it: the default notify mode.
    await asyncio.to_thread(subprocess.run, [RELAY_BIN, "migrate"], env=env.relay_env(),
                            check=True, capture_output=True, timeout=60)
    async with chaos_flow(env, tmp_path, "postgres restart", backlog=BACKLOG,
                          reconnect_max_s=2, batch_size=200, concurrency=2) as flow:
        procs = [flow.group.start() for _ in range(REPLICAS)]
        for p in procs:  # a relay still starting exits when PostgreSQL is away
            await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
        held, left = await _restart_mid_batch(private_pg, procs, flow.probe, env.pg_dsn)
        flow.tally.record(held)
        await flow.settle("postgres restart", in_flight=1, note=f" rows_left={left}")
        assert left > held.rows, "the backlog was still draining"
        assert await _statuses(env.pg_dsn, flow.tally) == {"aborted"}, "batches rolled back"
        assert all(p.alive() for p in procs)
        assert [p.terminate() for p in procs] == [0] * REPLICAS
        for p in procs:
            _assert_outage_logged_once(p)


def _assert_outage_logged_once(relay: RelayProcess) -> None:
    """One outage of the worker's pool: connection_lost then connection_restored, once each
    (the LISTEN session logs its own), and no drain_failed: every driver error of the outage
    is translated into a database error."""
    events = relay.log_events()
    assert not [e for e in events if e["event"] == "drain_failed"], events
    pool = [e["event"] for e in events if e.get("connection") == "database"]
    assert pool == ["connection_lost", "connection_restored"], pool


async def _statuses(dsn: str, tally: FaultTally) -> set[str]:
    """Commit status of every relay transaction sampled at a fault (a fresh cluster: epoch 0)."""
    xids = [x for held in tally.hits for x in held.rows_by_xid]
    rows = await pg_fetch(dsn, "SELECT pg_xact_status(x::xid8) FROM unnest($1::text[]) AS x",
                            xids)
    return {r[0] for r in rows}
