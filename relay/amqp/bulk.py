"""The import path the benchmarks use for the bulk publisher (it lives in pipeline.py)."""

from relay.amqp.pipeline import BulkPublisher

__all__ = ["BulkPublisher"]
