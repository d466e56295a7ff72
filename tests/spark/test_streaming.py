"""foreach_batch_writer with a real streaming query (file source), stopped and restarted from
its checkpoint with its last micro-batch uncommitted: the replay writes nothing new."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relay.errors import ConfigError
from relay.spark import foreach_batch_writer, python_outbox_id
from tests.helpers import pg_fetch

pytestmark = pytest.mark.spark


def drop_file(folder: Path, name: str, order_ids: range) -> None:
    lines = [json.dumps({"order_id": n, "cents": n * 10}) for n in order_ids]
    tmp = folder.parent / f".{name}"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(folder / name)  # the file source must never see a half-written file


def run_until_caught_up(spark: Any, source: Path, checkpoint: Path, db: str) -> list[int]:
    """Run the query over everything in `source` (availableNow), return the batch ids run."""
    from pyspark.sql import functions as F

    seen: list[int] = []
    write = foreach_batch_writer(dsn=db, key=["routing_key", "order_id"], exchange="x")

    def each_batch(batch: Any, batch_id: int) -> None:
        seen.append(batch_id)
        write(batch, batch_id)

    events = spark.readStream.schema("order_id long, cents long").json(str(source)).select(
        F.lit("order.paid").alias("routing_key"), F.col("order_id"),
        F.struct("order_id", "cents").alias("content"),
    )
    query = (events.writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    return seen


async def test_foreach_batch_writer__replayed_micro_batch_writes_nothing_new(
    spark: Any, db: str, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    drop_file(source, "part-1.json", range(0, 400))
    assert run_until_caught_up(spark, source, checkpoint, db) == [0]

    # A driver that died after the write but before Spark recorded the batch as done.
    for entry in ("0", ".0.crc"):
        (checkpoint / "commits" / entry).unlink(missing_ok=True)
    drop_file(source, "part-2.json", range(400, 600))
    replayed = run_until_caught_up(spark, source, checkpoint, db)

    assert replayed == [0, 1]  # batch 0 again (same files), then the new file
    ids = [r[0] for r in await pg_fetch(db, "SELECT id::text FROM queue_message")]
    assert len(ids) == 600
    assert set(ids) == {str(python_outbox_id("order.paid", n)) for n in range(600)}


@pytest.mark.parametrize("kwargs", [{"mode": "append"}, {"ids": "random"}])
def test_foreach_batch_writer__refuses_ids_a_replay_would_duplicate(kwargs: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="survive a replayed micro-batch"):
        foreach_batch_writer(**kwargs)
