"""The one consumer of the tests: consumes a queue and records every receipt.

Plain (`Consumer(url, queue)`): one connection, no acks, for tests whose broker stays up.
`robust=True` reconnects and consumes again after the broker or the link comes back;
`manual_ack=True` acks each message after recording it, so that messages on the wire when the
broker stops are redelivered instead of lost (a receipt the broker flags as redelivered is
recorded in `redelivered`, its own retry to us, not the relay's republish).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from tests.helpers import count_rows, pg_session, wait_until

QUIET_S = 5.0  # nothing arrives for this long while nothing is left anywhere: a loss


@dataclass
class Consumer:
    """Consumes one queue and records every message it receives, in order."""

    amqp_url: str
    queue: str
    robust: bool = False
    manual_ack: bool = False
    prefetch: int = 1000
    messages: list[aio_pika.abc.AbstractIncomingMessage] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # message_id of every receipt, in order
    redelivered: list[str] = field(default_factory=list)  # ids the broker flagged redelivered
    arrivals: dict[str, float] = field(default_factory=dict)  # first receipt, monotonic
    times: list[float] = field(default_factory=list)  # every receipt, monotonic, in order
    _conn: Any = None

    async def start(self) -> Consumer:
        """Connect and start consuming."""
        if self.robust:
            self._conn = await aio_pika.connect_robust(self.amqp_url, reconnect_interval=0.5)
        else:
            self._conn = await aio_pika.connect(self.amqp_url)
        channel = await self._conn.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        queue = await channel.get_queue(self.queue, ensure=True)
        await queue.consume(self._on_message, no_ack=not self.manual_ack)
        return self

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        mid = str(message.message_id)
        self.messages.append(message)
        self.ids.append(mid)
        if message.redelivered:
            self.redelivered.append(mid)
        now = time.monotonic()
        self.times.append(now)
        self.arrivals.setdefault(mid, now)
        if self.manual_ack:
            with contextlib.suppress(Exception):
                await message.ack()

    async def stop(self) -> None:
        """Close the connection (again: nothing)."""
        if self._conn is not None and not self._conn.is_closed:
            await self._conn.close()

    def bodies(self) -> list[Any]:
        """Decoded JSON bodies, in order."""
        return [json.loads(m.body) for m in self.messages]

    def distinct(self) -> int:
        """Distinct message ids received."""
        return len(set(self.ids))

    def duplicates(self) -> int:
        """How many receipts were repeats of an earlier message_id."""
        return sum(n - 1 for n in Counter(self.ids).values())

    async def wait_for(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until at least `count` distinct message ids arrived."""
        await wait_until(lambda: self.distinct() >= count, timeout_s=timeout_s,
                         what=f"{count} distinct messages (have {self.distinct()})")

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
            if await count_rows(dsn) == 0 and await self.queue_depth() == 0:
                raise AssertionError("lost: outbox and queue empty")
            return False

        try:
            await wait_until(arrived_or_lost, timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as exc:
            depth = await self.queue_depth()
            where = await outbox_state(dsn, sorted(want - set(self.ids))) if dsn else ""
            raise AssertionError(
                f"{exc}: {len(want - set(self.ids))} of {len(want)} "
                f"messages missing; {depth} ready in the queue; {where}"
            ) from None

    async def queue_depth(self) -> int | str:
        """Messages ready in the queue (or why that is unknown)."""
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
