"""A wait for an event, bounded by a timeout, must not swallow a cancellation that arrives
together with the event: Python 3.11's asyncio.wait_for returned the event's result instead
(gh-86296), so a loop around it went on after its task was cancelled (`relay dead watch`
ignored Ctrl-C while dead letters were being parked). The relay's event waits use
asyncio.timeout, which keeps the cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from relay.loop.express import _pause


async def _cancelled_as_woken(wait: asyncio.Task[None], event: asyncio.Event) -> None:
    await asyncio.sleep(0)  # the task waits on the event now
    event.set()
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait


async def test_pause__a_cancel_that_comes_with_the_wake_up_is_kept() -> None:
    done = asyncio.Event()
    await _cancelled_as_woken(asyncio.create_task(_pause(done, 10.0)), done)


async def test_wait_for__loses_that_cancel_on_this_python_which_is_why() -> None:
    """The library behaviour the relay avoids (on Python 3.12+ wait_for keeps the cancel)."""
    done = asyncio.Event()

    async def old_pause() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=10.0)

    task = asyncio.create_task(old_pause())
    await asyncio.sleep(0)
    done.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() is (sys.version_info >= (3, 12))
