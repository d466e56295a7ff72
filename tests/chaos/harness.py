"""What the chaos tests share beside the kit (tests/kit/): relay processes, proxies to a
server, broker users, and the loss / duplicate report."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aio_pika

from tests.helpers import Env, RelayProcess, count_rows, wait_until
from tests.kit.consumer import Consumer


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


def report(name: str, ids: list[str], consumer: Consumer) -> Outcome:
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


def assert_exactly_delivered(ids: list[str], consumer: Consumer, outcome: Outcome,
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
    """Relays for one test, killed on exit even when the test fails; then the end of each
    relay's log is printed, so that the failure's report says what the relays did."""
    group = Relays(env, tmp_path, **overrides)
    try:
        yield group
    except BaseException:
        group.kill_all()
        for number, proc in enumerate(group.procs):
            print(proc.log_tail(f"relay {number}"))
        raise
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


def events_since(relay: RelayProcess, cut_at: float) -> list[str]:
    """The relay's log events from `cut_at` (wall clock) on, each as "<s after>: <event>
    <its fields>", for a failure message that shows what the relay waited for."""
    out = []
    for event in relay.log_events():
        if "timestamp" not in event:
            continue
        at = datetime.fromisoformat(str(event["timestamp"])).timestamp()
        if at >= cut_at:
            fields = {k: v for k, v in event.items() if k not in ("timestamp", "event")}
            out.append(f"{at - cut_at:.2f}: {event.get('event')} {fields}")
    return out
