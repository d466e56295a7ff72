"""What every benchmark shares: a database and broker names of its own, rows, relays, /proc CPU.

The suite runs beside other work on a shared machine, so each scenario builds its own
database (`bench_<run>`), exchange and queue, and tears them down afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import uvloop

from relay.pg.migrate import migrate
from relay.pg.queries import TableNames
from relay.settings import NotifyMode, Settings
from tests.chaos.pgcluster import PrivateCluster, remove_stale

PG_ADMIN_DSN = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RELAY_BIN = str(Path(sys.executable).with_name("relay"))
# BENCH_RELAY_SRC=<folder>: run the relay from that source tree instead of this one.
RELAY_SRC = os.environ.get("BENCH_RELAY_SRC", "")
# What a user gets from `relay migrate` with no settings.
DEFAULT_MODE: NotifyMode = Settings.model_fields["notify"].default
NAMES = TableNames(None, "queue_message", "queue_message_notify")
ROUTING_KEY = "rk"

# ~200-byte JSON body, as in the measurements.
BODY_SQL = (
    "jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % 977), "
    "'sku', 'SKU-' || lpad((g % 100000)::text, 6, '0'), 'qty', g % 7 + 1, "
    "'amount_cents', (g * 37) % 100000, 'currency', 'EUR', "
    "'note', repeat('x', 64), 'created', '2026-01-01T00:00:00Z')"
)


def use_server(admin_dsn: str) -> None:
    """Run every later scenario on this PostgreSQL server (the private one below)."""
    global PG_ADMIN_DSN  # noqa: PLW0603 - one setting of the whole run, read at each use
    PG_ADMIN_DSN = admin_dsn


# Where a benchmark's PostgreSQL runs. The shared server of this machine runs with
# `autovacuum = off` (a setting of the machine's image, not of users' servers), so a backlog or
# churn figure taken there measures a server no user runs: a run starts a cluster of its own
# with `initdb` and every default (fsync, autovacuum, shared_buffers...) on a free port, and
# removes it afterwards; a cluster an earlier, killed run left behind is removed at the start.
PRIVATE_PREFIX = "relay-bench-pg-"
T = TypeVar("T")


@contextmanager
def private_server() -> Iterator[str]:
    """A running private cluster for this run; yields its admin DSN."""
    for stale in remove_stale(PRIVATE_PREFIX):
        print(f"removed a cluster an earlier run left: {stale}", flush=True)
    cluster = PrivateCluster(prefix=PRIVATE_PREFIX, durable=True, max_connections=100).init()
    try:
        cluster.start()
        yield cluster.dsn
    finally:
        cluster.destroy()


def run_on_private_server(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario()` with every benchmark database on a private cluster of its own."""
    with private_server() as dsn:
        use_server(dsn)
        return uvloop.run(scenario())  # type: ignore[arg-type]


def with_database(dsn: str, database: str) -> str:
    """The same server DSN, pointing at another database."""
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


@dataclass
class BenchEnv:
    """One scenario's database and broker objects."""

    dsn: str
    database: str
    exchange: str
    queue: str

    def relay_env(self, **overrides: Any) -> dict[str, str]:
        """Environment of a `relay run` subprocess for this scenario."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(
            RELAY_PG_DSN=self.dsn,
            RELAY_AMQP_URL=AMQP_URL,
            RELAY_LOG_FORMAT="json",
            RELAY_LOG_LEVEL="info",
            RELAY_POLL_INTERVAL_S="5",
        )
        env.update({f"RELAY_{k.upper()}": str(v) for k, v in overrides.items()})
        return env


async def create_env(tag: str, mode: NotifyMode | None = None) -> BenchEnv:
    """A migrated database and a durable queue bound to a direct exchange, all new.

    The trigger is the one `relay migrate` installs by default (the `RELAY_NOTIFY` default)
    unless a scenario asks for another mode, which it then reports beside the default.
    """
    suffix = f"{tag}_{secrets.token_hex(3)}"
    database = f"bench_{suffix}"
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    dsn = with_database(PG_ADMIN_DSN, database)
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, NAMES, mode or DEFAULT_MODE)
    finally:
        await conn.close()
    env = BenchEnv(dsn, database, f"bench-{suffix}-x", f"bench-{suffix}-q")
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        x = await ch.declare_exchange(env.exchange, aio_pika.ExchangeType.DIRECT, durable=True)
        q = await ch.declare_queue(env.queue, durable=True)
        await q.bind(x, ROUTING_KEY)
    finally:
        await amqp.close()
    return env


async def set_mode(env: BenchEnv, mode: NotifyMode) -> None:
    """`relay migrate` with this mode on the live table (running relays follow it)."""
    conn = await asyncpg.connect(env.dsn)
    try:
        await migrate(conn, NAMES, mode)
    finally:
        await conn.close()


async def drop_env(env: BenchEnv) -> None:
    """Remove the scenario's database, queue and exchange."""
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        await ch.queue_delete(env.queue)
        await ch.exchange_delete(env.exchange)
    finally:
        await amqp.close()
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{env.database}" WITH (FORCE)')
    finally:
        await admin.close()


