"""Copy mode, the executor side: each partition COPYs into a temporary table and merges it
with ON CONFLICT DO NOTHING, in one transaction per partition (psycopg 3)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from relay.spark.errors import OutboxColumnError
from relay.spark.frame import Prepared
from relay.spark.sql import StageShape
from relay.spark.target import Target


@dataclass(frozen=True)
class CopyPartition:
    """Callable shipped to executors by `rdd.mapPartitions`: yields one (rows, inserted,
    conflicting id or None) per partition.

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

    def __call__(self, rows: Iterable[Any]) -> Iterator[tuple[int, int, str | None]]:
        """Write one partition; yield (rows staged, rows inserted, None), or (0, 0, id) for an
        id two rows give different content (nothing of the partition committed)."""
        import psycopg

        with psycopg.connect(self.dsn, application_name=self.application_name) as conn:
            # psycopg opens a transaction on first use; the `with` commits it at the end.
            conn.execute(self.create_sql)
            with conn.cursor().copy(self.copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
            clash = conn.execute(self.check_sql).fetchone()
            if clash is not None:
                conn.rollback()
                yield 0, 0, str(clash[0])
                return
            result = conn.execute(self.merge_sql).fetchone()
        assert result is not None
        yield int(result[0]), int(result[1]), None


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
    results = df.rdd.mapPartitions(job).collect()
    clashes = [r[2] for r in results if r[2]]
    if clashes:
        raise OutboxColumnError(
            f"id {clashes[0]} is given to two rows with different content; its partition was "
            "not merged (give each event its own key)"
        )
    return sum(r[0] for r in results), sum(r[1] for r in results)
