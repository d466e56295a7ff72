"""One supervision primitive for every connection the relay keeps.

A `Supervisor` owns the life of one connection (the LISTEN session, the wake-up lock session,
the leader lock session, the broker connection, the worker's pool): it retries `establish`
with capped exponential backoff and full jitter, its sleeps end at once when the relay stops,
it logs one line when an outage starts and one when it ends (however many attempts fail in
between), and its state is read by /healthz. At start-up the same loop waits for a server that
is not up yet, bounded by `give_up_after_s`; past the bound it raises `GaveUp`, which the CLI
maps to its own exit code (distinct from a bad setting).

Driver errors are the caller's business: `retry_on` names the exceptions that mean "not
reachable now"; anything else (a wrong password, a missing database) propagates at once.

Loops that must do something between attempts (a worker that heartbeats, a standby that polls)
drive the same state one attempt at a time: `failed(error)` after a failure, `pause()` for the
next backoff delay of the outage, `ok()` after a success. Another session to the same server
that just came back calls `wake()`: the pause under way ends at once, so a connection does not
sit out a 30 s backoff after its server is known to answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

import structlog

from relay.backoff import jittered_delay_s
from relay.errors import RelayError

log = structlog.get_logger("relay.supervise")

T = TypeVar("T")
State = Literal["starting", "up", "down", "stopped"]
# The events a supervisor logs while its connection is down (each with connection=<name>).
DOWN_EVENTS = ("connection_waiting", "connection_lost", "connection_failing")


class GaveUp(RelayError):
    """A server stayed unreachable for longer than the configured start-up bound."""


class Stopping(RelayError):
    """The relay is stopping: a supervised wait ended without a connection."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: attempt n waits uniform(d/2, d), d = base*2^n."""

    base_s: float = 0.2
    max_s: float = 30.0

    def delays(self) -> Iterator[float]:
        """An endless series of jittered delays, doubling up to `max_s`."""
        attempt = 0
        while True:
            yield jittered_delay_s(self.base_s, self.max_s, attempt)
            attempt += 1


