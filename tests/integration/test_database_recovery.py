"""After a database outage the worker's pool comes back within seconds of the server, not at the
end of a backoff delay that grew during the outage: the LISTEN session, which reconnects on its
own (every 5 s at most), ends the pool's pause once the server answers. Real PostgreSQL through
a proxy that refuses connections for the outage."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay.app import database_config, make_listener
from relay.settings import Settings
from relay.supervise import Backoff, Supervisors
from tests.helpers import wait_until
from tests.kit.proxy import proxy_for, via_proxy


@pytest.mark.timing
async def test_listener_back__ends_the_worker_pools_backoff_at_once(db: str) -> None:
    proxy = await proxy_for(db)
    settings = Settings(pg_dsn=via_proxy(db, proxy.port), reconnect_max_s=60)
    # The pool's backoff has grown to a minute (the cap a user may set).
    supervisors = Supervisors(backoff=Backoff(base_s=60, max_s=60))
    database = supervisors.add("database")
    database.ok()
    listener = make_listener(database_config(settings), supervisors, lambda: None)
    listening = asyncio.ensure_future(listener.run())
    try:
        await wait_until(lambda: listener.connected, timeout_s=10, what="LISTEN session up")
        await proxy.cut()
        database.failed("connection refused")  # what the worker's next sweep finds
        await wait_until(lambda: not listener.connected, timeout_s=15,
                         what="the LISTEN session to see the outage")
        paused = asyncio.ensure_future(database.pause())
        await asyncio.sleep(3)  # long enough for the listener's backoff to grow
        assert not paused.done(), "the pool's pause ended while the server was still away"
        await proxy.restore()
        restored = time.monotonic()
        assert await asyncio.wait_for(paused, timeout=45) is True, "pool pause did not end"
        waited_s = time.monotonic() - restored
        assert listener.connected
        # The listener's backoff is capped at 5 s (jittered), the pool's at 60 s: the pool
        # waited for the listener's, not its own.
        assert waited_s < 30.0, f"pool waited {waited_s:.1f}s after the server came back"
    finally:
        supervisors.stop()
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await listener.close()
        await proxy.close()
