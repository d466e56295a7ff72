"""Per-key ordering inside a batch: hold-back, head-first waves, block on invalid. No servers."""

from __future__ import annotations

from relay.interfaces import Fault, Kind, OutboxRow, Reason, Verdict
from relay.loop import ordering
from relay.loop.worker import Worker, WorkerConfig
from tests.kit.fakes import FakePublisher, FakeStore, keyed, msg

NACKED = Fault(Reason.NACKED, "nacked")


def row(rid: str, key: str | None, attempts: int = 0) -> OutboxRow:
    return keyed(rid, key, attempts)


def ScriptedPublisher(fail: set[str] | None = None) -> FakePublisher:
    """Confirms everything except the ids in `fail` (nacked); records each publish call."""
    failing = fail or set()
    return FakePublisher(script=lambda m: NACKED if m.id in failing else None)


def verdicts(published: list[str], **others: Kind) -> list[Verdict]:
    """Verdicts for BATCH: the published ids, and other fates by id."""
    out = []
    for r in BATCH:
        if r.id in published:
            out.append(Verdict(r.id, Kind.PUBLISHED))
        else:
            kind = others.get(r.id, Kind.UNTOUCHED)
            out.append(Verdict(r.id, kind, Reason.NACKED))
    return out


def published(vs: list[Verdict]) -> list[str]:
    return [v.row_id for v in vs if v.kind is Kind.PUBLISHED]


BATCH = [row("a1", "A"), row("b1", "B"), row("a2", "A"), row("u1", None), row("a3", "A")]


def test_hold_back__rows_after_a_failed_row_of_the_key_are_not_deleted() -> None:
    vs, held = ordering.hold_back(BATCH, verdicts(["b1", "a2", "u1", "a3"], a1=Kind.RETRY),
                                  block_on_dead=False)
    assert held == 2
    assert published(vs) == ["b1", "u1"]
    assert {v.row_id: v.reason for v in vs if v.kind is Kind.UNTOUCHED} == {
        "a2": Reason.HELD, "a3": Reason.HELD}


def test_hold_back__a_dead_row_releases_the_rest_with_skip_and_holds_it_with_block() -> None:
    skip = verdicts(["b1", "a2", "u1", "a3"], a1=Kind.DEAD)
    assert ordering.hold_back(BATCH, skip, block_on_dead=False)[1] == 0
    vs, held = ordering.hold_back(BATCH, skip, block_on_dead=True)
    assert held == 2
    assert published(vs) == ["b1", "u1"]


def test_hold_back__an_unsent_middle_row_holds_only_the_rows_behind_it() -> None:
    vs, held = ordering.hold_back(BATCH, verdicts(["a1", "b1", "u1", "a3"]), block_on_dead=False)
    assert held == 1
    assert published(vs) == ["a1", "b1", "u1"]


def test_publishable__block_keeps_rows_after_an_invalid_row_of_the_key_unpublished() -> None:
    messages = [msg(r.id) for r in BATCH if r.id != "a1"]
    bad = {"a1": Fault(Reason.INVALID_OPTION, "bad")}
    kept = ordering.publishable(BATCH, messages, bad, block_on_dead=True)
    assert [m.id for m in kept] == ["b1", "u1"]
    kept = ordering.publishable(BATCH, messages, bad, block_on_dead=False)
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
    assert result.failed == {"a1": NACKED}
    assert sorted(result.confirmed) == ["b1", "u1"]


async def test_waves__a_retried_head_that_now_succeeds_releases_its_run_in_a_second_pass() -> None:
    rows = [row("a1", "A", attempts=2), *BATCH[1:]]
    pub = ScriptedPublisher()
    result = await ordering.publish_in_waves(pub, rows, [msg(r.id) for r in rows])
    assert pub.calls == [["a1", "b1", "u1"], ["a2", "a3"]]
    assert sorted(result.confirmed) == ["a1", "a2", "a3", "b1", "u1"]


async def test_drain__keeps_claiming_while_short_batches_carry_keyed_rows() -> None:
    # A keyed claim is capped by keys per batch, so short batches do not mean "empty".
    rows = [row(f"r{i}", f"k{i}") for i in range(9)]
    store, pub = FakeStore(list(rows), claim_cap=2), FakePublisher()
    await Worker(store, pub, WorkerConfig(batch_size=10, concurrency=1)).drain()
    assert store.rows == []
    assert pub.published == [r.id for r in rows]
