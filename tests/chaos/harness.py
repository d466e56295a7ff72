"""What the chaos tests share: a consumer that survives a broker restart, a steady producer,
relay processes, and the loss / duplicate report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika

from tests.helpers import Env, RelayProcess, count_rows, pg_execute, pg_session, wait_until
from tests.proxy import TcpProxy

QUIET_S = 5.0  # nothing arrives for this long while nothing is left anywhere: a loss


@dataclass
class RobustConsumer:
    """Consumes a queue over a robust connection (re-consumes after a broker restart).

    A message whose ack is lost with the connection comes again: counted as a duplicate.
    """

    amqp_url: str
    queue: str
    ids: list[str] = field(default_factory=list)
    # message ids of the receipts the broker flagged redelivered (its own retries to us)
    redelivered: list[str] = field(default_factory=list)
    arrivals: dict[str, float] = field(default_factory=dict)
    # Manual acks survive a broker restart (unacked messages are redelivered); tests that
    # never stop the consumer's broker consume without acks, about twice as fast.
    manual_ack: bool = True
    _conn: Any = None

    async def start(self) -> RobustConsumer:
        """Connect and consume with automatic ack."""
        self._conn = await aio_pika.connect_robust(self.amqp_url, reconnect_interval=0.5)
        channel = await self._conn.channel()
        await channel.set_qos(prefetch_count=2000)
        queue = await channel.get_queue(self.queue, ensure=True)
        # Manual acks: with no_ack, messages on the wire when the broker stops would be gone
        # and counted as lost by the relay's test; unacked ones are redelivered instead.
        await queue.consume(self._on_message, no_ack=not self.manual_ack)
        return self

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        mid = str(message.message_id)
        self.ids.append(mid)
        if message.redelivered:
            self.redelivered.append(mid)
        self.arrivals.setdefault(mid, time.monotonic())
        if self.manual_ack:
            with contextlib.suppress(Exception):
                await message.ack()

    async def stop(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            await self._conn.close()

    def distinct(self) -> int:
        """Distinct message ids received."""
        return len(set(self.ids))

    async def wait_all(self, ids: list[str], timeout_s: float, dsn: str | None = None) -> None:
        """Wait until every id arrived; the failure message says how many are missing.

        With `dsn`, a loss is proven early: ids still missing while the outbox is empty, the
        queue holds nothing and nothing arrived for QUIET_S, can no longer come.
        """
        want = set(ids)
        quiet = {"count": -1, "since": time.monotonic()}

        async def arrived_or_lost() -> bool:
            if want <= set(self.ids):
                return True
            if dsn is None:
                return False
            if len(self.ids) != quiet["count"]:
                quiet.update(count=len(self.ids), since=time.monotonic())
                return False
            if time.monotonic() - quiet["since"] < QUIET_S:
                return False
            if await count_rows(dsn) == 0 and await self._queue_depth() == 0:
                raise AssertionError("lost: outbox and queue empty")
            return False

        try:
            await wait_until(arrived_or_lost, timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as exc:
            depth = await self._queue_depth()
            where = await outbox_state(dsn, sorted(want - set(self.ids))) if dsn else ""
            raise AssertionError(
                f"{exc}: {len(want - set(self.ids))} of {len(want)} "
                f"messages missing; {depth} ready in the queue; {where}"
            ) from None

    async def _queue_depth(self) -> int | str:
        try:
            conn = await aio_pika.connect(self.amqp_url)
            try:
                channel = await conn.channel()
                queue = await channel.declare_queue(self.queue, passive=True)
                return int(queue.declaration_result.message_count or 0)
            finally:
                await conn.close()
        except Exception as exc:
            return f"unknown ({exc!r})"


async def outbox_state(dsn: str, missing: list[str]) -> str:
    """Where missing rows are: still in the outbox (and their attempts), or dead."""
    async with pg_session(dsn) as conn:
        live = await conn.fetch(
            "SELECT attempts, last_error, available_at > now() AS later, count(*) "
            "FROM queue_message WHERE id = ANY($1::uuid[]) GROUP BY 1, 2, 3", missing)
        dead = await conn.fetchval(
            "SELECT count(*) FROM queue_message_dead WHERE id = ANY($1::uuid[])", missing)
    return f"in the outbox: {[tuple(r) for r in live]}; dead: {dead}"


def via_proxy(url: str, port: int) -> str:
    """The same DSN or AMQP URL (user, password, database, query kept) through a local port."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


async def proxy_for(url: str) -> TcpProxy:
    """A started proxy to the server of a DSN or AMQP URL."""
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()


async def declare_names(env: Env) -> None:
    """The test's direct exchange and durable queue (bound with its routing key) on its broker;
    for a private node, where the shared fixtures do not reach."""
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        x = await channel.declare_exchange(env.exchange, aio_pika.ExchangeType.DIRECT,
                                           durable=True)
        q = await channel.declare_queue(env.queue, durable=True)
        await q.bind(x, env.routing_key)
    finally:
        await conn.close()


def fresh_ids(n: int) -> list[str]:
    """Client-side row ids, so a test knows every id it produced even across faults."""
    return [str(uuid.uuid4()) for _ in range(n)]


