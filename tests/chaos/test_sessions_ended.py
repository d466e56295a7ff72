"""Sessions ended one at a time at random moments: two relays with streams on, outbox rows
from a producer process and stream rows from the test, while the server ends one of the
relays' sessions (`pg_terminate_backend`, what a failover, a restart of a pooler or an admin
does to a single session) every 0.1-0.6 s for 20 s: the worker's pooled sessions, the LISTEN,
the wake-up lock's, the stream side's, each slot's and the status page's (polled throughout).

Every outbox row arrives (duplicates only from batches whose session ended mid-flight), every
stream row is in the stream once, both relays still run, and neither logged an error: each of
these sessions' ends is an outage its owner expects. Two bugs of this kind were found by
reading logs (a wake-up session ending during its lock wait ended the relay; the stream side
never opened a new session after the server ended its own); this test ends every kind of
session at every moment of its life. In single-active mode the same faults end leaders, which
exit by design and are started again, while the other relay leads. Seeded: a failure names its
seed."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.harness import relays
from tests.helpers import Env, pg_execute, pg_fetch, wait_until
from tests.integration.test_http import http_get
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import ProducerProcess
from tests.kit.stream import a_stream, insert_stream_rows, read_stream, stream_table_empty

pytestmark = pytest.mark.chaos

FAULT_S = 20.0
BATCH = 100


async def end_a_session(dsn: str, rng: random.Random, ended: Counter[str]) -> None:
    """End one relay session of the database: a kind of session first, then one of that kind,
    so that every kind is hit about as often, however many sessions of it there are."""
    sessions = await pg_fetch(
        dsn, "SELECT pid, split_part(application_name, ' ', 2) AS role "
        "FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'outbox-relay %' ORDER BY pid")
    if sessions:
        role = rng.choice(sorted({r["role"] for r in sessions}))
        victim = rng.choice([r for r in sessions if r["role"] == role])
        await pg_execute(dsn, "SELECT pg_terminate_backend($1)", victim["pid"])
        ended[victim["role"]] += 1


async def test_sessions_ended_at_random__nothing_lost_streams_once_no_error_logged(
    env: Env, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    consumer = await Consumer(env.amqp_url, env.queue, robust=True).start()
    producer = ProducerProcess(env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids",
                               rate=300, chunk=10)
    stream_ids: list[str] = []
    ended: Counter[str] = Counter()
    try:
        async with a_stream(f"relay-chaos-{secrets.token_hex(5)}") as stream:
            with relays(env, tmp_path, streams="true", stream_producers=2, stream_lease_s=3,
                        reconnect_max_s=1, batch_size=BATCH) as group:
                ports = [free_port(), free_port()]
                procs = [group.start(http_port=port) for port in ports]
                for proc in procs:
                    await wait_until(lambda p=proc: '"relay_started"' in p.log_text(),
                                     what="relay_started")
                await producer.start()
                stop = asyncio.Event()

                async def write_stream_rows() -> None:
                    while not stop.is_set():
                        stream_ids.extend(await insert_stream_rows(env.pg_dsn, stream, 5))
                        await asyncio.sleep(0.05)

                writer = asyncio.ensure_future(write_stream_rows())
                loop = asyncio.get_running_loop()
                until = loop.time() + FAULT_S
                while loop.time() < until:
                    await asyncio.sleep(rng.uniform(0.1, 0.6))
                    await end_a_session(env.pg_dsn, rng, ended)
                    for proc in procs:
                        assert proc.alive(), f"seed {seed}: a relay exited; ended {dict(ended)}"
                    # The status page's own session is among those ended; it answers 200, or
                    # 503 with the reason while its session is away, never an error of its own.
                    for port in ports:
                        code, text = await http_get(port, "/status")
                        assert code in (200, 503), f"seed {seed}: /status {code} {text[:300]}"
                stop.set()
                await writer
                ids = await producer.stop()
                print(f"\n[chaos] sessions ended (seed {seed}): {dict(ended)}; "
                      f"{len(ids)} outbox rows, {len(stream_ids)} stream rows")
                await consumer.wait_all(ids, timeout_s=90, dsn=env.pg_dsn)
                await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=90,
                                 what=f"the stream table emptied (seed {seed})")
                got = await read_stream(stream, at_least=len(stream_ids))
                in_stream = Counter(m["id"] for m in got)
                assert set(in_stream) == set(stream_ids), f"seed {seed}"
                assert max(in_stream.values()) == 1, f"seed {seed}: a stream row twice"
                duplicates = len(consumer.ids) - len(set(consumer.ids))
                assert set(consumer.ids) == set(ids), f"seed {seed}"
                # A worker session ended mid-batch after the broker confirmed: that batch again.
                assert duplicates <= BATCH * ended["worker"], (
                    f"seed {seed}: {duplicates} duplicates, {ended['worker']} worker sessions")
                errors = [e for p in procs for e in p.log_events() if e.get("level") == "error"]
                assert not errors, f"seed {seed}: {errors[:5]}"
                for port in ports:

                    async def healthy(port: int = port) -> bool:
                        return (await http_get(port, "/healthz"))[0] == 200

                    await wait_until(healthy, timeout_s=30, what=f"/healthz 200 (seed {seed})")
                for proc in procs:
                    assert proc.alive(), f"seed {seed}"
                    assert await proc.stop() == 0, f"seed {seed}"
                missed = {"worker", "streams", "listener", "status"} - set(ended)
                assert not missed, f"seed {seed}: no session of {missed} ended: {dict(ended)}"
    finally:
        producer.kill()
        await consumer.stop()


async def test_single_active_sessions_ended__a_leader_losing_its_lock_exits_and_a_standby_leads(
    env: Env, tmp_path: Path
) -> None:
    """RELAY_MODE=single-active under the same faults: a leader whose lock session ends exits
    with status 2 after logging `leadership_lost` (docs/ordering.md), and is started again as
    a supervisor would; the other relay leads meanwhile. Every row arrives; nothing but the
    lost leaderships is logged as an error."""
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    consumer = await Consumer(env.amqp_url, env.queue, robust=True).start()
    producer = ProducerProcess(env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids",
                               rate=300, chunk=10)
    ended: Counter[str] = Counter()
    exits: list[int | None] = []
    try:
        with relays(env, tmp_path, mode="single-active", leader_poll_interval_s=0.5,
                    reconnect_max_s=1, batch_size=BATCH) as group:
            running = [group.start(), group.start()]
            await wait_until(lambda: any('"leader_elected"' in p.log_text() for p in running),
                             what="a leader elected")
            await producer.start()
            loop = asyncio.get_running_loop()
            until = loop.time() + FAULT_S

            def start_again_what_exited() -> None:
                for i, proc in enumerate(running):
                    if not proc.alive():
                        exits.append(proc.proc.wait() if proc.proc else None)
                        running[i] = group.start()  # as systemd or a Deployment would

            while loop.time() < until:
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                await end_a_session(env.pg_dsn, rng, ended)
                start_again_what_exited()
            await asyncio.sleep(2.0)  # a leader whose lock session just ended exits meanwhile
            start_again_what_exited()
            for proc in running:
                await wait_until(lambda p=proc: '"relay_started"' in p.log_text(),
                                 what=f"relay_started (seed {seed})")
            ids = await producer.stop()
            print(f"\n[chaos] single-active, sessions ended (seed {seed}): {dict(ended)}; "
                  f"{len(exits)} leader exits; {len(ids)} rows")
            await consumer.wait_all(ids, timeout_s=90, dsn=env.pg_dsn)
            assert set(consumer.ids) == set(ids), f"seed {seed}"
            assert all(code == 2 for code in exits), f"seed {seed}: exit codes {exits}"
            lost = [e for p in group.procs for e in p.log_events()
                    if e.get("event") == "leadership_lost"]
            assert len(lost) == len(exits), f"seed {seed}: {len(lost)} leadership_lost, {exits}"
            errors = [e for p in group.procs for e in p.log_events()
                      if e.get("level") == "error"
                      and e.get("event") not in ("leadership_lost", "relay_failed")]
            assert not errors, f"seed {seed}: {errors[:5]}"
            failed = [e for p in group.procs for e in p.log_events()
                      if e.get("event") == "relay_failed"]
            assert all("leader lock connection lost" in e["error"] for e in failed), (
                f"seed {seed}: {failed[:3]}")
            assert ended["leader"] >= 1, f"seed {seed}: no leader session ended: {dict(ended)}"
            for proc in running:
                assert proc.alive(), f"seed {seed}"
                assert await proc.stop() == 0, f"seed {seed}"
    finally:
        producer.kill()
        await consumer.stop()
