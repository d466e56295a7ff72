"""Spark jobs write to the outbox: `write_outbox`, `foreach_batch_writer`, `outbox_id`,
`session`, `jdbc_jar`.

Importing this package does not import pyspark; the functions do, when called.
"""

from relay.spark.errors import JdbcDriverNotFound, OutboxColumnError, SparkWriteError
from relay.spark.ids import NAMESPACE, key_of, outbox_id, python_outbox_id
from relay.spark.runtime import DEBIAN_JDBC_JAR, jdbc_jar, session
from relay.spark.stream import foreach_batch_writer
from relay.spark.writer import WriteMode, WriteResult, cleanup_staging, write_outbox

__all__ = [
    "DEBIAN_JDBC_JAR",
    "NAMESPACE",
    "JdbcDriverNotFound",
    "OutboxColumnError",
    "SparkWriteError",
    "WriteMode",
    "WriteResult",
    "cleanup_staging",
    "foreach_batch_writer",
    "jdbc_jar",
    "key_of",
    "outbox_id",
    "python_outbox_id",
    "session",
    "write_outbox",
]
