"""Demo Spark job: derive one event per generated order and write them to the outbox.

Runs with plain `python` in the spark image (local Spark). Uses relay.spark's public API:
session() and write_outbox(); ids come from the event's key, so a re-run inserts nothing new.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F
from relay.spark import session, write_outbox


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
        F.col("order_id"),
        F.lit("demo.events").alias("exchange"),
        F.lit("order.created").alias("routing_key"),
        F.struct("order_id", "amount").alias("content"),
    )
    # Staged mode (atomic, idempotent) as the Spark writer role; order_id is the event's key
    # (id = outbox_id(routing_key, order_id)) and is not written as a column.
    write_outbox(events, key=["routing_key", "order_id"])
    print(f"wrote {args.rows} events", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
