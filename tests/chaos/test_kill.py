"""kill -9 of relay replicas while they hold claimed rows, with a producer in its own process:
nothing is lost, no row stays locked, and the relay's duplicates never exceed the rows the
killed processes held at the instant they died."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.chaos.flow import chaos_flow
from tests.chaos.inflight import Held, LockProbe, caught_holding_rows
from tests.helpers import Env, RelayProcess, wait_until

pytestmark = pytest.mark.chaos

KILLS = 6
BACKLOG = 5_000
RATE = 800  # rows/s from the producer process, on top of the backlog


async def kill_mid_batch(victim: RelayProcess, probe: LockProbe) -> Held:
    """kill -9 the victim, frozen at an instant it holds claimed rows: the rows sampled are
    exactly what it held when it died. A replica busy with the backlog and the producer is
    caught within a fraction of a second; 5 s without a claim is a finding in itself."""
    # A replica still starting (seconds on a loaded machine) holds nothing yet.
    await wait_until(lambda: '"relay_started"' in victim.log_text(), timeout_s=60,
                     what="the victim started")
    async with caught_holding_rows([victim], probe, timeout_s=5) as held:
        os.kill(victim.pid, signal.SIGKILL)
        victim.kill()  # reap it
    return held


async def test_kill9__replicas_killed_holding_rows_lose_nothing_and_duplicate_at_most_those_rows(
    env: Env, tmp_path: Path
) -> None:
    async with chaos_flow(env, tmp_path, "kill -9", backlog=BACKLOG, rate=RATE) as flow:
        replicas = [flow.group.start(), flow.group.start()]
        await flow.start_producer()
        for k in range(KILLS):
            flow.tally.record(await kill_mid_batch(replicas[k % 2], flow.probe))
            replicas[k % 2] = flow.group.start()
        await flow.settle(f"kill -9 x{KILLS}", in_flight=KILLS)
        assert all(p.alive() for p in replicas)
        # A process still importing has no SIGTERM handler yet: let it finish starting.
        for p in replicas:
            await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
        assert [p.terminate() for p in replicas] == [0, 0]
