"""Every notify mode delivers, each within its own bound: `conditional` (the default) and
`always` wake the relay at once, `off` relies on polling and is bounded by the poll interval.
The database is migrated in the mode under test (the `notify_mode` fixture)."""

from __future__ import annotations

import time

import pytest

from relay.settings import NotifyMode
from tests.helpers import Env, wait_until
from tests.integration.test_conditional_notify import wait_sleepers
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

POLL_S = {NotifyMode.CONDITIONAL: 30.0, NotifyMode.ALWAYS: 30.0, NotifyMode.OFF: 2.0}
# Woken: the wake-up, claim, publish and consume on a loaded 2-core machine. Polling: the poll
# interval on top of that.
BOUND_S = {NotifyMode.CONDITIONAL: 2.0, NotifyMode.ALWAYS: 2.0, NotifyMode.OFF: 2.0 + 2.0}


@pytest.mark.parametrize("notify_mode", list(NotifyMode))
@pytest.mark.timing
async def test_notify_mode__idle_relay_delivers_each_row_within_the_mode_bound(
    notify_mode: NotifyMode, env: Env, consumer: Consumer, start_relay
) -> None:
    relay = start_relay(poll_interval_s=POLL_S[notify_mode])
    await wait_until(lambda: '"relay_started"' in relay.log_text(), what="start")
    latencies: list[float] = []
    for n in range(3):
        if notify_mode is NotifyMode.CONDITIONAL:
            # Asleep first (holding the wake-up lock): only a NOTIFY can wake it in time.
            await wait_sleepers(env.pg_dsn, 1)
        started = time.monotonic()
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": n}])
        await wait_until(lambda ids=ids: set(ids) <= set(consumer.ids),
                         timeout_s=POLL_S[notify_mode] + 10, interval_s=0.01,
                         what=f"row {n} delivered")
        latencies.append(time.monotonic() - started)
    print(f"\n[notify {notify_mode.value}] latencies s: {[round(x, 3) for x in latencies]}")
    assert max(latencies) <= BOUND_S[notify_mode], latencies
    assert consumer.duplicates() == 0
    assert relay.terminate() == 0
