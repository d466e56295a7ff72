"""The suite's medians, spreads and ratios from its raw runs; RESULTS.md's and README's blocks."""

from __future__ import annotations

import statistics
from typing import Any

Figure = dict[str, Any]


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and spread ((max-min)/median) over runs."""
    med = statistics.median(values)
    return {"median": round(med, 3), "min": round(min(values), 3), "max": round(max(values), 3),
            "spread_pct": round((max(values) - min(values)) / med * 100, 1) if med else 0.0,
            "n": len(values)}


def _of(runs: list[Figure], keys: tuple[str, ...]) -> Figure:
    return {k: summary([r[k] for r in runs]) for k in keys}


def _of_known(runs: list[Figure], keys: tuple[str, ...]) -> Figure:
    """As _of, over the runs that have each figure (None: none has it)."""
    out: Figure = {}
    for k in keys:
        values = [r[k] for r in runs if r.get(k) is not None]
        out[k] = summary(values) if values else None
    return out


def _load_of(runs: list[Figure], key: str = "load_before") -> Figure:
    return {"load_before": [r[key][0] for r in runs]}


def summarise(raw: Figure) -> Figure:
    """Medians and spreads of every figure, and the ratios of this run's figures."""
    limits = {k: summary([r["msg_per_s"] for r in v]) for k, v in raw["limits"].items()
              if k == "bulk_frames"}
    drains = [{k: d[k] for k in ("kind", "processes", "publisher", "rows", "pinned")}
              | _of(d["runs"], ("msg_per_s",)) | _load_of(d["runs"])
              | {"cpu_cores": {k: round(statistics.median(r["cpu_cores"][k] for r in d["runs"]),
                                        2) for k in d["runs"][0]["cpu_cores"]}}
              for d in raw["drain"]]
    latency = [{k: e[k] for k in ("mode", "rate_per_s", "connections")} | _load_of(e["runs"])
               | _of(e["runs"], ("achieved_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"))
               for e in raw["latency"]]
    producers = []
    for situation, mode in dict.fromkeys((r["situation"], r["mode"]) for r in raw["producers"]):
        runs = [r for r in raw["producers"] if (r["situation"], r["mode"]) == (situation, mode)]
        off = {r["round"]: r["tps"] for r in raw["producers"]
               if r["situation"] == situation and r["mode"] == "off"}
        producers.append({"situation": situation, "mode": mode, "tps": summary(
            [r["tps"] for r in runs]), "ratio_to_no_trigger": summary(
            [r["tps"] / off[r["round"]] for r in runs]),
            "notifications": [r["notifications"] for r in runs],
            "rows_left": [r["rows_left"] for r in runs]} | _load_of(runs))
    fairness = [{k: e[k] for k in ("relays", "rows", "live_rate_per_s")}
                | _load_of(e["runs"], "load_before_beside")
                | _of(e["runs"], ("alone_msg_per_s", "beside_live_msg_per_s", "drain_ratio",
                                  "live_p50_ms", "live_p95_ms", "live_p99_ms", "live_max_ms"))
                for e in raw["fairness"]]
    cold = [{k: e[k] for k in ("relays", "rows", "idle_s", "live_rate_per_s")}
            | _load_of(e["runs"])
            | _of(e["runs"], ("first_s", "bulk_msg_per_s"))
            | _of_known(e["runs"], ("live_p50_ms", "live_p99_ms", "live_max_ms"))
            for e in raw.get("cold", [])]
    one = next((d for d in drains if d["kind"] == "scale" and d["processes"] == 1), None)
    cost = [{"processes": d["processes"], "rows": d["rows"],
             **{k: round(statistics.median(r["cpu_s_per_1k_msgs"][k] for r in d["runs"]), 4)
                for k in d["runs"][0]["cpu_s_per_1k_msgs"]}}
            for d in raw["drain"] if d["kind"] in ("scale", "big")]
    return {"limits": limits, "drain": drains, "latency": latency, "headline": one,
            "ratios": _ratios(drains, limits, one), "cost": cost, "producers": producers,
            "fairness": fairness, "cold": cold}


