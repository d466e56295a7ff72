"""`python -m relay.spark cleanup`: drop staging tables left behind by crashed staged jobs."""

from __future__ import annotations

import argparse
import sys

from relay.errors import RelayError
from relay.spark.writer import cleanup_staging


def main(argv: list[str] | None = None) -> int:
    """Run the sub-command; 0 on success, 2 on a relay error (message on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m relay.spark")
    sub = parser.add_subparsers(dest="command", required=True)
    clean = sub.add_parser("cleanup", help="drop staging tables whose job is gone")
    clean.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: RELAY_PG_DSN)")
    clean.add_argument("--table", default=None, help="outbox table (default: RELAY_TABLE)")
    args = parser.parse_args(argv)
    try:
        dropped = cleanup_staging(dsn=args.dsn, table=args.table)
    except RelayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"dropped {len(dropped)} staging table(s)" + "".join(f"\n  {t}" for t in dropped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
