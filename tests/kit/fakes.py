"""The one in-memory store, publisher and wake-up lock base the unit tests drive the loop
with (no servers).

FakeStore keeps rows in a list, locks what a claim takes, and applies a settlement only when
the claim commits (a claim left without commit() rolls back, as in PostgreSQL);
tests/integration/test_store_contract.py runs the same cases against it and the real store.
FakePublisher builds rows with the relay's real encoder (pure code) and settles each message
as scripted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from relay.amqp.encoder import Encoder
from relay.interfaces import (
    Fault,
    LockState,
    Message,
    OutboxRow,
    PublishResult,
    Reason,
    Settlement,
)
from relay.options import Properties


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No RELAY_* variable of the caller's shell, and a working folder with no .env (a test
    module uses it with `pytestmark = pytest.mark.usefixtures("clean_env")`)."""
    for key in list(os.environ):
        if key.startswith("RELAY_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def rows(n: int, prefix: str = "id") -> list[OutboxRow]:
    """n plain rows to exchange 'x', key 'rk'."""
    return [OutboxRow(f"{prefix}-{i}", "x", "rk", "{}", None, 0) for i in range(n)]


def keyed(rid: str, key: str | None, attempts: int = 0) -> OutboxRow:
    """A row of an ordering key."""
    return OutboxRow(rid, "x", "rk", "{}", None, attempts, ordering_key=key)


def msg(rid: str) -> Message:
    """A plain message."""
    return Message(rid, "x", "rk", b"{}", Properties(), True)


@dataclass
class FakeClaim:
    """Rows locked by one fake transaction."""

    rows: Sequence[OutboxRow]
    store: FakeStore
    settlement: Settlement | None = None
    committed: bool = False
    more_due: bool = False

    async def settle(self, settlement: Settlement) -> None:
        self.settlement = settlement

    async def commit(self) -> None:
        if self.store.fail_commit:
            raise self.store.fail_commit
        self.committed = True
        s = self.settlement or Settlement()
        self.store.settlements.append(s)
        gone = set(s.published) | {d[0] for d in s.dead}
        self.store.deleted += s.published
        self.store.dead += [(d[0], d[1]) for d in s.dead]
        counted = {r[0]: r[3] for r in s.retry}  # id -> whether the attempt counts
        self.store.rows = [
            r._replace(attempts=r.attempts + int(counted[r.id])) if r.id in counted else r
            for r in self.store.rows if r.id not in gone
        ]


@dataclass
class FakeStore:
    """Rows in a list; claims lock, commits apply settlements."""

    rows: list[OutboxRow] = field(default_factory=list)
    settlements: list[Settlement] = field(default_factory=list)
    locked: set[str] = field(default_factory=set)
    deleted: list[str] = field(default_factory=list)
    dead: list[tuple[str, str]] = field(default_factory=list)
    claims: int = 0
    claim_cap: int | None = None  # a keyed claim is capped by keys per batch
    fail_commit: BaseException | None = None

    @asynccontextmanager
    async def claim(self, limit: int, *, max_bytes: int | None = None
                    ) -> AsyncIterator[FakeClaim]:
        self.claims += 1
        cap = limit if self.claim_cap is None else min(limit, self.claim_cap)
        free = [r for r in self.rows if r.id not in self.locked][:cap]
        self.locked |= {r.id for r in free}
        try:
            yield FakeClaim(free, self)
        finally:
            self.locked -= {r.id for r in free}

    async def seconds_until_next_due(self) -> float | None:
        return None


Script = Callable[[Message], "Fault | Reason | None"]


@dataclass
class FakePublisher:
    """Confirms every message unless `script` returns a Fault (failed) or a Reason (unsent)."""

    ready: bool = True
    script: Script | None = None
    lose_broker_once: bool = False
    encoder: Encoder = field(default_factory=Encoder)
    published: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    hold: asyncio.Event | None = None  # when set: publish waits for it

    @property
    def connected(self) -> bool:
        return self.ready

    async def wait_ready(self) -> None:
        self.ready = True

    def build(self, row: OutboxRow) -> Message | Fault:
        return self.encoder.build(row)

    async def publish(
        self, messages: Sequence[Message], *, deadline: float | None = None
    ) -> PublishResult:
        self.calls.append([m.id for m in messages])
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(0)
        result = PublishResult()
        if self.lose_broker_once:
            self.lose_broker_once = False
            self.ready = False
            result.unsent = {m.id: Reason.BROKER_LOST for m in messages}
            return result
        for m in messages:
            outcome = self.script(m) if self.script is not None else None
            if isinstance(outcome, Fault):
                result.failed[m.id] = outcome
            elif isinstance(outcome, Reason):
                result.unsent[m.id] = outcome
            else:
                result.confirmed.append(m.id)
                self.published.append(m.id)
        return result


class FakeLock:
    """A WakeupLock for worker tests: subclass it, define prepare (and release to record the
    order of calls). `current` is what state() reports: by default this relay is the sleeper
    of a table in conditional mode, lock not held, so no sleep is capped (the poll interval
    applies) and after a drain that found rows the sleeper only tries the lock (queue False)."""

    current: LockState = LockState(role="sleeper", mode="conditional")

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        return LockState(role="sleeper", mode="conditional", held=True, checked=True)

    def state(self) -> LockState:
        return self.current

    async def release(self) -> None:
        pass

    async def step_down(self) -> None:
        pass

    async def close(self) -> None:
        pass
