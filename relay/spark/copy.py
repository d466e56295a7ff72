"""Copy mode, the executor side: each partition COPYs into a temporary table and merges it
with ON CONFLICT DO NOTHING, in one transaction per partition (psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CopyPartition:
    """Callable shipped to executors by `rdd.mapPartitions`: yields (rows, inserted) once.

    A retried task repeats the whole partition; its rows carry the same ids, so the merge
    skips the ones an earlier attempt committed.
    """

    dsn: str | None = field(repr=False)
    create_sql: str
    copy_sql: str
    merge_sql: str
    application_name: str = "outbox-relay-spark-copy"

    def __call__(self, rows: Iterable[Any]) -> Iterator[tuple[int, int]]:
        """Write one partition; yield (rows staged, rows inserted)."""
        import psycopg

        with psycopg.connect(self.dsn or "", application_name=self.application_name) as conn:
            # psycopg opens a transaction on first use; the `with` commits it at the end.
            conn.execute(self.create_sql)
            with conn.cursor().copy(self.copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
            result = conn.execute(self.merge_sql).fetchone()
        assert result is not None
        yield int(result[0]), int(result[1])
