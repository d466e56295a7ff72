"""`relay run` freezes what start-up made before the daemon's loop starts (docs/speed.md)."""

from __future__ import annotations

import argparse
import gc
import importlib

import pytest

from relay import app
from relay.settings import Settings

# relay.cli exports the function `main`, which hides the module of that name.
cli = importlib.import_module("relay.cli.main")


def test_run_freezes_the_startup_heap_before_the_daemon_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    async def daemon(settings: Settings) -> None:
        seen.append(gc.get_freeze_count())

    gc.unfreeze()
    monkeypatch.setattr(app, "run", daemon)
    try:
        assert cli.cmd_run(argparse.Namespace(), Settings()) == cli.EXIT_OK
    finally:
        gc.unfreeze()
    assert seen, "the daemon never started"
    assert seen[0] > 10_000, "the daemon started with start-up's objects unfrozen"
