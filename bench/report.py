"""RESULTS.md and README's block from a suite report (`python -m bench`): what ran where, then
every figure."""

from __future__ import annotations

from typing import Any

from bench.common import with_block


def _range(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f}, ±{s['spread_pct'] / 2:.0f}%)"


def _ms(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}, n={s['n']:.0f})"


def _loads(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}" if values else "-"


def _header(report: dict[str, Any]) -> list[str]:
    m, v = report["machine"], report["versions"]
    return [
        "## The suite",
        "",
        "Written by `python -m bench` (do not edit by hand); raw runs in results.json beside it.",
        "",
        f"- date: {report['date']}  ·  run: {report['mode']}  ·  wall time: "
        f"{report['elapsed_s']:.0f} s",
        f"- command: `{report['command']}`",
        "- scenarios: " + "; ".join(
            f"{name} {e['date'][:16].replace('T', ' ')} UTC ({e['mode']}, load before "
            f"{e['load_before'][0]:.1f}, `{e['command']}`)"
            for name, e in report.get("scenarios", {}).items()),
        f"- notify mode: **{report['notify_mode']}** (the default `relay migrate` installs) "
        "unless a row says otherwise",
        f"- machine: {m['cpu']}, nproc {m['nproc']}, {m['memory_gb']} GB, Linux {m['kernel']}; "
        f"load average before the suite {', '.join(f'{x:.1f}' for x in report['load_before'])};"
        " each table gives the 1-minute load average before each of its runs (the machine is "
        "shared with other work: compare ratios from this one run, not absolute figures)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- every figure: median (min–max) over the runs; bodies ~200 bytes of JSON, "
        "persistent messages, durable queue, PostgreSQL and RabbitMQ on loopback",
        "",
    ]


def _render_drains(s: dict[str, Any]) -> list[str]:
    lines = ["### Drain throughput (`relay run`, batch 500 × 3 lanes, backlog committed at once)",
             "", "pinned: another session holds a REPEATABLE READ snapshot taken before the "
             "backlog's insert until the drain ends (no deleted row can be cleaned up).", "",
             "| processes | publisher | rows | xmin horizon | msg/s | load before | CPU cores: "
             "relay / postgres / rabbitmq / other |", "|---|---|---|---|---|---|---|"]
    for d in s["drain"]:
        c = d["cpu_cores"]
        horizon = "pinned" if d.get("pinned") else "free"
        traced = {"traced_off": ", a traceparent per row, tracing off",
                  "traced_on": ", a traceparent per row, **tracing on**"}.get(d.get("kind", ""), "")
        lines.append(
            f"| {d['processes']} | {d['publisher']}{traced} | {d['rows']:,} | {horizon} | "
            f"{_range(d['msg_per_s'])} "
            f"| {_loads(d['load_before'])} | {c['relay']} / {c['postgres']} / {c['rabbitmq']} / "
            f"{c['other']} |")
    lines += ["", "### Cost model: CPU-seconds per 1,000 messages while draining", "",
              "postgres (own sessions) = the backends serving this database (what the relay "
              "causes); postgres (all) and rabbitmq = every process of the server, so they include "
              "other work on this shared machine.", "",
              "| relay processes | rows | relay | postgres (own sessions) | postgres (all) | "
              "rabbitmq |", "|---|---|---|---|---|---|"]
    for c in s["cost"]:
        lines.append(f"| {c['processes']} | {c['rows']:,} | {c['relay']:.4f} | "
                     f"{c['postgres_own_sessions']:.4f} | {c['postgres']:.4f} | "
                     f"{c['rabbitmq']:.4f} |")
    return lines


