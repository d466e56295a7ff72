"""Proof that a fault landed on a batch in flight: the rows relay sessions hold locked at the
instant of the fault, read from PostgreSQL (never from the relay's internals).

A relay claims a batch with `SELECT ... FOR UPDATE SKIP LOCKED` in a transaction it keeps open
across the publish; PostgreSQL marks each locked row with the claiming transaction's id (its
xmax) and shows that transaction in `pg_stat_activity.backend_xid` for the relay's session
(`application_name` "outbox-relay <role> <host> <pid>"). Joining the two says which relay
process holds how many rows, at one instant. Freezing the relay (SIGSTOP) while sampling makes
that instant exact: a frozen relay cannot finish its batch between the sample and the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from tests.helpers import RelayProcess

HELD_ROWS = """
WITH relay_tx AS (
    SELECT a.pid, a.backend_xid AS xid, a.application_name, a.state,
           now() - a.xact_start AS in_transaction, left(a.query, 100) AS query
    FROM pg_stat_activity AS a
    WHERE a.datname = current_database()
      AND a.application_name LIKE 'outbox-relay %'
      AND a.backend_xid IS NOT NULL
)
SELECT t.application_name, t.xid::text AS xid, count(q.*) AS rows,
       format('%s, %s for %s: %s', t.application_name, t.state, t.in_transaction, t.query)
           AS session
FROM relay_tx AS t LEFT JOIN queue_message AS q ON q.xmax = t.xid
GROUP BY t.application_name, t.xid, t.state, t.in_transaction, t.query
"""


# A frozen relay sends nothing new, but the server still runs what it had sent: wait until its
# worker sessions finished (a claim still running would lock rows after the sample).
BUSY_WORKERS = """
SELECT a.application_name, a.wait_event_type, a.wait_event, left(a.query, 60) AS query
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.application_name LIKE 'outbox-relay worker %'
  AND a.state = 'active'
  -- waiting for the (frozen) client's next message: nothing runs on the server's side
  AND a.wait_event IS DISTINCT FROM 'ClientRead'
"""


@dataclass(frozen=True)
class Held:
    """Relay transactions and the outbox rows each holds, at one instant."""

    rows_by_xid: dict[str, int]
    # Each holding transaction's session at the sample (role, state, time in the transaction,
    # its last statement), for a failure message: the transaction may be gone a moment later.
    sessions: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def rows(self) -> int:
        """Rows locked (or deleted, not yet committed) by relay transactions."""
        return sum(self.rows_by_xid.values())

    @property
    def in_flight(self) -> bool:
        """A relay held at least one claimed row: a batch was in flight."""
        return self.rows > 0


class LockProbe:
    """Samples the rows relay sessions hold, over a connection of its own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: asyncpg.Connection | None = None
        self.last_busy: list[dict[str, object]] = []  # what kept the last sample from settling

    async def held(self, relay_pids: Iterable[int] | None = None,
                   settle_s: float = 0.5) -> Held | None:
        """Rows held by the sessions of the given relay processes (all relays when None).

        Call it with the relays frozen: it first waits until the server finished every query
        their worker sessions had sent, so that the sample is what they hold until thawed.
        None when a query is still running after `settle_s` (a server blocked writing a result
        the frozen relay does not read): no exact sample at this instant.
        """
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.dsn)
        wanted = None if relay_pids is None else {str(p) for p in relay_pids}

        def mine(rows: list[asyncpg.Record]) -> list[asyncpg.Record]:
            return [r for r in rows
                    if wanted is None or r["application_name"].rsplit(" ", 1)[-1] in wanted]

        deadline = time.monotonic() + settle_s
        while busy := mine(await self._conn.fetch(BUSY_WORKERS)):
            if time.monotonic() > deadline:
                self.last_busy = [dict(r) for r in busy]
                return None
            await asyncio.sleep(0.002)
        held = mine(await self._conn.fetch(HELD_ROWS))
        return Held({r["xid"]: int(r["rows"]) for r in held},
                    {r["xid"]: r["session"] for r in held})

    async def close(self) -> None:
        """Close the probe's connection (a restarted server may have closed it already)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None


@contextlib.asynccontextmanager
async def frozen(procs: Iterable[RelayProcess]) -> AsyncIterator[None]:
    """SIGSTOP the relay processes for the block, SIGCONT after (a no-op for dead ones)."""
    stopped = [p for p in procs if p.alive()]
    for p in stopped:
        os.kill(p.pid, signal.SIGSTOP)
    for p in stopped:
        await _until_stopped(p.pid)
    try:
        yield
    finally:
        for p in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)


def _proc_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("" once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""


async def _until_stopped(pid: int) -> None:
    """SIGSTOP is delivered asynchronously: wait until the kernel shows the process stopped."""
    for _ in range(1000):
        if _proc_state(pid) in {"T", "t", "Z", "X", ""}:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop after SIGSTOP")


@dataclass
class FaultTally:
    """Every fault a test fired and what it hit."""

    name: str
    hits: list[Held] = field(default_factory=list)

    def record(self, held: Held) -> None:
        """One fault fired, with the rows relays held at that instant."""
        self.hits.append(held)

    @property
    def faults(self) -> int:
        """Faults fired."""
        return len(self.hits)

    @property
    def in_flight(self) -> int:
        """Faults that struck a relay holding claimed rows."""
        return sum(1 for h in self.hits if h.in_flight)

    @property
    def rows_in_flight(self) -> int:
        """Claimed rows held by relays at the instants of the faults, summed."""
        return sum(h.rows for h in self.hits)

    def summary(self) -> str:
        """One line for the test's output."""
        return (f"faults={self.faults} in_flight={self.in_flight} "
                f"rows_in_flight={self.rows_in_flight} per_fault={[h.rows for h in self.hits]}")


@contextlib.asynccontextmanager
async def caught_holding_rows(procs: list[RelayProcess], probe: LockProbe,
                              timeout_s: float = 15.0, settle_s: float = 0.5
                              ) -> AsyncIterator[Held]:
    """Freeze the relays at an instant they hold claimed rows and run the block (the fault)
    while they stay frozen; yields what they held. Tries every ~20 ms; after the timeout the
    block runs anyway and the sample says what it says (a fault that hit nothing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with frozen(procs):
            held = await probe.held([p.pid for p in procs], settle_s)
            if held is not None and (held.in_flight or time.monotonic() > deadline):
                yield held
                return
            if held is None and time.monotonic() > deadline:
                raise AssertionError("relay sessions never idle while frozen (no exact sample): "
                                     f"{probe.last_busy}")
        # Let them run a little (longer after a sample that found a query still running).
        await asyncio.sleep(0.02 if held is not None else 0.1)
