"""Where each task of the process waits: for the log line of a stop that timed out.

`asyncio.Task.get_stack()` shows only a suspended task's outermost frame; this follows the
chain of awaits (`cr_await`, `ag_await`, `gi_yieldfrom`) down to the innermost coroutine, so
a batch stuck on a statement reads as the call that waits (`settle`, `commit`, `acquire`),
not as `Worker.run`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

_DEPTH = 40


def await_chain(awaitable: Any) -> list[str]:
    """`file:line function` of each coroutine in the chain, outermost first."""
    chain: list[str] = []
    current = awaitable
    while current is not None and len(chain) < _DEPTH:
        frame = (getattr(current, "cr_frame", None) or getattr(current, "ag_frame", None)
                 or getattr(current, "gi_frame", None))
        if frame is not None:
            code = frame.f_code
            chain.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        current = (getattr(current, "cr_await", None) or getattr(current, "ag_await", None)
                   or getattr(current, "gi_yieldfrom", None))
    return chain


def waiting_tasks(limit: int = 20) -> list[dict[str, Any]]:
    """The process's unfinished tasks (up to `limit`) with where each waits, innermost last."""
    out: list[dict[str, Any]] = []
    for task in asyncio.all_tasks():
        if task.done() or task is asyncio.current_task():
            continue
        out.append({"task": task.get_name(), "awaits": await_chain(task.get_coro())})
        if len(out) >= limit:
            break
    return out
