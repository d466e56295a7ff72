"""How much a pass may still write: no more than the broker can confirm by its deadline.

A message written to the socket is gone: the kernel's buffers (and a slow link's) take
megabytes at once, and a batch whose deadline passes before their confirms come leaves those
rows for a later batch, which sends them again while the first copies are still on their way.
Through a 1 MB/s link that multiplied rows. So the bulk transport meters its channel: the bytes
written and not yet confirmed (in flight), and the rate at which the broker confirms bytes
while some are in flight (the link's or the broker's speed, whichever is lower). A pass writes
its next piece only while what is in flight plus that piece can be confirmed by its deadline
(`PACE` of the rate times the time left); the rest is not sent at all, so it is claimed again
without being a duplicate. Before any measurement the allowance is `FIRST_WINDOW` bytes.

On a fast link this changes nothing (the allowance is far above a batch); on a slow one, a
missed deadline leaves at most the last piece's rows in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque

FIRST_WINDOW = 1 << 20  # bytes in flight before the first measurement
PACE = 0.75  # of the measured rate: a margin for the confirms' own latency
MEASURE_BYTES = 256 * 1024  # a rate sample covers at least this many confirmed bytes
MEASURE_S = 0.25  # ... or this much busy time, whichever comes first
PIECE_TIME_S = 0.1  # a piece is about this long on the wire (between the bounds below)
PIECE_MIN = 16 * 1024


class LinkMeter:
    """Bytes in flight on one confirm channel and the rate the broker confirms them at."""

    def __init__(self) -> None:
        self.rate: float | None = None  # bytes/s confirmed while some were in flight
        self.written = 0  # bytes written on the current channel
        self.confirmed = 0  # ... of which confirmed (acked or nacked)
        self._marks: deque[tuple[int, int]] = deque()  # (tag, bytes written through it)
        self._since: float | None = None  # start of the current busy stretch, or last confirm
        self._window_bytes = 0
        self._window_s = 0.0
        self._heard: asyncio.Event | None = None

    @property
    def in_flight(self) -> int:
        """Bytes written and not confirmed yet."""
        return self.written - self.confirmed

    def new_channel(self) -> None:
        """A new channel: its tags start again at 1 and nothing is in flight on it (the rate,
        a property of the link, is kept)."""
        self.written = self.confirmed = 0
        self._marks.clear()
        self._since = None
        self._wake()

    def wrote(self, through_tag: int, size: int, now: float) -> None:
        """`size` bytes were handed to the writer, ending with (or inside) `through_tag`."""
        if self.in_flight == 0:
            self._since = now
        self.written += size
        self._marks.append((through_tag, self.written))

    def heard(self, tag: int, now: float) -> None:
        """The broker confirmed (acked or nacked) up to `tag`."""
        through = self.confirmed
        while self._marks and self._marks[0][0] <= tag:
            through = self._marks.popleft()[1]
        if through > self.confirmed:
            if self._since is not None:
                self._window_s += max(now - self._since, 0.0)
            self._window_bytes += through - self.confirmed
            self.confirmed = through
            self._since = now if self.in_flight else None
            if self._window_bytes >= MEASURE_BYTES or self._window_s >= MEASURE_S:
                sample = self._window_bytes / max(self._window_s, 1e-6)
                self.rate = sample if self.rate is None else (self.rate + sample) / 2
                self._window_bytes, self._window_s = 0, 0.0
        self._wake()

    def allowance(self, left_s: float) -> float:
        """Bytes that may be in flight with `left_s` seconds left before a deadline."""
        if self.rate is None:
            return FIRST_WINDOW
        return PACE * self.rate * max(left_s, 0.0)

    def piece_bytes(self, ceiling: int) -> int:
        """How large a write to make: about PIECE_TIME_S on the measured link."""
        if self.rate is None:
            return ceiling
        return int(min(ceiling, max(PIECE_MIN, self.rate * PIECE_TIME_S)))

    async def wait_heard(self, timeout_s: float) -> None:
        """Wait for the next confirm (or a new channel), at most `timeout_s`."""
        self._heard = heard = asyncio.Event()
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await heard.wait()
        except TimeoutError:
            pass
        finally:
            if self._heard is heard:
                self._heard = None

    def wake(self) -> None:
        """End a wait_heard() now (the channel closed: nothing more will be confirmed)."""
        self._wake()

    def _wake(self) -> None:
        if self._heard is not None:
            self._heard.set()
