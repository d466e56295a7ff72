"""Deterministic message ids: RFC 4122 version-5 UUIDs under the project's namespace.

The same key gives the same id in Spark SQL (`outbox_id`) and in Python (`python_outbox_id`),
so a re-run job writes the same ids and consumers can dedupe by `message_id`.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column

#: uuid5(NAMESPACE_URL, "https://github.com/outbox-relay/outbox-relay#spark-outbox-id").
#: Fixed for ever: changing it would change every id a job derives.
NAMESPACE = uuid.UUID("1e994731-cac4-52f3-8a69-5c80710f69d2")

#: Joins several key columns (ASCII unit separator: not expected inside key values).
KEY_SEPARATOR = "\x1f"


def key_of(*values: Any) -> str:
    """The key string several values make: str() of each (None as ''), joined by KEY_SEPARATOR.

    Spark renders numbers and dates as its own string cast does; pass strings (or cast in
    Spark) when Python must reproduce the id of a non-string value.
    """
    return KEY_SEPARATOR.join("" if v is None else str(v) for v in values)


def python_outbox_id(*values: Any) -> uuid.UUID:
    """The id `outbox_id` computes in Spark for the same values: uuid5(NAMESPACE, key_of(...))."""
    return uuid.uuid5(NAMESPACE, key_of(*values))


def outbox_id(*cols: Column | str) -> Column:
    """A Spark column: the version-5 UUID (text) of the given columns' key, in Spark SQL only.

    sha1(namespace bytes || UTF-8 key), first 16 bytes, version nibble 5, RFC 4122 variant:
    exactly Python's `uuid.uuid5(NAMESPACE, key)`. No Python UDF, so it runs at JVM speed.
    """
    from pyspark.sql import functions as F

    if not cols:
        raise ValueError("outbox_id needs at least one column")
    parts = [F.coalesce((F.col(c) if isinstance(c, str) else c).cast("string"), F.lit(""))
             for c in cols]
    key = parts[0] if len(parts) == 1 else F.concat_ws(KEY_SEPARATOR, *parts)
    digest = F.sha1(F.concat(F.unhex(F.lit(NAMESPACE.hex)), F.encode(key, "UTF-8")))
    # Nibble 13 (1-based) becomes the version 5; nibble 17 keeps its low two bits under 10xx.
    variant = F.lower(F.hex(
        F.conv(F.substring(digest, 17, 1), 16, 10).cast("int").bitwiseAND(3).bitwiseOR(8)
    ))
    return F.concat(
        F.substring(digest, 1, 8), F.lit("-"),
        F.substring(digest, 9, 4), F.lit("-5"),
        F.substring(digest, 14, 3), F.lit("-"),
        variant, F.substring(digest, 18, 3), F.lit("-"),
        F.substring(digest, 21, 12),
    )
