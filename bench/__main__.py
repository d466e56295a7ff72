"""The benchmarks, one command; docs/speed.md says what each scenario measures and how to run
them. The suite's scenarios write results.json (every run with its date, command and load
average) and the suite's block of RESULTS.md into --out (bench/, or a temporary folder for
--smoke); spark and compare write their own blocks of bench/RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import json
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench import common
from bench.cold import cold_once
from bench.common import AMQP_URL, DEFAULT_MODE, TRACED_OPTIONS_SQL, BenchEnv, load_before
from bench.drain import bulk_frame_limit, drain_once
from bench.latency import LIVE_KEY, LIVE_RATE, fairness_once, latency_once
from bench.producers import producer_rounds
from bench.report import Figure, render_markdown, render_readme_block, summarise
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
    bulk_msgs: int
    pinned_rows: int
    fairness_rows: int
    fairness_relays: tuple[int, ...]
    fairness_runs: int
    quiet_below: float | None  # before each run, wait (<= 5 min) for the load to fall under it
    other_modes: tuple[NotifyMode, ...]  # beside the default, labelled
    cold_rows: int  # a bulk after relays sat idle on an emptied, vacuumed outbox
    cold_relays: tuple[int, ...]
    cold_idle_s: float


FULL = Plan(3, 100_000, 1_000_000, 20_000, (1, 2, 4), ((1000, 4), (3000, 16)), 10.0, 5, 4.0,
            80_000, 100_000, 500_000, 300_000, (1, 2), 2, 1.0, (NotifyMode.ALWAYS,),
            300_000, (1, 2), 60.0)
SMOKE = Plan(1, 3_000, 6_000, 1_000, (1, 2), ((1000, 4),), 1.5, 1, 1.0, 10_000, 2_000, 3_000,
             20_000, (1,), 1, None, (), 5_000, (2,), 2.0)


async def repeat(plan: Plan, runs: int, label: str,
                 once: Callable[[], Awaitable[Figure]]) -> list[Figure]:
    """`runs` runs, each once the machine is quiet, with the load before it, printed as it comes."""
    out = []
    for i in range(runs):
        await common.wait_quiet(plan.quiet_below)
        load = load_before()
        out.append({"load_before": load} | await once())
        print(f"{label} run {i + 1}/{runs}: {json.dumps(out[-1])}", flush=True)
    return out


async def drains(env: BenchEnv, plan: Plan, kind: str, rows: int, runs: int,
                 **options: Any) -> Figure:
    """`runs` drains of `rows` rows (options: drain_once's), labelled `kind`."""
    figs = await repeat(plan, runs, f"drain {kind} {rows}",
                        lambda: drain_once(env, rows, **options))
    return {"kind": kind, "processes": options.get("processes", 1), "rows": rows,
            "publisher": options.get("publisher", "bulk"), "pinned": options.get("pinned", False),
            "runs": figs}


async def limits(plan: Plan) -> Figure:
    async with common.scenario_env("limits") as env:
        return {"limits": {"bulk_frames": await repeat(
            plan, plan.runs, "bulk-frames", lambda: bulk_frame_limit(env, plan.bulk_msgs))}}


async def drain(plan: Plan) -> Figure:
    async with common.scenario_env("drain") as env:
        out = [await drains(env, plan, "scale", plan.drain_rows, plan.runs, processes=p)
               for p in plan.processes]
        out.append(await drains(env, plan, "big", plan.big_rows, 1))
        out.append(await drains(env, plan, "simple", plan.simple_rows, plan.runs,
                                publisher="simple"))
        return {"drain": out}


async def pinned(plan: Plan) -> Figure:
    """Back to back, the same size: what a pinned xmin horizon costs a drain."""
    async with common.scenario_env("pinned") as env:
        return {"drain": [await drains(env, plan, "unpinned", plan.pinned_rows, 1),
                          await drains(env, plan, "pinned", plan.pinned_rows, 1, pinned=True)]}


async def tracing(plan: Plan) -> Figure:
    """Drains of traced rows, tracing off and on (all sampled, to an OTLP receiver), alternating."""
    runs: dict[str, list[Figure]] = {"traced_off": [], "traced_on": []}
    async with common.scenario_env("tracing") as env:
        with OtlpReceiver() as receiver:
            on = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                  "OTEL_TRACES_SAMPLER": "always_on"}
            for _ in range(plan.runs):
                for kind, extra in (("traced_off", None), ("traced_on", on)):
                    runs[kind] += (await drains(env, plan, kind, plan.drain_rows, 1,
                                                extra_env=extra,
                                                options_sql=TRACED_OPTIONS_SQL))["runs"]
    return {"drain": [{"kind": k, "processes": 1, "rows": plan.drain_rows, "publisher": "bulk",
                       "pinned": False, "runs": figs} for k, figs in runs.items()]}


