"""`relay dead list|show|watch|replay|purge` and `relay prune`: argument parsing and output.

The logic lives in relay/pg/deadletters.py. Operations that change rows work on a snapshot of
ids taken when they start, say how many they will touch (`--dry-run` stops there), take
`--limit`, and show progress; `purge` without a filter needs `--all`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from relay.ops.console import Progress, print_table
from relay.pg.deadletters import DeadLetters, Filter, UsageError, parse_duration_s
from relay.settings import Settings

EXIT_OK = 0
EXIT_NOT_FOUND = 3

WithDeadLetters = Callable[[Settings, Callable[[Any], Coroutine[Any, Any, int]]], int]
# Runs `show(rows)` over the dead letters parked from a time on (None: from now), as they come.
WatchDeadLetters = Callable[
    [Settings, datetime | None, Callable[[AsyncIterator[dict[str, Any]]],
                                         Coroutine[Any, Any, int]]], int]


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: an age (30m, 12h, 7d) or a time (ISO 8601; UTC unless it says otherwise)."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration_s(text))
    except UsageError:
        pass
    except OverflowError:  # an age reaching before the year 1 (or past what timedelta holds)
        raise UsageError(f"invalid --since {text!r}: an age that reaches before the year 1"
                         ) from None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"invalid --since {text!r}: an age (30m, 12h, 7d) or a time "
                         "(2026-11-26T09:00:00+01:00)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _watch_line(row: dict[str, Any]) -> str:
    key = f" key {row['ordering_key']}" if row.get("ordering_key") else ""
    return (f"{row['dead_at']:%Y-%m-%d %H:%M:%S%z}  {row['id']}  "
            f"{row['exchange']!s}/{row['routing_key']!s}{key}  attempts {row['attempts']}  "
            f"{row['reason']}")


async def _watch(rows: AsyncIterator[dict[str, Any]], as_json: bool) -> int:
    """Print each dead letter as it comes: a line on a terminal, JSON lines otherwise."""
    async for row in rows:
        print(json.dumps(row, default=str) if as_json else _watch_line(row), flush=True)
    return EXIT_OK


def _filter(args: argparse.Namespace) -> Filter:
    older = getattr(args, "older_than", None)
    return Filter(
        ids=getattr(args, "ids", None) or None,
        reason=getattr(args, "reason", None),
        older_than_s=None if older is None else parse_duration_s(older),
        limit=getattr(args, "limit", None),
    )


async def _list_streams(dl: DeadLetters, args: argparse.Namespace) -> int:
    rows = await dl.stream_listing(limit=args.limit, reason=args.reason)
    if args.json:
        print(json.dumps(rows, default=str))
    elif not rows:
        print("no parked stream rows" + (" match" if args.reason else ""))
    else:
        print_table(rows, ["id", "dead_at", "stream", "bytes", "reason"], 80)
    return EXIT_OK


async def _replay_streams(dl: DeadLetters, args: argparse.Namespace, table: str) -> int:
    if args.older_than or args.limit or args.dry_run:
        raise UsageError("replay --streams takes IDs, --reason CODE or --all")
    if not (args.ids or args.reason or args.all):
        raise UsageError("replay what? give IDs, --reason CODE or --all")
    moved = await dl.stream_replay(args.ids or None, args.reason)
    _say_missing(args.ids, moved, "parked stream row")
    print(f"moved {len(moved)} parked stream row(s) back into {table}_stream")
    return EXIT_OK


async def _list(dl: DeadLetters, args: argparse.Namespace) -> int:
    if args.streams:
        return await _list_streams(dl, args)
    rows = await dl.listing(limit=args.limit, reason=args.reason)
    if args.json:
        print(json.dumps(rows, default=str))
        return EXIT_OK
    total = await dl.count(Filter(reason=args.reason))
    if not rows:
        print("no dead letters" + (" match" if args.reason else ""))
        return EXIT_OK
    print_table(rows, ["id", "dead_at", "attempts", "exchange", "routing_key", "reason"], 60)
    more = " (--limit N shows more)" if len(rows) < total else ""
    print(f"{len(rows)} of {total} dead letter(s){more}")
    return EXIT_OK


async def _show(dl: DeadLetters, args: argparse.Namespace) -> int:
    rows = await dl.show(args.id)
    if not rows:
        print(f"relay: no dead letter with id {args.id}", file=sys.stderr)
        return EXIT_NOT_FOUND
    # One object for an id parked once (as always); a list, latest first, for a reused id.
    print(json.dumps(rows[0] if len(rows) == 1 else rows, default=str, indent=2))
    return EXIT_OK


def _say_missing(wanted_ids: list[str] | None, ids: list[str],
                 what: str = "dead letter") -> None:
    """Name the IDs given on the command line that are not among `ids` (not `what`s, or not
    matching the filters)."""
    found = {i.lower() for i in ids}
    for wanted in wanted_ids or []:
        if wanted.lower() not in found:
            print(f"no {what} {wanted} (matching the filters)")


async def _replay(dl: DeadLetters, args: argparse.Namespace, table: str) -> int:
    if args.streams:
        return await _replay_streams(dl, args, table)
    which = _filter(args)
    if not (which.narrows or args.all):
        raise UsageError("replay what? give IDs, --reason CODE, --older-than AGE or --all")
    ids = await dl.snapshot(which)
    _say_missing(which.ids, ids)
    if args.dry_run:
        print(f"would replay {len(ids)} dead letter(s) into {table}")
        return EXIT_OK
    result = await dl.replay(ids, batch_rows=args.batch_rows, progress=Progress("replayed"))
    print(f"replayed {len(result.replayed)} of {len(ids)} dead letter(s) into {table}")
    for row_id, why in result.left:
        print(f"left {row_id}: {why}")
    return EXIT_OK


async def _purge(dl: DeadLetters, args: argparse.Namespace) -> int:
    which = _filter(args)
    if not (which.narrows or args.all):
        total = await dl.count(which)
        raise UsageError(f"purge would delete all {total} dead letter(s): say --all, or "
                         "narrow it with --older-than AGE, --reason CODE or IDs")
    if which.ids:
        _say_missing(which.ids, await dl.snapshot(which))
    # By each dead letter's own key: an id parked again under another reason keeps the
    # dead letters that did not match.
    keys = await dl.snapshot_keys(which)
    if args.dry_run:
        print(f"would purge {len(keys)} dead letter(s)")
        return EXIT_OK
    n = await dl.purge(keys, batch_rows=args.batch_rows, progress=Progress("purged"))
    print(f"purged {n} dead letter(s)")
    return EXIT_OK


def make_dead_command(with_dead_letters: WithDeadLetters,
                      watch: WatchDeadLetters) -> Callable[..., int]:
    """The handler of `relay dead ACTION`."""

    def cmd_dead(args: argparse.Namespace, settings: Settings) -> int:
        if args.action == "watch":
            since = None if args.since is None else parse_since(args.since)
            as_json = args.json or not sys.stdout.isatty()
            return watch(settings, since, lambda rows: _watch(rows, as_json))

        async def work(dl: DeadLetters) -> int:
            if args.action == "list":
                return await _list(dl, args)
            if args.action == "show":
                return await _show(dl, args)
            if args.action == "replay":
                return await _replay(dl, args, settings.table)
            return await _purge(dl, args)

        return with_dead_letters(settings, work)

    return cmd_dead


def make_prune_command(with_dead_letters: WithDeadLetters) -> Callable[..., int]:
    """The handler of `relay prune --older-than 7d`."""

    def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
        older = parse_duration_s(args.older_than)

        async def work(dl: DeadLetters) -> int:
            done = await dl.prune_archive(older_than_s=older, batch_rows=args.batch_rows)
            if done.partitioned:
                print(f"dropped {len(done.partitions)} archive partition(s) holding only rows "
                      f"published more than {args.older_than} ago"
                      + (f": {', '.join(done.partitions)}" if done.partitions else "")
                      + "; a partition only partly that old waits for its turn")
                print(f"pruned {done.rows_deleted} archived row(s) of the default partition")
            else:
                print(f"pruned {done.rows_deleted} archived row(s) published more than "
                      f"{args.older_than} ago")
            return EXIT_OK

        return with_dead_letters(settings, work)

    return cmd_prune


def _changing(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--all", action="store_true", help=f"{verb} every dead letter")
    p.add_argument("--reason", metavar="CODE",
                   help=f"{verb} those of this reason code (the text before ':', any case)")
    p.add_argument("--older-than", help=f"{verb} those dead for longer than this (7d, 12h)")
    p.add_argument("--limit", type=int, help=f"{verb} at most N (oldest first)")
    p.add_argument("--dry-run", action="store_true", help=f"say how many; {verb} nothing")
    p.add_argument("--batch-rows", type=int, default=1000,
                   help="rows per transaction (default 1000)")


def add_failure_commands(add: Callable[..., argparse.ArgumentParser],
                         with_dead_letters: WithDeadLetters, watch: WatchDeadLetters) -> None:
    """The dead-letter and retention sub-commands."""
    dead = add("dead", make_dead_command(with_dead_letters, watch),
               "list, show, watch, replay or purge dead letters (<table>_dead)")
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("list", help="dead letters, oldest first")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--reason", metavar="CODE",
                   help="only those of this reason code (the text before ':', any case)")
    p.add_argument("--streams", action="store_true",
                   help="stream rows parked as too large to send (<table>_stream_dead)")
    p = actions.add_parser("show", help="every column of one dead letter, as JSON")
    p.add_argument("id")
    p = actions.add_parser("watch", help="print dead letters as they are parked (Ctrl-C ends)")
    p.add_argument("--since", help="first those parked since then: an age (30m, 12h, 7d) or "
                   "a time (ISO 8601, UTC unless it says)")
    p.add_argument("--json", action="store_true",
                   help="JSON lines (the default when the output is not a terminal)")
    p = actions.add_parser(
        "replay", help="move dead letters back into the outbox (same id, attempts reset)"
    )
    _changing(p, "replay")
    p.add_argument("--streams", action="store_true",
                   help="parked stream rows back into <table>_stream (IDs, --reason or --all)")
    p = actions.add_parser("purge", help="delete dead letters (a filter, or --all)")
    _changing(p, "purge")
    prune = add("prune", make_prune_command(with_dead_letters),
                "delete archived rows (RELAY_ON_SUCCESS=archive) by age")
    prune.add_argument("--older-than", required=True, help="age of published rows (7d, 12h)")
    prune.add_argument("--batch-rows", type=int, default=10_000,
                       help="rows deleted per transaction (default 10000)")
