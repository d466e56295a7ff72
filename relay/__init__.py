"""outbox-relay: moves messages from a PostgreSQL outbox table to RabbitMQ, with no loss."""

__version__ = "0.1.0"