class Records(list[dict[str, Any]]):
    """A one-off run's records, kept for its report; each is printed as a JSON line when
    added, so a long run shows its progress."""

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """Keep `record` and print it."""
        print(json.dumps(record), flush=True)
        self.append(record)
        return record


@asynccontextmanager
async def one_off_env(tag: str, mode: NotifyMode | None = None,
                      ) -> AsyncIterator[tuple[BenchEnv, Records]]:
    """A one-off script's scenario: a database, exchange and queue of its own (removed at the
    end) and the records the run collects."""
    env = await create_env(tag, mode)
    try:
        yield env, Records()
    finally:
        await drop_env(env)


def builds(before_src: str) -> Iterator[str]:
    """"before" (the relay started from `before_src`), then "after" (this tree): what each
    Relay started meanwhile runs."""
    # The one setting Relay.start reads at each start; every script shares it through here.
    global RELAY_SRC  # noqa: PLW0603
    given = RELAY_SRC
    try:
        for build, src in (("before", before_src), ("after", "")):
            RELAY_SRC = src
            yield build
    finally:
        RELAY_SRC = given


async def checkpoint(env: BenchEnv) -> None:
    """Flush every dirty buffer now (the scenario's admin connection is a superuser's)."""
    conn = await asyncpg.connect(env.dsn)
    try:
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def purge_queue(env: BenchEnv) -> None:
    """Empty the scenario's queue between runs (nothing consumes during a drain)."""
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        q = await ch.get_queue(env.queue)
        await q.purge()
    finally:
        await amqp.close()


async def delete_queues(names: Iterable[str]) -> None:
    """Delete these queues (a scenario's own, at its end)."""
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        for name in names:
            await ch.queue_delete(name)
    finally:
        await amqp.close()


async def reset_env(env: BenchEnv) -> None:
    """Empty the outbox and the queue (before repeating a run that failed half-way)."""
    conn = await asyncpg.connect(env.dsn)
    try:
        await conn.execute("TRUNCATE queue_message")
    finally:
        await conn.close()
    await purge_queue(env)


# Each row's options with a distinct, valid W3C traceparent (trace id and parent span id from
# md5 of its series number `g`): what a producer using relay.tracing.producer writes.
TRACED_OPTIONS_SQL = (
    "jsonb_build_object('headers', jsonb_build_object('traceparent', "
    "'00-' || md5(g::text) || '-' || left(md5((g + 1)::text), 16) || '-01'))"
)


async def insert_backlog(conn: asyncpg.Connection, env: BenchEnv, rows: int,
                         options_sql: str = "NULL") -> float:
    """Insert `rows` rows in one classic INSERT ... SELECT; return the commit's monotonic time.
    `options_sql`: each row's options, an SQL expression of the series number `g`."""
    await conn.execute(
        f"INSERT INTO queue_message (exchange, routing_key, content, options) "
        f"SELECT $1, $2, {BODY_SQL}, {options_sql} FROM generate_series(1, $3) AS g",
        env.exchange,
        ROUTING_KEY,
        rows,
    )
    committed = time.monotonic()
    if rows >= 10_000:
        # What autovacuum does on a default server once 10,000 rows came in (the outbox's
        # autovacuum_analyze_threshold): without statistics of the new rows the claim's plan
        # sorts the whole table. Done here because the server may run with autovacuum off.
        await conn.execute("ANALYZE queue_message")
    return committed


