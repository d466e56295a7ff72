"""Per-key ordering inside a batch: hold-back, head-first waves, block on invalid. No servers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from relay.interfaces import Message, OutboxRow, PublishResult, Settlement
from relay.loop import ordering
from relay.loop.worker import Worker, WorkerConfig
from relay.options import Properties


def row(rid: str, key: str | None, attempts: int = 0) -> OutboxRow:
    return OutboxRow(rid, "x", "rk", "{}", None, attempts, ordering_key=key)


def msg(rid: str) -> Message:
    return Message(rid, "x", "rk", b"{}", Properties(), True)


@dataclass
class ScriptedPublisher:
    """Confirms everything except the ids in `fail`; records each publish call."""

    fail: set[str] = field(default_factory=set)
    calls: list[list[str]] = field(default_factory=list)
    ready: bool = True

    async def wait_ready(self) -> None:
        return None

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        self.calls.append([m.id for m in messages])
        result = PublishResult()
        for m in messages:
            if m.id in self.fail:
                result.failed[m.id] = "nacked"
            else:
                result.confirmed.append(m.id)
        return result


BATCH = [row("a1", "A"), row("b1", "B"), row("a2", "A"), row("u1", None), row("a3", "A")]


def test_hold_back__rows_after_a_failed_row_of_the_key_are_not_deleted() -> None:
    settlement = Settlement(published=["b1", "a2", "u1", "a3"], retry=[("a1", "nacked", 1.0)])
    held = ordering.hold_back(BATCH, settlement, block_on_dead=False)
    assert held == 2
    assert settlement.published == ["b1", "u1"]


def test_hold_back__a_dead_row_releases_the_rest_with_skip_and_holds_it_with_block() -> None:
    skip = Settlement(published=["b1", "a2", "u1", "a3"], dead=[("a1", "bad", False)])
    assert ordering.hold_back(BATCH, skip, block_on_dead=False) == 0
    block = Settlement(published=["b1", "a2", "u1", "a3"], dead=[("a1", "bad", False)])
    assert ordering.hold_back(BATCH, block, block_on_dead=True) == 2
    assert block.published == ["b1", "u1"]


def test_hold_back__an_unsent_middle_row_holds_only_the_rows_behind_it() -> None:
    settlement = Settlement(published=["a1", "b1", "u1", "a3"])  # a2 unsent: left untouched
    assert ordering.hold_back(BATCH, settlement, block_on_dead=False) == 1
    assert settlement.published == ["a1", "b1", "u1"]


def test_publishable__block_keeps_rows_after_an_invalid_row_of_the_key_unpublished() -> None:
    messages = [msg(r.id) for r in BATCH if r.id != "a1"]
    kept = ordering.publishable(BATCH, messages, {"a1": "bad options"}, block_on_dead=True)
    assert [m.id for m in kept] == ["b1", "u1"]
    kept = ordering.publishable(BATCH, messages, {"a1": "bad options"}, block_on_dead=False)
    assert [m.id for m in kept] == ["b1", "a2", "u1", "a3"]


async def test_waves__one_pass_when_no_head_failed_before() -> None:
    pub = ScriptedPublisher()
    result = await ordering.publish_in_waves(pub, BATCH, [msg(r.id) for r in BATCH])
    assert pub.calls == [["a1", "b1", "a2", "u1", "a3"]]
    assert len(result.confirmed) == 5


async def test_waves__a_retried_head_goes_first_and_its_key_stops_if_it_fails_again() -> None:
    rows = [row("a1", "A", attempts=2), *BATCH[1:]]
    pub = ScriptedPublisher(fail={"a1"})
    result = await ordering.publish_in_waves(pub, rows, [msg(r.id) for r in rows])
    assert pub.calls == [["a1", "b1", "u1"]]
    assert result.failed == {"a1": "nacked"}
    assert sorted(result.confirmed) == ["b1", "u1"]


async def test_waves__a_retried_head_that_now_succeeds_releases_its_run_in_a_second_pass() -> None:
    rows = [row("a1", "A", attempts=2), *BATCH[1:]]
    pub = ScriptedPublisher()
    result = await ordering.publish_in_waves(pub, rows, [msg(r.id) for r in rows])
    assert pub.calls == [["a1", "b1", "u1"], ["a2", "a3"]]
    assert sorted(result.confirmed) == ["a1", "a2", "a3", "b1", "u1"]


async def test_drain__keeps_claiming_while_short_batches_carry_keyed_rows() -> None:
    # A keyed claim is capped by keys per batch, so short batches do not mean "empty".
    from tests.unit.test_worker import FakePublisher, FakeStore

    class KeyCappedStore(FakeStore):
        def claim(self, limit: int):  # type: ignore[no-untyped-def]
            return super().claim(min(limit, 2))

    rows = [row(f"r{i}", f"k{i}") for i in range(9)]
    store, pub = KeyCappedStore(list(rows)), FakePublisher()
    await Worker(store, pub, WorkerConfig(batch_size=10, concurrency=1)).drain()
    assert store.rows == []
    assert pub.published == [r.id for r in rows]