def _ratios(drains: list[Figure], limits: Figure, one: Figure | None) -> dict[str, float]:
    kinds = {d["kind"]: d["msg_per_s"]["median"] for d in drains if d["processes"] == 1}
    rate = one["msg_per_s"]["median"] if one else 0.0
    out: dict[str, float] = {}
    if rate and "bulk_frames" in limits:
        out["relay_1p_vs_bulk_frame_limit"] = round(rate / limits["bulk_frames"]["median"], 2)
    for d in drains:
        if d["kind"] == "scale" and d["processes"] > 1 and rate:
            out[f"relay_{d['processes']}p_vs_1p"] = round(d["msg_per_s"]["median"] / rate, 2)
    for name, top, bottom, digits in (
            ("big_backlog_vs_small", "big", "scale", 2),
            ("pinned_horizon_vs_unpinned", "pinned", "unpinned", 2),
            ("tracing_on_vs_off", "traced_on", "traced_off", 3),
            ("traced_rows_vs_plain", "traced_off", "scale", 2),
            ("relay_bulk_vs_simple_publisher", "scale", "simple", 2)):
        if kinds.get(top) and kinds.get(bottom):
            out[name] = round(kinds[top] / kinds[bottom], digits)
    return out


def _range(s: Figure) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f}, ±{s['spread_pct'] / 2:.0f}%)"


def _ms(s: Figure) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _ratio(s: Figure) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}, n={s['n']:.0f})"


def _loads(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}" if values else "-"


