"""What relay/pg needs of the settings, in one typed value built at the door.

Only relay/app.py and relay/cli/ read `Settings` (`relay.app.database_config` builds this);
every function of relay/pg takes a `DatabaseConfig`, so a test or a tool opens the database
with exactly the knobs the database side uses, and the queries are rendered once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.deadlines import Deadlines
from relay.interfaces import ClaimOptions, OnSuccess
from relay.pg.queries import Queries, TableNames


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """The database side of one relay process or command.

    dsn: libpq URL or keyword string (None: the PG* variables alone). table: the outbox table
    as the user named it (for messages). deadlines: every bound of a batch (relay/deadlines.py).
    lock_command_timeout_s: the client-side bound of sessions that wait on locks or migrate.
    reconnect_max_s / startup_timeout_s: the backoff cap and the bound of a one-shot command's
    wait for the server. pool_size: the worker's connections (lanes, express lane, the rest).
    leader_idle_session_ms: idle_session_timeout of the single-active leader's lock session.
    """

    dsn: str | None
    names: TableNames
    table: str
    deadlines: Deadlines
    lock_command_timeout_s: float
    reconnect_max_s: float
    startup_timeout_s: float
    on_success: OnSuccess
    claim: ClaimOptions
    pool_size: int
    leader_idle_session_ms: int
    queries: Queries = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queries", Queries(self.names))
