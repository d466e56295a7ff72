"""The relay's exceptions. Driver errors are translated into these where they enter."""

from __future__ import annotations


class RelayError(Exception):
    """The relay failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(RelayError):
    """A setting is invalid."""


class DatabaseError(RelayError):
    """PostgreSQL is unreachable or refused a statement."""


class DatabaseUnavailable(DatabaseError):
    """No usable PostgreSQL server now: unreachable, starting or stopping, out of connection
    slots, or only a read-only one (a standby) answered; retried, never a configuration error."""


class BrokerError(RelayError):
    """RabbitMQ is unreachable or closed the connection."""


class BrokerRefusedAtStart(BrokerError):
    """At start-up the broker refused the relay's credentials or its certificate: waiting will
    not change them (a configuration error; after start the same refusal is an outage)."""


class SchemaError(RelayError):
    """The outbox table is missing or not migrated: run `relay migrate`."""


class InvalidRow(RelayError):
    """A row can never be published as it is (bad options, too large); it goes to dead letters."""