async def wait_empty(conn: asyncpg.Connection, timeout_s: float) -> float:
    """Poll until the outbox is empty; return the monotonic time it was first seen empty."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queue_message)"):
            return time.monotonic()
        if time.monotonic() > deadline:
            left = await conn.fetchval("SELECT count(*) FROM queue_message")
            raise TimeoutError(f"outbox not drained after {timeout_s}s ({left} rows left)")
        await asyncio.sleep(0.01)


async def wait_drained(
    conn: asyncpg.Connection, env: BenchEnv, rows: int, timeout_s: float
) -> float:
    """Wait for a drain of `rows` rows to finish without loading PostgreSQL while it runs.

    Polling the table itself every few ms scans the dead tuples the drain leaves at the head
    of the heap, which costs the server more than the relay's own claims; so watch the queue's
    message count on the broker first, and the table only for the last batches' deletes.
    """
    deadline = time.monotonic() + timeout_s
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        channel = await amqp.channel()
        while True:
            q = await channel.declare_queue(env.queue, passive=True)
            if (q.declaration_result.message_count or 0) >= rows:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {q.declaration_result.message_count} of {rows} "
                                   f"messages reached the queue after {timeout_s}s")
            await asyncio.sleep(0.05)
    finally:
        await amqp.close()
    return await wait_empty(conn, max(deadline - time.monotonic(), 1.0))


class Relay:
    """A real `relay run` subprocess."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        command = [RELAY_BIN, "run"]
        if RELAY_SRC:
            # Another checkout of the relay (e.g. `git archive main` unpacked): before/after.
            command = [sys.executable, "-m", "relay.cli", "run"]
            env = {**env, "PYTHONPATH": RELAY_SRC}
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=RELAY_SRC or None)

    async def wait_started(self, timeout_s: float = 30.0) -> None:
        """Until the process logged relay_started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"relay exited: {self.log_path.read_text()[-2000:]}")
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "relay_started":
                    return
            await asyncio.sleep(0.05)
        raise TimeoutError("relay did not start")

    def stop(self) -> None:
        """SIGTERM, then kill if it lingers."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# ---------------------------------------------------------------------- CPU from /proc

_CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) used so far by process `pid`, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK


def _pids_named(names: tuple[str, ...]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            pids.append(int(entry.name))
    return pids


def machine_cpu_s() -> tuple[float, float]:
    """CPU-seconds of the whole machine so far: (all, idle), from /proc/stat."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in parts]
    idle = values[3] + values[4]
    return sum(values) / _CLK, idle / _CLK


@contextmanager
def cpu_split(relay_pids: list[int]) -> Iterator[dict[str, float]]:
    """CPU used (in cores) by the relays, postgres and rabbitmq over the block, plus the rest.

    Postgres and RabbitMQ are shared with other work on this machine: their figures include it.
    """
    groups = {
        "relay": lambda: relay_pids,
        "postgres": lambda: _pids_named(("postgres",)),
        "rabbitmq": lambda: _pids_named(("beam.smp",)),
    }
    start_pids = {k: f() for k, f in groups.items()}
    start = {k: {p: cpu_s(p) for p in pids} for k, pids in start_pids.items()}
    total0, idle0 = machine_cpu_s()
    t0 = time.monotonic()
    out: dict[str, float] = {}
    yield out
    wall = max(time.monotonic() - t0, 1e-6)
    total1, idle1 = machine_cpu_s()
    for key, f in groups.items():
        used = 0.0
        for pid in set(f()) | set(start[key]):
            used += cpu_s(pid) - start[key].get(pid, 0.0)
        out[key] = round(used / wall, 3)
    busy = (total1 - total0) - (idle1 - idle0)
    out["machine_busy"] = round(busy / wall, 3)
    out["window_s"] = round(wall, 3)
    out["other"] = round(out["machine_busy"] - out["relay"] - out["postgres"] - out["rabbitmq"], 3)


# ---------------------------------------------------------------------- run metadata


async def wait_quiet(below: float, most_s: float = 120.0) -> None:
    """Wait (at most `most_s`) until the 1-minute load average is under `below`: the runs
    themselves load this 2-core machine, and a run must not start on the last one's load."""
    for _ in range(int(most_s / 2)):
        if os.getloadavg()[0] < below:
            return
        await asyncio.sleep(2)


def machine() -> dict[str, Any]:
    """CPU model, cores (nproc), memory, kernel."""
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {"cpu": model, "nproc": os.cpu_count(), "memory_gb": round(mem_kb / 1e6, 1),
            "kernel": os.uname().release}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in percent) of an unsorted list."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def tail_ms(ms: list[float], prefix: str = "") -> dict[str, float | None]:
    """p50, p95, p99 and max of latencies in ms (`<prefix>p50_ms`...); None when none."""
    return {f"{prefix}{name}_ms": round(percentile(ms, q), 2) if ms else None
            for name, q in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}