def _render_latency(s: dict[str, Any]) -> list[str]:
    lines = ["", "### Latency, producer commit → consumer receipt (ms)", "",
             "Producers, relay and consumer in separate processes; producers commit 1-row "
             "transactions (Poisson arrivals) on N connections; first second left out.", "",
             "floor: the machine's own p50 right before each run (bench/latency.py), median of "
             "the runs: a committed transaction / a persistent publish's confirm / how late a "
             "1 ms timer wakes.", "",
             "| mode | commits/s | connections | achieved | p50 | p95 | p99 | max | load before "
             "| floor ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in s["latency"]:
        lines.append(f"| {e['mode']} | {e['rate_per_s']:,} | {e['connections']} | "
                     f"{e['achieved_per_s']['median']:,.0f} | {_ms(e['p50_ms'])} | "
                     f"{_ms(e['p95_ms'])} | {_ms(e['p99_ms'])} | {_ms(e['max_ms'])} | "
                     f"{_loads(e['load_before'])} | {_floor(e.get('floor_p50_ms'))} |")
    return lines


def _floor(floor: dict[str, Any] | None) -> str:
    if not floor:
        return "-"
    return " / ".join(f"{floor[p]['median']:.2f}"
                      for p in ("pg_commit", "amqp_confirm", "timer_late"))


def _render_producers(s: dict[str, Any]) -> list[str]:
    lines = ["", "### Producers spared: pgbench, 8 clients, one 1-row INSERT per transaction", "",
             "Rounds alternate the modes on the live table; ratio = the mode's commits/s over no "
             "trigger (`off`) in the same round. backlog: one relay drains a backlog all along "
             "(rows left at the end > 0); live: two relays follow the producers from an empty "
             "table.", "",
             "| situation | mode | commits/s | ratio to no trigger | NOTIFYs per run | "
             "rows left | load before |", "|---|---|---|---|---|---|---|"]
    for e in s["producers"]:
        lines.append(f"| {e['situation']} | {e['mode']} | {_range(e['tps'])} | "
                     f"{_ratio(e['ratio_to_no_trigger'])} | "
                     f"{min(e['notifications'])}–{max(e['notifications'])} | "
                     f"{min(e['rows_left']):,}–{max(e['rows_left']):,} | "
                     f"{_loads(e['load_before'])} |")
    lines += ["", "### What a trigger costs a bulk insert (one INSERT … SELECT, no relay)", "",
              "| trigger | rows/s | ratio to no trigger | load before |", "|---|---|---|---|"]
    for e in s["triggers"]:
        lines.append(f"| {e['trigger']} | {_range(e['rows_per_s'])} | "
                     f"{_ratio(e['ratio_to_none'])} | {_loads(e['load_before'])} |")
    return lines


def targets(s: dict[str, Any], mode: str) -> list[tuple[str, float | None, str, bool]]:
    """(target, measured median, comparison, met) for the stated targets, default mode."""
    lat = {(e["mode"], e["rate_per_s"]): e for e in s["latency"]}
    prod = {(e["situation"], e["mode"]): e for e in s["producers"]}
    out: list[tuple[str, float | None, str, bool]] = []

    def add(name: str, value: float | None, op: str, bound: float) -> None:
        met = value is not None and (value <= bound if op == "≤" else value >= bound)
        out.append((name, value, f"{op} {bound:g}", met))

    e1, e3 = lat.get((mode, 1000)), lat.get((mode, 3000))
    add("p50 ms at 1,000 commits/s", e1 and e1["p50_ms"]["median"], "≤", 1.5)
    add("p99 ms at 1,000 commits/s", e1 and e1["p99_ms"]["median"], "≤", 5)
    add("p99 ms at 3,000 commits/s, 16 connections", e3 and e3["p99_ms"]["median"], "≤", 10)
    for situation in ("backlog", "live"):
        e = prod.get((situation, mode))
        add(f"8 producers, {situation}: ratio to no trigger",
            e and e["ratio_to_no_trigger"]["median"], "≥", 0.9)
    r = s["ratios"]
    add("one relay vs the bulk-frame publish limit", r.get("relay_1p_vs_bulk_frame_limit"),
        "≥", 0.85)
    add("big backlog vs the small one", r.get("big_backlog_vs_small"), "≥", 0.9)
    add("drain with the xmin horizon pinned vs free, same size",
        r.get("pinned_horizon_vs_unpinned"), "≥", 0.8)
    add("drain with tracing on vs off (rows with a traceparent each)",
        r.get("tracing_on_vs_off"), "≥", 0.95)
    for e in s.get("fairness", []):
        beside = (f"live rows beside a {e['rows']:,}-row bulk, {e['relays']} "
                  f"relay{'s' if e['relays'] > 1 else ''}")
        add(f"{beside}: p50 ms", e["live_p50_ms"]["median"], "≤", 5)
        add(f"{beside}: p99 ms", e["live_p99_ms"]["median"], "≤", 25)
        add(f"{beside}: bulk drain vs alone", e["drain_ratio"]["median"], "≥", 0.8)
    return out


def render_markdown(report: dict[str, Any]) -> str:
    """RESULTS.md: what ran where, then every figure with its median and spread."""
    s = report["summary"]
    lines = _header(report)
    lines += ["### Targets (default mode, medians of this run)", "",
              "| target | measured | bound | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {'-' if v is None else f'{v:g}'} | {bound} | "
              f"{'yes' if met else '**no**'} |"
              for name, v, bound, met in targets(s, report["notify_mode"])]
    lines += ["", "For a target not met, docs/speed.md (\"The targets and the latest full run\") "
              "gives where its time goes, from the traces, profiles and per-process CPU of "
              "the experiments it quotes, and what would move it."]
    lines += ["", "### Ratios (this run)", "", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {val} |" for k, val in s["ratios"].items()]
    lines += ["", *_render_drains(s)]
    lines += ["", "### Ceilings and baseline (same run)", "", "| path | msg/s |", "|---|---|"]
    names = {"classic_relay": "classic per-row relay (1 tx + 1 confirm channel per row)",
             "aio_pika_pipelined": "aio-pika, confirms pipelined (1,000 in flight)",
             "bulk_frames": "bulk-frame publish limit (BulkPublisher alone, 3 × 500 in flight, "
                            "no DB)",
             "pg_claim_delete": "PostgreSQL DELETE … FOR UPDATE SKIP LOCKED, 3 × 500"}
    lines += [f"| {names[k]} | {_range(val)} |" for k, val in s["limits"].items()]
    lines += _render_latency(s) + _render_producers(s) + _render_fairness(s) + [""]
    return "\n".join(lines)


def _render_fairness(s: dict[str, Any]) -> list[str]:
    if not s.get("fairness"):
        return []
    lines = ["", "### Live rows beside a bulk job (bench/fairness.py)", "",
             "The relays run with their defaults before a bulk job commits its rows in one "
             "INSERT … SELECT (to a durable queue nobody consumes during the run); the bulk "
             "drains once alone, then again while an application commits one row per "
             "transaction (Poisson arrivals) to another queue the benchmark consumes. Live "
             "latency: the producer's commit returned → consumer received, for live rows "
             "committed before the bulk drained. 00f8d6b:bench/broker-floor-RESULTS.md gives the "
             "broker's own floor for a live message beside a bulk publisher on this machine.",
             "", "| relays | bulk rows | live rows/s | bulk alone msg/s | beside live msg/s | "
             "drain ratio | live p50 ms | p95 | p99 | max | load before |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in s["fairness"]:
        lines.append(f"| {e['relays']} | {e['rows']:,} | {e['live_rate_per_s']} | "
                     f"{_range(e['alone_msg_per_s'])} | {_range(e['beside_live_msg_per_s'])} | "
                     f"{_ratio(e['drain_ratio'])} | {_ms(e['live_p50_ms'])} | "
                     f"{_ms(e['live_p95_ms'])} | {_ms(e['live_p99_ms'])} | "
                     f"{_ms(e['live_max_ms'])} | {_loads(e['load_before'])} |")
    return lines


def _cost_lines(s: dict[str, Any]) -> list[str]:
    cost = [c for c in s["cost"] if c["rows"] == s["headline"]["rows"]]
    one = next(c for c in cost if c["processes"] == 1)
    per_1k = one["relay"] + one["postgres_own_sessions"] + one["rabbitmq"]
    lines = ["Cost model (CPU-seconds per 1,000 messages while one relay drains, from /proc; "
             "RabbitMQ's figure includes other work on this shared machine):", "",
             "| relay processes | relay | PostgreSQL (its sessions) | RabbitMQ | drain msg/s | "
             "whole machine busy (cores) |", "|---|---|---|---|---|---|"]
    for c in cost:
        d = next(x for x in s["drain"] if x["processes"] == c["processes"]
                 and x["rows"] == c["rows"] and x["publisher"] == "bulk"
                 and not x.get("kind", "").startswith("traced"))
        lines.append(f"| {c['processes']} | {c['relay']:.3f} | {c['postgres_own_sessions']:.3f} "
                     f"| {c['rabbitmq']:.3f} | {d['msg_per_s']['median']:,.0f} | "
                     f"{d['cpu_cores']['machine_busy']} |")
    relay_rate = 1000 / one["relay"] if one["relay"] else 0.0
    lines += ["", f"What follows: a message costs about {per_1k:.3f} CPU-seconds per 1,000 on "
              f"the three processes together, so 10,000 msg/s needs about {per_1k * 10:.1f} "
              f"cores, of which the relay takes {one['relay'] * 10:.2f}; one relay core would "
              f"carry about {relay_rate:,.0f} msg/s, so replicas are for availability long "
              "before they are for throughput, and PostgreSQL and RabbitMQ set the rate. With "
              "more relay processes the drain rate is "
              + ", ".join(f"{k.split('_')[1]}: {v}x one" for k, v in s["ratios"].items()
                          if k.startswith("relay_") and k.endswith("p_vs_1p"))
              + " here: this machine has 2 cores and the servers already take them during a "
              "one-relay drain (whole machine busy above), so the check cannot show scaling; "
              "it shows that more replicas cost little CPU per message."]
    return lines


def render_readme_block(report: dict[str, Any]) -> str:
    """The figures README quotes, from this report only."""
    s, m = report["summary"], report["machine"]
    r = s["ratios"]
    head = s["headline"]
    lat = {(e["mode"], e["rate_per_s"]): e for e in s["latency"]}
    prod = {(e["situation"], e["mode"]): e for e in s["producers"]}
    mode = report["notify_mode"]
    lines = [f"`{report['command']}`, {report['date'][:16].replace('T', ' ')} UTC, nproc "
             f"{m['nproc']}, {m['memory_gb']} GB, load average before the suite "
             f"{report['load_before'][0]:.1f} (before each run: bench/RESULTS.md); notify mode "
             f"`{mode}` (the default) unless marked.", ""]
    lines.append(f"- Drain, one `relay run`: {head['msg_per_s']['median']:,.0f} msg/s = "
                 f"{r['relay_1p_vs_bulk_frame_limit']}x the bulk-frame publish limit of the "
                 f"same run; {r['relay_1p_vs_classic']}x a classic per-row relay"
                 + (f"; a {report['plan']['big_rows']:,}-row backlog at "
                    f"{r['big_backlog_vs_small']}x the {head['rows']:,}-row rate"
                    if "big_backlog_vs_small" in r else "") + ".")
    pinned = next((d for d in s["drain"] if d.get("pinned")), None)
    if pinned is not None and "pinned_horizon_vs_unpinned" in r:
        lines.append(f"- A {pinned['rows']:,}-row drain while another session pins the xmin "
                     f"horizon: {pinned['msg_per_s']['median']:,.0f} msg/s = "
                     f"{r['pinned_horizon_vs_unpinned']}x the same drain with it free.")
    for (md, rate), e in lat.items():
        lines.append(f"- Commit → consumer at {rate:,} commits/s ({e['connections']} producer "
                     f"connections, `{md}`; the producers reached "
                     f"{e['achieved_per_s']['median']:,.0f}/s): p50 "
                     f"{e['p50_ms']['median']:.2f} ms, p99 {e['p99_ms']['median']:.2f} ms "
                     f"(median of {e['p50_ms']['n']:.0f}).")
    for (situation, md), e in prod.items():
        if md == "off":
            continue
        q = e["ratio_to_no_trigger"]
        lines.append(f"- 8 one-row pgbench producers, {situation}, `{md}`: "
                     f"{q['median']:.2f}x their no-trigger commit rate (rounds "
                     f"{q['min']:.2f}–{q['max']:.2f}, n={q['n']:.0f}).")
    rows = report["plan"]["trigger_rows"]
    for e in s["triggers"]:
        if e["trigger"] != "none":
            kind = e["trigger"].replace("_", "-")
            lines.append(f"- A {rows:,}-row INSERT … SELECT with the {kind} trigger: "
                         f"{e['ratio_to_none']['median']:.2f}x the rate with none.")
    for e in s.get("fairness", []):
        lines.append(f"- Live one-row transactions at {e['live_rate_per_s']}/s beside a "
                     f"{e['rows']:,}-row bulk transaction, {e['relays']} relay"
                     f"{'s' if e['relays'] > 1 else ''}: p50 {e['live_p50_ms']['median']:.2f} "
                     f"ms, p99 {e['live_p99_ms']['median']:.2f} ms while the bulk drained at "
                     f"{e['drain_ratio']['median']:.2f}x its rate alone "
                     f"(median of {e['live_p50_ms']['n']:.0f}).")
    lines += ["", *_cost_lines(s)]
    return "\n".join(lines)


def replace_readme_block(readme: str, block: str) -> str:
    """README text with its figures block replaced (its markers must be there)."""
    return with_block(readme, "figures", block, append=False)
