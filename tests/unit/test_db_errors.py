"""Which driver errors mean "no usable server now" (retried, one outage) and which are errors."""

from __future__ import annotations

import asyncpg
import structlog

from relay.errors import DatabaseError, DatabaseUnavailable
from relay.pg.connection import database_error
from relay.supervise import Supervisor

# What asyncpg raised to a claim on a session PostgreSQL's shutdown had just ended (seen in a
# restart test): its protocol had read the FATAL message and was still consuming it.
STATE_ERROR = asyncpg.exceptions.InternalClientError(
    "cannot switch to state 12; another operation (2) is in progress")


def test_a_session_ended_under_a_statement__is_unavailable_like_the_refusals_after_it() -> None:
    assert type(database_error(STATE_ERROR, "claiming rows")) is DatabaseUnavailable
    refused = database_error(ConnectionRefusedError(111, "Connection refused"), "taking one")
    assert type(refused) is DatabaseUnavailable


def test_a_stale_statement_cache_or_a_server_error__stays_an_error() -> None:
    stale = asyncpg.exceptions.OutdatedSchemaCacheError("cached statement plan is invalid")
    assert type(database_error(stale, "claiming rows")) is DatabaseError
    syntax = asyncpg.exceptions.PostgresSyntaxError("syntax error at or near")
    assert type(database_error(syntax, "claiming rows")) is DatabaseError


def test_a_restart_seen_by_the_worker__logs_one_outage_line_and_one_recovery() -> None:
    """The worker's supervisor is told of each failed attempt: the state error, then
    refusals while the server is down, then the claim that works."""
    sup = Supervisor("database")
    sup.ok()
    with structlog.testing.capture_logs() as logs:
        sup.failed(database_error(STATE_ERROR, "claiming rows"))
        for _ in range(3):
            sup.failed(database_error(ConnectionRefusedError(111, "refused"), "taking one"))
        sup.ok()
    assert [e["event"] for e in logs] == ["connection_lost", "connection_restored"]
