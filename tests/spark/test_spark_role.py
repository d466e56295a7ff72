"""Every write mode runs as a login in the Spark writer role of sql/roles.sql, which can
neither read content nor change rows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from relay.errors import ConfigError
from relay.spark import cleanup_staging, python_outbox_id, write_outbox
from tests.helpers import pg_fetch, pg_fetchval, pg_session
from tests.spark.roles import spark_writer_login

pytestmark = pytest.mark.spark


@pytest.fixture
async def spark_login(db: str) -> AsyncIterator[str]:
    """DSN of a LOGIN user in a Spark writer role made by `relay migrate --roles
    --spark-role` (tests/spark/roles.py)."""
    async with spark_writer_login(db) as dsn:
        yield dsn


def frame(spark: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=2).select(
        F.lit("x").alias("exchange"), F.lit("rk").alias("routing_key"),
        F.col("id").alias("order_id"), F.struct(F.col("id").alias("n")).alias("content"),
        F.format_string("k%d", F.col("id") % 3).alias("ordering_key"),
    )


async def test_spark_role__idempotent_modes_write_and_skip_a_rerun(
    spark: Any, db: str, spark_login: str
) -> None:
    df = frame(spark, 300)
    staged = write_outbox(df, dsn=spark_login, mode="staged", key=["order_id"],
                          order_by=["order_id"])
    copy = write_outbox(df, dsn=spark_login, mode="copy", key=["order_id"])
    assert cleanup_staging(dsn=spark_login) == []

    assert staged.inserted == 300
    assert copy.inserted == 0  # the same ids, already there
    ids = {r[0] for r in await pg_fetch(db, "SELECT id::text FROM queue_message")}
    assert ids == {str(python_outbox_id(n)) for n in range(300)}


async def test_spark_role__append_is_refused_before_writing_for_lack_of_select(
    spark: Any, db: str, spark_login: str
) -> None:
    with pytest.raises(ConfigError, match="append mode needs SELECT"):
        write_outbox(frame(spark, 10), dsn=spark_login, mode="append", key=["order_id"])
    assert await pg_fetchval(db, "SELECT count(*) FROM queue_message") == 0


async def test_spark_role__cannot_read_content_or_change_rows(
    spark: Any, db: str, spark_login: str
) -> None:
    write_outbox(frame(spark, 3), dsn=spark_login, key=["order_id"])
    async with pg_session(spark_login) as conn:
        for sql in ("SELECT content FROM queue_message", "DELETE FROM queue_message",
                    "UPDATE queue_message SET attempts = 1", "SELECT * FROM queue_message_dead"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        assert await conn.fetchval("SELECT count(id) FROM queue_message") == 3


async def test_spark_role__creates_only_in_the_staging_schema(
    spark: Any, db: str, spark_login: str
) -> None:
    """The Spark writer had CREATE on the outbox's schema; its staging tables now live in
    <table>_stage, the only schema where it may create anything."""
    async with pg_session(spark_login) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE TABLE public.queue_message_shadow (id uuid)")
        await conn.execute("CREATE TABLE queue_message_stage.probe (id uuid)")
        await conn.execute("DROP TABLE queue_message_stage.probe")
    write_outbox(frame(spark, 20), dsn=spark_login, key=["order_id"], mode="staged")
    async with pg_session(db) as admin:
        assert await admin.fetchval("SELECT count(*) FROM queue_message") == 20
        leftovers = await admin.fetchval(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'relay\\_stage\\_%'")
        assert leftovers == 0
