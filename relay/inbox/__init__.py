"""Effectively-once consumers: an inbox in the consumer's own PostgreSQL database.

    from relay.inbox import ConsumerConfig, consume

    async def handle(message, conn):       # conn: the transaction the inbox record is in
        await conn.execute("INSERT INTO orders ...", ...)

    await consume(amqp_url, pg_dsn, handle, ConsumerConfig(queue="orders"))

The relay delivers at least once; with the inbox, a message delivered again (a relay killed
between the broker's confirm and its commit, a consumer killed before its ack) finds its id
recorded and is acked without running the handler. Needs aio-pika and asyncpg only (no other
part of the relay is imported). docs/inbox.md: the guarantee, the settings, the plain SQL for
consumers in other languages.
"""

from relay.inbox.consumer import ConsumerConfig, InboxConsumer, consume, delivery_attempt
from relay.inbox.store import (
    DEFAULT_TABLE,
    ConsumerCount,
    Handler,
    Inbox,
    InboxError,
    InboxStats,
    message_key,
    migrate,
    prune,
    session,
    stats,
    table_name,
)

__all__ = [
    "DEFAULT_TABLE",
    "ConsumerConfig",
    "ConsumerCount",
    "Handler",
    "Inbox",
    "InboxConsumer",
    "InboxError",
    "InboxStats",
    "consume",
    "delivery_attempt",
    "message_key",
    "migrate",
    "prune",
    "session",
    "stats",
    "table_name",
]
