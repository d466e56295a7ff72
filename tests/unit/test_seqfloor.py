"""Where the unkeyed claim starts (relay/pg/seqfloor.py): pure bookkeeping, a fake clock."""

from __future__ import annotations

from relay.pg.seqfloor import FROM_START, SeqFloor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _floor(**kw: float) -> tuple[SeqFloor, Clock]:
    clock = Clock()
    return SeqFloor(lag_s=1.0, rescan_every_s=1.0, rescan_share=0.05, clock=clock, **kw), clock


def test_the_first_claim_rescans_and_a_floor_needs_a_claim_at_least_the_lag_old() -> None:
    floor, clock = _floor()
    assert floor.start() == FROM_START
    floor.claimed(FROM_START, 10, 0.001)
    clock.now += 0.5
    assert floor.start() == FROM_START  # the only mark is younger than the lag
    floor.claimed(FROM_START, 510, 0.001)
    clock.now += 0.6
    assert floor.start() == 10  # the newest mark at least 1 s old, not the younger 510


def test_a_floor_follows_the_claims_with_the_lag() -> None:
    floor, clock = _floor()
    floor.claimed(floor.start(), 1, 0.001)
    seqs = iter(range(501, 100_000, 500))
    starts = []
    for _ in range(40):  # 4 s of claims, one every 0.1 s
        clock.now += 0.1
        start = floor.start()
        starts.append(start)
        floor.claimed(start, next(seqs), 0.001)
    floored = [s for s in starts if s != FROM_START]
    assert floored == sorted(floored)
    assert floored[-1] > 10_000
    # Every floor is a claim's lowest seq from at least 1 s (10 claims) earlier.
    assert all(s <= 1 + 500 * (i - 9) for i, s in enumerate(starts, 1) if s != FROM_START)


def test_rescans_come_at_least_every_second__and_rarer_when_they_are_expensive() -> None:
    floor, clock = _floor()
    floor.claimed(floor.start(), 1, 0.001)
    kinds = []
    for i in range(50):  # 5 s
        clock.now += 0.1
        start = floor.start()
        kinds.append(start == FROM_START)
        floor.claimed(start, 1000 + i * 500, 0.001)
    # The first second has no floor old enough (every claim starts at the bottom); then one
    # rescan a second.
    assert all(kinds[:9]), kinds
    assert 3 <= sum(kinds[10:]) <= 5, kinds
    # A rescan that took 0.2 s may come again only after 0.2 / 0.05 = 4 s.
    floor, clock = _floor()
    floor.claimed(floor.start(), 1, 0.2)
    rescans_at = []
    for i in range(100):  # 10 s
        clock.now += 0.1
        start = floor.start()
        if start == FROM_START:
            rescans_at.append(round(clock.now - 100.0, 1))
        floor.claimed(start, 1000 + i * 500, 0.2 if start == FROM_START else 0.001)
    # Floorless claims of the first second (each an expensive rescan, 0.2 s), then the next
    # rescan 4 s after the last of them.
    first_second = [t for t in rescans_at if t <= 1.0]
    later = [t for t in rescans_at if t > 1.0]
    assert len(first_second) >= 9, rescans_at
    assert len(later) == 2, rescans_at
    gaps = [b - a for a, b in zip([first_second[-1], *later], later, strict=False)]
    assert all(4.0 <= g <= 4.2 for g in gaps), rescans_at


def test_a_floored_claim_that_finds_nothing__makes_the_next_claim_a_rescan() -> None:
    floor, clock = _floor()
    floor.claimed(floor.start(), 5, 0.001)
    clock.now += 0.5
    floor.claimed(floor.start(), 500, 0.001)  # no floor old enough: from the bottom
    clock.now += 0.6
    start = floor.start()
    assert start == 5
    floor.claimed(start, None, 0.001)
    assert floor.start() == FROM_START


def test_a_rescan_that_finds_a_row_below_the_floor__drops_every_floor() -> None:
    floor, clock = _floor()
    floor.claimed(floor.start(), 1000, 0.001)
    clock.now += 1.5
    assert floor.start() == FROM_START  # periodic: 1.5 s since the first rescan
    floor.claimed(FROM_START, 2000, 0.001)
    clock.now += 0.1
    assert floor.start() == 1000
    floor.claimed(1000, 2500, 0.001)
    clock.now += 1.0
    assert floor.start() == FROM_START
    # A late commit: row 7 below the floor turned up.
    floor.claimed(FROM_START, 7, 0.001)
    clock.now += 0.1
    assert floor.start() == FROM_START  # no floor old enough any more
    clock.now += 1.0
    floor.claimed(FROM_START, 3000, 0.001)
    clock.now += 0.1
    assert floor.start() == 7  # marks from after the drop only


def test_marks_stay_few() -> None:
    floor, clock = _floor()
    for i in range(10_000):
        clock.now += 0.01
        floor.claimed(floor.start(), i, 0.001)
    assert len(floor._marks) <= 102


def _draining() -> SeqFloor:
    """A floor past its first claim (a rescan), its next claim not a rescan."""
    floor, _ = _floor()
    floor.start()
    floor.claimed(FROM_START, 1, 0.001)
    floor.start()
    return floor


def test_fill__starts_above_the_fill_frontier_while_a_backlog_drains() -> None:
    floor, clock = _floor()
    assert floor.start() == FROM_START
    assert floor.fill_start(FROM_START) == FROM_START  # a rescan's fill starts with it
    floor.claimed(FROM_START, 1, 0.001)
    floor.filled(500, full=True)
    clock.now += 0.5
    assert floor.start() == FROM_START  # no floor yet (no mark a second old), no rescan
    assert floor.fill_start(FROM_START) == 501  # above what the fill took
    floor.filled(1000, full=True)
    floor.filled(800, full=True)  # lanes finish out of order: the frontier never falls
    assert floor.fill_start(FROM_START) == 1001
    clock.now += 1.0
    assert floor.start() == FROM_START  # a rescan, every second
    assert floor.fill_start(FROM_START) == FROM_START  # its fill walks from the start


def test_fill__a_short_claim_sends_the_next_fill_back_to_the_floor() -> None:
    floor = _draining()
    floor.filled(500, full=True)
    assert floor.fill_start(7) == 501
    floor.filled(600, full=False)  # the backlog above the frontier is drained
    assert floor.fill_start(7) == 7
    floor.filled(None, full=True)  # a full batch with no fill rows leaves no frontier
    assert floor.fill_start(7) == 7


def test_fill__never_starts_below_the_claims_floor() -> None:
    floor = _draining()
    floor.filled(100, full=True)
    assert floor.fill_start(5_000) == 5_000


def test_fill__rows_given_back_send_the_next_fill_back_to_the_floor() -> None:
    floor = _draining()
    floor.filled(500, full=True)
    floor.released()  # a batch rolled back or retried: its rows are below the frontier
    assert floor.fill_start(7) == 7
