"""The relay's memory has a ceiling set by bytes, not rows: rows near the size limit committed
together stay under the Deployment's memory limit (real servers, a real `relay run`)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers import Env, count_rows, pg_fetch, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

DEPLOYMENT = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "deployment.yaml"


def _deployment_limit_bytes() -> int:
    """The relay container's memory limit in deploy/k8s/deployment.yaml."""
    for doc in yaml.safe_load_all(DEPLOYMENT.read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            limit = container.get("resources", {}).get("limits", {}).get("memory")
            if container["name"] == "relay" and limit:
                value, unit = re.fullmatch(r"(\d+)(Mi|Gi)", limit).groups()  # type: ignore[union-attr]
                return int(value) * (1 << (20 if unit == "Mi" else 30))
    raise AssertionError("no memory limit for the relay container in deployment.yaml")


def _peak_rss_bytes(pid: int) -> int:
    """VmHWM: the process's peak resident set so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_rows_near_the_size_limit_committed_together__peak_memory_under_the_limit(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """Twelve 15 MiB rows took a relay to 483 MiB (limit 384 MiB): every replica that claimed
    them was OOM-killed, in a loop, and the line stopped."""
    body = "x" * (15 * 1024 * 1024 - 2)  # a JSON string of 15 MiB
    async with pg_session(env.pg_dsn) as conn, conn.transaction():
        for _ in range(12):
            await insert_rows(conn, env.exchange, env.routing_key, [body])
        await insert_rows(conn, env.exchange, env.routing_key, ({"n": g} for g in range(1, 301)))
    relay = start_relay(poll_interval_s=1)
    await consumer.wait_for(312, timeout_s=120)
    await wait_until(lambda: _empty(env), what="an empty outbox")
    peak = _peak_rss_bytes(relay.pid)
    limit = _deployment_limit_bytes()
    print(f"relay peak RSS {peak / 2**20:.0f} MiB, Deployment limit {limit / 2**20:.0f} MiB")
    assert peak < limit, f"peak RSS {peak / 2**20:.0f} MiB >= limit {limit / 2**20:.0f} MiB"
    assert consumer.duplicates() == 0
    assert relay.alive()
    await asyncio.sleep(0)


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


@pytest.mark.parametrize(("mode", "keyed"), [("parallel", False), ("parallel", True),
                                             ("single-active", True)])
async def test_claims_of_every_kind__stop_at_the_byte_budget_and_keep_key_order(
    env: Env, consumer: Consumer, start_relay, mode: str, keyed: bool
) -> None:
    """The unkeyed claim, the keyed claim function and the single-active claim all stop once
    the rows taken reach RELAY_BATCH_MAX_BYTES (the first row always goes)."""
    pad = "z" * (1024 * 1024 - 2)  # 1 MiB
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                      ({"n": g, "pad": pad} for g in range(1, 13)),
                      ordering_keys="k" if keyed else None)
    relay = start_relay(batch_max_bytes=int(2.5 * 1024 * 1024), mode=mode, log_level="debug",
                        leader_poll_interval_s=0.2)
    await consumer.wait_for(12, timeout_s=60)

    def claimed_so_far() -> list[int]:
        return [e["claimed"] for e in relay.log_events() if e.get("event") == "batch_settled"]

    # A message reaches the consumer before its batch commits and logs batch_settled.
    await wait_until(lambda: sum(claimed_so_far()) >= 12, timeout_s=30,
                     what="batch_settled lines for all 12 rows")
    claimed = claimed_so_far()
    assert sum(claimed) == 12, claimed
    # Rows of 1 MiB against 2.5 MiB: a batch takes rows while the bytes before it are under
    # the budget, so three at most.
    assert max(claimed) <= 3, claimed
    if keyed:
        assert [json.loads(m.body)["n"] for m in consumer.messages] == list(range(1, 13))


@pytest.mark.parametrize(("mode", "keyed"), [("parallel", False), ("parallel", True),
                                             ("single-active", False)])
async def test_rows_over_the_message_limit__parked_as_too_large_without_leaving_postgresql(
    env: Env, consumer: Consumer, start_relay, mode: str, keyed: bool
) -> None:
    """A 150 MiB row took a relay with the defaults to 358 MiB before it parked the row; a
    larger one, or two on two lanes, passed the Deployment's limit: OOM-killed, and the next
    replica claimed the same lowest-seq row and died too. Rows over RELAY_MAX_MESSAGE_BYTES
    are parked by the claim's transaction; their content never reaches the relay."""
    # JSON strings of 150 and 60 MiB (the quotes count)
    big = {150: "b" * (150 * 1024 * 1024 - 2), 60: "m" * (60 * 1024 * 1024 - 2)}
    key = "k" if keyed else None
    async with pg_session(env.pg_dsn) as conn, conn.transaction():
        await insert_rows(conn, env.exchange, env.routing_key, ({"n": g} for g in range(1, 501)))
        for size in (150, 60, 60):
            await insert_rows(conn, env.exchange, env.routing_key, [big[size]], ordering_keys=key)
        await insert_rows(conn, env.exchange, env.routing_key,
                          ({"n": 500 + g} for g in range(1, 501)), ordering_keys=key)
    relay = start_relay(poll_interval_s=1, mode=mode, leader_poll_interval_s=0.2)
    await consumer.wait_for(1000, timeout_s=120)
    await wait_until(lambda: _empty(env), what="an empty outbox", timeout_s=60)
    peak = _peak_rss_bytes(relay.pid)
    print(f"relay peak RSS {peak / 2**20:.0f} MiB")
    # The relay's idle size is ~90 MiB; one 60 MiB body in memory would show.
    assert peak < 160 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB: a large row's content " \
        "reached the relay"
    parked = await pg_fetch(env.pg_dsn, "SELECT reason, octet_length(content::text) AS size "
                            "FROM queue_message_dead ORDER BY size DESC")
    assert [r["reason"].split(":")[0] for r in parked] == ["too_large"] * 3, parked
    assert [r["size"] for r in parked] == [150 * 2**20, 60 * 2**20, 60 * 2**20]
    assert "RELAY_MAX_MESSAGE_BYTES" in parked[0]["reason"]
    assert sorted(json.loads(m.body)["n"] for m in consumer.messages) == list(range(1, 1001))
    assert consumer.duplicates() == 0
    assert relay.alive()
