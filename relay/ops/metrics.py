"""Prometheus metrics of one relay process, and the bounded-rate backlog poller behind them.

Every series lives in a registry of its own (not the library's global one), so a test can hold
several relays' metrics side by side. Names follow Prometheus conventions: base units in the
name (`_seconds`, `_rows`), counters end in `_total` once exposed.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from relay.errors import RelayError
from relay.interfaces import Kind, OutboxRow, Reason, Verdict
from relay.version import build_labels

log = structlog.get_logger("relay.ops.metrics")

BATCH_SIZE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
AGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

class BulkHistogram:
    """A histogram fed once per batch with many values, exposed through a custom collector.

    prometheus_client's Histogram.observe() costs about 5 µs a call here: one call per row at
    20,000 rows/s would take a tenth of a core. Bucketing a batch's values with bisect and
    adding them up costs a small fraction of that; scrapes read the totals.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(self._bounds) + 1)  # the last slot is +Inf
        self._sum = 0.0
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        """Add every value (the event loop is the only writer, so no lock is needed)."""
        ordered = sorted(values)
        if not ordered:
            return
        counts, below = self._counts, 0
        for i, bound in enumerate(self._bounds):
            upto = bisect.bisect_right(ordered, bound)  # values <= bound
            counts[i] += upto - below
            below = upto
        counts[-1] += len(ordered) - below
        self._sum += sum(ordered)

    def collect(self) -> Iterator[Metric]:
        """The cumulative buckets, sum and count, as Prometheus expects them."""
        cumulative, running = [], 0
        for bound, count in zip([*self._bounds, float("inf")], self._counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=cumulative, sum_value=self._sum
        )


