"""`relay inbox migrate|status|prune`: the consumer's inbox table, in the consumer's database.

The inbox lives beside the consumer's business tables, not beside the outbox, so these commands
take that database's DSN (`--dsn`, else libpq's PG* variables), not RELAY_PG_DSN.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import Any

from relay.errors import ConfigError
from relay.inbox.store import DEFAULT_TABLE, InboxError, migrate, prune, session, stats
from relay.pg.deadletters import parse_duration_s
from relay.settings import Settings

EXIT_OK = 0


async def _migrate(args: argparse.Namespace) -> int:
    async with session(args.dsn) as conn:
        await migrate(conn, args.table)
    print(f"inbox table {args.table} ready")
    return EXIT_OK


async def _status(args: argparse.Namespace) -> int:
    async with session(args.dsn) as conn:
        found = await stats(conn, args.table)
    if args.json:
        print(json.dumps({"table": args.table, "table_bytes": found.table_bytes,
                          "messages": found.messages,
                          "consumers": [c.__dict__ for c in found.consumers]}, default=str))
        return EXIT_OK
    print(f"inbox table {args.table}: {found.messages:,} messages, "
          f"{found.table_bytes / 2**20:,.1f} MiB")
    for c in found.consumers:
        print(f"  {c.consumer}: {c.messages:,} messages, oldest {c.oldest:%Y-%m-%d %H:%M:%S%z}, "
              f"newest {c.newest:%Y-%m-%d %H:%M:%S%z}")
    return EXIT_OK


async def _prune(args: argparse.Namespace) -> int:
    older_than_s = parse_duration_s(args.older_than)
    async with session(args.dsn) as conn:
        deleted = await prune(conn, older_than_s, args.table, args.batch)
    print(f"deleted {deleted:,} inbox rows older than {args.older_than}")
    return EXIT_OK


COMMANDS = {"migrate": _migrate, "status": _status, "prune": _prune}


def cmd_inbox(args: argparse.Namespace, settings: Settings) -> int:
    """Run one `relay inbox` sub-command; an inbox usage error is a user error."""
    del settings  # the inbox's database is the consumer's, named by --dsn
    try:
        return asyncio.run(COMMANDS[args.inbox_command](args))
    except InboxError as exc:
        raise ConfigError(str(exc)) from None


def add_inbox_command(
        add: Callable[[str, Callable[[argparse.Namespace, Settings], int], str],
                      argparse.ArgumentParser]) -> None:
    """`relay inbox ...` on the parser."""
    inbox = add("inbox", cmd_inbox,
                "the consumer's inbox table (effectively-once consumers, docs/inbox.md)")
    sub = inbox.add_subparsers(dest="inbox_command", metavar="SUBCOMMAND", required=True)
    common: dict[str, dict[str, Any]] = {
        "--dsn": {"default": None, "help": "the consumer's database (default: libpq's PG* "
                  "variables)"},
        "--table": {"default": DEFAULT_TABLE,
                    "help": f"the inbox table, name or schema.name (default {DEFAULT_TABLE})"},
    }

    def with_common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for flag, kwargs in common.items():
            p.add_argument(flag, **kwargs)
        return p

    with_common(sub.add_parser("migrate", help="create the inbox table and its index "
                                               "(idempotent)"))
    status = with_common(sub.add_parser("status", help="messages recorded per consumer, the "
                                                       "oldest, and the table's size"))
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    prune = with_common(sub.add_parser("prune", help="delete rows recorded longer ago than "
                                                     "--older-than, in batches"))
    prune.add_argument("--older-than", required=True, metavar="AGE",
                       help="7d, 12h, 30m... keep this longer than any message can wait to "
                            "be delivered again")
    prune.add_argument("--batch", type=int, default=10_000, help="rows per DELETE")
