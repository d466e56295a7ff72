"""The `relay` command: the only place that reads Settings and starts things."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from relay.errors import RelayError
from relay.ops import logs
from relay.settings import SECRET_FIELDS, Settings
from relay.supervise import GaveUp

EXIT_OK = 0
EXIT_PENDING = 1  # `relay migrate --check`: migrations (or a notify mode change) are pending
EXIT_USER_ERROR = 2
EXIT_NOT_FOUND = 3
EXIT_GAVE_UP = 75  # EX_TEMPFAIL: a server stayed away past RELAY_STARTUP_TIMEOUT_S; retry later


def settings_help() -> str:
    """A table of every setting: environment variable, default, meaning."""
    lines = ["settings (environment variables, or a .env file in the working directory):"]
    for name, field in Settings.model_fields.items():
        env = f"RELAY_{name.upper()}"
        default = field.default
        shown = "unset" if default is None else (getattr(default, "value", default))
        lines.append(f"  {env:<26} {field.description} [default: {shown}]")
    lines.append("  (libpq's PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE apply when "
                 "RELAY_PG_DSN is unset)")
    lines.append(f"  secrets: a file per setting (relay_pg_dsn, relay_amqp_url, ...) in "
                 f"RELAY_SECRETS_DIR, else {DEFAULT_SECRETS_DIR} when it exists")
    return "\n".join(lines)


DEFAULT_SECRETS_DIR = "/run/secrets"


def secrets_dir() -> str | None:
    """Folder of secret files (one file per setting, e.g. relay_pg_dsn), or None.

    RELAY_SECRETS_DIR names it; else /run/secrets is used when it exists (where Docker and
    Kubernetes mount secrets). Environment variables win over files.
    """
    explicit = os.environ.get("RELAY_SECRETS_DIR")
    if explicit:
        if not Path(explicit).is_dir():
            from relay.errors import ConfigError

            raise ConfigError(f"RELAY_SECRETS_DIR: {explicit} is not a directory")
        return explicit
    return DEFAULT_SECRETS_DIR if Path(DEFAULT_SECRETS_DIR).is_dir() else None


def load_settings() -> Settings:
    """Read settings; an unknown variable or a bad value raises ConfigError naming it."""
    from relay.cli.config import check_variables
    from relay.errors import ConfigError

    check_variables()
    try:
        # _secrets_dir is BaseSettings' run-time override; mypy only sees the model's fields.
        return Settings(_secrets_dir=secrets_dir())  # type: ignore[call-arg]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            if not err["loc"]:  # a check across fields names them itself
                problems.append(message)
                continue
            field = str(err["loc"][0])
            got = "" if field in SECRET_FIELDS else f" (got {err.get('input')!r})"
            problems.append(f"RELAY_{field.upper()}: {message}{got}")
        raise ConfigError("invalid setting: " + "; ".join(problems)) from None


def _run_async(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main())


# ---------------------------------------------------------------------- sub-commands


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply the schema (or, with --check / --dry-run, only say what is pending)."""
    from relay.app import database_config
    from relay.pg.connection import session
    from relay.pg.migrate import migrate, plan

    db = database_config(settings)

    # RELAY_NOTIFY given (environment, .env or secret file): install it; else keep the
    # installed mode, so a routine migrate on every deploy never changes it.
    requested = settings.notify if "notify" in settings.model_fields_set else None
    if args.roles:  # bad role names stop it before anything is applied
        from relay.pg.roles import roles_sql

        roles_sql(db.names, args.producer_role, args.relay_role, args.spark_role)

    async def main() -> int:
        async with session(db, "migrate", wait=True) as conn:
            todo = await plan(conn, db.names, requested)
            deadline = time.monotonic() + (args.wait_s if args.check else 0)
            while not todo.up_to_date and time.monotonic() < deadline:
                # An init container waiting for the migrate Job of the same rollout.
                await asyncio.sleep(min(2.0, deadline - time.monotonic()))
                todo = await plan(conn, db.names, requested)
            if args.check or args.dry_run:
                print(f"{settings.table}: {todo.describe()}")
                if args.dry_run and args.roles:
                    print(f"roles: would grant {args.producer_role}, {args.relay_role} and "
                          f"{args.spark_role}")
                return EXIT_PENDING if args.check and not todo.up_to_date else EXIT_OK
            applied = await migrate(conn, db.names, requested,
                                    lock_wait_s=args.lock_wait_s,
                                    partition_archive=args.partition_archive)
            if args.roles:
                from relay.pg.roles import apply_roles

                await apply_roles(conn, db.names, args.producer_role,
                                  args.relay_role, args.spark_role)
        print(f"migrated {settings.table}: "
              + (", ".join(applied) if applied else "already up to date")
              + f" (notify trigger: {todo.notify.value}"
              + (")" if todo.notify_changes or todo.installed_notify is None else ", kept)"))
        if args.partition_archive:
            print(f"archive: {settings.table}_archive partitioned by day (published_at, UTC); "
                  "`relay status` lists its partitions")
        if args.roles:
            print(f"roles: {args.producer_role} (INSERT of the producer columns only), "
                  f"{args.relay_role} (relay), {args.spark_role} (Spark jobs, docs/spark.md)")
        return EXIT_OK

    return _run_async(main)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the relay daemon."""
    from relay import app

    async def main() -> int:
        await app.run(settings)
        return EXIT_OK

    return _run_async(main)


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective configuration, secrets redacted."""
    from relay.cli.config import effective
    from relay.version import version

    rows = effective(settings)
    if args.json:
        print(json.dumps({"version": version(),
                          "settings": {r["variable"]: r["value"] for r in rows}}))
        return EXIT_OK
    from relay.ops.console import print_table

    print_table(rows, ["variable", "value", "source"], width=80)
    return EXIT_OK


