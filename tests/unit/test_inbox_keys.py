"""The inbox's pure parts (relay/inbox/): what a message is recorded under, which table names
and settings it takes, how it counts attempts, and that a message without an id is rejected
(a publisher other than the relay; aio-pika itself always sets a message_id, so the real broker
cannot be given one without)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from relay.inbox import ConsumerConfig, InboxConsumer, InboxError, message_key, table_name
from relay.inbox.consumer import delivery_attempt
from relay.inbox.store import KEY_MAX_BYTES, queries

ROW = "0b9f7b1e-3c43-4c55-a1e4-7a0f6f1d2c11"


def test_message_key__the_relays_header_first_then_message_id() -> None:
    assert message_key({"x-outbox-id": ROW}, "chosen-by-producer") == ROW
    assert message_key({}, "chosen-by-producer") == "chosen-by-producer"
    assert message_key({"x-outbox-id": ""}, "m1") == "m1"
    assert message_key(None, None) is None
    assert message_key({"x-outbox-id": b""}, "") is None


def test_message_key__an_occurrence_of_a_recurring_row_is_its_own_key() -> None:
    at = "2026-11-27T10:00:00+00:00"
    assert message_key({"x-outbox-id": ROW, "x-outbox-occurrence": at}, ROW) == f"{ROW}@{at}"


def test_message_key__an_id_with_the_separator_never_meets_an_id_with_an_occurrence() -> None:
    """Found by tests/property/test_inbox_property.py: both were `a@b`."""
    plain = message_key({"x-outbox-id": "a@b"}, None)
    recurring = message_key({"x-outbox-id": "a", "x-outbox-occurrence": "b"}, None)
    assert (plain, recurring) == ("hex:614062", "a@b")
    assert message_key({"x-outbox-id": "hex:61"}, None) == "hex:6865783a3631"


def test_message_key__text_postgres_cannot_store_and_long_ids_are_encoded() -> None:
    assert message_key({"x-outbox-id": b"\xff\xfe"}, None) == "hex:fffe"
    assert message_key({"x-outbox-id": "a\x00b"}, None) == "hex:610062"
    assert message_key({"x-outbox-id": "é".encode()}, None) == "é"
    long = message_key({"x-outbox-id": "x" * (KEY_MAX_BYTES + 1)}, None)
    assert long is not None
    assert long.startswith("sha256:")
    assert len(long) == 71


@pytest.mark.parametrize("name", ["relay_inbox", "app.relay_inbox", "inbox$2", "_x", "a" * 63])
def test_table_name__plain_lower_case_names_are_taken(name: str) -> None:
    assert ".".join(table_name(name)) == name
    assert "CREATE TABLE IF NOT EXISTS" in queries(name)["inbox_create"]


@pytest.mark.parametrize("name", ["", "Inbox", "a.b.c", "1inbox", "in box", "a" * 64,
                                  'x"; DROP TABLE orders; --', "app."])
def test_table_name__anything_else_is_refused_saying_what_is_allowed(name: str) -> None:
    with pytest.raises(InboxError, match="lower-case letters"):
        table_name(name)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"queue": ""}, "queue"), ({"prefetch": 0}, "prefetch"), ({"prefetch": 70000}, "prefetch"),
    ({"concurrency": 0}, "concurrency"), ({"prefetch": 4, "concurrency": 8}, "concurrency"),
    ({"on_error": "drop"}, "on_error"), ({"max_attempts": 0}, "max_attempts"),
    ({"retention_s": 0}, "retention_s"), ({"retention_s": float("nan")}, "retention_s"),
    ({"prune_every_s": -1}, "prune_every_s"), ({"command_timeout_s": 0}, "command_timeout_s"),
    ({"command_timeout_s": float("inf")}, "command_timeout_s"),
])
def test_consumer_config__a_bad_setting_is_named(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(InboxError, match=f"setting {named}="):
        ConsumerConfig(**{"queue": "orders", **kwargs})


def test_consumer_config__the_command_timeout_bounds_statements_and_connects() -> None:
    args = ConsumerConfig(queue="orders", command_timeout_s=30).pool_args()
    assert (args["command_timeout"], args["timeout"]) == (30, 30)
    assert callable(args["init"])  # the client's keepalives, on each new session's socket
    # No startup setting: a pooler in front of the server (pgbouncer) refuses unknown ones.
    assert "server_settings" not in args


def test_consumer_config__the_name_is_the_queues_unless_given() -> None:
    assert ConsumerConfig(queue="orders").name == "orders"
    assert ConsumerConfig(queue="orders", consumer="billing").name == "billing"


@dataclass
class FakeMessage:
    """What the consumer reads of a delivery, and how it answered."""

    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    delivery_tag: int = 1
    answers: list[str] = field(default_factory=list)

    async def ack(self) -> None:
        self.answers.append("ack")

    async def reject(self, requeue: bool = False) -> None:
        self.answers.append(f"reject requeue={requeue}")

    async def nack(self, requeue: bool = True) -> None:
        self.answers.append(f"nack requeue={requeue}")


def test_delivery_attempt__the_brokers_count_when_it_keeps_one() -> None:
    assert delivery_attempt(FakeMessage(headers={"x-delivery-count": 2}), 1) == 3  # type: ignore[arg-type]
    assert delivery_attempt(FakeMessage(), 4) == 4  # type: ignore[arg-type]
    assert delivery_attempt(FakeMessage(headers={"x-delivery-count": True}), 1) == 1  # type: ignore[arg-type]


def test_a_message_without_any_id_is_rejected_and_no_handler_runs() -> None:
    ran: list[Any] = []

    async def handler(message: Any, conn: Any) -> None:
        ran.append(message)

    consumer = InboxConsumer("amqp://unused", "postgresql://unused", handler,
                             ConsumerConfig(queue="orders"))
    message = FakeMessage()
    asyncio.run(consumer._one(None, message))  # type: ignore[arg-type]
    assert message.answers == ["reject requeue=False"]
    assert ran == []
