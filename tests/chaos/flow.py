"""The skeleton every chaos scenario shares: a backlog, a consumer, a producer process (or
none), the probe that reads what relays hold at a fault, the tally of faults; then, once the
scenario fired its faults, the same verdict: every row arrived, the outbox is empty, and
duplicates stay within the rows the relays held at the instants of the faults."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.harness import (
    Outcome,
    Relays,
    assert_drained,
    assert_exactly_delivered,
    relays,
    report,
)
from tests.chaos.inflight import FaultTally, LockProbe
from tests.helpers import Env
from tests.kit.consumer import Consumer
from tests.kit.producer import ProducerProcess, fresh_ids, insert_with_ids


@dataclass
class ChaosFlow:
    """What a scenario drives while it fires its faults (see chaos_flow)."""

    env: Env
    group: Relays
    consumer: Consumer
    probe: LockProbe
    tally: FaultTally
    backlog: list[str]
    producer: ProducerProcess | None = None
    settled: bool = field(default=False, init=False)

    async def start_producer(self) -> None:
        """Rows keep coming from another process from now on (through the faults)."""
        assert self.producer is not None, "chaos_flow(rate=None) has no producer"
        await self.producer.start()

    async def settle(self, name: str, *, in_flight: int, timeout_s: float = 120.0,
                     note: str = "") -> Outcome:
        """The verdict: every row of the backlog and the producer arrived, the outbox is
        drained, exactly `in_flight` faults struck a relay holding rows, and duplicates are
        within the rows held at those instants."""
        ids = self.backlog + (await self.producer.stop() if self.producer is not None else [])
        await self.consumer.wait_all(ids, timeout_s=timeout_s, dsn=self.env.pg_dsn)
        await assert_drained(self.env.pg_dsn)
        outcome = report(name, ids, self.consumer)
        print(f"[chaos] {self.tally.name}: {self.tally.summary()}{note}")
        assert self.tally.in_flight == in_flight, self.tally.summary()
        assert_exactly_delivered(ids, self.consumer, outcome, self.tally.rows_in_flight)
        self.settled = True
        return outcome


@contextlib.asynccontextmanager
async def chaos_flow(
    env: Env,
    tmp_path: Path,
    fault: str,
    *,
    backlog: int,
    rate: int | None = None,
    chunk: int = 50,
    manual_ack: bool = False,
    **relay_overrides: object,
) -> AsyncIterator[ChaosFlow]:
    """A backlog inserted, a consumer and a probe started, a producer process ready (when
    `rate` is given; the scenario starts it), relays started through `flow.group` with
    `relay_overrides`; everything stopped and killed at the end, also when the block fails."""
    ids = fresh_ids(backlog)
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, ids)
    consumer = await Consumer(env.amqp_url, env.queue, robust=True, manual_ack=manual_ack).start()
    probe = LockProbe(env.pg_dsn)
    producer = None if rate is None else ProducerProcess(
        env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids", rate=rate, chunk=chunk)
    try:
        with relays(env, tmp_path, **relay_overrides) as group:
            yield ChaosFlow(env, group, consumer, probe, FaultTally(fault), ids, producer)
    finally:
        if producer is not None:
            producer.kill()
        await probe.close()
        await consumer.stop()
