"""The benchmarks write their reports from their records alone: every report names the
command, the date, the machine and the load average (pure code)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench import compare


def _latency(build: str, rate: int, p50: float) -> dict[str, object]:
    return {"build": build, "rate": rate, "connections": 4, "run": 1, "p50_ms": p50,
            "p95_ms": p50 * 2, "p99_ms": p50 * 3, "achieved_per_s": rate,
            "load_before": [0.5, 0.5, 0.5]}


def options(parser: argparse.ArgumentParser) -> None:
    """This module stands for a scenario with a report of its own (bench/__main__.py)."""
    parser.add_argument("--label", required=True)


def measure(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    return f"An example: {args.label}", ["a detail"], ["| a | table |"]


def test_a_report_of_its_own__names_command_date_machine_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import __main__ as bench_main

    monkeypatch.setitem(bench_main.OWN_REPORTS, "example", __name__)
    out = tmp_path / "sub" / "report.md"
    text = bench_main.own_report("example", ["--label", "a cut", "--out", str(out)])
    assert out.read_text() == text
    lines = text.splitlines()
    assert lines[0] == "## An example: a cut"
    assert lines[2].startswith("- date: 20")
    assert lines[3] == "- command: `python -m bench --scenario example -- --label 'a cut' " \
        f"--out {out}`"
    assert lines[4].startswith("- machine: {")
    assert lines[5].startswith("- load average before the run: [")
    assert lines[6:] == ["- a detail", "", "| a | table |"]
    with pytest.raises(SystemExit):  # its own options are checked
        bench_main.own_report("example", ["--out", str(out)])


def test_a_comparison__every_run_then_the_medians_and_the_drains_ratio_run_by_run() -> None:
    def drain(build: str, run: int, rate: float, relays: int = 1) -> dict[str, object]:
        return {"build": build, "run": run, "rate": relays, "rows": 1000,
                "seconds": round(1000 / rate, 3), "msg_per_s": rate,
                "cpu_s_per_1k_msgs": {"postgres_own_sessions": 0.0305, "relay": 0.04},
                "load_before": [0.4, 0.3, 0.2]}

    lines = compare.report([_latency("before", 1000, 5.0), _latency("after", 1000, 4.0)],
                           [drain("before", 1, 100.0), drain("after", 1, 150.0),
                            drain("before", 2, 200.0), drain("after", 2, 100.0),
                            drain("before", 3, 100.0), drain("before", 1, 90.0, relays=4),
                            drain("after", 1, 180.0, relays=4)])
    assert lines[2] == "| before | 1000 | 4 | 1 | 5.0 | 10.0 | 15.0 | 1000 | [0.5, 0.5, 0.5] |"
    assert "| 1000 | after | 4.00 | 12.00 |" in lines
    assert "| 1 | 1 | before | 1,000 | 10.0 | 100 | 30.5 / 40.0 | 0.4 |" in lines
    # Run 3 has no "after": no ratio of it; each number of relays has its own.
    assert lines[-1] == ("after over before, msg/s, run by run: 1 relay(s) 1.50, "
                         "1 relay(s) 0.50, 4 relay(s) 2.00.")
    # Drains alone (--rates none): no latency table at all.
    assert compare.report([], [drain("before", 1, 100.0)])[0] == ""


def test_builds__each_relay_start_sees_its_build_and_the_setting_comes_back() -> None:
    from bench import common
    given = common.RELAY_SRC
    seen = [(build, common.RELAY_SRC) for build in common.builds("/src/before")]
    assert seen == [("before", "/src/before"), ("after", "")]
    assert given == common.RELAY_SRC


def test_flatten__joins_each_scenarios_runs_into_the_suites_raw_results() -> None:
    """A run of some scenarios replaces theirs and keeps the others (bench/__main__.py): the
    report is computed from every scenario's runs, in the suite's order."""
    from bench.__main__ import flatten

    scenarios = {
        "streams": {"raw": {"drain": [{"kind": "a scenario no longer in the suite"}]}},
        "pinned": {"raw": {"drain": [{"kind": "pinned"}]}},
        "limits": {"raw": {"limits": {"bulk_frames": [1]}}},
        "drain": {"raw": {"drain": [{"kind": "scale"}]}},
        "producers": {"raw": {"producers": [{"p": 1}], "triggers": [{"t": 1}]}},
    }
    raw = flatten(scenarios)
    assert [d["kind"] for d in raw["drain"]] == ["scale", "pinned"]
    assert raw["limits"] == {"bulk_frames": [1]}
    assert (raw["producers"], raw["latency"]) == ([{"p": 1}], [])
    assert "triggers" not in raw  # measured once by an older suite, no longer part of it


def test_the_committed_results__are_what_the_report_code_writes_from_results_json() -> None:
    """bench/RESULTS.md and README's figures block are written from bench/results.json; a
    change of the report's wording must write them again (`python -m bench --render-only
    --update-readme`), so neither describes a report the code no longer writes."""
    import json

    from bench.common import with_block
    from bench.report import render_markdown, render_readme_block

    bench = Path(__file__).resolve().parents[2] / "bench"
    from bench.__main__ import flatten
    from bench.report import summarise

    report = json.loads((bench / "results.json").read_text())
    assert summarise(flatten(report["scenarios"])) == report["summary"]
    results = (bench / "RESULTS.md").read_text()
    assert with_block(results, "suite", render_markdown(report)) == results
    assert render_readme_block(report) in (bench.parent / "README.md").read_text()


def test_the_one_results_file__holds_a_block_of_every_scenario_with_a_report() -> None:
    """Every scenario `python -m bench --scenario` runs writes its block of bench/RESULTS.md,
    and each block there names the command that wrote it."""
    from bench.__main__ import OWN_REPORTS
    from bench.common import RESULTS, block_markers

    text = RESULTS.read_text()
    # compare records one experiment at a time (docs/speed.md names its runs' commits).
    for name in ["suite", *(n for n in OWN_REPORTS if n != "compare")]:
        start, end = block_markers(name)
        assert start in text, name
        assert end in text, name
        block = text[text.index(start):text.index(end)]
        assert "command: `python -m bench" in block, name


