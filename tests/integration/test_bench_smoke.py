"""CI keeps the benchmark suite working: its smoke mode runs end to end and writes its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke__runs_every_scenario_and_writes_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    summary = report["summary"]
    assert {"classic_relay", "aio_pika_pipelined", "bulk_frames", "pg_claim_delete"} <= set(
        summary["limits"]
    )
    assert {(d["processes"], d["publisher"]) for d in summary["drain"]} == {
        (1, "bulk"), (2, "bulk"), (1, "simple")
    }
    assert all(d["msg_per_s"]["median"] > 0 for d in summary["drain"])
    assert summary["latency"][0]["p99_ms"]["median"] > 0
    assert "relay_1p_vs_classic" in summary["ratios"]
    markdown = (tmp_path / "RESULTS.md").read_text()
    assert "## Drain throughput" in markdown
    assert "## Latency" in markdown
