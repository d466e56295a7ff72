"""Demo Spark job: derive one event per generated order and write them to the outbox.

Runs with plain `python` in the spark image (local Spark). Uses relay.spark's public API:
session() and write_outbox(); ids come from outbox_id(), so a re-run inserts nothing new.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F
from relay.spark import outbox_id, session, write_outbox


def main() -> None:
    """Generate --rows orders and write one `order.created` event per order."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    spark = session(app_name="outbox-demo-job")
    orders = spark.range(args.rows).select(
        F.col("id").alias("order_id"),
        (F.rand(seed=7) * 100).cast("decimal(10,2)").alias("amount"),
    )
    events = orders.select(
        outbox_id(F.lit("order.created"), F.col("order_id").cast("string")).alias("id"),
        F.lit("demo.events").alias("exchange"),
        F.lit("order.created").alias("routing_key"),
        F.struct("order_id", "amount").alias("content"),
    )
    # copy mode: idempotent with INSERT-only rights (staged mode would need CREATE for its
    # staging table, which the producer role does not have).
    write_outbox(events, mode="copy")
    print(f"wrote {args.rows} events", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
