"""Least-privilege roles (sql/roles.sql): a producer that may only INSERT, a relay that may
only do what `relay run` and the dead-letter commands need."""

from __future__ import annotations

import re

import asyncpg

from relay.errors import ConfigError, DatabaseError
from relay.pg.connection import DB_ERRORS
from relay.pg.queries import TableNames, quote_ident, quote_literal, sql_dir

DEFAULT_PRODUCER_ROLE = "outbox_producer"
DEFAULT_RELAY_ROLE = "outbox_relay"
DEFAULT_SPARK_ROLE = "outbox_spark_writer"
_ROLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def roles_sql(
    names: TableNames, producer_role: str, relay_role: str,
    spark_role: str = DEFAULT_SPARK_ROLE,
) -> str:
    """sql/roles.sql rendered for one outbox table and its role names."""
    for role in (producer_role, relay_role, spark_role):
        if not _ROLE_RE.match(role):
            raise ConfigError(f"role name {role!r}: must be an identifier (letters, digits, _)")
    if producer_role == relay_role:
        raise ConfigError("the producer and relay roles must differ")
    if spark_role in (producer_role, relay_role):
        raise ConfigError("the Spark writer role must differ from the producer and relay roles")
    text = names.render((sql_dir() / "roles.sql").read_text(encoding="utf-8"))
    relays = names.placeholders()["relays"]
    extra = {
        "producer_role": quote_ident(producer_role),
        "relay_role": quote_ident(relay_role),
        "producer_role_literal": quote_literal(producer_role),
        "relay_role_literal": quote_literal(relay_role),
        "spark_role": quote_ident(spark_role),
        "spark_role_literal": quote_literal(spark_role),
        "relays_literal": quote_literal(relays),
    }
    return re.sub(r"\{(\w+)\}", lambda m: extra.get(m.group(1), m.group(0)), text)


async def apply_roles(
    conn: asyncpg.Connection, names: TableNames, producer_role: str, relay_role: str,
    spark_role: str = DEFAULT_SPARK_ROLE,
) -> None:
    """Create the roles when missing and grant them their privileges, in one transaction."""
    script = roles_sql(names, producer_role, relay_role, spark_role)
    try:
        async with conn.transaction():
            await conn.execute(script)
    except DB_ERRORS as exc:
        raise DatabaseError(f"applying roles failed: {exc}") from exc
