"""Metrics bookkeeping and probe decisions, driven with plain values (no servers)."""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.interfaces import Kind, OutboxRow, Reason, Verdict
from relay.ops.http import Health, HttpServer, probe_body
from relay.ops.metrics import (
    EXCHANGE_SERIES,
    OTHER_EXCHANGES,
    BacklogPoller,
    BacklogSnapshot,
    RelayMetrics,
)


def row(i: int, exchange: str = "orders", created_at_s: float | None = 100.0) -> OutboxRow:
    return OutboxRow(f"id{i}", exchange, "rk", "{}", None, 0, created_at_s)


def sample(metrics: RelayMetrics, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def test_observe_batch__counts_by_exchange_reason_code_and_records_age_at_confirm() -> None:
    m = RelayMetrics()
    rows = [row(1), row(2), row(3, "billing"), row(4), row(5), row(6)]
    verdicts = [
        Verdict("id1", Kind.PUBLISHED), Verdict("id2", Kind.PUBLISHED),
        Verdict("id3", Kind.PUBLISHED),
        Verdict("id4", Kind.RETRY, Reason.CONFIRM_TIMEOUT, "no confirm", 1.0, counted=True),
        Verdict("id5", Kind.DEAD, Reason.EXCHANGE_NOT_FOUND, "exchange 'nope' not found"),
        Verdict("id6", Kind.UNTOUCHED, Reason.BROKER_LOST),
    ]
    m.observe_batch(rows, verdicts, publish_s=0.02, batch_s=0.03, confirmed_at=102.5)
    assert sample(m, "relay_messages_published_total", exchange="orders") == 2
    assert sample(m, "relay_messages_published_total", exchange="billing") == 1
    assert sample(m, "relay_messages_failed_total", reason="confirm_timeout") == 1
    assert sample(m, "relay_messages_failed_total", reason="exchange_not_found") == 1
    assert sample(m, "relay_messages_failed_total", reason="broker_lost") == 1
    assert sample(m, "relay_messages_dead_lettered_total", reason="exchange_not_found") == 1
    assert sample(m, "relay_row_verdicts_total", verdict="published", reason="published") == 3
    assert sample(m, "relay_row_verdicts_total", verdict="untouched", reason="broker_lost") == 1
    assert sample(m, "relay_batch_size_rows_sum") == 6
    assert sample(m, "relay_message_age_at_confirm_seconds_count") == 3
    assert sample(m, "relay_message_age_at_confirm_seconds_sum") == pytest.approx(7.5)
    assert sample(m, "relay_message_age_at_confirm_seconds_bucket", le="1.0") == 0
    assert sample(m, "relay_message_age_at_confirm_seconds_bucket", le="2.5") == 3


async def test_backlog_poller__sets_gauges_and_keeps_the_last_good_figures_on_error() -> None:
    from relay.errors import DatabaseError

    m = RelayMetrics()
    answers: list[dict[str, object] | Exception] = [
        {"due": 7, "delayed": 2, "oldest_due_age_s": 3.5, "dead": 1, "stream_rows": 40,
         "stream_oldest_age_s": 2.5, "stream_dead_rows": 3},
        DatabaseError("connection refused"),
    ]

    async def fetch() -> dict[str, object]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    poller = BacklogPoller(fetch, m, interval_s=1)
    await poller.poll_once()
    assert sample(m, "relay_backlog_due_rows") == 7
    assert sample(m, "relay_oldest_due_age_seconds") == 3.5
    assert sample(m, "relay_dead_letter_rows") == 1
    assert sample(m, "relay_stream_rows") == 40
    assert sample(m, "relay_stream_oldest_age_seconds") == 2.5
    assert sample(m, "relay_stream_dead_rows") == 3
    await poller.poll_once()
    assert poller.snapshot.error == "connection refused"
    assert poller.snapshot.figures is not None
    assert poller.snapshot.figures["due"] == 7
    assert sample(m, "relay_backlog_poll_errors_total") == 1


def health(**overrides: object) -> Health:
    values: dict[str, object] = {
        "worker_alive": lambda: True,
        "last_activity": lambda: 1000.0,
        "postgres_connected": lambda: True,
        "rabbitmq_connected": lambda: True,
        "broker_blocked": lambda: False,
        "backlog": lambda: BacklogSnapshot({"due": 3, "oldest_due_age_s": 1.0}, 1000.0),
        "ready_max_lag_s": 60.0,
        "stall_after_s": 120.0,
        "backlog_stale_after_s": 30.0,
    }
    values.update(overrides)
    return Health(**values)  # type: ignore[arg-type]


def test_readiness__passes_when_connected_unblocked_and_keeping_up() -> None:
    status, body = probe_body(health().readiness(now=1001.0))
    assert status == 200
    assert body["reasons"] == []


@pytest.mark.parametrize(
    ("overrides", "failing"),
    [
        ({"rabbitmq_connected": lambda: False}, "rabbitmq"),
        ({"postgres_connected": lambda: False}, "postgres"),
        ({"broker_blocked": lambda: True}, "flow_control"),
        ({"backlog": lambda: BacklogSnapshot({"due": 9, "oldest_due_age_s": 61.0}, 1000.0)},
         "lag"),
        ({"backlog": lambda: BacklogSnapshot(None, None, "refused")}, "lag"),
        ({"backlog": lambda: BacklogSnapshot({"oldest_due_age_s": 0.0}, 900.0)}, "lag"),
    ],
)
def test_readiness__fails_with_the_reason_named(
    overrides: dict[str, object], failing: str
) -> None:
    status, body = probe_body(health(**overrides).readiness(now=1001.0))
    assert status == 503
    assert [r.split(":")[0] for r in body["reasons"]] == [failing]


def test_liveness__fails_when_the_loop_stalls_not_while_the_broker_is_away_or_blocking() -> None:
    assert probe_body(health().liveness(now=1100.0))[0] == 200
    assert probe_body(health().liveness(now=1200.0))[0] == 503
    waiting = health(rabbitmq_connected=lambda: False)
    assert probe_body(waiting.liveness(now=1200.0))[0] == 200
    blocked = health(broker_blocked=lambda: True)
    assert probe_body(blocked.liveness(now=1200.0))[0] == 200
    assert probe_body(health(worker_alive=lambda: False).liveness(now=1001.0))[0] == 503


def test_route__serves_metrics_probes_and_refuses_the_rest() -> None:
    fresh = BacklogSnapshot({"due": 0, "oldest_due_age_s": 0.0}, time.monotonic())
    server = HttpServer("127.0.0.1", 0, health(backlog=lambda: fresh, last_activity=time.monotonic),
                        lambda: b"relay_up 1\n")
    assert server.route("GET", "/metrics")[2] == b"relay_up 1\n"
    status, ctype, body = server.route("GET", "/readyz?verbose=1")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body)["status"] == "ok"
    assert server.route("GET", "/elsewhere")[0] == 404
    assert server.route("POST", "/metrics")[0] == 405


def test_observe_batch__the_exchange_series_are_bounded_and_later_ones_share_one() -> None:
    m = RelayMetrics()
    rows = [row(i, f"tenant-{i}") for i in range(EXCHANGE_SERIES + 50)]
    m.observe_batch(rows, [Verdict(f"id{i}", Kind.PUBLISHED) for i in range(len(rows))],
                    publish_s=0.01, batch_s=0.01, confirmed_at=102.5)
    m.observe_batch(rows[:1], [Verdict("id0", Kind.PUBLISHED)], publish_s=0.01, batch_s=0.01,
                    confirmed_at=103.0)
    series = [s for f in text_string_to_metric_families(m.render().decode())
              if f.name == "relay_messages_published" for s in f.samples
              if s.name == "relay_messages_published_total"]
    assert len(series) == EXCHANGE_SERIES + 1
    assert sample(m, "relay_messages_published_total", exchange=OTHER_EXCHANGES) == 50
    assert sample(m, "relay_messages_published_total", exchange="tenant-0") == 2
