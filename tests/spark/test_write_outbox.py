"""write_outbox against a real local Spark, PostgreSQL and RabbitMQ (and a real relay).

The tests are async and call the blocking write_outbox from inside the running event loop,
which is also how notebooks and async jobs call it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from relay.errors import DatabaseError
from relay.settings import NotifyMode
from relay.spark import (
    OutboxColumnError,
    SparkWriteError,
    WriteMode,
    cleanup_staging,
    outbox_id,
    python_outbox_id,
    write_outbox,
)
from tests.helpers import Env, count_rows, pg_fetch, pg_fetchrow, wait_until
from tests.kit.consumer import Consumer

pytestmark = pytest.mark.spark


def events(spark: Any, n: int, exchange: str, *, partitions: int = 4, tag: str = "t") -> Any:
    """n outbox rows: struct content (with a nested map), deterministic ids from (tag, n)."""
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=partitions).select(
        F.lit(exchange).alias("exchange"),
        F.lit("rk").alias("routing_key"),
        F.struct(
            F.col("id").alias("n"),
            F.lit("héllo ✓").alias("text"),
            F.create_map(F.lit("cents"), F.col("id") * 100).alias("amount"),
        ).alias("content"),
        outbox_id(F.lit(tag), F.col("id")).alias("id"),
    )


def failing_on(
    partition: int, *, first_attempt_only: bool, at_row: int = 700
) -> Callable[..., Any]:
    """A Python UDF (test-only) that raises in one partition after `at_row` of its rows went
    by, so earlier JDBC batches of that task were already sent."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    def check(n: int) -> int:
        ctx = TaskContext.get()
        assert ctx is not None
        if (ctx.partitionId() == partition and n % 2500 == at_row
                and (ctx.attemptNumber() == 0 or not first_attempt_only)):
            raise RuntimeError("injected failure")
        return n

    return F.udf(check, "long")  # type: ignore[no-any-return]


async def ids_in(dsn: str) -> list[str]:
    return [r[0] for r in await pg_fetch(dsn, "SELECT id::text FROM queue_message")]


async def stage_tables(dsn: str) -> list[str]:
    return [r[0] for r in await pg_fetch(
        dsn, "SELECT relname::text FROM pg_class WHERE relname LIKE 'relay\\_stage\\_%'")]


@pytest.mark.parametrize("mode", [m.value for m in WriteMode])
async def test_write_outbox__relay_delivers_each_row_once_with_row_id_as_message_id(
    spark: Any, env: Env, consumer: Consumer, start_relay: Any, mode: str
) -> None:
    start_relay()
    df = events(spark, 20_000, env.exchange, tag=mode)
    if mode == "append":
        df = df.drop("id")  # append works without ids too; the table gives random ones

    result = write_outbox(df, dsn=env.pg_dsn, mode=mode)

    await consumer.wait_for(20_000, timeout_s=180)
    async def outbox_empty() -> bool:
        return await count_rows(env.pg_dsn) == 0

    await wait_until(outbox_empty, timeout_s=60, what="an empty outbox")
    assert consumer.duplicates() == 0
    assert len(consumer.messages) == 20_000
    if mode != "append":
        assert result.rows == result.inserted == 20_000
        expected = {str(python_outbox_id(mode, n)) for n in range(20_000)}
        assert set(consumer.ids) == expected
    # Struct/map content arrives as the JSON object it describes.
    by_n = {body["n"]: body for body in consumer.bodies()}
    assert by_n[12_345] == {"n": 12_345, "text": "héllo ✓", "amount": {"cents": 1_234_500}}


# Counts the notifications of `always`: in the default (conditional) mode only a sleeping relay
# is notified, and no relay runs here.
@pytest.mark.parametrize("notify_mode", [NotifyMode.ALWAYS])
async def test_staged__run_twice_inserts_each_id_once_and_wakes_the_relay_once(
    spark: Any, db: str
) -> None:
    wakeups: list[str] = []
    listener = await asyncpg.connect(db)
    await listener.add_listener("queue_message_notify", lambda *a: wakeups.append(a[3]))
    try:
        df = events(spark, 5_000, "x", partitions=4)
        first = write_outbox(df, dsn=db, batch_size=1_000)
        await wait_until(lambda: len(wakeups) >= 1, what="a notification")
        await listener.fetchval("SELECT pg_sleep(0.5)")
        assert len(wakeups) == 1  # 4 partitions x 5 JDBC batches, one merge statement
        second = write_outbox(df, dsn=db)
    finally:
        await listener.close()

    assert (first.rows, first.inserted) == (5_000, 5_000)
    assert (second.rows, second.inserted, second.skipped) == (5_000, 0, 5_000)
    ids = await ids_in(db)
    assert len(ids) == len(set(ids)) == 5_000
    assert await stage_tables(db) == []


@pytest.mark.parametrize("mode", ["staged", "copy"])
async def test_task_failing_on_first_attempt__retry_leaves_each_id_once(
    spark: Any, db: str, mode: str
) -> None:
    from pyspark.sql import functions as F

    df = events(spark, 10_000, "x", partitions=4)
    df = df.withColumn("content", F.struct(
        failing_on(1, first_attempt_only=True)(F.col("content.n")).alias("n")))

    result = write_outbox(df, dsn=db, mode=mode, batch_size=200)

    assert result.rows == result.inserted == 10_000
    ids = await ids_in(db)
    assert len(ids) == len(set(ids)) == 10_000


