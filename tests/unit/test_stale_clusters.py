"""A run's start removes the private clusters a killed run left, and only those: a cluster whose
maker still runs belongs to a live run (a suite and a test run by hand side by side)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.chaos.pgcluster import OWNER_FILE, remove_stale


def _folder(prefix: str, owner_pid: int | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    (root / "data").mkdir()
    if owner_pid is not None:
        (root / OWNER_FILE).write_text(str(owner_pid))
    return root


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_remove_stale__keeps_a_live_runs_cluster_and_removes_a_dead_runs() -> None:
    prefix = f"relay-pg-stale-test-{uuid.uuid4().hex[:8]}-"
    live = _folder(prefix, owner_pid=os.getpid())
    dead = _folder(prefix, owner_pid=_dead_pid())
    unowned = _folder(prefix, owner_pid=None)
    an_hour_ago = time.time() - 3600
    os.utime(unowned, (an_hour_ago, an_hour_ago))
    # Made a moment ago without its owner file yet: another worker's, between the two steps.
    being_made = _folder(prefix, owner_pid=None)
    try:
        removed = remove_stale(prefix)
        assert sorted(removed) == sorted([dead, unowned])
        assert live.exists()
        assert being_made.exists()
        assert not dead.exists()
        assert not unowned.exists()
    finally:
        for root in (live, dead, unowned, being_made):
            shutil.rmtree(root, ignore_errors=True)