async def latency(plan: Plan) -> Figure:
    out: list[Figure] = []
    async with common.scenario_env("latency") as env:
        for mode in (DEFAULT_MODE, *plan.other_modes):
            await env.set_mode(mode)
            for rate, conns in plan.latency if mode is DEFAULT_MODE else plan.latency[:1]:
                runs = await repeat(plan, plan.runs, f"latency {mode.value} {rate}/s",
                                    lambda r=rate, c=conns: latency_once(  # type: ignore[misc]
                                        env, r, plan.latency_s, connections=c))
                out.append({"mode": mode.value, "rate_per_s": rate, "connections": conns,
                            "runs": runs})
    return {"latency": out}


async def producers(plan: Plan) -> Figure:
    out: list[Figure] = []
    for situation in ("backlog", "live"):
        async with common.scenario_env(f"prod_{situation}") as env:
            out += await producer_rounds(
                env, situation=situation, modes=(NotifyMode.OFF, DEFAULT_MODE, *plan.other_modes),
                rounds=plan.producer_rounds, seconds=plan.producer_s,
                backlog_rows=plan.producer_backlog)
    return {"producers": out}


async def fairness(plan: Plan) -> Figure:
    """Live rows beside a bulk job, with each number of relays."""
    out: list[Figure] = []
    async with common.scenario_env("fairness", (LIVE_KEY,)) as env:
        for n in plan.fairness_relays:
            runs = await repeat(plan, plan.fairness_runs, f"fairness {n} relay(s)",
                                lambda n=n: fairness_once(  # type: ignore[misc]
                                    env, plan.fairness_rows, relays_n=n,
                                    quiet_below=plan.quiet_below))
            out.append({"relays": n, "rows": plan.fairness_rows, "live_rate_per_s": LIVE_RATE,
                        "runs": runs})
    return {"fairness": out}


async def cold(plan: Plan) -> Figure:
    """A bulk after the relays sat idle on an emptied outbox recorded as empty, live rows beside."""
    out: list[Figure] = []
    async with common.scenario_env("cold", (LIVE_KEY,)) as env:
        for n in plan.cold_relays:
            runs = await repeat(plan, plan.fairness_runs, f"cold {n} relay(s)",
                                lambda n=n: cold_once(  # type: ignore[misc]
                                    env, plan.cold_rows, relays_n=n, idle_s=plan.cold_idle_s,
                                    live_s=max(plan.cold_rows / 5000, 4.0)))
            out.append({"relays": n, "rows": plan.cold_rows, "idle_s": plan.cold_idle_s,
                        "live_rate_per_s": LIVE_RATE, "runs": runs})
    return {"cold": out}


SUITE: dict[str, Callable[[Plan], Coroutine[Any, Any, Figure]]] = {
    "limits": limits, "drain": drain, "pinned": pinned, "tracing": tracing, "latency": latency,
    "producers": producers, "fairness": fairness, "cold": cold}
OWN_REPORTS = {"spark": "bench.spark.run", "compare": "bench.compare",
               "statements": "bench.statements", "horizon": "bench.horizon"}


