"""Structured Streaming: write each micro-batch with `write_outbox`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from relay.errors import ConfigError
from relay.spark.writer import WriteMode, write_outbox

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = structlog.get_logger("relay.spark")


def foreach_batch_writer(**write_outbox_kwargs: Any) -> Callable[[DataFrame, int], None]:
    """A function for `DataStreamWriter.foreachBatch` that writes each micro-batch to the
    outbox with `write_outbox(batch, **write_outbox_kwargs)`.

    Spark replays a micro-batch whose commit it did not record (a crash, a restart from the
    checkpoint); ids from `key=` (or an `id` column) make the replay insert nothing new, so
    this writer refuses append mode and `ids="random"` up front.
    """
    mode = WriteMode(write_outbox_kwargs.get("mode", WriteMode.STAGED))
    if mode is WriteMode.APPEND or write_outbox_kwargs.get("ids") == "random":
        raise ConfigError(
            "foreach_batch_writer needs ids that survive a replayed micro-batch: use mode "
            "'staged' or 'copy' with key=[...] or an 'id' column (not append, not ids='random')"
        )

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        result = write_outbox(batch, **write_outbox_kwargs)
        log.info(
            "spark_micro_batch_written", batch_id=batch_id, rows=result.rows,
            inserted=result.inserted,
        )

    return write_batch