async def insert_with_ids(
    dsn: str, exchange: str, routing_key: str, ids: list[str], *, pad: int = 0
) -> None:
    """Insert rows with the given ids (classic columns), in one statement."""
    await pg_execute(
        dsn, "INSERT INTO queue_message (id, exchange, routing_key, content) "
        "SELECT i, $1, $2, jsonb_build_object('id', i::text, 'pad', repeat('x', $4)) "
        "FROM unnest($3::uuid[]) AS i",
        exchange, routing_key, ids, pad,
    )


async def produce(
    env: Env, total: int, *, chunk: int, interval_s: float, dsn: str | None = None
) -> list[str]:
    """Insert `total` rows in chunks at a steady pace; return their ids in order."""
    ids = fresh_ids(total)
    for start in range(0, total, chunk):
        await insert_with_ids(dsn or env.pg_dsn, env.exchange, env.routing_key,
                              ids[start:start + chunk])
        await asyncio.sleep(interval_s)
    return ids


@dataclass(frozen=True)
class Outcome:
    """What a consumer received against what a test produced.

    `republished` counts the relay's duplicates: repeats among first deliveries (the broker
    flags its own redeliveries to a consumer whose ack it lost; those are `redelivered`).
    """

    produced: int
    received: int
    lost: int
    unexpected: int
    duplicates: int
    republished: int
    redelivered: int

    def line(self) -> str:
        """The counts, for the test's output."""
        return (f"produced={self.produced} received={self.received} lost={self.lost} "
                f"unexpected={self.unexpected} duplicates={self.duplicates} "
                f"(relay republished={self.republished}, broker redelivered={self.redelivered})")


def report(name: str, ids: list[str], consumer: RobustConsumer) -> Outcome:
    """Print and return the outcome for the ids a test produced."""
    got = Counter(consumer.ids)
    first = Counter(consumer.ids)
    first.subtract(Counter(consumer.redelivered))
    outcome = Outcome(
        produced=len(ids),
        received=len(consumer.ids),
        lost=len(set(ids) - set(got)),
        unexpected=len(set(got) - set(ids)),
        duplicates=sum(n - 1 for n in got.values()),
        republished=sum(n - 1 for n in first.values() if n > 1),
        redelivered=len(consumer.redelivered),
    )
    print(f"\n[chaos] {name}: {outcome.line()}")
    return outcome


def assert_exactly_delivered(ids: list[str], consumer: RobustConsumer, outcome: Outcome,
                             max_republished: int) -> None:
    """Every produced id arrived, nothing else did, and the relay's duplicates stay within
    what the faults could have caught in flight."""
    assert set(consumer.ids) == set(ids), outcome.line()
    assert outcome.republished <= max_republished, (
        f"{outcome.republished} republished > {max_republished} rows in flight: {outcome.line()}")


class Relays:
    """Relay processes of one test, each with its own log file; all killed at the end."""

    def __init__(self, env: Env, tmp_path: Path, **overrides: object) -> None:
        self.env = env
        self.tmp_path = tmp_path
        self.overrides = overrides
        self.procs: list[RelayProcess] = []

    def start(self, **more: object) -> RelayProcess:
        """Start one more `relay run`."""
        log_path = self.tmp_path / f"relay-{len(self.procs)}.log"
        proc = RelayProcess(self.env.relay_env(**{**self.overrides, **more}), log_path).start()
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        """kill -9 whatever is still running."""
        for proc in self.procs:
            proc.kill()

    def events(self, name: str, *, connection: str | None = None) -> list[dict[str, Any]]:
        """Log events of that name from every relay process of the test; with `connection`,
        only the supervisor's lines about that connection (database, broker, listener, ...)."""
        return [e for p in self.procs for e in p.log_events() if e.get("event") == name
                and (connection is None or e.get("connection") == connection)]


@contextmanager
def relays(env: Env, tmp_path: Path, **overrides: object) -> Iterator[Relays]:
    """Relays for one test, killed on exit even when the test fails."""
    group = Relays(env, tmp_path, **overrides)
    try:
        yield group
    finally:
        group.kill_all()


async def assert_drained(dsn: str, timeout_s: float = 60.0) -> None:
    """The outbox ends empty: no row lost in it or left locked."""
    async def empty() -> bool:
        return await count_rows(dsn) == 0
    await wait_until(empty, timeout_s=timeout_s, interval_s=0.2,
                     what=f"an empty outbox (has {await count_rows(dsn)} rows)")


def rabbitmqctl(*args: str, timeout_s: float = 120.0) -> None:
    """Run rabbitmqctl on the local node; raise on failure."""
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=timeout_s)


@contextmanager
def broker_user(prefix: str, write: str = ".*") -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of the caller's own on vhost / (configure and read everything, write
    what `write` matches); deleted at the end. Yields (user, password)."""
    user, password = f"{prefix}_{secrets.token_hex(3)}", secrets.token_hex(8)
    rabbitmqctl("add_user", user, password)
    try:
        rabbitmqctl("set_permissions", "-p", "/", user, ".*", write, ".*")
        yield user, password
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            rabbitmqctl("delete_user", user)


def dump(obj: Any) -> str:
    """JSON for failure messages."""
    return json.dumps(obj, default=str)[:2000]
