"""relay.spark's pure parts: DSN -> JDBC, ids in Python, jar lookup, SQL rendering."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from relay.pg.queries import TableNames
from relay.spark import JdbcDriverNotFound, jdbc_jar, key_of, python_outbox_id
from relay.spark import runtime as session_module
from relay.spark.dsn import jdbc_target
from relay.spark.sql import SparkSql


def test_jdbc_target__url_dsn_keeps_the_password_out_of_the_url() -> None:
    target = jdbc_target("postgresql://app:p%40ss@db.example:6432/orders?sslmode=require",
                         environ={})
    assert target.url.startswith("jdbc:postgresql://db.example:6432/orders?")
    assert "stringtype=unspecified" in target.url
    assert "reWriteBatchedInserts=true" in target.url
    assert "sslmode=require" in target.url
    assert "p@ss" not in target.url
    assert "p%40ss" not in target.url
    assert target.properties() == {
        "driver": "org.postgresql.Driver", "user": "app", "password": "p@ss"}
    assert "p@ss" not in str(target)
    assert "p@ss" not in repr(target)


def test_jdbc_target__unix_socket_dsn_becomes_loopback_tcp() -> None:
    target = jdbc_target("host=/var/run/postgresql dbname='my db' user=postgres port=5433",
                         environ={})
    assert target.url.startswith("jdbc:postgresql://127.0.0.1:5433/my%20db?")
    assert target.password is None
    assert "password" not in target.properties()


def test_jdbc_target__unset_dsn_uses_libpq_variables() -> None:
    env = {"PGHOST": "pg.internal", "PGPORT": "5555", "PGDATABASE": "app", "PGUSER": "job",
           "PGPASSWORD": "pw"}
    target = jdbc_target(None, environ=env)
    assert target.url.startswith("jdbc:postgresql://pg.internal:5555/app?")
    assert (target.user, target.password) == ("job", "pw")


def test_jdbc_target__multi_host_url_keeps_every_host() -> None:
    target = jdbc_target("postgresql://u@a:1,b:2/d", environ={})
    assert target.url.startswith("jdbc:postgresql://a:1,b:2/d?")


def test_python_outbox_id__is_uuid5_of_the_joined_key() -> None:
    ns = uuid.UUID("1e994731-cac4-52f3-8a69-5c80710f69d2")
    assert python_outbox_id("order-1") == uuid.uuid5(ns, "order-1")
    assert python_outbox_id("a", None, 3) == uuid.uuid5(ns, "a\x1f\x1f3")
    assert key_of("a", None, 3) == "a\x1f\x1f3"


def test_jdbc_jar__missing_everywhere_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RELAY_SPARK_JDBC_JAR", raising=False)
    monkeypatch.setattr(session_module, "DEBIAN_JDBC_JAR", str(tmp_path / "none.jar"))
    with pytest.raises(JdbcDriverNotFound) as info:
        session_module.jdbc_jar()
    assert "apt-get install libpostgresql-jdbc-java" in str(info.value)
    assert "RELAY_SPARK_JDBC_JAR" in str(info.value)


def test_jdbc_jar__setting_wins_and_must_exist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jar = tmp_path / "postgresql-42.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("RELAY_SPARK_JDBC_JAR", str(jar))
    assert jdbc_jar("/other/postgresql.jar") == str(jar)
    monkeypatch.setenv("RELAY_SPARK_JDBC_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(JdbcDriverNotFound, match="is not a file"):
        jdbc_jar()


def test_spark_sql__merge_names_quoted_columns_and_the_stage() -> None:
    sql = SparkSql(TableNames("jobs", "outbox", "outbox_notify")).render(
        "spark_merge", stage='"jobs"."relay_stage_x"', columns=["id", "content"])
    assert 'INSERT INTO "jobs"."outbox" ("id", "content")' in sql
    assert 'FROM "jobs"."relay_stage_x" AS s' in sql
    assert '"jobs"."outbox_archive"' in sql
    assert "{" not in sql