class Receipts(dict[str, float]):
    """When each message reached this process (CLOCK_MONOTONIC, one clock for every process
    of the machine), by message id."""

    async def consume(self, amqp: aio_pika.abc.AbstractConnection, queue: str,
                      prefetch: int) -> None:
        """Take every message of `queue` from now on (no ack), noting its arrival."""
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=prefetch)
        await (await channel.get_queue(queue)).consume(self.note, no_ack=True)

    async def note(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """The first arrival of a message id."""
        self.setdefault(str(message.message_id), time.monotonic())

    async def wait_for(self, ids: Iterable[str], timeout_s: float = 60.0) -> None:
        """Until every one of `ids` arrived; TimeoutError naming how many did not."""
        wanted = set(ids)
        deadline = time.monotonic() + timeout_s
        while missing := wanted - self.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} of {len(wanted)} messages did not arrive "
                                   f"within {timeout_s:g} s")
            await asyncio.sleep(0.05)


def parse_rates(text: str) -> list[tuple[int, int]]:
    """`--rates 1000:4,3000:16`: (commits per second, producer connections) pairs."""
    pairs = []
    for part in text.split(","):
        rate, connections = part.split(":")
        pairs.append((int(rate), int(connections)))
    return pairs


def load_before() -> list[float]:
    """The load average (1, 5, 15 min) right before a run starts."""
    return [round(x, 2) for x in os.getloadavg()]


# The one results file: the suite's block (from results.json beside it) and a block of each
# scenario with a report of its own, each written by its run between its markers.
RESULTS = Path(__file__).with_name("RESULTS.md")
RESULTS_PREAMBLE = (
    "# Benchmark results\n\nEvery block here is written by a run of `python -m bench` (do not "
    "edit by hand): the suite's from results.json beside it, each other scenario's by its own "
    "run, with the command, the date, the machine and the load average before it.\n")


def block_markers(name: str) -> tuple[str, str]:
    """The comments around the block `name` of a Markdown file."""
    return (f"<!-- python -m bench writes this block: {name} -->",
            f"<!-- end of the block: {name} -->")


def with_block(text: str, name: str, body: str, *, append: bool = True) -> str:
    """`text` with its block `name` replaced by `body`; a block not there yet is added at the
    end, or with `append=False` is a ValueError (README's blocks must stay where they are)."""
    start, end = block_markers(name)
    block = f"{start}\n\n{body.strip()}\n\n{end}"
    if start in text:
        i = text.index(start)
        j = text.index(end, i) + len(end)
        return text[:i] + block + text[j:]
    if not append:
        raise ValueError(f"no block {name!r} to replace (its marker: {start})")
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_block(path: Path, name: str, body: str) -> None:
    """Replace (or add) the block `name` of the results file `path`, keeping the others."""
    text = path.read_text() if path.exists() else RESULTS_PREAMBLE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(with_block(text, name, body))
    print(f"wrote the block {name!r} of {path}")


