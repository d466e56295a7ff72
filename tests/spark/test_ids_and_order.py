"""Ids by construction (key=), conflicting ids, order_by, and the connection cap."""

from __future__ import annotations

from typing import Any

import pytest

from relay.errors import ConfigError
from relay.spark import OutboxColumnError, python_outbox_id, write_outbox
from tests.helpers import pg_fetch

pytestmark = pytest.mark.spark


def orders(spark: Any, n: int, *, partitions: int = 4) -> Any:
    """n order events keyed by (routing_key, order_id); order_id is not an outbox column."""
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=partitions).select(
        F.lit("x").alias("exchange"),
        F.lit("order.settled").alias("routing_key"),
        F.col("id").alias("order_id"),
        F.struct(F.col("id").alias("n")).alias("content"),
    )


async def fetch(dsn: str, sql: str) -> list[Any]:
    return list(await pg_fetch(dsn, sql))


@pytest.mark.parametrize("mode", ["staged", "copy"])
async def test_key__ids_are_outbox_id_of_the_key_and_a_reshuffled_rerun_adds_nothing(
    spark: Any, db: str, mode: str
) -> None:
    df = orders(spark, 3_000)
    first = write_outbox(df, dsn=db, mode=mode, key=["routing_key", "order_id"])
    # The same rows, computed in another order and partitioning (a recomputed stage).
    second = write_outbox(df.repartition(3).orderBy("content.n", ascending=False), dsn=db,
                          mode=mode, key=["routing_key", "order_id"])

    assert (first.inserted, second.inserted, second.skipped) == (3_000, 0, 3_000)
    rows = await fetch(db, "SELECT id::text AS id, content->>'n' AS n FROM queue_message")
    assert {r["id"] for r in rows} == {
        str(python_outbox_id("order.settled", n)) for n in range(3_000)}
    assert all(r["id"] == str(python_outbox_id("order.settled", r["n"])) for r in rows)


@pytest.mark.parametrize("mode", ["staged", "copy"])
async def test_idempotent_modes__refuse_a_frame_without_key_or_id_column(
    spark: Any, db: str, mode: str
) -> None:
    df = orders(spark, 10).drop("order_id")
    with pytest.raises(OutboxColumnError, match="no ids: give key="):
        write_outbox(df, dsn=db, mode=mode)
    assert await fetch(db, "SELECT 1 FROM queue_message") == []


async def test_random_ids__opt_out_writes_rows_with_table_drawn_ids(spark: Any, db: str) -> None:
    result = write_outbox(orders(spark, 100).drop("order_id"), dsn=db, ids="random")
    assert result.inserted == 100
    rows = await fetch(db, "SELECT count(DISTINCT id) AS n FROM queue_message")
    assert rows[0]["n"] == 100


@pytest.mark.parametrize("mode", ["staged", "copy"])
async def test_same_id_with_different_content__is_an_error_naming_the_id(
    spark: Any, db: str, mode: str
) -> None:
    from pyspark.sql import functions as F

    # order 7 appears twice with different content; order 8 twice with equal content.
    df = orders(spark, 20).union(
        orders(spark, 20).where("order_id = 7").withColumn(
            "content", F.struct(F.lit(-1).cast("long").alias("n"))))
    clash = str(python_outbox_id("order.settled", 7))

    with pytest.raises(OutboxColumnError, match=f"id {clash} is given to two rows"):
        write_outbox(df, dsn=db, mode=mode, key=["routing_key", "order_id"])

    if mode == "staged":  # atomic: nothing at all
        assert await fetch(db, "SELECT 1 FROM queue_message") == []


async def test_equal_duplicates__are_written_once(spark: Any, db: str) -> None:
    df = orders(spark, 20).union(orders(spark, 20).where("order_id = 8"))
    result = write_outbox(df, dsn=db, key=["routing_key", "order_id"])
    assert (result.rows, result.inserted) == (21, 20)


async def test_order_by__seq_follows_the_order_column_within_each_ordering_key(
    spark: Any, db: str
) -> None:
    from pyspark.sql import functions as F

    # 10 keys x 500 events, shuffled across partitions so arrival order is arbitrary.
    df = orders(spark, 5_000, partitions=8).withColumn(
        "ordering_key", F.format_string("k%d", F.col("order_id") % 10)
    ).withColumn("event_time", F.col("order_id") * 1000).repartition(8)

    write_outbox(df, dsn=db, key=["order_id"], order_by=["event_time"])

    rows = await fetch(db, "SELECT ordering_key AS k, (content->>'n')::int AS n "
                           "FROM queue_message ORDER BY seq")
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["k"], []).append(r["n"])
    assert len(per_key) == 10
    assert all(ns == sorted(ns) and len(ns) == 500 for ns in per_key.values())
    columns = await fetch(db, "SELECT attname FROM pg_attribute WHERE attrelid = "
                              "'queue_message'::regclass AND attname LIKE 'relay_order%'")
    assert columns == []


async def test_order_by__outside_staged_mode_is_refused(spark: Any, db: str) -> None:
    with pytest.raises(ConfigError, match="order_by needs mode='staged'"):
        write_outbox(orders(spark, 5), dsn=db, mode="copy", key=["order_id"],
                     order_by=["order_id"])


@pytest.mark.parametrize("mode", ["staged", "append"])
async def test_max_connections__caps_the_write_tasks_at_that_many(
    spark: Any, db: str, mode: str
) -> None:
    sc = spark.sparkContext
    group = f"cap-{mode}"
    sc.setJobGroup(group, "connection cap")
    try:
        write_outbox(orders(spark, 2_000, partitions=8), dsn=db, mode=mode, key=["order_id"],
                     max_connections=3, validate=False)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    tasks = [tracker.getStageInfo(s).numTasks
             for j in tracker.getJobIdsForGroup(group)
             for s in tracker.getJobInfo(j).stageIds]
    assert tasks
    assert max(tasks) == 3  # one JDBC connection per write task
    assert (await fetch(db, "SELECT count(*) AS n FROM queue_message"))[0]["n"] == 2_000
