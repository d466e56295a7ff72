"""`relay status`: the backlog once, or `--watch` it: rates, ETA, dead letters by reason.

On a terminal the watch redraws in place; otherwise it prints one JSON line per tick, for
scripts and log collectors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from relay.pg.status import Sample, StatusReader, document
from relay.settings import Settings

EXIT_OK = 0


def human_s(seconds: float | None) -> str:
    """1.5s, 3.2m, 4.1h; '-' for unknown."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def lines(doc: dict[str, Any]) -> list[str]:
    """The human form of one status document."""
    eta = doc.get("eta_s")
    growing = doc.get("in_per_s") is not None and eta is None and doc["due"]
    rows = [
        ("table", doc["table"]),
        ("relays connected", doc["relays"]),
        ("notify mode", doc["notify_mode"]),
        ("due rows", f"{doc['due']:,}"),
        ("oldest due row age", human_s(doc["oldest_due_age_s"])),
        ("  of live transactions", human_s(doc.get("oldest_live_due_age_s"))),
        ("  of bulk transactions", human_s(doc.get("oldest_bulk_due_age_s"))),
        ("rate in / out", f"{_rate(doc.get('in_per_s'))} / {_rate(doc.get('out_per_s'))}"),
        ("empty in", "not draining" if growing else human_s(eta)),
        ("delayed rows", f"{doc['delayed']:,}"),
        ("rows retrying", f"{doc['retrying']:,}"),
        ("recurring rows", f"{doc.get('recurring', 0):,}"),
        ("rows for streams", f"{doc.get('stream_rows', 0):,}"
         + (f", oldest {human_s(doc['stream_oldest_age_s'])}" if doc.get("stream_rows") else "")),
        ("stream rows parked", f"{doc.get('stream_dead_rows', 0):,}"),
        ("dead letters", f"{doc['dead']:,}"),
    ]
    rows += [(f"  {reason}", f"{n:,}") for reason, n in doc["dead_by_reason"].items()]
    parts = doc.get("archive_partitions") or []
    if parts:
        rows.append(("archive partitions", f"{len(parts)}, "
                     f"{sum(p['bytes'] for p in parts) / 2**20:,.1f} MiB"))
        rows += [(f"  {p['name']}", f"{p['bytes'] / 2**20:,.1f} MiB, ~{p['rows']:,} rows, "
                  f"{p['bounds']}") for p in parts]
    rows += [("dead tuples", doc["dead_tuples"]),
             ("last vacuum", human_s(doc["last_vacuum_age_s"]) + " ago")]
    width = max(len(k) for k, _ in rows)
    return [f"{key:<{width}}  {value}" for key, value in rows]


async def watch(reader: StatusReader, table: str, *, interval_s: float, count: int | None,
                tty: bool) -> None:
    """Sample every interval; redraw in place on a terminal, else one JSON line per tick."""
    before: Sample | None = None
    drawn = 0
    tick = 0
    while count is None or tick < count:
        sample = await reader.sample()
        doc = document(table, sample, before)
        if tty:
            text = lines(doc)
            # Cursor up over the previous drawing, clear to the end of the screen, redraw.
            prefix = f"\x1b[{drawn}F\x1b[J" if drawn else ""
            print(prefix + "\n".join(text), flush=True)
            drawn = len(text)
        else:
            print(json.dumps(doc, default=str), flush=True)
        before, tick = sample, tick + 1
        if count is None or tick < count:
            await asyncio.sleep(interval_s)


def make_status_command(
    run_async: Callable[[Callable[[], Coroutine[Any, Any, int]]], int],
) -> Callable[[argparse.Namespace, Settings], int]:
    """The handler of `relay status`."""

    def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
        from relay.app import database_config
        from relay.pg.status import open_status

        async def main() -> int:
            async with open_status(database_config(settings)) as reader:
                if args.watch:
                    await watch(reader, settings.table, interval_s=args.interval_s,
                                count=args.count, tty=sys.stdout.isatty() and not args.json)
                    return EXIT_OK
                doc = document(settings.table, await reader.sample(), None)
                for key in ("in_per_s", "out_per_s", "eta_s"):
                    doc.pop(key)
                print(json.dumps(doc, default=str) if args.json else "\n".join(lines(doc)))
            return EXIT_OK

        return run_async(main)

    return cmd_status


def add_status_command(add: Callable[..., argparse.ArgumentParser],
                       run_async: Callable[[Callable[[], Coroutine[Any, Any, int]]], int],
                       ) -> None:
    """`relay status [--json] [--watch [--interval-s S] [--count N]]`."""
    status = add("status", make_status_command(run_async),
                 "show the backlog, dead letters by reason and table health (--watch: live)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--watch", action="store_true",
                        help="sample again every interval: rates in and out, ETA; in place on "
                             "a terminal, one JSON line per tick otherwise")
    status.add_argument("--interval-s", type=float, default=2.0,
                        help="seconds between samples of --watch (default 2)")
    status.add_argument("--count", type=int, default=None,
                        help="stop --watch after N samples (default: until Ctrl-C)")