def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    """Print messages arriving on an exchange."""
    from relay.amqp.tail import tail

    async def main() -> int:
        await tail(settings.amqp_url, args.exchange, args.binding_key, args.count)
        return EXIT_OK

    return _run_async(main)


def with_dead_letters(
    settings: Settings,
    work: Callable[[Any], Coroutine[Any, Any, int]],
) -> int:
    """Run `work(DeadLetters)` over one connection (dead letters and retention commands)."""
    from relay.app import database_config
    from relay.pg.deadletters import open_dead_letters

    async def main() -> int:
        async with open_dead_letters(database_config(settings)) as dead:
            return await work(dead)

    return _run_async(main)


def watch_dead_letters(
    settings: Settings, since: Any,
    show: Callable[[Any], Coroutine[Any, Any, int]],
) -> int:
    """Run `show(rows)` over the dead letters parked from `since` on, as they come; a lost
    database is said on stderr and waited for."""
    from relay.app import database_config
    from relay.pg import deadwatch

    def outage(why: str) -> None:
        print(f"relay: the database is unavailable ({why}); trying again in "
              f"{deadwatch.WATCH_RETRY_S:.0f} s", file=sys.stderr, flush=True)

    return _run_async(lambda: show(deadwatch.watch_dead_letters(
        database_config(settings), since, on_outage=outage)))


