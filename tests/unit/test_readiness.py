"""Readiness means "this pod can work": the table's lag never makes every replica unready."""

from __future__ import annotations

from relay.ops.http import Health, HttpServer, probe_body
from relay.ops.metrics import BacklogSnapshot


def _health(ready_max_lag_s: float, oldest_s: float) -> Health:
    return Health(
        worker_alive=lambda: True,
        last_activity=lambda: 1000.0,
        postgres_connected=lambda: True,
        rabbitmq_connected=lambda: True,
        broker_blocked=lambda: False,
        backlog=lambda: BacklogSnapshot({"due": 90_000, "oldest_due_age_s": oldest_s}, 995.0),
        ready_max_lag_s=ready_max_lag_s,
        stall_after_s=120.0,
        backlog_stale_after_s=30.0,
    )


def test_readiness__a_deep_old_backlog_does_not_make_a_connected_relay_unready() -> None:
    health = _health(ready_max_lag_s=0, oldest_s=7200.0)
    status, body = probe_body(health.readiness(now=1000.0))
    assert status == 200
    assert "lag" not in body["checks"]
    info = health.backlog_info(now=1000.0)
    assert info["oldest_due_age_s"] == 7200.0
    assert info["due_rows"] == 90_000


def test_readiness__lag_counts_only_when_a_limit_is_set() -> None:
    status, body = probe_body(_health(ready_max_lag_s=60, oldest_s=7200.0).readiness(now=1000.0))
    assert status == 503
    assert body["reasons"][0].startswith("lag: oldest due row is 7200.0s old")


def test_readyz__reports_the_backlog_as_info() -> None:
    server = HttpServer("127.0.0.1", 0, _health(0, 5.0), lambda: b"")
    status, ctype, body = server.route("GET", "/readyz")
    assert (status, ctype) == (200, "application/json")
    assert b'"info": {"backlog": {"due_rows": 90000' in body