async def test_staged__job_failing_for_good_leaves_no_rows_and_no_staging_table(
    spark: Any, db: str
) -> None:
    from pyspark.sql import functions as F

    df = events(spark, 10_000, "x", partitions=4)
    df = df.withColumn("content", F.struct(
        failing_on(2, first_attempt_only=False)(F.col("content.n")).alias("n")))

    with pytest.raises(SparkWriteError, match="no rows were merged"):
        write_outbox(df, dsn=db, batch_size=200)

    assert await count_rows(db) == 0
    assert await stage_tables(db) == []


async def test_cleanup__drops_abandoned_staging_tables_and_keeps_a_live_jobs_table(
    db: str,
) -> None:
    conn = await asyncpg.connect(db)
    live = await asyncpg.connect(db)
    try:
        await conn.execute("CREATE TABLE relay_stage_1_abandoned (id uuid)")
        await conn.execute("CREATE TABLE relay_stage_2_live (id uuid)")
        await live.execute("SELECT pg_advisory_lock(hashtext('outbox-relay:stage'), "
                           "hashtext('relay_stage_2_live'))")

        dropped = cleanup_staging(dsn=db)

        assert dropped == ['public.relay_stage_1_abandoned']
        assert await stage_tables(db) == ["relay_stage_2_live"]
    finally:
        await live.close()
        await conn.close()


def _bad_frames(spark: Any) -> list[tuple[str, Any, str]]:
    from pyspark.sql import functions as F

    good = spark.range(3).select(
        F.lit("x").alias("exchange"), F.lit("rk").alias("routing_key"),
        F.to_json(F.struct(F.col("id").alias("n"))).alias("content"))
    return [
        ("missing", good.drop("routing_key"), "'routing_key' is required"),
        ("unknown", good.withColumn("colour", F.lit("red")), "unknown column 'colour'"),
        ("managed", good.withColumn("attempts", F.lit(1)), "'attempts' is managed"),
        ("wrong type", good.withColumn("content", F.col("id") if "id" in good.columns
                                       else F.lit(7)), "'content' has type int"),
        ("bad JSON", good.withColumn("content", F.when(F.col("exchange") == "x", F.lit('{"a": ')
                                                       ).otherwise(F.lit("{}"))),
         "'content' is not valid JSON: first offending value '{\"a\": '"),
        ("null exchange", good.withColumn("exchange", F.lit(None).cast("string")),
         "'exchange' is null"),
        ("bad id", good.withColumn("id", F.lit("not-a-uuid")), "'id' is not a UUID"),
    ]


@pytest.mark.parametrize("case", range(7))
async def test_write_outbox__invalid_frame_fails_naming_the_column_and_writes_nothing(
    spark: Any, db: str, case: int
) -> None:
    what, df, message = _bad_frames(spark)[case]
    ids = None if "id" in df.columns else "random"
    for mode in ("staged", "append"):
        with pytest.raises(OutboxColumnError) as info:
            write_outbox(df, dsn=db, mode=mode, ids=ids)
        assert message in str(info.value), what
    assert await count_rows(db) == 0


def test_outbox_id__equals_python_uuid5_for_10000_keys_including_non_ascii(spark: Any) -> None:
    from pyspark.sql import functions as F

    keys = [f"order-{i}" for i in range(9_000)] + [
        f"客户-{i}-Ünïcødé-🚀" for i in range(999)] + [""]
    df = spark.createDataFrame([(k, i) for i, k in enumerate(keys)], "k string, i long")
    rows = df.select("k", "i", outbox_id("k").alias("one"),
                     outbox_id(F.col("k"), "i").alias("two")).collect()
    ns = uuid.UUID("1e994731-cac4-52f3-8a69-5c80710f69d2")
    assert len(rows) == 10_000
    for row in rows:
        assert row.one == str(uuid.uuid5(ns, row.k))
        assert row.two == str(python_outbox_id(row.k, row.i))


def test_write_outbox__connection_error_never_shows_the_password(spark: Any) -> None:
    df = events(spark, 10, "x")
    with pytest.raises(DatabaseError, match="cannot connect") as info:
        write_outbox(df, dsn="postgresql://postgres:s3cr3t-pw@127.0.0.1:1/nodb")
    assert "s3cr3t-pw" not in str(info.value)
    assert "***" in str(info.value)


async def test_write_outbox__string_json_and_options_reach_the_table_as_jsonb(
    spark: Any, db: str
) -> None:
    rows = [("x", "rk", json.dumps({"a": [1, 2]}), json.dumps({"contentType": "application/json"}))]
    df = spark.createDataFrame(rows, "exchange string, routing_key string, content string, "
                                     "options string")

    write_outbox(df, dsn=db, mode="copy", ids="random")

    row = await pg_fetchrow(db, "SELECT jsonb_typeof(content) AS t, content->'a' AS a, "
                              "options->>'contentType' AS ct FROM queue_message")
    assert (row["t"], json.loads(row["a"]), row["ct"]) == ("object", [1, 2], "application/json")


async def test_write_outbox__marks_the_jobs_rows_with_a_fairness_key(spark: Any, db: str) -> None:
    """staged: every row carries the key; the relay's columns stay out of the job's reach."""
    write_outbox(events(spark, 50, "x", tag="fair"), dsn=db, fairness_key="backfill")
    marked = await pg_fetchrow(
        db, "SELECT count(*) AS n, count(*) FILTER (WHERE fairness_key = 'backfill') AS k "
            "FROM queue_message")
    assert (marked["n"], marked["k"]) == (50, 50)
    from pyspark.sql import functions as F

    with pytest.raises(OutboxColumnError, match="'xact' is managed by the relay"):
        write_outbox(events(spark, 1, "x", tag="xact").withColumn("xact", F.lit(1)), dsn=db)