def table(head: str, rows: list[list[Any]], title: str = "", text: str = "") -> list[str]:
    """A Markdown table (`head`: its columns, " | " between them), under a title and a text."""
    return [*(["", f"### {title}", ""] if title else [""]), *([text, ""] if text else []),
            f"| {head} |", "|" + "---|" * len(head.split(" | ")),
            *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def targets(s: Figure, mode: str) -> list[tuple[str, float | None, str, bool]]:
    """(target, measured median, bound, met) of the stated targets, default mode."""
    lat = {(e["mode"], e["rate_per_s"]): e for e in s["latency"]}
    prod = {(e["situation"], e["mode"]): e for e in s["producers"]}
    r = s["ratios"]
    e1, e3 = lat.get((mode, 1000)), lat.get((mode, 3000))
    rows: list[tuple[str, float | None, str, float]] = [
        ("p50 ms at 1,000 commits/s", e1 and e1["p50_ms"]["median"], "≤", 1.5),
        ("p99 ms at 1,000 commits/s", e1 and e1["p99_ms"]["median"], "≤", 5),
        ("p99 ms at 3,000 commits/s, 16 connections", e3 and e3["p99_ms"]["median"], "≤", 10),
        *((f"8 producers, {sit}: ratio to no trigger", (e := prod.get((sit, mode))) and
           e["ratio_to_no_trigger"]["median"], "≥", 0.9) for sit in ("backlog", "live")),
        ("one relay vs the bulk-frame publish limit", r.get("relay_1p_vs_bulk_frame_limit"),
         "≥", 0.85),
        ("big backlog vs the small one", r.get("big_backlog_vs_small"), "≥", 0.9),
        ("drain with the xmin horizon pinned vs free", r.get("pinned_horizon_vs_unpinned"), "≥",
         0.8),
        ("drain with tracing on vs off (a traceparent per row)", r.get("tracing_on_vs_off"), "≥",
         0.95)]
    for f in s["fairness"]:
        beside = f"live rows beside a {f['rows']:,}-row bulk, {f['relays']} relay(s)"
        rows += [(f"{beside}: p50 ms", f["live_p50_ms"]["median"], "≤", 5),
                 (f"{beside}: p99 ms", f["live_p99_ms"]["median"], "≤", 25),
                 (f"{beside}: bulk drain vs alone", f["drain_ratio"]["median"], "≥", 0.8)]
    for c in s.get("cold", []):
        rows.append((f"first 10,000 of a {c['rows']:,}-row bulk after {c['idle_s']:g} s idle on "
                     f"a vacuumed empty outbox, {c['relays']} relay(s): s from its commit",
                     c["first_s"]["median"], "≤", 1.5))
    return [(name, v, f"{op} {bound:g}", v is not None and (v <= bound if op == "≤"
                                                           else v >= bound))
            for name, v, op, bound in rows]


def runs(report: Figure) -> str:
    """Each command that ran scenarios of this report: when, which, the load as each began."""
    by: dict[str, list[tuple[str, Figure]]] = {}
    for name, e in report["scenarios"].items():
        by.setdefault(e["command"], []).append((name, e))
    return "; ".join(
        f"`{cmd}` from {min(e['date'] for _, e in es)[:16].replace('T', ' ')} UTC "
        f"({', '.join(n for n, _ in es)}; load average as each began "
        f"{_loads([e['load_before'][0] for _, e in es])})" for cmd, es in by.items())


def render_markdown(report: Figure) -> str:
    """RESULTS.md's suite block: what ran where, then every figure."""
    s, m = report["summary"], report["machine"]
    lines = [
        "## The suite", "", "Written by `python -m bench` from results.json beside it.", "",
        f"- runs: {runs(report)}; results.json last written {report['date']} by the "
        f"command: `{report['command']}`",
        f"- notify mode: **{report['notify_mode']}** (the default) unless a row says otherwise",
        f"- machine: {m['cpu']}, nproc {m['nproc']}, {m['memory_gb']} GB, Linux {m['kernel']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "- every figure: median (min–max) over the runs, with the 1-minute load average before "
        "them; ~200-byte JSON bodies, persistent messages, durable queues, servers on loopback, "
        "relays at their defaults"]
    lines += table("target | measured | bound | met", [
        [n, "-" if v is None else f"{v:g}", b, "yes" if met else "**no**"]
        for n, v, b, met in targets(s, report["notify_mode"])], "Targets (default mode)")
    traced = {"traced_off": ", a traceparent per row", "traced_on": ", traced"}
    lines += table(
        "processes | publisher | rows | xmin horizon | msg/s | load before | CPU cores: relay / "
        "postgres / rabbitmq / other",
        [[d["processes"], d["publisher"] + traced.get(d["kind"], ""), f"{d['rows']:,}",
          "pinned" if d["pinned"] else "free", _range(d["msg_per_s"]), _loads(d["load_before"]),
          " / ".join(str(d["cpu_cores"][k]) for k in ("relay", "postgres", "rabbitmq", "other"))]
         for d in s["drain"]], "Drains")
    lines += table("path | msg/s", [["bulk-frame publish limit", _range(v)]
                                    for v in s["limits"].values()], "Ceiling")
    lines += table(
        "mode | commits/s | connections | achieved | p50 | p95 | p99 | max | load before",
        [[e["mode"], f"{e['rate_per_s']:,}", e["connections"],
          f"{e['achieved_per_s']['median']:,.0f}",
          *(_ms(e[k]) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")),
          _loads(e["load_before"])] for e in s["latency"]],
        "Latency, commit → consumer (ms)")
    lines += table(
        "situation | mode | commits/s | ratio to no trigger | NOTIFYs per run | rows left | "
        "load before",
        [[e["situation"], e["mode"], _range(e["tps"]), _ratio(e["ratio_to_no_trigger"]),
          f"{min(e['notifications'])}–{max(e['notifications'])}",
          f"{min(e['rows_left']):,}–{max(e['rows_left']):,}", _loads(e["load_before"])]
         for e in s["producers"]], "Producers spared: pgbench, 8 clients, 1-row INSERTs")
    lines += table(
        "relays | bulk rows | live rows/s | bulk alone msg/s | beside live msg/s | drain ratio | "
        "live p50 ms | p95 | p99 | max | load before",
        [[e["relays"], f"{e['rows']:,}", e["live_rate_per_s"], _range(e["alone_msg_per_s"]),
          _range(e["beside_live_msg_per_s"]), _ratio(e["drain_ratio"]),
          *(_ms(e[f"live_{k}_ms"]) for k in ("p50", "p95", "p99", "max")),
          _loads(e["load_before"])] for e in s["fairness"]], "Live rows beside a bulk job")
    lines += [] if not s.get("cold") else table(
        "relays | bulk rows | idle s | first 10,000 s | bulk msg/s | live p50 ms | p99 | max | "
        "load before",
        [[e["relays"], f"{e['rows']:,}", f"{e['idle_s']:g}", _ms(e["first_s"]),
          _range(e["bulk_msg_per_s"]),
          *(_ms(e[f"live_{k}_ms"]) if e[f"live_{k}_ms"] else "-" for k in ("p50", "p99", "max")),
          _loads(e["load_before"])]
         for e in s.get("cold", [])],
        "Relays that went idle: a bulk after an idle spell on an emptied outbox that VACUUM "
        "ANALYZE recorded as empty, not analyzed after it came, live rows beside it")
    return "\n".join(lines) + "\n"


def render_readme_block(report: Figure) -> str:
    """The figures README quotes, from this report only."""
    s, m = report["summary"], report["machine"]
    r, head = s["ratios"], s["headline"]
    pinned = next(d for d in s["drain"] if d["pinned"])
    big = next(d for d in s["drain"] if d["kind"] == "big")
    lines = [f"{runs(report)}; nproc {m['nproc']}, {m['memory_gb']} GB (the load average before "
             f"each run: bench/RESULTS.md); notify mode `{report['notify_mode']}` (the default) "
             "unless marked.", "",
             f"- Drain, one `relay run`: {head['msg_per_s']['median']:,.0f} msg/s = "
             f"{r['relay_1p_vs_bulk_frame_limit']}x the bulk-frame publish limit of the same "
             f"run; a {big['rows']:,}-row backlog at {r['big_backlog_vs_small']}x "
             f"the {head['rows']:,}-row rate.",
             f"- A {pinned['rows']:,}-row drain while another session pins the xmin horizon: "
             f"{pinned['msg_per_s']['median']:,.0f} msg/s = {r['pinned_horizon_vs_unpinned']}x "
             "the same drain with it free."]
    lines += [f"- Commit → consumer at {e['rate_per_s']:,} commits/s ({e['connections']} producer"
              f" connections, `{e['mode']}`; the producers reached "
              f"{e['achieved_per_s']['median']:,.0f}/s): p50 {e['p50_ms']['median']:.2f} ms, "
              f"p99 {e['p99_ms']['median']:.2f} ms (median of {e['p50_ms']['n']:.0f})."
              for e in s["latency"]]
    lines += [f"- 8 one-row pgbench producers, {e['situation']}, `{e['mode']}`: "
              f"{q['median']:.2f}x their no-trigger commit rate (rounds {q['min']:.2f}–"
              f"{q['max']:.2f}, n={q['n']:.0f})." for e in s["producers"] if e["mode"] != "off"
              for q in [e["ratio_to_no_trigger"]]]
    lines += [f"- Live one-row transactions at {e['live_rate_per_s']}/s beside a {e['rows']:,}"
              f"-row bulk transaction, {e['relays']} relay{'s' if e['relays'] > 1 else ''}: p50 "
              f"{e['live_p50_ms']['median']:.2f} ms, p99 {e['live_p99_ms']['median']:.2f} ms "
              f"while the bulk drained at {e['drain_ratio']['median']:.2f}x its rate alone "
              f"(median of {e['live_p50_ms']['n']:.0f})." for e in s["fairness"]]
    cost = {c["processes"]: c for c in s["cost"] if c["rows"] == head["rows"]}
    lines += ["", "Cost model (CPU-seconds per 1,000 messages while the relays drain, from "
              "/proc; RabbitMQ's figure includes other work on this shared machine):"]
    lines += table("relay processes | relay | PostgreSQL (its sessions) | RabbitMQ | drain msg/s "
                   "| whole machine busy (cores)", [
                       [p, f"{c['relay']:.3f}", f"{c['postgres_own_sessions']:.3f}",
                        f"{c['rabbitmq']:.3f}", f"{d['msg_per_s']['median']:,.0f}",
                        d["cpu_cores"]["machine_busy"]]
                       for d in s["drain"] if d["kind"] == "scale"
                       for p, c in [(d["processes"], cost[d["processes"]])]])
    one = cost[1]
    per_1k = one["relay"] + one["postgres_own_sessions"] + one["rabbitmq"]
    lines += ["", f"What follows: a message costs about {per_1k:.3f} CPU-seconds per 1,000 on "
              f"the three processes together, so 10,000 msg/s needs about {per_1k * 10:.1f} "
              f"cores, of which the relay takes {one['relay'] * 10:.2f}; one relay core would "
              f"carry about {1000 / one['relay']:,.0f} msg/s, so replicas are for availability "
              "long before they are for throughput, and PostgreSQL and RabbitMQ set the rate. "
              "With more relay processes the drain rate is " + ", ".join(
                  f"{k.split('_')[1]}: {v}x one" for k, v in r.items()
                  if k.startswith("relay_") and k.endswith("p_vs_1p"))
              + " here: this machine has 2 cores and the servers already take them during a "
              "one-relay drain (whole machine busy above), so the check cannot show scaling; "
              "it shows that more replicas cost little CPU per message."]
    return "\n".join(lines)
