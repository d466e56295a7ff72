"""The bulk transport's meter: bytes in flight, the rate the broker confirms them at (busy
time only), and a pass that writes only what can be confirmed by its deadline."""

from __future__ import annotations

import asyncio

import pytest

from relay.amqp.pacing import FIRST_WINDOW, PACE, PIECE_MIN, LinkMeter
from relay.amqp.transports import _paced


def test_meter__the_rate_counts_busy_time_only_and_a_new_channel_keeps_it() -> None:
    meter = LinkMeter()
    assert meter.rate is None
    assert meter.allowance(2.0) == FIRST_WINDOW
    meter.wrote(10, 500_000, now=100.0)
    meter.wrote(20, 500_000, now=100.0)
    assert meter.in_flight == 1_000_000
    meter.heard(10, now=100.5)  # 500 kB in 0.5 s
    assert meter.in_flight == 500_000
    assert meter.rate == pytest.approx(1_000_000)
    meter.heard(20, now=101.0)
    assert meter.in_flight == 0
    # Idle for a minute: not part of any measurement.
    meter.wrote(30, 400_000, now=161.0)
    meter.heard(30, now=161.1)  # 4 MB/s
    assert meter.rate == pytest.approx((1_000_000 + 4_000_000) / 2)
    assert meter.allowance(2.0) == pytest.approx(PACE * meter.rate * 2.0)
    assert meter.piece_bytes(1 << 20) == min(1 << 20, int(meter.rate * 0.1))
    meter.wrote(40, 300, now=170.0)
    meter.new_channel()
    assert meter.in_flight == 0
    assert meter.rate is not None


def test_meter__a_tag_inside_a_piece_confirms_nothing_and_pieces_have_a_floor() -> None:
    meter = LinkMeter()
    meter.wrote(5, 1000, now=0.0)
    meter.heard(3, now=0.1)
    assert meter.in_flight == 1000
    meter.heard(5, now=0.2)
    assert meter.in_flight == 0
    meter.rate = 1.0
    assert meter.piece_bytes(1 << 20) == PIECE_MIN


async def test_paced__writes_what_can_be_confirmed_in_time_and_stops_before_what_cannot() -> None:
    loop = asyncio.get_running_loop()
    meter = LinkMeter()
    # Seconds of margin: a loaded machine's stalls must not reach the deadline.
    deadline = loop.time() + 5.0
    # Unmeasured: every piece goes (nothing in flight), a pass's first one always.
    assert await _paced(meter, 10 << 20, deadline, first=False)
    meter.rate = 100_000.0  # 100 kB/s: about 375 kB can be confirmed in the 5 s left
    assert not await _paced(meter, 600_000, deadline, first=False)
    assert await _paced(meter, 600_000, deadline, first=True)
    assert await _paced(meter, 200_000, deadline, first=False)
    meter.wrote(1, 200_000, loop.time())
    # 200 kB in flight, 200 kB more fits only once confirms come: they do, after 0.1 s.
    loop.call_later(0.1, meter.heard, 1, loop.time() + 0.1)
    started = loop.time()
    assert await _paced(meter, 200_000, deadline, first=False)
    assert loop.time() - started >= 0.09
    # No confirm comes and the deadline passes: nothing more is written.
    meter.wrote(2, 300_000, loop.time())
    assert not await _paced(meter, 200_000, loop.time() + 0.2, first=False)


async def test_paced__a_closed_channel_ends_the_wait_at_once_not_at_the_deadline() -> None:
    """A pass waiting for confirms before its next piece held its claim until the batch's
    deadline when the broker connection dropped (a CI run: a claim while the broker is away)."""
    loop = asyncio.get_running_loop()
    meter = LinkMeter()
    meter.rate = 1_000_000.0
    meter.wrote(1, 900_000, loop.time())
    closed = False

    def close() -> None:
        nonlocal closed
        closed = True
        meter.wake()

    loop.call_later(0.05, close)
    started = loop.time()
    assert not await _paced(meter, 900_000, loop.time() + 1.5, first=False,
                            closed=lambda: closed)
    assert loop.time() - started < 0.5
