"""Loads sql/queries.sql (every SQL statement of the relay) into a name -> SQL mapping.

Statements name tables through placeholders ({table}, {dead}, {archive}, ...) that are filled
only with quoted identifiers derived from validated settings, never with values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)

# First key of the two-key advisory lock a relay holds while asleep (the second key is the
# outbox table's oid), in conditional notify mode: "RELY" in ASCII.
WAKEUP_LOCK_CLASS = 0x52454C59
# Namespaces of the other two-key locks, keyed on the table's oid like the wake-up lock (never on
# the spelling of RELAY_TABLE: `queue_message` and `public.queue_message` are one table):
# the single-active leader's session lock ("RLDR") and the batch fence ("RFNC").
LEADER_LOCK_CLASS = 0x524C4452
FENCE_LOCK_CLASS = 0x52464E43


def sql_dir() -> Path:
    """The folder of SQL files: sql/ in a checkout, relay/sql when installed as a wheel."""
    packaged = Path(str(resources.files("relay"))) / "sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "sql"


def quote_ident(name: str) -> str:
    """Quote one SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """Quote one SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class TableNames:
    """Quoted names of the relay's tables and objects for one outbox table."""

    schema: str | None
    name: str
    channel: str

    @property
    def dead_channel(self) -> str:
        """The channel that hears of parked rows: the table's channel and `_dead`, the
        channel's end cut where the whole would pass PostgreSQL's 63 bytes."""
        base = self.channel.encode()[: 63 - len("_dead")].decode(errors="ignore")
        return base + "_dead"

    @property
    def stream_channel(self) -> str:
        """The channel that wakes a relay asleep on the stream table: the table's channel and
        `_stream`, cut the same way."""
        base = self.channel.encode()[: 63 - len("_stream")].decode(errors="ignore")
        return base + "_stream"

    def _q(self, suffix: str = "") -> str:
        base = quote_ident(self.name + suffix)
        return f"{quote_ident(self.schema)}.{base}" if self.schema else base

    def placeholders(self) -> dict[str, str]:
        """Values for the {placeholders} in SQL text."""
        return {
            "table": self._q(),
            "dead": self._q("_dead"),
            "archive": self._q("_archive"),
            "relays": self._q("_relays"),
            "notify_fn": self._q("_notify_stmt"),
            "notify_trigger": quote_ident(self.name + "_notify"),
            "claim_keyed_fn": self._q("_claim_keyed"),
            "claim_fair_fn": self._q("_claim_fair"),
            "claim_keys_fn": self._q("_claim_keys"),
            "analyze_fn": self._q("_analyze"),
            "analyze_fn_literal": quote_literal(self._q("_analyze")),
            "fill_frontier": self._q("_fill_frontier"),
            "fill_frontier_literal": quote_literal(self._q("_fill_frontier")),
            "replay_fn": self._q("_replay"),
            "replay_fn_literal": quote_literal(self._q("_replay")),
            "dead_letter_fn": self._q("_park"),
            "dead_letter_fn_literal": quote_literal(self._q("_park")),
            "repeat_field_fn": self._q("_repeat_field"),
            "archive_partitions_fn": self._q("_archive_partitions"),
            "archive_partitions_fn_literal": quote_literal(self._q("_archive_partitions")),
            "archive_drop_fn": self._q("_archive_drop"),
            "archive_drop_fn_literal": quote_literal(self._q("_archive_drop")),
            "archive_literal": quote_literal(self._q("_archive")),
            "archive_name_literal": quote_literal(self.name + "_archive"),
            "archive_default": self._q("_archive_default"),
            # `relay migrate --partition-archive`'s steps (relay/pg/archive_convert.py): the
            # key built beforehand and the CHECK that proves the rows fit the legacy partition.
            "archive_key_ready": quote_ident(self.name + "_archive_key_ready"),
            "archive_bound": quote_ident(self.name + "_archive_bound"),
            "archive_bound_literal": quote_literal(self.name + "_archive_bound"),
            "archive_default_literal": quote_literal(self._q("_archive_default")),
            "repeat_valid_fn": self._q("_repeat_valid"),
            "repeat_problem_fn": self._q("_repeat_problem"),
            "repeat_valid_fn_literal": quote_literal(self._q("_repeat_valid")),
            "dead_literal": quote_literal(self._q("_dead")),
            # Rows for RabbitMQ streams (sql/migrations/0017_streams.sql).
            "stream_table": self._q("_stream"),
            "stream_slots": self._q("_stream_slots"),
            "stream_seq": self._q("_stream_seq"),
            "stream_relays": self._q("_stream_relays"),
            "stream_legacy": self._q("_stream_legacy"),  # sql/migrations/0022
            "stream_legacy_literal": quote_literal(self._q("_stream_legacy")),
            "stream_seq_literal": quote_literal(self._q("_stream_seq")),
            "stream_dead": self._q("_stream_dead"),  # sql/migrations/0018_stream_dead.sql
            # sql/migrations/0019_stream_notify.sql
            "stream_literal": quote_literal(self._q("_stream")),
            "stream_notify_fn": self._q("_stream_notify_stmt"),
            "stream_notify_trigger": quote_ident(self.name + "_stream_notify"),
            "stream_notify_trigger_literal": quote_literal(self.name + "_stream_notify"),
            "stream_channel_literal": quote_literal(self.stream_channel),
            "stream_assigned_check": quote_ident(self.name + "_stream_assigned"),
            "stream_unassigned_idx": quote_ident(self.name + "_stream_unassigned_idx"),
            "stream_assigned_idx": quote_ident(self.name + "_stream_assigned_idx"),
            # sql/migrations/0020_stream_definer_functions.sql
            "stream_park_fn": self._q("_stream_park"),
            "stream_park_fn_literal": quote_literal(self._q("_stream_park")),
            "stream_replay_fn": self._q("_stream_replay"),
            "stream_replay_fn_literal": quote_literal(self._q("_stream_replay")),
            # Spark's staging tables: a schema of their own (sql/migrations/0010).
            "stage_schema": quote_ident(self.name + "_stage"),
            "stage_schema_literal": quote_literal(self.name + "_stage"),
            "migrations": (
                f"{quote_ident(self.schema)}.relay_migrations"
                if self.schema
                else "relay_migrations"
            ),
            "schema": quote_ident(self.schema) if self.schema else "public",
            "table_literal": quote_literal(self._q()),
            "name": self.name,
            "channel": self.channel,
            "channel_literal": "'" + self.channel + "'",
            "dead_channel_literal": quote_literal(self.dead_channel),
            # The table as a person writes it (schema.name, unquoted), for messages.
            "table_name_literal": quote_literal(f"{self.schema}.{self.name}" if self.schema
                                                else self.name),
            "wakeup_lock_class": str(WAKEUP_LOCK_CLASS),
            "leader_lock_class": str(LEADER_LOCK_CLASS),
            "fence_lock_class": str(FENCE_LOCK_CLASS),
            "table_oid": quote_literal(self._q()) + "::regclass::oid::int",
        }

    def render(self, sql: str) -> str:
        """Fill the {placeholders} of one statement; other braces (JSON, arrays) stay."""
        values = self.placeholders()
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), sql)


def parse(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


@cache
def raw_queries() -> dict[str, str]:
    """All named statements of sql/queries.sql, unrendered."""
    return parse((sql_dir() / "queries.sql").read_text(encoding="utf-8"))


class Queries:
    """The named statements rendered for one outbox table."""

    def __init__(self, names: TableNames) -> None:
        self.names = names
        self._sql = {k: names.render(v) for k, v in raw_queries().items()}

    def __getitem__(self, name: str) -> str:
        return self._sql[name]