def cmd_health(args: argparse.Namespace, settings: Settings) -> int:
    """Ask a running relay's HTTP endpoint (container HEALTHCHECK, exec probes)."""
    import urllib.error
    import urllib.request

    if not settings.http_port:
        print("relay: RELAY_HTTP_PORT is not set: the HTTP endpoint is off", file=sys.stderr)
        return EXIT_USER_ERROR
    host = settings.http_host
    if host in {"", "0.0.0.0", "::"}:  # noqa: S104 - a wildcard bind is reached on loopback
        host = "127.0.0.1"
    url = f"http://{host}:{settings.http_port}/{'readyz' if args.ready else 'healthz'}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout_s) as response:
            print(response.read().decode().strip())
            return EXIT_OK
    except urllib.error.HTTPError as exc:
        print(exc.read().decode().strip())
        return 1
    except OSError as exc:
        print(f"relay: {url} does not answer: {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every sub-command's help ends with the settings table."""
    epilog = settings_help()
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="relay",
        description="outbox-relay: moves rows from a PostgreSQL outbox table to RabbitMQ.",
        epilog=epilog,
        formatter_class=fmt,
    )
    from relay.version import version

    parser.add_argument("--version", action="version", version=f"relay {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[[argparse.Namespace, Settings], int],
            help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=fmt)
        p.set_defaults(handler=handler)
        return p

    mig = add("migrate", cmd_migrate, "create or upgrade the outbox table and its trigger")
    mig.add_argument("--check", action="store_true",
                     help="change nothing; exit 1 when migrations are pending (init containers)")
    mig.add_argument("--wait-s", type=float, default=0.0, metavar="SECONDS",
                     help="with --check: check again every 2 s until up to date, for at most "
                          "this long (an init container waiting for the migrate Job)")
    mig.add_argument("--lock-wait-s", type=float, default=300.0, metavar="SECONDS",
                     help="when a change is due and other sessions hold the outbox: try again "
                          "(each try waits at most 0.3 s for the lock, so producers are never "
                          "held up longer) for at most this long (default 300)")
    mig.add_argument("--dry-run", action="store_true",
                     help="change nothing; print what would be applied")
    mig.add_argument("--partition-archive", action="store_true",
                     help="partition the archive by day (published_at, UTC), so that "
                          "`relay prune` drops whole days; the archive as it is becomes the "
                          "first partition, rows kept. Run it once every relay of the table "
                          "runs this version")
    mig.add_argument("--roles", action="store_true",
                     help="also create/grant the least-privilege roles of sql/roles.sql")
    mig.add_argument("--producer-role", default="outbox_producer", metavar="NAME",
                     help="group role that may only INSERT (default: outbox_producer)")
    mig.add_argument("--relay-role", default="outbox_relay", metavar="NAME",
                     help="group role the relay runs as (default: outbox_relay)")
    mig.add_argument("--spark-role", default="outbox_spark_writer", metavar="NAME",
                     help="group role Spark jobs write as (default: outbox_spark_writer)")
    health = add("health", cmd_health,
                 "ask the running relay's /healthz (or /readyz); exit 0 when it passes")
    health.add_argument("--ready", action="store_true", help="ask /readyz instead")
    health.add_argument("--timeout-s", type=float, default=3.0, help="seconds to wait")
    add("run", cmd_run, "run the relay until SIGTERM/SIGINT")
    from relay.cli.status import add_status_command

    add_status_command(add, _run_async)
    config = add("config", cmd_config,
                  "print the effective configuration (secrets redacted) and where each came from")
    config.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tail = add("tail", cmd_tail, "print messages arriving on an exchange (a throwaway queue)")
    tail.add_argument("exchange", help="exchange to bind to, e.g. amq.topic")
    tail.add_argument("binding_key", nargs="?", default="#", help="binding key (default #)")
    tail.add_argument("--count", type=int, default=None, help="exit after N messages")
    from relay.cli.dead import add_failure_commands

    add_failure_commands(add, with_dead_letters, watch_dead_letters)
    from relay.cli.inbox import add_inbox_command

    add_inbox_command(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `relay` console script."""
    args = build_parser().parse_args(argv)
    logs.configure_early(os.environ.get("RELAY_LOG_FORMAT"))
    try:
        settings = load_settings()
        logs.configure(settings.log_level, settings.log_format)
        return int(args.handler(args, settings))
    except GaveUp as exc:
        logs.fatal(f"gave up waiting: {exc}", EXIT_GAVE_UP)
        return EXIT_GAVE_UP
    except RelayError as exc:
        logs.fatal(str(exc), EXIT_USER_ERROR)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # `relay config | head`: the reader left; say nothing more (no traceback at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