class BrokerNodeCollector:
    """relay_broker_node{node} (1 for the node the broker connection is on, none before the
    first connection) and relay_broker_failovers_total, read at scrape time."""

    def __init__(self, read: Callable[[], tuple[str | None, int]],
                 registry: CollectorRegistry) -> None:
        self._read = read
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The two series as the connection has them now."""
        node, failovers = self._read()
        gauge = GaugeMetricFamily(
            "relay_broker_node", "1 for the RabbitMQ node (host:port) this relay is connected "
            "to, or was last.", labels=["node"])
        if node is not None:
            gauge.add_metric([node], 1.0)
        yield gauge
        yield CounterMetricFamily(
            "relay_broker_failovers", "Broker connections that went to another node than the "
            "one before.", value=failovers)


# Exchange names come from rows: the label set is bounded, so that producers that name an
# exchange per tenant or per request cannot grow the series (and every scrape) without end.
EXCHANGE_SERIES = 100
OTHER_EXCHANGES = "(other)"


class RelayMetrics:
    """The relay's series; the worker reports each settled batch through observe_batch()."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.published = Counter(
            "relay_messages_published",
            "Messages confirmed by the broker and settled, by exchange (the first "
            f"{EXCHANGE_SERIES} exchanges seen; later ones count as {OTHER_EXCHANGES!r}).",
            ["exchange"], registry=r,
        )
        self._exchanges: set[str] = set()
        self.failed = Counter(
            "relay_messages_failed",
            "Rows not published by their batch (retried, dead-lettered, or left untouched for an "
            "outside cause such as broker_lost), by reason code.",
            ["reason"], registry=r,
        )
        self.verdicts = Counter(
            "relay_row_verdicts",
            "Every claimed row's verdict (published, retry, dead, untouched), by reason code.",
            ["verdict", "reason"], registry=r,
        )
        self.dead_lettered = Counter(
            "relay_messages_dead_lettered", "Rows moved to the dead-letter table, by reason.",
            ["reason"], registry=r,
        )
        self.batch_rows = Histogram(
            "relay_batch_size_rows", "Rows claimed per non-empty batch.",
            buckets=BATCH_SIZE_BUCKETS, registry=r,
        )
        self.publish_seconds = Histogram(
            "relay_publish_duration_seconds",
            "Seconds from the first publish of a batch to its last confirm.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_seconds = Histogram(
            "relay_batch_duration_seconds",
            "Seconds from claim to commit of a batch (claim, publish, settle).",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.message_age = BulkHistogram(
            "relay_message_age_at_confirm_seconds",
            "Seconds from a row's created_at (database clock) to the broker's confirm.",
            AGE_BUCKETS, r,
        )
        self.backlog_due = Gauge(
            "relay_backlog_due_rows", "Rows due for publishing now (last poll).", registry=r
        )
        self.backlog_delayed = Gauge(
            "relay_backlog_delayed_rows",
            "Rows waiting for a later available_at: delayed or retrying (last poll).", registry=r,
        )
        self.oldest_due_age = Gauge(
            "relay_oldest_due_age_seconds",
            "Age of the oldest due row, 0 when none (last poll).", registry=r,
        )
        self.oldest_due_age_by_class = Gauge(
            "relay_oldest_due_age_by_class_seconds",
            "Age of the oldest due row of transactions that wrote fewer than 1,000 rows "
            "(class=live) or more (class=bulk), 0 when none (last poll).", ["class"],
            registry=r,
        )
        self.dead_rows = Gauge(
            "relay_dead_letter_rows", "Rows in the dead-letter table (last poll).", registry=r
        )
        self.stream_rows = Gauge(
            "relay_stream_rows", "Rows waiting for their RabbitMQ streams (last poll).",
            registry=r,
        )
        self.stream_oldest_age = Gauge(
            "relay_stream_oldest_age_seconds",
            "Age of the oldest row waiting for its stream, 0 when none (last poll).", registry=r,
        )
        self.stream_dead_rows = Gauge(
            "relay_stream_dead_rows",
            "Stream rows parked because they can never be sent (last poll).", registry=r,
        )
        self.backlog_polled = Gauge(
            "relay_backlog_last_poll_timestamp_seconds",
            "Unix time of the last successful backlog poll.", registry=r,
        )
        self.lock_strangers = Gauge(
            "relay_lock_strangers",
            "Sessions holding the leader lock (role=leader) or the wake-up sleeper role "
            "(role=wakeup) of this table that are not relays (last poll).", ["role"],
            registry=r,
        )
        self.backlog_poll_errors = Counter(
            "relay_backlog_poll_errors", "Backlog polls that failed.", registry=r
        )
        self.archive_upkeep_failures = Gauge(
            "relay_archive_upkeep_failures",
            "Failed tries in a row to make the partitioned archive's coming days (0 once one "
            "succeeds; a try comes every minute while failing).", registry=r,
        )
        self.connected = Gauge(
            "relay_connected", "1 while the connection to the server is up.", ["server"],
            registry=r,
        )
        self.broker_blocked = Gauge(
            "relay_broker_blocked",
            "1 while RabbitMQ blocks publishers (memory or disk alarm).", registry=r,
        )
        self.last_activity = Gauge(
            "relay_loop_last_activity_timestamp_seconds",
            "Unix time the relay loop last woke up or settled a batch.", registry=r,
        )
        self.last_batch_at = 0.0  # time.monotonic() of the last settled batch
        # Which build runs: relay_build_info{version,python} 1, for dashboards and rollouts.
        Info("relay_build", "The relay's version and Python.", registry=r).info(build_labels())

    def watch_connections(
        self,
        postgres: Callable[[], bool],
        rabbitmq: Callable[[], bool],
        blocked: Callable[[], bool],
        broker_node: Callable[[], tuple[str | None, int]] | None = None,
    ) -> None:
        """Read connection state at scrape time (no polling, never stale)."""
        self.connected.labels("postgres").set_function(lambda: float(postgres()))
        self.connected.labels("rabbitmq").set_function(lambda: float(rabbitmq()))
        self.broker_blocked.set_function(lambda: float(blocked()))
        if broker_node is not None:
            BrokerNodeCollector(broker_node, self.registry)

    def _exchange_label(self, exchange: str) -> str:
        """The exchange's own series while fewer than EXCHANGE_SERIES exist, else the shared
        one."""
        if exchange in self._exchanges:
            return exchange
        if len(self._exchanges) < EXCHANGE_SERIES:
            self._exchanges.add(exchange)
            return exchange
        return OTHER_EXCHANGES

    def observe_batch(
        self,
        rows: Sequence[OutboxRow],
        verdicts: Sequence[Verdict],
        *,
        publish_s: float,
        batch_s: float,
        confirmed_at: float,
    ) -> None:
        """Record one committed batch (called by the worker after its commit); never raises."""
        try:
            self._observe_batch(rows, verdicts, publish_s=publish_s, batch_s=batch_s,
                                confirmed_at=confirmed_at)
        except Exception:  # a metrics bug must never fail a batch that is already committed
            log.exception("metrics_observe_failed")

    def _observe_batch(
        self,
        rows: Sequence[OutboxRow],
        verdicts: Sequence[Verdict],
        *,
        publish_s: float,
        batch_s: float,
        confirmed_at: float,
    ) -> None:
        self.last_batch_at = time.monotonic()
        self.last_activity.set(time.time())
        if not rows:
            return
        self.batch_rows.observe(len(rows))
        if publish_s > 0:
            self.publish_seconds.observe(publish_s)
        self.batch_seconds.observe(batch_s)
        published = {v.row_id for v in verdicts if v.kind is Kind.PUBLISHED}
        done = [row for row in rows if row.id in published]
        # A published row has an exchange; the type allows NULL for rows of classic tables.
        exchanges: Tally[str] = Tally(row.exchange or "" for row in done)
        # Clock skew between the database and this host can make an age negative: count it as 0.
        # A producer may write created_at = +-infinity: such a row has no age to observe.
        ages = [confirmed_at - row.created_at_s for row in done
                if row.created_at_s is not None and math.isfinite(row.created_at_s)]
        self.message_age.observe_many(age if age > 0 else 0.0 for age in ages)
        for exchange, n in exchanges.items():
            self.published.labels(self._exchange_label(exchange)).inc(n)
        fates: Tally[tuple[Kind, str]] = Tally((v.kind, v.code) for v in verdicts)
        for (kind, code), n in fates.items():
            self.verdicts.labels(kind.value, code).inc(n)
            if kind is Kind.DEAD:
                self.dead_lettered.labels(code).inc(n)
            if kind is not Kind.PUBLISHED and code != Reason.HELD.value:
                self.failed.labels(code).inc(n)

    def loop_woke(self) -> None:
        """The relay loop woke up (kept for the activity gauge)."""
        self.last_activity.set(time.time())

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


@dataclass(slots=True)
class BacklogSnapshot:
    """The last backlog poll: figures, when it was taken, and the error if it failed."""

    figures: dict[str, Any] | None = None
    polled_at: float | None = None  # time.monotonic()
    error: str | None = None

    def age_s(self, now: float) -> float | None:
        """Seconds since the last successful poll, None before the first one."""
        return None if self.polled_at is None else now - self.polled_at


class BacklogPoller:
    """Runs the backlog query at most once per interval, whatever the scrape rate.

    Scrapes and probes read the last snapshot; N relays each poll, so the interval bounds the
    load to N queries per interval.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[dict[str, Any]]],
        metrics: RelayMetrics | None,
        interval_s: float,
    ) -> None:
        self._fetch = fetch
        self._metrics = metrics
        self.interval_s = interval_s
        self.snapshot = BacklogSnapshot()
        self.polled = asyncio.Event()  # set after the first poll (success or failure)
        self._strangers_seen: set[tuple[str, int]] = set()

    async def poll_once(self) -> None:
        """Run the query once and update the snapshot and gauges."""
        try:
            figures = await self._fetch()
        except RelayError as exc:
            if self.snapshot.error is None:
                log.warning("backlog_poll_failed", error=str(exc))
            self.snapshot.error = str(exc)
            if self._metrics is not None:
                self._metrics.backlog_poll_errors.inc()
            self.polled.set()
            return
        self.snapshot = BacklogSnapshot(figures, time.monotonic(), None)
        m = self._metrics
        if m is not None:
            m.backlog_due.set(float(figures.get("due") or 0))
            m.backlog_delayed.set(float(figures.get("delayed") or 0))
            m.oldest_due_age.set(float(figures.get("oldest_due_age_s") or 0.0))
            for cls in ("live", "bulk"):
                m.oldest_due_age_by_class.labels(cls).set(
                    float(figures.get(f"oldest_{cls}_due_age_s") or 0.0))
            m.dead_rows.set(float(figures.get("dead") or 0))
            m.stream_rows.set(float(figures.get("stream_rows") or 0))
            m.stream_oldest_age.set(float(figures.get("stream_oldest_age_s") or 0.0))
            m.stream_dead_rows.set(float(figures.get("stream_dead_rows") or 0))
            strangers = figures.get("lock_strangers") or []
            for role in ("leader", "wakeup"):
                m.lock_strangers.labels(role).set(
                    float(sum(1 for h in strangers if h["role"] == role)))
            m.backlog_polled.set(time.time())
        self._report_strangers(figures.get("lock_strangers") or [])
        self.polled.set()

    def _report_strangers(self, strangers: list[dict[str, Any]]) -> None:
        """A warning when the set of sessions holding a relay role's lock without being a
        relay changes to a non-empty one (one line per change, not per poll)."""
        seen = {(h["role"], h["pid"]) for h in strangers}
        if seen and seen != self._strangers_seen:
            for h in strangers:
                log.warning("relay_lock_held_by_stranger", role=h["role"], pid=h["pid"],
                            application_name=h["application_name"])
        self._strangers_seen = seen

    async def close(self) -> None:
        """Nothing to release: the queries run on the relay's pool."""

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            started = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # a bug here must not end the relay: log it and poll again
                log.exception("backlog_poll_crashed")
            await asyncio.sleep(max(self.interval_s - (time.monotonic() - started), 0.1))
