"""The SQL catalogue, without servers."""

from __future__ import annotations

import pytest

from relay.pg.queries import Queries, TableNames, parse, raw_queries


def test_parse__splits_named_statements() -> None:
    text = "-- name: a\nSELECT 1;\n\n-- name: b\n-- why\nSELECT 2\n"
    assert parse(text) == {"a": "SELECT 1", "b": "-- why\nSELECT 2"}


def test_parse__rejects_a_name_defined_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_queries__render_quoted_schema_qualified_names_and_leave_json_braces() -> None:
    q = Queries(TableNames("outbox", "events", "queue_message_notify"))
    assert '"outbox"."events"' in q["claim"]
    assert '"outbox"."events_dead"' in q["dead_show"]
    assert '"outbox"."events_park"' in q["dead_letter"]
    assert "{" not in q["delete_published"]


def test_catalogue__every_statement_renders_without_leftover_placeholders() -> None:
    q = Queries(TableNames(None, "queue_message", "queue_message_notify"))
    for name in raw_queries():
        rendered = q[name]
        for placeholder in TableNames(None, "t", "c").placeholders():
            assert "{" + placeholder + "}" not in rendered, name


def test_delete_at_commit__ids_reach_the_script_only_as_canonical_uuids() -> None:
    from relay.pg.store import _uuid_array_literal
    ids = ["0190F3A2-0000-7000-8000-000000000001", "{0190f3a2-0000-7000-8000-000000000002}"]
    assert _uuid_array_literal(ids) == ("{0190f3a2-0000-7000-8000-000000000001,"
                                        "0190f3a2-0000-7000-8000-000000000002}")
    with pytest.raises(ValueError, match="badly formed"):
        _uuid_array_literal(["0190f3a2-0000-7000-8000-000000000001'}'); DROP TABLE x; --"])
    script = Queries(TableNames(None, "queue_message", "n"))["delete_published_and_commit"]
    assert script.count("{ids}") == 1
    assert script.rstrip().endswith("COMMIT")


def test_the_stream_channel__is_the_tables_channel_and_stream_within_63_bytes() -> None:
    assert TableNames(None, "queue_message", "queue_message_notify").stream_channel == (
        "queue_message_notify_stream")
    long = "é" * 31 + "x"  # 63 bytes: the end is cut on a character boundary
    channel = TableNames(None, "t", long).stream_channel
    assert channel.endswith("_stream")
    assert len(channel.encode()) <= 63
    assert channel == "é" * 28 + "_stream"
