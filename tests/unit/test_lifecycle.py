"""The process's lifecycle (relay/lifecycle.py): services run in the background, everything
closes at stop, newest first, and one failing close does not keep the others open."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from relay import lifecycle
from relay.lifecycle import Services


class Part:
    def __init__(self, name: str, log: list[str], *, fail_close: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_close = fail_close
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.log.append(f"cancelled {self.name}")
            raise

    async def close(self) -> None:
        self.log.append(f"closed {self.name}")
        if self.fail_close:
            raise RuntimeError("close failed")


async def test_services_run_until_stop__then_are_cancelled_and_closed_newest_first() -> None:
    log: list[str] = []
    services = Services()
    pool = services.hold(Part("pool", log))
    listener = services.start(Part("listener", log))
    poller = services.start(Part("poller", log, fail_close=True))
    http = services.hold(Part("http", log))
    await asyncio.wait_for(asyncio.gather(listener.running.wait(), poller.running.wait()), 2)
    assert log == []
    await services.stop()
    assert log == ["cancelled poller", "cancelled listener",
                   "closed http", "closed poller", "closed listener", "closed pool"]
    assert not pool.running.is_set()
    assert not http.running.is_set()
    await services.stop()  # a second stop has nothing left to do
    assert len(log) == 6


class FailsFirst(Part):
    """Its first run() raises what a bug would raise; later runs work until cancelled."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            raise KeyError("a bug")
        await super().run()


async def test_a_service_whose_run_raises__is_logged_and_started_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that died silently left the relay looking healthy without it (a stream worker
    whose first connection failed sent no stream row until the relay restarted)."""
    monkeypatch.setattr(lifecycle, "RESTART_FIRST_S", 0.01)
    log: list[str] = []
    services = Services()
    part = services.start(FailsFirst("streams", log))
    with structlog.testing.capture_logs() as logged:
        await asyncio.wait_for(part.running.wait(), 2)
    assert part.runs == 2
    failed = [e for e in logged if e["event"] == "service_failed"]
    assert [(e["part"], e["log_level"]) for e in failed] == [("FailsFirst", "error")]
    await services.stop()
    assert log == ["cancelled streams", "closed streams"]
