"""Per-key ordering inside one batch: what to publish, in which waves, and what to hold back.

The claim (sql/migrations/0004_ordering.sql) hands a relay the head run of each key it locked;
this module keeps the run's order through the publish and the settlement. The rule: a row of a
key is deleted as published only if every earlier row of that key in the batch was published
too (or, with on_dead=skip, dead-lettered). Later rows of a key whose run broke stay in the
table untouched, and go out again, in order, after the row that broke the run: a broker that
refused row k after accepting k+1.. therefore delivers k+1.. once early and once again in
order (docs/ordering.md says exactly when that happens).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from relay.interfaces import (
    Fault,
    Kind,
    Message,
    OutboxRow,
    Publisher,
    PublishResult,
    Reason,
    Verdict,
)


def rows_after_breaks(rows: Sequence[OutboxRow], broken: Collection[str]) -> set[str]:
    """Ids of keyed rows that come after a row in `broken` of the same key (rows in seq order)."""
    stopped: set[str] = set()
    after: set[str] = set()
    for row in rows:
        key = row.ordering_key
        if key is None:
            continue
        if key in stopped:
            after.add(row.id)
        elif row.id in broken:
            stopped.add(key)
    return after


def publishable(
    rows: Sequence[OutboxRow], messages: Sequence[Message], invalid: Mapping[str, Fault],
    *, block_on_dead: bool,
) -> list[Message]:
    """Drop messages that must not go out yet: with block, rows after an invalid row of a key."""
    if not block_on_dead or not invalid:
        return list(messages)
    held = rows_after_breaks(rows, invalid.keys())
    return [m for m in messages if m.id not in held]


async def publish_in_waves(
    publisher: Publisher, rows: Sequence[OutboxRow], messages: Sequence[Message],
    *, deadline: float | None = None, into: PublishResult | None = None,
) -> PublishResult:
    """Publish a batch; a key whose head failed before goes out head first, the rest after.

    A head row with attempts > 0 failed last time and is likely to fail again: publishing it
    alone first (with every other message) and the rest of its key's run only once it is
    confirmed means a persistently failing head never lets later rows reach the broker early.
    `into`: the result to add to, so that a caller whose second wave crashed still knows what
    the first one settled.
    """
    result = into if into is not None else PublishResult()
    heads: dict[str, OutboxRow] = {}
    for row in rows:
        if row.ordering_key is not None and row.ordering_key not in heads:
            heads[row.ordering_key] = row
    suspects = {r.id for r in heads.values() if r.attempts > 0}
    if not suspects:
        result.merge(await publisher.publish(messages, deadline=deadline))
        return result
    behind = rows_after_breaks(rows, suspects)
    first = [m for m in messages if m.id not in behind]
    result.merge(await publisher.publish(first, deadline=deadline))
    confirmed = set(result.confirmed)
    broken = suspects - confirmed
    hold = rows_after_breaks(rows, broken)
    second = [m for m in messages if m.id in behind and m.id not in hold]
    if second:
        result.merge(await publisher.publish(second, deadline=deadline))
    return result


def hold_back(
    rows: Sequence[OutboxRow], verdicts: Sequence[Verdict], *, block_on_dead: bool
) -> tuple[list[Verdict], int]:
    """Turn published verdicts after a key's first unpublished row into untouched (held).

    A key's run breaks at its first row that was not published (retried, untouched, or
    dead-lettered under block). Confirmed rows after the break stay in the table untouched: they
    were delivered early and will be delivered again after the row that broke the run.
    Returns the new verdicts and how many were held.
    """
    broken = {
        v.row_id
        for row, v in zip(rows, verdicts, strict=True)
        if row.ordering_key is not None
        and v.kind is not Kind.PUBLISHED
        and (block_on_dead or v.kind is not Kind.DEAD)
    }
    held = rows_after_breaks(rows, broken)
    if not held:
        return list(verdicts), 0
    out = [
        Verdict(v.row_id, Kind.UNTOUCHED, Reason.HELD)
        if v.kind is Kind.PUBLISHED and v.row_id in held else v
        for v in verdicts
    ]
    return out, sum(1 for v in verdicts if v.kind is Kind.PUBLISHED and v.row_id in held)
