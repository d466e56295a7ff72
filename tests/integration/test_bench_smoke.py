"""CI keeps the benchmark suite working: its smoke mode runs end to end, in the notify mode a
user gets by default, and writes its report with what every figure needs to be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relay.settings import NotifyMode, Settings

# Benchmarks load the whole machine and measure: nothing runs beside them (tests/run.py).
pytestmark = pytest.mark.alone
REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke__runs_every_scenario_in_the_default_mode_and_writes_results(
    tmp_path: Path,
) -> None:
    """About a minute (66-68 s): every benchmark scenario, each at its smallest size, with the
    relays and private servers each one starts."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    default = Settings.model_fields["notify"].default
    assert isinstance(default, NotifyMode)
    assert report["notify_mode"] == default.value
    assert {"nproc", "memory_gb"} <= set(report["machine"])
    assert len(report["load_before"]) == 3
    assert report["command"].startswith("python -m bench --smoke")
    assert set(report["scenarios"]) == {"limits", "drain", "pinned", "tracing", "latency",
                                        "producers", "fairness", "cold"}
    assert all(len(e["load_before"]) == 3 for e in report["scenarios"].values())
    summary = report["summary"]
    assert summary["limits"]["bulk_frames"]["median"] > 0
    assert summary["ratios"]["relay_1p_vs_bulk_frame_limit"] > 0
    assert {(d["processes"], d["publisher"]) for d in summary["drain"]} == {
        (1, "bulk"), (2, "bulk"), (1, "simple")
    }
    assert all(d["msg_per_s"]["median"] > 0 for d in summary["drain"])
    assert all(r["load_before"] for d in report["raw"]["drain"] for r in d["runs"])
    latency_modes = {e["mode"] for e in summary["latency"]}
    assert default.value in latency_modes
    assert all(e["p99_ms"]["median"] > 0 for e in summary["latency"])
    assert {(e["situation"], e["mode"]) for e in summary["producers"]} >= {
        ("backlog", "off"), ("backlog", default.value), ("live", "off"), ("live", default.value)
    }
    assert all(c["relay"] > 0 for c in summary["cost"])
    assert "big_backlog_vs_small" in summary["ratios"]
    assert summary["ratios"]["pinned_horizon_vs_unpinned"] > 0
    assert [d["pinned"] for d in summary["drain"] if d["kind"] in ("pinned", "unpinned")] == [
        False, True]
    fairness = summary["fairness"]
    assert [e["relays"] for e in fairness] == [1]
    assert fairness[0]["live_p99_ms"]["median"] > 0
    assert fairness[0]["drain_ratio"]["median"] > 0
    cold = summary["cold"]
    assert [(e["relays"], e["rows"]) for e in cold] == [(2, 5_000)]
    assert cold[0]["first_s"]["median"] > 0
    assert cold[0]["bulk_msg_per_s"]["median"] > 0
    markdown = (tmp_path / "RESULTS.md").read_text()
    for section in ("### Targets", "### Drains", "### Ceiling", "### Latency",
                    "### Producers spared", "### Live rows beside a bulk job",
                    "### Relays that went idle"):
        assert section in markdown
    assert f"notify mode: **{default.value}**" in markdown
    # The relays' and producers' logs stay beside the report, not in the machine's /tmp.
    assert {p.name.split("-")[0] for p in (tmp_path / "logs").iterdir()} >= {
        "drain", "latency", "producers", "fairness", "cold"}

