"""Example job: a nightly settlement run that emits one event per merchant into the outbox.

Generates a day of card transactions (deterministic, no input files), sums them per merchant
and writes one `settlement.completed` event per merchant with `write_outbox`. The event id is
derived from its key (routing key, date, merchant), so a retried task, a recomputed stage or
a second run for the same day sends nothing new while the first run's rows are in the outbox.

    python -m relay.spark.example_job --date 2024-05-01 --exchange settlements
    spark-submit --master spark://host:7077 --jars /usr/share/java/postgresql.jar \
        relay/spark/example_job.py --date 2024-05-01

The database comes from RELAY_PG_DSN (else the PG* variables), the table from RELAY_TABLE.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from relay.spark import session, write_outbox


def settlement_events(spark: Any, day: str, transactions: int, merchants: int) -> Any:
    """One outbox row per merchant: struct content, keyed by (routing_key, date, merchant_id).

    `date` and `merchant_id` are not outbox columns: write_outbox uses them for the id and
    does not write them.
    """
    from pyspark.sql import functions as F

    txns = spark.range(transactions).select(
        (F.col("id") % merchants).alias("merchant_id"),
        # A deterministic amount between 1.00 and 500.00 per transaction.
        (F.abs(F.hash(F.col("id"), F.lit(day))) % 49_900 + 100).alias("amount_cents"),
    )
    per_merchant = txns.groupBy("merchant_id").agg(
        F.count("*").alias("transactions"), F.sum("amount_cents").alias("total_cents")
    )
    return per_merchant.select(
        F.lit("settlement.completed").alias("routing_key"),
        F.lit(day).alias("date"),
        F.col("merchant_id"),
        F.struct(
            F.lit("settlement.completed").alias("type"),
            F.lit(day).alias("date"),
            F.format_string("m-%05d", "merchant_id").alias("merchant"),
            F.col("transactions"),
            F.struct(F.col("total_cents").alias("cents"), F.lit("EUR").alias("currency"))
            .alias("total"),
        ).alias("content"),
        F.create_map(F.lit("contentType"), F.lit("application/json")).alias("options"),
    )


#: The event's natural key: the same settlement always gets the same id.
KEY = ["routing_key", "date", "merchant_id"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The job's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--date", required=True, help="settlement day, YYYY-MM-DD")
    parser.add_argument("--exchange", default="settlements", help="exchange of the events")
    parser.add_argument("--transactions", type=int, default=200_000)
    parser.add_argument("--merchants", type=int, default=1_000)
    parser.add_argument("--mode", default="staged", choices=["staged", "copy", "append"])
    parser.add_argument("--batch-size", type=int, default=10_000, help="rows per JDBC batch")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: spark-submit's, else local[*])")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, transform: Callable[[Any], Any] = lambda df: df) -> int:
    """Build the events, pass them through `transform` (identity; tests inject faults) and
    write them; print what was written."""
    # A few hundred merchants need no more than a few shuffle partitions.
    spark = session(
        "settlement-events", master=args.master, **{"spark.sql.shuffle.partitions": "4"}
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        events = transform(settlement_events(spark, args.date, args.transactions,
                                             args.merchants))
        result = write_outbox(events, mode=args.mode, exchange=args.exchange, key=KEY,
                              batch_size=args.batch_size)
    finally:
        spark.stop()
    if result.rows is None:
        print(f"settlement {args.date}: events appended ({result.elapsed_s:.1f}s, append mode)")
    else:
        print(
            f"settlement {args.date}: {result.rows} events, {result.inserted} new, "
            f"{result.skipped} already in the outbox ({result.elapsed_s:.1f}s, "
            f"{result.mode} mode)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the job from the command line."""
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
