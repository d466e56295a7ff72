"""One lifecycle for the long-running parts of a relay process.

A *service* works in `run()` until it is cancelled and releases what it holds in `close()`
(the LISTEN session, the backlog poller; one whose `run()` raises is logged and started again
after a pause); a *resource* only has `close()` (the pool, the broker connection, the wake-up
lock's session, the HTTP endpoint). relay/app.py registers each as it creates it; `stop()`
cancels every running service, newest first, waits for them, then closes everything, newest
first, so nothing is closed under a part that still uses it. The worker is the one part outside
the group: it stops gracefully, finishing its batches within RELAY_SHUTDOWN_TIMEOUT_S, before
the group stops.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, TypeVar

import structlog

log = structlog.get_logger("relay.lifecycle")

# Each step of a stop (the cancelled services together, then each close) waits at most this
# long: a part stuck on a silent link is left behind, the process still exits in time.
STEP_BOUND_S = 6.0


class Resource(Protocol):
    """Something held open while the process runs."""

    async def close(self) -> None:
        """Release it (called once, at stop)."""


class Service(Resource, Protocol):
    """A part that works in the background while the process runs."""

    async def run(self) -> None:
        """Work until cancelled."""


R = TypeVar("R", bound=Resource)
S = TypeVar("S", bound=Service)


class Services:
    """The process's services and resources, started in order, stopped in reverse."""

    def __init__(self) -> None:
        self._held: list[Resource] = []
        self._tasks: list[asyncio.Task[None]] = []

    def hold(self, resource: R) -> R:
        """Close `resource` at stop (after everything registered later)."""
        self._held.append(resource)
        return resource

    def start(self, service: S) -> S:
        """Run `service` in the background from now on; cancel and close it at stop."""
        self.hold(service)
        self._tasks.append(asyncio.ensure_future(_keep_running(service)))
        return service

    async def stop(self) -> None:
        """Cancel every running service and wait for it, then close everything; newest first.
        A failing close is logged and the others still close."""
        tasks, self._tasks = self._tasks[::-1], []
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=STEP_BOUND_S)
            if stuck:
                log.warning("stop_left_running", parts=len(stuck))
        held, self._held = self._held[::-1], []
        for resource in held:
            started = time.monotonic()
            try:
                await asyncio.wait_for(resource.close(), timeout=STEP_BOUND_S)
            except Exception as exc:
                log.warning("close_failed", part=type(resource).__name__,
                            error=str(exc) or type(exc).__name__)
            took = time.monotonic() - started
            if took > 1.0:  # a stop must fit the orchestrator's grace period: say what is slow
                log.warning("close_slow", part=type(resource).__name__, seconds=round(took, 1))


# A service whose run() raised is started again after this long (doubling while it keeps
# failing at once, up to RESTART_MAX_S).
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0


async def _keep_running(service: Service) -> None:
    """Run `service` until it returns or is cancelled. A run() that raises (a bug, a driver
    surprise: each service handles the failures it expects itself) is logged with its
    traceback and started again after a pause: a part that died silently would leave the
    relay looking healthy without it (no LISTEN, no stream rows sent) until a restart."""
    pause_s = RESTART_FIRST_S
    while True:
        started = time.monotonic()
        try:
            await service.run()
            return
        except Exception as exc:
            log.error("service_failed", part=type(service).__name__, error=repr(exc),
                      restart_in_s=pause_s, exc_info=True)
        await asyncio.sleep(pause_s)
        ran_s = time.monotonic() - started
        pause_s = RESTART_FIRST_S if ran_s > 10 * RESTART_MAX_S else min(pause_s * 2,
                                                                          RESTART_MAX_S)
