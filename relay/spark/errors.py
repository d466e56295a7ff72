"""Errors of the Spark writer; all are RelayErrors, and none carries a password."""

from __future__ import annotations

from relay.errors import ConfigError, RelayError


class SparkWriteError(RelayError):
    """Writing the DataFrame to the outbox failed."""


class OutboxColumnError(SparkWriteError, ValueError):
    """A DataFrame column is missing, unknown, of the wrong type or holds a bad value; nothing
    was written."""


class JdbcDriverNotFound(ConfigError):
    """The PostgreSQL JDBC driver jar was not found."""