def test_a_block__replaced_in_place_added_at_the_end_or_refused_where_it_must_exist(
    tmp_path: Path,
) -> None:
    from bench.common import block_markers, with_block, write_block

    start, end = block_markers("a")
    text = f"intro\n\n{start}\n\nold\n\n{end}\n\nafter\n"
    assert with_block(text, "a", "new\n") == f"intro\n\n{start}\n\nnew\n\n{end}\n\nafter\n"
    added = with_block(text, "b", "b's")
    assert added.startswith(text.rstrip("\n"))
    assert added.endswith(f"{block_markers('b')[0]}\n\nb's\n\n{block_markers('b')[1]}\n")
    with pytest.raises(ValueError, match="no block 'b'"):
        with_block(text, "b", "x", append=False)
    out = tmp_path / "RESULTS.md"
    write_block(out, "a", "one")
    write_block(out, "b", "two")
    write_block(out, "a", "three")
    written = out.read_text()
    assert written.startswith("# Benchmark results")
    assert "three" in written
    assert "two" in written
    assert "one" not in written
    assert written.index(block_markers("a")[0]) < written.index(block_markers("b")[0])


def test_statements_report__per_1000_messages_each_drain_and_its_statements() -> None:
    from bench import statements

    def drain(relays: int, buffers: int) -> dict[str, Any]:
        return {"relays": relays, "msg_per_s": 5000.0, "load_before": [0.5, 0.5, 0.5],
                "cpu_s_per_1k_msgs": {"postgres_own_sessions": 0.04, "relay": 0.05},
                "statements": [{"query": "-- claim | x", "calls": 200, "ms": 3000.0,
                                "buffers": buffers, "rows": 100_000}]}

    lines = statements.report([drain(1, 280_000), drain(4, 870_000)], rows=100_000)
    assert "| 1 | 5,000 | 40.0 / 50.0 | 0.5 |" in lines
    assert "| `-- claim / x` | 2.0 | 30.00 | 2,800 | 1,000 |" in lines
    assert "| `-- claim / x` | 2.0 | 30.00 | 8,700 | 1,000 |" in lines
