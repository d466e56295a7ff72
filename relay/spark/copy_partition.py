"""Copy mode, the executor side: each partition COPYs into a temporary table and merges it
with ON CONFLICT DO NOTHING, in one transaction per partition (psycopg 3).

The rows reach the executor's Python as Arrow record batches (`DataFrame.mapInArrow`): no
`df.rdd`, no pickled Row objects. Needs pyarrow and psycopg on the executors (the `spark`
extra)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from relay.spark.errors import OutboxColumnError
from relay.spark.frame import Prepared
from relay.spark.sql import StageShape
from relay.spark.target import Target

# What each partition's task returns (CopyPartition.__call__), as Spark's DDL.
RESULT_SCHEMA = "staged long, inserted long, clash string"


@dataclass(frozen=True)
class CopyPartition:
    """Callable shipped to executors by `mapInArrow`: yields one record batch (rows, inserted,
    conflicting id or null) per partition.

    A retried task repeats the whole partition; its rows carry the same ids, so the merge
    skips the ones an earlier attempt committed. `dsn` is the driver's fully resolved
    conninfo: an executor reads no PG* variables of its own.
    """

    dsn: str = field(repr=False)
    create_sql: str
    copy_sql: str
    check_sql: str
    merge_sql: str
    application_name: str = "outbox-relay-spark-copy"

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Write one partition (its Arrow record batches); yield one batch of one row:
        (rows staged, rows inserted, null), or (0, 0, id) for an id two rows give different
        content (nothing of the partition committed)."""
        import psycopg
        import pyarrow as pa

        def result(staged: int, inserted: int, clash: str | None) -> Any:
            return pa.RecordBatch.from_pydict(
                {"staged": [staged], "inserted": [inserted], "clash": [clash]},
                schema=pa.schema([("staged", pa.int64()), ("inserted", pa.int64()),
                                  ("clash", pa.string())]))

        with psycopg.connect(self.dsn, application_name=self.application_name) as conn:
            # psycopg opens a transaction on first use; the `with` commits it at the end.
            conn.execute(self.create_sql)
            with conn.cursor().copy(self.copy_sql) as copy:
                for batch in batches:
                    for row in zip(*(column.to_pylist() for column in batch.columns),
                                   strict=True):
                        copy.write_row(row)
            clash = conn.execute(self.check_sql).fetchone()
            if clash is not None:
                conn.rollback()
                yield result(0, 0, str(clash[0]))
                return
            merged = conn.execute(self.merge_sql).fetchone()
        assert merged is not None
        yield result(int(merged[0]), int(merged[1]), None)


def write_copy(
    prepared: Prepared, target: Target, shape: StageShape, max_connections: int
) -> tuple[int, int]:
    """COPY and merge each partition on the executors: (rows, inserted) over all partitions."""
    temp, sql = "relay_copy", target.sql
    job = CopyPartition(
        dsn=target.conninfo,
        create_sql=sql.render("spark_copy_create", stage=temp, shape=shape),
        copy_sql=sql.render("spark_copy_rows", stage=temp,
                            shape=dataclasses.replace(shape, columns=prepared.columns)),
        check_sql=sql.render("spark_conflicting_id", stage=temp, shape=shape),
        merge_sql=sql.render("spark_merge", stage=temp, shape=shape),
    )
    df = prepared.df.select(*prepared.columns)
    # Rows of one id meet in one partition, so each partition's check sees all of them.
    df = (df.repartition(max_connections, "id") if "id" in df.columns
          else df.coalesce(max_connections))
    results = df.mapInArrow(job, RESULT_SCHEMA).collect()
    clashes = [r[2] for r in results if r[2]]
    if clashes:
        raise OutboxColumnError(
            f"id {clashes[0]} is given to two rows with different content; its partition was "
            "not merged (give each event its own key)"
        )
    return sum(r[0] for r in results), sum(r[1] for r in results)