def one_off(module: str, *, scenario: str, rates: str | None = None,
            runs: int | None = None, seconds: float | None = None, quiet_below: float = 1.0,
            options: dict[str, dict[str, Any]] | None = None,
            ) -> tuple[argparse.Namespace, OneOff]:
    """A scenario with a report of its own: its command line, parsed, and its run. --out
    (default: its block of bench/RESULTS.md) and --quiet-below always; --rates (parsed into
    pairs), --runs and --seconds where a default is given; `options` are the script's own
    (flag -> add_argument keywords)."""
    prog = f"python -m bench --scenario {scenario} --"
    parser = argparse.ArgumentParser(prog=prog)
    for flag, kwargs in (options or {}).items():
        parser.add_argument(flag, **kwargs)
    if rates is not None:
        parser.add_argument("--rates", default=rates, type=parse_rates,
                            help="commits per second and producer connections: 1000:4,3000:16")
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs)
    if seconds is not None:
        parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--out", type=Path,
                        help="a Markdown file of its own to write (default: the scenario's "
                        "block of bench/RESULTS.md)")
    parser.add_argument("--quiet-below", type=float, default=quiet_below,
                        help="wait (up to 2 min) for the 1-minute load average to fall under "
                        "this before each run")
    args = parser.parse_args()
    return args, OneOff(module, scenario)


@dataclass
class OneOff:
    """A run of a scenario with a report of its own: the command that started it, when, the
    load average then, and where its report goes."""

    module: str
    scenario: str
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    load: list[float] = field(default_factory=load_before)

    @property
    def command(self) -> str:
        """The command line, as a reader would type it."""
        return f"python -m bench --scenario {self.scenario} -- " + shlex.join(sys.argv[1:])

    def header(self, title: str, *details: str) -> list[str]:
        """The first lines of the report: what wrote it, when, where, on what load."""
        script = self.module.replace(".", "/") + ".py"
        return [f"## {title}", "", f"Written by `{script}` (do not edit by hand).", "",
                f"- date: {self.started}", f"- command: `{self.command}`",
                f"- machine: {machine()}", f"- load average before the run: {self.load}",
                *(f"- {d}" for d in details), ""]

    def write(self, out: Path | None, text: str) -> None:
        """The report into its block of bench/RESULTS.md, or into the file `out`."""
        if out is None:
            write_block(RESULTS, self.scenario, text)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")


async def alternate(runs: int, kinds: dict[str, Callable[[], Awaitable[dict[str, Any]]]],
                    key: str, quiet_below: float) -> list[dict[str, Any]]:
    """Run each of `kinds` in turn, `runs` times (a, b, a, b...), each after the machine is
    quiet; one record per run, its kind under `key`, printed as it comes."""
    out = []
    for i in range(runs):
        for kind, once in kinds.items():
            await wait_quiet(quiet_below)
            record = {key: kind, "run": i + 1, **await once()}
            print(json.dumps(record), flush=True)
            out.append(record)
    return out


def alternation_table(records: list[dict[str, Any]], key: str, size: str, base: str,
                      subject: str) -> list[str]:
    """Every run of an alternation (`key`: `base` or `subject`; `size`: the run's rows or
    messages), then `subject` over `base` run by run and their median."""
    lines = [f"| run | {key} | {size} | seconds | msg/s | load before |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r[key]} | {r[size]:,} | {r['seconds']} | {r['msg_per_s']:,.0f} "
              f"| {r['load_before'][0]} |" for r in records]
    pairs: dict[int, dict[str, float]] = {}
    for r in records:
        pairs.setdefault(r["run"], {})[r[key]] = r["msg_per_s"]
    ratios = [p[subject] / p[base] for p in pairs.values() if {base, subject} <= p.keys()]
    if ratios:
        lines += ["", f"{subject} over {base}, run by run: "
                  + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f})."]
    return lines