class Supervisor:
    """The state and the retry loop of one connection; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        backoff: Backoff | None = None,
        stopping: asyncio.Event | None = None,
        give_up_after_s: float | None = None,
        describe: str = "",
    ) -> None:
        self.name = name
        self.backoff = backoff or Backoff()
        self.stopping = stopping or asyncio.Event()
        self.give_up_after_s = give_up_after_s
        self.describe = describe  # e.g. the redacted URL, for log lines
        # What the connection's owner adds to the snapshot (the broker: its node, failovers).
        self.details: Callable[[], dict[str, object]] | None = None
        self.state: State = "starting"
        self.last_error: str | None = None
        self.down_since: float | None = None  # time.monotonic() when the outage began
        self.outages = 0
        self._outage_logged = False
        self._logged_kinds: set[str] = set()
        self._attempts = 0
        self._never_up = True
        self._delays: Iterator[float] | None = None  # this outage's backoff; None when up
        self._woken = asyncio.Event()  # set by wake(): ends the pause under way (or the next)

    # ------------------------------------------------------------------ state changes

    def lost(self, error: BaseException | str) -> None:
        """The connection was up and is gone: mark it down and log the outage once."""
        if self.state == "stopped":
            return
        self._mark_down(error)

    def failed(self, error: BaseException | str) -> None:
        """One attempt over the connection failed: down (logged once per outage).

        Raises `GaveUp` when a server that was never up stayed away past the start-up bound.
        """
        if self.state == "stopped":
            return
        self._attempts += 1
        self._mark_down(error)
        self._check_give_up()

    def ok(self) -> None:
        """An attempt over the connection worked: up (the recovery is logged once)."""
        if self.state == "stopped":
            return
        if self.state != "up":
            self._attempts += 1
            self._mark_up()
        self._delays = None

    async def pause(self) -> bool:
        """Sleep this outage's next backoff delay, or less when `wake()` is called meanwhile;
        False (at once) when the relay stops."""
        return await self._sleep_unless_woken(self.next_delay_s())

    async def _sleep_unless_woken(self, seconds: float) -> bool:
        if not self._woken.is_set():
            woken = asyncio.ensure_future(self._woken.wait())
            stopping = asyncio.ensure_future(self.stopping.wait())
            try:
                await asyncio.wait({woken, stopping}, timeout=max(seconds, 0.0),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                stopping.cancel()
        self._woken.clear()
        return not self.stopping.is_set()

    def wake(self) -> None:
        """The server answers again (another session to it reconnected): end this outage's
        pause now rather than at its backoff delay. Does nothing while the connection is up."""
        if self.state == "down":
            self._woken.set()

    def next_delay_s(self) -> float:
        """This outage's next backoff delay (for a loop that must not block: it notes when
        the next attempt is due and does other work meanwhile)."""
        if self._delays is None:
            self._delays = self.backoff.delays()
        delay = next(self._delays)
        if self.give_up_after_s is not None and self._never_up and self.down_since is not None:
            # Wake for the start-up bound's last attempt rather than sleep past it.
            left_s = self.give_up_after_s - (time.monotonic() - self.down_since)
            delay = min(delay, max(left_s, 0.0) + 0.01)
        return delay

    def _mark_down(self, error: BaseException | str) -> None:
        self.last_error = error if isinstance(error, str) else _describe_error(error)
        if self.state != "down":
            self.state = "down"
            self.down_since = time.monotonic()
        kind = type(error).__name__ if isinstance(error, BaseException) else "lost"
        if not self._outage_logged:
            self._outage_logged = True
            self._logged_kinds = {kind}
            self.outages += 1
            event = "connection_waiting" if self.outages == 1 and self._never_up else (
                "connection_lost"
            )
            log.warning(event, connection=self.name, target=self.describe or None,
                        error=self.last_error)
        elif kind not in self._logged_kinds and kind != "lost":
            # The outage's cause became known or changed (a closed connection whose
            # reconnects are now refused): one line per kind of cause, not one per attempt.
            self._logged_kinds.add(kind)
            log.warning("connection_failing", connection=self.name,
                        target=self.describe or None, error=self.last_error)

    def _mark_up(self) -> None:
        if self._outage_logged:
            outage_s = time.monotonic() - (self.down_since or time.monotonic())
            log.info("connection_restored", connection=self.name, attempts=self._attempts,
                     outage_s=round(outage_s, 1))
        self._never_up = False
        self._outage_logged = False
        self._delays = None
        self._woken.clear()
        self.state, self.down_since, self.last_error, self._attempts = "up", None, None, 0

    def stop(self) -> None:
        """The relay is stopping: end every wait of this supervisor."""
        self.state = "stopped"
        self.stopping.set()

    # ------------------------------------------------------------------ the retry loop

    async def establish(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        retry_on: tuple[type[BaseException], ...] = (OSError,),
    ) -> T:
        """Call `attempt` until it returns; back off between failures that are in `retry_on`.

        Raises `Stopping` when the relay stops meanwhile, `GaveUp` when a server that was never
        up stayed away longer than `give_up_after_s`, and any error outside `retry_on` at once.
        """
        while True:
            if self.stopping.is_set():
                raise Stopping(f"{self.name}: stopping")
            try:
                result = await attempt()
            except retry_on as exc:
                self.failed(exc)
            else:
                self.ok()
                return result
            await self.pause()

    def _check_give_up(self) -> None:
        # The bound is for start-up ("containers start in any order"); a server lost after it
        # was once up is retried for as long as the relay runs.
        if self.give_up_after_s is None or self.down_since is None or not self._never_up:
            return
        waited_s = time.monotonic() - self.down_since
        if waited_s >= self.give_up_after_s:
            raise GaveUp(
                f"{self.name}: {self.describe or 'server'} unreachable for {waited_s:.0f}s "
                f"(limit {self.give_up_after_s:g}s): {self.last_error}"
            )

    async def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`; return False (at once) when the relay is stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await self.stopping.wait()
        return not self.stopping.is_set()

    # ------------------------------------------------------------------ health

    @property
    def up(self) -> bool:
        """The connection is established."""
        return self.state == "up"

    @property
    def ever_up(self) -> bool:
        """The connection was established at least once (start-up is over for it)."""
        return not self._never_up

    def snapshot(self) -> dict[str, object]:
        """State for /healthz and `relay status`: no secrets, no driver objects."""
        down_s = None if self.down_since is None else round(time.monotonic() - self.down_since, 1)
        snap: dict[str, object] = {"state": self.state, "down_for_s": down_s,
                                   "last_error": self.last_error, "outages": self.outages}
        if self.details is not None:
            snap.update(self.details())
        return snap


class Supervisors:
    """The supervisors of one relay process, sharing one stop event."""

    def __init__(
        self, *, backoff: Backoff | None = None, give_up_after_s: float | None = None
    ) -> None:
        self.stopping = asyncio.Event()
        self.backoff = backoff or Backoff()
        self.give_up_after_s = give_up_after_s
        self._all: dict[str, Supervisor] = {}

    def add(self, name: str, *, describe: str = "", bounded: bool = False,
            backoff: Backoff | None = None) -> Supervisor:
        """A new supervisor under this process's stop event and backoff (or its own).

        `bounded`: the start-up bound applies (the servers `relay run` waits for before it
        starts); the sessions opened afterwards retry for as long as the relay runs.
        """
        sup = Supervisor(name, backoff=backoff or self.backoff, stopping=self.stopping,
                         give_up_after_s=self.give_up_after_s if bounded else None,
                         describe=describe)
        self._all[name] = sup
        return sup

    def get(self, name: str) -> Supervisor:
        """The supervisor of that name."""
        return self._all[name]

    def discard(self, name: str) -> None:
        """Forget a supervisor (it no longer shows in snapshots)."""
        self._all.pop(name, None)

    def __iter__(self) -> Iterator[Supervisor]:
        return iter(self._all.values())

    def stop(self) -> None:
        """End every supervised wait; safe to call twice."""
        for sup in self._all.values():
            sup.state = "stopped"
        self.stopping.set()

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Every connection's state, by name."""
        return {name: sup.snapshot() for name, sup in self._all.items()}


def _describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
