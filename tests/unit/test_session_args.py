"""Session arguments for failover: every host of a multi-host DSN, a writable server by default."""

from __future__ import annotations

import pytest

from relay.app import database_config
from relay.pg.connection import session_args
from relay.settings import Settings


def _args(dsn: str) -> dict[str, object]:
    return session_args(database_config(Settings(pg_dsn=dsn)), "worker")


def test_session_args__keyword_host_and_port_lists_become_lists() -> None:
    args = _args("host=db1,db2 port=5432,5433 user=relay dbname=app")
    assert args["host"] == ["db1", "db2"]
    assert args["port"] == [5432, 5433]
    assert args["database"] == "app"


def test_session_args__ask_for_a_writable_server_unless_the_dsn_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    assert _args("postgresql://relay@db1:5432,db2:5432/app")["target_session_attrs"] == (
        "read-write")
    assert _args("host=db1,db2 dbname=app")["target_session_attrs"] == "read-write"
    url = "postgresql://relay@db1,db2/app?target_session_attrs=primary"
    assert _args(url)["target_session_attrs"] == "primary"
    assert _args("host=db1 target_session_attrs=any")["target_session_attrs"] == "any"


def test_session_args__pgtargetsessionattrs_is_left_to_the_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "primary")
    assert "target_session_attrs" not in _args("host=db1,db2 dbname=app")
