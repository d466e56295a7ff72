"""Every deadline comes from one place, and a batch's publish always ends before the server
could free its locks. No servers."""

from __future__ import annotations

import pytest

from relay.amqp.nodes import Nodes, split_urls
from relay.app import database_config, deadlines
from relay.deadlines import Deadlines
from relay.dsn import redact
from relay.pg.connection import connect_args
from relay.settings import Settings


@pytest.mark.parametrize("budget_s", [0.5, 5.0, 15.0, 60.0, 600.0])
@pytest.mark.parametrize("statement_s", [1.0, 30.0, 300.0])
def test_derive__the_publish_budget_ends_before_idle_in_transaction_frees_the_locks(
    budget_s: float, statement_s: float
) -> None:
    d = Deadlines.derive(publish_budget_s=budget_s, statement_timeout_s=statement_s,
                         poll_interval_s=5.0)
    assert d.idle_in_transaction_s >= d.publish_budget_s + 5.0
    # liveness never calls a batch stalled while it may still legitimately run
    assert d.stall_after_s > d.publish_budget_s + 4 * d.statement_timeout_s


def test_connect_args__the_worker_sessions_carry_the_derived_server_limits() -> None:
    settings = Settings(pg_dsn="postgresql://u@h/db", publish_timeout_s=20,
                        shutdown_timeout_s=30, statement_timeout_s=12)
    d = deadlines(settings)
    args = connect_args(database_config(settings), "worker")
    assert args["server_settings"]["idle_in_transaction_session_timeout"] == str(
        d.idle_in_transaction_ms)
    assert args["server_settings"]["statement_timeout"] == "12000"
    assert args["command_timeout"] > 12
    # sessions that wait on locks or migrate carry no statement timeout
    wakeup = connect_args(database_config(settings), "wakeup")
    assert "statement_timeout" not in wakeup["server_settings"]


def test_connect_args__claiming_sessions_plan_by_the_indexes_unless_the_dsn_says_otherwise(
) -> None:
    settings = Settings(pg_dsn="postgresql://u@h/db")
    for role in ("worker", "streams"):
        claiming = connect_args(database_config(settings), role)["server_settings"]
        assert (claiming["enable_seqscan"], claiming["enable_bitmapscan"]) == ("off", "off")
        assert claiming["jit"] == "off"
    # sessions that never claim plan as the server does
    for role in ("wakeup", "leader", "status", "listener"):
        assert "enable_seqscan" not in connect_args(database_config(settings), role)[
            "server_settings"]
    # a DSN's own options win: the server applies startup settings after them
    own = Settings(pg_dsn="postgresql://u@h/db?options=-c%20enable_seqscan%3Don")
    claiming = connect_args(database_config(own), "worker")["server_settings"]
    assert "enable_seqscan" not in claiming
    assert claiming["enable_bitmapscan"] == "off"
    assert claiming["options"] == "-c enable_seqscan=on"


def test_settings__a_stop_shorter_than_a_publish_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="must exceed RELAY_PUBLISH_TIMEOUT_S") as exc:
        Settings(publish_timeout_s=30, shutdown_timeout_s=20)
    assert "shutdown_timeout_s" in str(exc.value)


def test_nodes__a_comma_separated_url_list_is_shuffled_and_walked_in_a_ring() -> None:
    value = "amqp://u:p1@a:5672/, amqp://u:p2@b:5672/,amqp://u:p3@c:5672/"
    assert split_urls(value) == ["amqp://u:p1@a:5672/", "amqp://u:p2@b:5672/",
                                 "amqp://u:p3@c:5672/"]
    assert "p1" not in redact(value)
    assert "p3" not in redact(value)
    nodes = Nodes(value)
    seen = [nodes.current, nodes.advance(), nodes.advance(), nodes.advance()]
    assert sorted(seen[:3]) == sorted(split_urls(value))
    assert seen[3] == seen[0]
