"""The benchmark suite, one command: `python -m bench` (every scenario of the suite, by hand)
or `--smoke` (CI), or `--scenario drain,latency` for some of them.

Suite scenarios (each on a database and queue of its own): limits, drain, pinned, tracing,
latency, producers, fairness. Beside them, scenarios with reports of their own, each taking its
own options after `--`: spark (the Spark writers, bench/spark/run.py), trace-picture (README's
trace picture, bench/trace_picture.py), compare (two builds back to back, bench/compare.py) and
prune (retention of a large archive, by DELETE or by dropping days, bench/prune.py), inbox (a
consumer with and without the inbox) and streams (rows into a stream beside a classic queue; both
bench/once.py).

Writes results.json (every scenario's runs, each with its date, command and load average) and
the suite's block of RESULTS.md into --out (default: bench/ for a full run, a temporary folder
for --smoke); a run of some scenarios replaces theirs in an existing results.json and keeps the
others. A scenario with a report of its own writes its block of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench import common
from bench.common import (
    AMQP_URL,
    DEFAULT_MODE,
    TRACED_OPTIONS_SQL,
    BenchEnv,
    create_env,
    drop_env,
    load_before,
    machine,
    private_server,
    reset_env,
    set_mode,
    wait_quiet,
)
from bench.drain import drain_once
from bench.fairness import LIVE_RATE, bind_live_queue
from bench.fairness import run_once as fairness_once
from bench.latency import latency_once
from bench.limits import aio_pika_limit, bulk_frame_limit, classic_relay, pg_claim_delete_limit
from bench.producers import producer_rounds, trigger_costs
from bench.producers import ratios as ratios_to_off
from bench.report import render_markdown, render_readme_block, replace_readme_block
from relay.settings import NotifyMode
from tests.servers.otlp_receiver import OtlpReceiver


@dataclass(frozen=True)
class Plan:
    """Sizes of one suite run."""

    runs: int
    drain_rows: int
    big_rows: int
    simple_rows: int
    processes: tuple[int, ...]
    latency: tuple[tuple[int, int], ...]  # (commits/s, producer connections)
    latency_s: float
    producer_rounds: int
    producer_s: float
    producer_backlog: int
    trigger_rows: int
    aio_pika_msgs: int
    bulk_msgs: int
    pg_rows: int
    classic_rows: int
    pinned_rows: int = 0  # a drain of this size with the xmin horizon pinned, and one without
    # Before each run, wait (at most 2 min) for the 1-minute load average to fall under this:
    # a drain leaves this 2-core machine at ~2, and the next run must not start on it.
    quiet_below: float | None = None
    other_modes: tuple[NotifyMode, ...] = (NotifyMode.ALWAYS,)  # beside the default, labelled
    # Live rows beside a bulk job (bench/fairness.py): a bulk of this size in one transaction,
    # one-row transactions at 200/s from its commit on, with each number of relays.
    fairness_rows: int = 0
    fairness_relays: tuple[int, ...] = (1, 2)
    fairness_runs: int = 1


FULL = Plan(3, 100_000, 1_000_000, 20_000, (1, 2, 4), ((1000, 4), (3000, 16)), 10.0,
            5, 4.0, 80_000, 100_000, 20_000, 100_000, 100_000, 1_000, pinned_rows=500_000,
            quiet_below=1.0, fairness_rows=300_000, fairness_runs=2)
SMOKE = Plan(1, 3_000, 6_000, 1_000, (1, 2), ((1000, 4),), 1.5,
             1, 1.0, 10_000, 5_000, 2_000, 3_000, 3_000, 100, pinned_rows=3_000,
             other_modes=(), fairness_rows=20_000, fairness_relays=(1,))


Figure = dict[str, Any]
QUIET_BELOW: float | None = None  # the plan's, set by main()


async def servers_answer(timeout_s: float = 120.0) -> None:
    """Wait until both servers accept connections (others on this machine restart them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = await asyncpg.connect(common.PG_ADMIN_DSN, timeout=5)
            await conn.close()
            amqp = await aio_pika.connect(AMQP_URL, timeout=5)
            await amqp.close()
            return
        except (OSError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)


async def repeat(
    env: BenchEnv, runs: int, label: str, once: Callable[[], Awaitable[Figure]]
) -> list[Figure]:
    """Run one scenario `runs` times, printing each result as it comes, with the load
    average read right before each run.

    A run that fails because a server went away (restarted by other work on this shared
    machine) is repeated once the servers answer again, at most twice; the figure records it.
    """
    out = []
    for i in range(runs):
        for attempt in range(3):
            if QUIET_BELOW is not None:
                await wait_quiet(QUIET_BELOW)
            load = load_before()
            try:
                result = await once()
                break
            except Exception as exc:
                if attempt == 2:
                    raise
                print(f"{label} run {i + 1}/{runs} failed ({exc!r}); retrying", flush=True)
                await servers_answer()
                await reset_env(env)
        result.setdefault("load_before", load)
        result["retried"] = attempt
        print(f"{label} run {i + 1}/{runs}: {json.dumps(result)}", flush=True)
        out.append(result)
    return out


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and spread ((max-min)/median) of a figure over runs."""
    med = statistics.median(values)
    return {
        "median": round(med, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "spread_pct": round((max(values) - min(values)) / med * 100, 1) if med else 0.0,
        "n": len(values),
    }


async def _limits(env: BenchEnv, plan: Plan) -> dict[str, list[Figure]]:
    return {
        "classic_relay": await repeat(env, plan.runs, "classic",
                                      lambda: classic_relay(env, plan.classic_rows)),
        "aio_pika_pipelined": await repeat(env, plan.runs, "aio-pika",
                                           lambda: aio_pika_limit(env, plan.aio_pika_msgs)),
        "bulk_frames": await repeat(env, plan.runs, "bulk-frames",
                                    lambda: bulk_frame_limit(env, plan.bulk_msgs)),
        "pg_claim_delete": await repeat(env, plan.runs, "pg",
                                        lambda: pg_claim_delete_limit(env, plan.pg_rows)),
    }


async def _drain_kind(env: BenchEnv, kind: str, rows: int, runs: int, procs: int = 1, *,
                      publisher: str = "bulk", pinned: bool = False) -> Figure:
    figs = await repeat(env, runs, f"drain {kind} p={procs} {rows}", lambda: drain_once(
        env, rows, processes=procs, publisher=publisher, pinned=pinned))
    return {"kind": kind, "processes": procs, "batch_size": 500, "publisher": publisher,
            "rows": rows, "pinned": pinned, "runs": figs}


async def _drains(env: BenchEnv, plan: Plan) -> list[Figure]:
    out = [await _drain_kind(env, "scale", plan.drain_rows, plan.runs, procs)
           for procs in plan.processes]
    if plan.big_rows:
        out.append(await _drain_kind(env, "big", plan.big_rows, 1))
    out.append(await _drain_kind(env, "simple", plan.simple_rows, plan.runs,
                                 publisher="simple"))
    return out


async def _pinned(env: BenchEnv, plan: Plan) -> list[Figure]:
    """Back to back, the same size: the ratio is what a pinned horizon costs a drain."""
    if not plan.pinned_rows:
        return []
    return [await _drain_kind(env, "unpinned", plan.pinned_rows, 1),
            await _drain_kind(env, "pinned", plan.pinned_rows, 1, pinned=True)]


async def _tracing_drains(env: BenchEnv, plan: Plan) -> list[Figure]:
    """Drains of rows that carry a traceparent each, tracing off and on (exporting to a
    local OTLP receiver, every trace sampled), alternating run by run."""
    runs: dict[str, list[Figure]] = {"traced_off": [], "traced_on": []}
    with OtlpReceiver() as receiver:
        on = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
              "OTEL_TRACES_SAMPLER": "always_on"}
        for i in range(plan.runs):
            for kind, extra in (("traced_off", None), ("traced_on", on)):
                runs[kind] += await repeat(
                    env, 1, f"drain {kind} {plan.drain_rows} ({i + 1}/{plan.runs})",
                    lambda extra=extra: drain_once(  # type: ignore[misc]
                        env, plan.drain_rows, extra_env=extra,
                        options_sql=TRACED_OPTIONS_SQL))
    return [{"kind": kind, "processes": 1, "batch_size": 500, "publisher": "bulk",
             "rows": plan.drain_rows, "pinned": False, "runs": figs}
            for kind, figs in runs.items()]


async def _latencies(env: BenchEnv, plan: Plan) -> list[Figure]:
    out: list[Figure] = []
    for mode in (DEFAULT_MODE, *plan.other_modes):
        await set_mode(env, mode)
        configs = plan.latency if mode is DEFAULT_MODE else plan.latency[:1]
        for rate, conns in configs:
            runs = await repeat(env, plan.runs, f"latency {mode.value} {rate}/s x{conns}",
                                lambda r=rate, c=conns: latency_once(  # type: ignore[misc]
                                    env, r, plan.latency_s, connections=c))
            out.append({"mode": mode.value, "rate_per_s": rate, "connections": conns,
                        "runs": runs})
    await set_mode(env, DEFAULT_MODE)
    return out


async def _fairness(env: BenchEnv, plan: Plan) -> list[Figure]:
    """Live rows beside a bulk job, with each number of relays."""
    out: list[Figure] = []
    if not plan.fairness_rows:
        return out
    live_queue = await bind_live_queue(env)
    try:
        for relays in plan.fairness_relays:
            runs = await repeat(env, plan.fairness_runs,
                                f"fairness {relays} relay(s) {plan.fairness_rows}",
                                lambda n=relays: fairness_once(  # type: ignore[misc]
                                    env, live_queue, plan.fairness_rows, live_rate=LIVE_RATE,
                                    relays=n, settings={},
                                    log_dir=Path(tempfile.mkdtemp(prefix="bench-fairness-"))))
            out.append({"relays": relays, "rows": plan.fairness_rows,
                        "live_rate_per_s": LIVE_RATE, "runs": runs})
    finally:
        await servers_answer()
        await common.delete_queues([live_queue])
    return out


async def _in_env(tag: str, work: Callable[[BenchEnv], Awaitable[Any]]) -> Any:
    """`work` on a database and queue of its own, dropped afterwards."""
    env = await create_env(tag)
    try:
        return await work(env)
    finally:
        await servers_answer()
        await drop_env(env)


async def _producers(plan: Plan) -> dict[str, Any]:
    out: list[Figure] = []
    modes = (NotifyMode.OFF, DEFAULT_MODE, *plan.other_modes)
    for situation in ("backlog", "live"):
        out += await _in_env(f"prod_{situation}", lambda env, s=situation: producer_rounds(  # type: ignore[misc]
            env, situation=s, modes=modes, rounds=plan.producer_rounds,
            seconds=plan.producer_s, backlog_rows=plan.producer_backlog))
    triggers = await _in_env("triggers", lambda env: trigger_costs(env, plan.trigger_rows,
                                                                    plan.runs))
    return {"producers": out, "triggers": triggers}


async def _keyed(key: str, tag: str, work: Callable[[BenchEnv], Awaitable[Any]]) -> Any:
    return {key: await _in_env(tag, work)}


# Each suite scenario: its raw results, under the keys of the suite's raw results it fills.
SUITE: dict[str, Callable[[Plan], Awaitable[dict[str, Any]]]] = {
    "limits": lambda plan: _keyed("limits", "limits", lambda env: _limits(env, plan)),
    "drain": lambda plan: _keyed("drain", "drain", lambda env: _drains(env, plan)),
    "pinned": lambda plan: _keyed("drain", "pinned", lambda env: _pinned(env, plan)),
    "tracing": lambda plan: _keyed("drain", "tracing", lambda env: _tracing_drains(env, plan)),
    "latency": lambda plan: _keyed("latency", "latency", lambda env: _latencies(env, plan)),
    "producers": _producers,
    "fairness": lambda plan: _keyed("fairness", "fairness", lambda env: _fairness(env, plan)),
}
# Scenarios with reports of their own (their options follow `--`).
OWN_REPORTS = {"spark": "bench.spark.run", "trace-picture": "bench.trace_picture",
               "compare": "bench.compare", "prune": "bench.prune",
               "inbox": "bench.once:inbox_main", "streams": "bench.once:streams_main"}


async def run_scenarios(plan: Plan, names: list[str]) -> dict[str, Any]:
    """Each named suite scenario in turn; its raw results with its own provenance."""
    out: dict[str, Any] = {}
    for name in names:
        load, date = load_before(), datetime.now(UTC).isoformat(timespec="seconds")
        started = time.monotonic()
        raw = await SUITE[name](plan)
        out[name] = {"date": date, "load_before": load, "elapsed_s": time.monotonic() - started,
                     "raw": raw}
    return out


def flatten(scenarios: dict[str, Any]) -> dict[str, Any]:
    """The raw results of every scenario as one suite's: lists joined in the suite's order."""
    raw: dict[str, Any] = {"limits": {}, "drain": [], "latency": [], "triggers": [],
                           "producers": [], "fairness": []}
    for name in SUITE:
        for key, value in scenarios.get(name, {}).get("raw", {}).items():
            if isinstance(value, dict):
                raw[key].update(value)
            else:
                raw[key] += value
    return raw


def _cost(drains: list[Figure]) -> list[Figure]:
    """CPU-seconds per 1,000 messages by process group, per number of relay processes."""
    out = []
    for d in drains:
        if d["publisher"] != "bulk" or d.get("pinned") or d.get("kind", "").startswith("traced"):
            continue
        keys = d["runs"][0]["cpu_s_per_1k_msgs"]
        out.append({"processes": d["processes"], "rows": d["rows"],
                    **{k: round(statistics.median(r["cpu_s_per_1k_msgs"][k] for r in d["runs"]),
                                4) for k in keys}})
    return out


def _floor_summary(runs: list[Figure]) -> dict[str, Any]:
    """The machine's latency floor over a scenario's runs (bench/latency.py), p50 of each probe."""
    floors = [r["floor"] for r in runs if r.get("floor")]
    if not floors:
        return {}
    return {"floor_p50_ms": {probe: summary([f[probe]["p50_ms"] for f in floors])
                             for probe in ("pg_commit", "amqp_confirm", "timer_late")}}


def _ratios(drains: list[Figure], limits: dict[str, Any], one: Figure | None,
            ) -> dict[str, float]:
    """The ratios the targets are stated in, of what this report holds."""
    kinds = {d["kind"]: d for d in drains}
    big, pinned, unpinned = kinds.get("big"), kinds.get("pinned"), kinds.get("unpinned")
    simple = next((d for d in drains if d["publisher"] == "simple"), None)
    rate = one["msg_per_s"]["median"] if one is not None else 0.0
    ratios: dict[str, float] = {}
    for key, name, digits in (("bulk_frames", "relay_1p_vs_bulk_frame_limit", 2),
                              ("classic_relay", "relay_1p_vs_classic", 1),
                              ("aio_pika_pipelined", "relay_1p_vs_aio_pika_limit", 2),
                              ("pg_claim_delete", "relay_1p_vs_pg_limit", 2)):
        if rate and key in limits:
            ratios[name] = round(rate / limits[key]["median"], digits)
    for d in drains:
        if d["processes"] > 1 and rate:
            ratios[f"relay_{d['processes']}p_vs_1p"] = round(d["msg_per_s"]["median"] / rate, 2)
    if big is not None and rate:
        ratios["big_backlog_vs_small"] = round(big["msg_per_s"]["median"] / rate, 2)
    if pinned is not None and unpinned is not None:
        ratios["pinned_horizon_vs_unpinned"] = round(
            pinned["msg_per_s"]["median"] / unpinned["msg_per_s"]["median"], 2)
    if "traced_on" in kinds and "traced_off" in kinds:
        ratios["tracing_on_vs_off"] = round(kinds["traced_on"]["msg_per_s"]["median"]
                                            / kinds["traced_off"]["msg_per_s"]["median"], 3)
        if rate:
            ratios["traced_rows_vs_plain"] = round(kinds["traced_off"]["msg_per_s"]["median"]
                                                   / rate, 2)
    if simple is not None and rate:
        ratios["relay_bulk_vs_simple_publisher"] = round(rate / simple["msg_per_s"]["median"], 2)
    return ratios


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads, and the ratios the targets are stated in (all from this run)."""
    limits = {k: summary([r["msg_per_s"] for r in v]) for k, v in results["limits"].items()}
    drains = []
    for d in results["drain"]:
        drains.append({**{k: d[k] for k in ("processes", "batch_size", "publisher", "rows")},
                       "kind": d.get("kind", "scale"), "pinned": d.get("pinned", False),
                       "msg_per_s": summary([r["msg_per_s"] for r in d["runs"]]),
                       "load_before": [r["load_before"][0] for r in d["runs"]],
                       "cpu_cores": {k: round(statistics.median(r["cpu_cores"][k]
                                                                for r in d["runs"]), 2)
                                     for k in d["runs"][0]["cpu_cores"]}})
    lat = []
    for entry in results["latency"]:
        lat.append({k: entry[k] for k in ("mode", "rate_per_s", "connections")}
                   | {"load_before": [r["load_before"][0] for r in entry["runs"]]}
                   | {k: summary([r[k] for r in entry["runs"]])
                      for k in ("achieved_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms")}
                   | _floor_summary(entry["runs"]))
    one = next((d for d in drains if d["processes"] == 1 and d["publisher"] == "bulk"
                and d["kind"] == "scale"), None)
    ratios = _ratios(drains, limits, one)
    producers = []
    for situation in dict.fromkeys(r["situation"] for r in results["producers"]):
        runs = [r for r in results["producers"] if r["situation"] == situation]
        for mode in dict.fromkeys(r["mode"] for r in runs):
            mine = [r for r in runs if r["mode"] == mode]
            producers.append({"situation": situation, "mode": mode,
                              "tps": summary([r["tps"] for r in mine]),
                              "ratio_to_no_trigger": summary(ratios_to_off(runs, mode)),
                              "notifications": [r["notifications"] for r in mine],
                              "rows_left": [r["rows_left"] for r in mine],
                              "load_before": [r["load_before"][0] for r in mine]})
    triggers = []
    for kind in dict.fromkeys(r["trigger"] for r in results["triggers"]):
        mine = [r for r in results["triggers"] if r["trigger"] == kind]
        base = {r["round"]: r["rows_per_s"] for r in results["triggers"]
                if r["trigger"] == "none"}
        triggers.append({"trigger": kind, "rows_per_s": summary([r["rows_per_s"] for r in mine]),
                         "ratio_to_none": summary([r["rows_per_s"] / base[r["round"]]
                                                   for r in mine]),
                         "load_before": [r["load_before"][0] for r in mine]})
    fairness = [{k: e[k] for k in ("relays", "rows", "live_rate_per_s")}
                | {"load_before": [r["load_before_beside"][0] for r in e["runs"]]}
                | {k: summary([r[k] for r in e["runs"]])
                   for k in ("alone_msg_per_s", "beside_live_msg_per_s", "drain_ratio",
                             "live_p50_ms", "live_p95_ms", "live_p99_ms", "live_max_ms")}
                for e in results.get("fairness", [])]
    return {"limits": limits, "drain": drains, "latency": lat, "ratios": ratios,
            "headline": one, "cost": _cost(results["drain"]), "producers": producers,
            "triggers": triggers, "fairness": fairness}


async def versions() -> dict[str, str]:
    """Client libraries, servers and interpreter."""
    out = {"python": platform.python_version()}
    for dist in ("aio-pika", "aiormq", "pamqp", "asyncpg", "uvloop"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "-"
    conn = await asyncpg.connect(common.PG_ADMIN_DSN)
    try:
        out["postgresql"] = str(await conn.fetchval("SHOW server_version"))
        out["postgresql autovacuum"] = str(await conn.fetchval("SHOW autovacuum"))
    finally:
        await conn.close()
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        props = amqp.transport.connection.server_properties  # type: ignore[union-attr]
        out["rabbitmq"] = str(props.get("version", "?"))
    finally:
        await amqp.close()
    return out


def _own_report(target: str, rest: list[str]) -> int:
    """A scenario with a report of its own: its module's main (or the function named after
    `module:`), given the options after `--`."""
    import importlib

    module, _, function = target.partition(":")
    sys.argv = [f"python -m {module}", *(rest[1:] if rest[:1] == ["--"] else rest)]
    getattr(importlib.import_module(module), function or "main")()
    return 0


def render_again(out: Path, update_readme: bool) -> int:
    """RESULTS.md's suite block (and README's) from an existing results.json: a change of the
    report's wording or layout, with the figures as they were measured."""
    report = json.loads((out / "results.json").read_text())
    common.write_block(out / "RESULTS.md", "suite", render_markdown(report))
    if update_readme:
        readme = Path(__file__).parents[1] / "README.md"
        readme.write_text(replace_readme_block(readme.read_text(), render_readme_block(report)))
        print(f"updated the figures block in {readme}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the scenarios, write results.json and RESULTS.md."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="suite",
                        help="suite (the default: every one of " + ", ".join(SUITE) + "), a "
                        "comma-separated list of them, or one of " + ", ".join(OWN_REPORTS))
    parser.add_argument("--smoke", action="store_true", help="a few thousand rows, < 90 s")
    parser.add_argument("--runs", type=int, help="repetitions of every figure")
    parser.add_argument("--out", type=Path, help="folder for RESULTS.md and results.json")
    parser.add_argument("--update-readme", action="store_true",
                        help="rewrite README's figures block (every suite scenario must be in "
                        "results.json)")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: write RESULTS.md (and with --update-readme README's "
                        "block) again from the results.json in --out, with this report code")
    parser.add_argument("--server", choices=("private", "shared"),
                        help="PostgreSQL: a private initdb cluster with the server's defaults "
                        "(bench/common.py; the default) or the shared one of RELAY_TEST_PG_DSN "
                        "(the default of --smoke)")
    args, rest = parser.parse_known_args(argv)
    if args.render_only:
        return render_again(args.out or Path(__file__).parent, args.update_readme)
    if args.scenario in OWN_REPORTS:
        return _own_report(OWN_REPORTS[args.scenario], rest)
    if rest:
        parser.error(f"unknown options: {' '.join(rest)}")
    names = list(SUITE) if args.scenario == "suite" else args.scenario.split(",")
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: suite, "
                     + ", ".join([*SUITE, *OWN_REPORTS]))
    server = args.server or ("shared" if args.smoke else "private")
    plan = SMOKE if args.smoke else FULL
    if args.runs:
        plan = dataclasses.replace(plan, runs=args.runs)
    global QUIET_BELOW  # noqa: PLW0603 - one setting of the whole run
    QUIET_BELOW = plan.quiet_below
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-smoke-")) if args.smoke
                       else Path(__file__).parent)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "bench",
                                                 *(argv if argv is not None else sys.argv[1:])])
    started = time.monotonic()
    load = load_before()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.ExitStack() as stack:
        if server == "private":
            common.use_server(stack.enter_context(private_server()))
        ran = runner(run_scenarios(plan, names))
        server_versions = runner(versions())
    server_versions["postgresql server"] = (
        "private initdb cluster, server defaults" if server == "private" else "shared")
    previous = out / "results.json"
    scenarios = {}
    if previous.exists():
        scenarios = json.loads(previous.read_text()).get("scenarios", {})
    for entry in ran.values():
        entry.update(command=command, mode="smoke" if args.smoke else "full",
                     plan=plan.__dict__, versions=server_versions)
    scenarios.update(ran)
    raw = flatten(scenarios)
    report: dict[str, Any] = {
        "mode": "smoke" if args.smoke else "full",
        "notify_mode": DEFAULT_MODE.value,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "load_before": load,
        "versions": server_versions,
        "plan": plan.__dict__,
        "elapsed_s": time.monotonic() - started,
        "summary": summarise(raw),
        "scenarios": scenarios,
        "raw": raw,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out / 'results.json'}")
    common.write_block(out / "RESULTS.md", "suite", render_markdown(report))
    if args.update_readme:
        missing = [n for n in SUITE if n not in scenarios]
        if missing:
            parser.error(f"README's block needs every suite scenario; missing: {missing}")
        readme = Path(__file__).parents[1] / "README.md"
        readme.write_text(replace_readme_block(readme.read_text(), render_readme_block(report)))
        print(f"updated the figures block in {readme}")
    print(json.dumps(report["summary"]["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