def own_report(name: str, argv: list[str]) -> str:
    """A scenario's own report, headed by command, date, machine, load: into RESULTS.md or --out."""
    module = importlib.import_module(OWN_REPORTS[name])
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load, command = load_before(), shlex.join(["python", "-m", "bench", "--scenario", name,
                                                "--", *argv])
    parser = argparse.ArgumentParser(prog=f"python -m bench --scenario {name} --",
                                     description=module.__doc__)
    parser.add_argument("--out", type=Path, help="a file of its own (default: its block of "
                        "bench/RESULTS.md)")
    parser.add_argument("--quiet-below", type=float, default=1.0, help="before each run, wait "
                        "(<= 5 min) for the 1-minute load average to fall under this")
    module.options(parser)
    args = parser.parse_args(argv)
    title, details, body = module.measure(args)
    text = "\n".join([f"## {title}", "", f"- date: {started}", f"- command: `{command}`",
                      f"- machine: {common.machine()}", f"- load average before the run: {load}",
                      *(f"- {d}" for d in details), "", *body]) + "\n"
    if args.out is None:
        common.write_block(common.RESULTS, name, text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return text


def flatten(scenarios: dict[str, Any]) -> dict[str, Any]:
    """Every suite scenario's raw results as one suite's, lists joined in the suite's order."""
    raw: dict[str, Any] = {"limits": {}, "drain": [], "latency": [], "producers": [],
                           "fairness": [], "cold": []}
    for name in SUITE:
        for key, value in scenarios.get(name, {}).get("raw", {}).items():
            if key not in raw:
                continue  # what a scenario measured that the suite no longer does
            if isinstance(value, dict):
                raw[key].update(value)
            else:
                raw[key] += value
    return raw


async def versions() -> dict[str, str]:
    """Client libraries, servers and interpreter."""
    out = {"python": platform.python_version()} | {
        d: metadata.version(d) for d in ("aio-pika", "aiormq", "pamqp", "asyncpg", "uvloop")}
    conn = await asyncpg.connect(common.PG_ADMIN_DSN)
    out["postgresql"], out["postgresql autovacuum"] = [
        str(await conn.fetchval(f"SHOW {s}")) for s in ("server_version", "autovacuum")]
    await conn.close()
    amqp = await aio_pika.connect(AMQP_URL)
    out["rabbitmq"] = str(amqp.transport.connection.server_properties  # type: ignore[union-attr]
                          .get("version", "?"))
    await amqp.close()
    return out


def write_reports(out: Path, report: dict[str, Any], update_readme: bool) -> None:
    """results.json (its summary from its scenarios), its RESULTS.md block and README's."""
    report["raw"] = flatten(report["scenarios"])
    report["summary"] = summarise(report["raw"])
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    common.write_block(out / "RESULTS.md", "suite", render_markdown(report))
    if update_readme:
        missing = [n for n in SUITE if n not in report["scenarios"]]
        if missing:
            sys.exit(f"README's block needs every suite scenario in results.json; missing: "
                     f"{', '.join(missing)}")
        readme = Path(__file__).parents[1] / "README.md"
        readme.write_text(common.with_block(readme.read_text(), "figures",
                                            render_readme_block(report), append=False))
        print(f"updated the figures block of {readme}")
    print(json.dumps(report["summary"]["ratios"]))


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the scenarios, write results.json, RESULTS.md (and README's block)."""
    args_in = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="suite", help="suite (every one of "
                        f"{', '.join(SUITE)}), some of them (a,b), or {' or '.join(OWN_REPORTS)}")
    parser.add_argument("--smoke", action="store_true", help="a few thousand rows, < 3 min")
    parser.add_argument("--runs", type=int, help="repetitions of every figure")
    parser.add_argument("--out", type=Path, help="the folder of RESULTS.md and results.json")
    parser.add_argument("--update-readme", action="store_true", help="rewrite README's block")
    parser.add_argument("--render-only", action="store_true", help="run nothing: the reports "
                        "again from the results.json of --out, with this report code")
    parser.add_argument("--server", choices=("private", "shared"), help="PostgreSQL: a private "
                        "initdb cluster with the server's defaults (the default) or the shared "
                        "one of RELAY_TEST_PG_DSN (the default of --smoke)")
    args, rest = parser.parse_known_args(args_in)
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-smoke-")) if args.smoke
                       else Path(__file__).parent)
    if args.render_only:
        write_reports(out, json.loads((out / "results.json").read_text()), args.update_readme)
        return 0
    if args.scenario in OWN_REPORTS:
        print(own_report(args.scenario, rest[1:] if rest[:1] == ["--"] else rest))
        return 0
    names = list(SUITE) if args.scenario == "suite" else args.scenario.split(",")
    if rest or set(names) - set(SUITE):
        parser.error(f"unknown scenario or option in {args_in}; scenarios: suite, "
                     + ", ".join([*SUITE, *OWN_REPORTS]))
    plan = dataclasses.replace(SMOKE if args.smoke else FULL, **(
        {"runs": args.runs} if args.runs else {}))
    out.mkdir(parents=True, exist_ok=True)
    common.LOGS = (out / "logs") if args.smoke else None
    command = shlex.join(["python", "-m", "bench", *args_in])
    load = load_before()
    shared = args.server == "shared" or (args.smoke and args.server is None)
    ran: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if not shared:
            stack.enter_context(common.private_server())
        for name in names:
            entry: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                                     "load_before": load_before()}
            t0 = time.monotonic()
            entry["raw"] = common.run(functools.partial(SUITE[name], plan))
            ran[name] = entry | {"elapsed_s": time.monotonic() - t0}
        server_versions = common.run(versions)
    server_versions["postgresql server"] = (
        "shared" if shared else "private initdb cluster, server defaults")
    for entry in ran.values():
        entry.update(command=command, mode="smoke" if args.smoke else "full",
                     plan=dataclasses.asdict(plan), versions=server_versions)
    previous = out / "results.json"
    scenarios = json.loads(previous.read_text())["scenarios"] if previous.exists() else {}
    write_reports(out, {
        "mode": "smoke" if args.smoke else "full", "notify_mode": DEFAULT_MODE.value,
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": command,
        "machine": common.machine(), "load_before": load, "versions": server_versions,
        "scenarios": scenarios | ran}, args.update_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
