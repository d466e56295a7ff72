"""What the scenarios share: databases and queues, backlogs, relays, CPU, the results file."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from relay.pg.migrate import migrate
from relay.pg.queries import TableNames
from relay.settings import NotifyMode, Settings
from tests.chaos.pgcluster import PrivateCluster, remove_stale

PG_ADMIN_DSN = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RELAY_BIN = str(Path(sys.executable).with_name("relay"))
RELAY_SRC = ""  # another checkout to run the relay from (bench/compare.py's "before")
DEFAULT_MODE: NotifyMode = Settings.model_fields["notify"].default  # what `relay migrate` installs
NAMES = TableNames(None, "queue_message", "queue_message_notify")
ROUTING_KEY = "rk"
# ~200 bytes of JSON: one message's body (BODY), and each backlog row's, of its number `g`.
BODY = ('{"order_id": 123456, "customer": "customer-12", "sku": "SKU-012345", "qty": 3, '
        '"amount_cents": 45678, "currency": "EUR", "note": "' + "x" * 64 + '", '
        '"created": "2026-01-01T00:00:00Z"}')
BODY_SQL = (
    "jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % 977), "
    "'sku', 'SKU-' || lpad((g % 100000)::text, 6, '0'), 'qty', g % 7 + 1, "
    "'amount_cents', (g * 37) % 100000, 'currency', 'EUR', "
    "'note', repeat('x', 64), 'created', '2026-01-01T00:00:00Z')")
# Each row's options with a distinct W3C traceparent, as relay.tracing.producer writes them.
TRACED_OPTIONS_SQL = (
    "jsonb_build_object('headers', jsonb_build_object('traceparent', "
    "'00-' || md5(g::text) || '-' || left(md5((g + 1)::text), 16) || '-01'))")
T = TypeVar("T")
LOGS: Path | None = None  # the relays' and producers' logs: python -m bench sets it


def log_dir(tag: str) -> Path:
    """A new folder for one run's logs, under LOGS (a new temporary folder if unset)."""
    global LOGS  # noqa: PLW0603 - one folder for the whole run
    LOGS = LOGS or Path(tempfile.mkdtemp(prefix="bench-logs-"))
    LOGS.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=LOGS))


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on uvloop (the relay's own loop)."""
    import uvloop

    return uvloop.run(main())


@contextmanager
def private_server(settings: dict[str, str] | None = None) -> Iterator[str]:
    """A private `initdb` cluster with the server's defaults (autovacuum and fsync on; plus
    `settings`) for the scenarios run meanwhile; one an earlier, killed run left is removed
    first."""
    global PG_ADMIN_DSN  # noqa: PLW0603 - one setting of the whole run
    for stale in remove_stale("relay-bench-pg-"):
        print(f"removed a cluster an earlier run left: {stale}", flush=True)
    cluster = PrivateCluster(prefix="relay-bench-pg-", durable=True, max_connections=100,
                             settings=settings).init()
    given = PG_ADMIN_DSN
    try:
        cluster.start()
        PG_ADMIN_DSN = cluster.dsn
        yield cluster.dsn
    finally:
        PG_ADMIN_DSN = given
        cluster.destroy()


async def sql(dsn: str, *work: str | Callable[[asyncpg.Connection], Awaitable[Any]]) -> None:
    """Run statements (or functions of a connection) on a connection of their own."""
    conn = await asyncpg.connect(dsn)
    try:
        for w in work:
            await (conn.execute(w) if isinstance(w, str) else w(conn))
    finally:
        await conn.close()


@asynccontextmanager
async def channel() -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A channel on a connection of its own."""
    conn = await aio_pika.connect(AMQP_URL)
    try:
        yield await conn.channel()
    finally:
        await conn.close()


@dataclass
class BenchEnv:
    """One scenario's database (`bench_<tag>_<random>`), exchange and durable queue (and a
    queue `<queue>-<key>` for each other routing key it was made with)."""

    dsn: str
    database: str
    exchange: str
    queue: str

    def relay_env(self, **overrides: Any) -> dict[str, str]:
        """The environment of a `relay run` for this scenario: its defaults but these."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(RELAY_PG_DSN=self.dsn, RELAY_AMQP_URL=AMQP_URL, RELAY_LOG_FORMAT="json")
        return env | {f"RELAY_{k.upper()}": str(v) for k, v in overrides.items()}

    async def purge(self) -> None:
        """Empty the queue (nothing consumes it during a drain)."""
        async with channel() as ch:
            await (await ch.get_queue(self.queue)).purge()

    async def set_mode(self, mode: NotifyMode) -> None:
        """`relay migrate` with this notify mode on the live table (running relays follow)."""
        await sql(self.dsn, lambda conn: migrate(conn, NAMES, mode))


@asynccontextmanager
async def scenario_env(tag: str, keys: tuple[str, ...] = ()) -> AsyncIterator[BenchEnv]:
    """A new database migrated in the default notify mode, and queues bound to a direct
    exchange, all dropped at the end."""
    suffix = f"{tag}_{secrets.token_hex(3)}"
    await sql(PG_ADMIN_DSN, f'CREATE DATABASE "bench_{suffix}"')
    dsn = urlunsplit(urlsplit(PG_ADMIN_DSN)._replace(path=f"/bench_{suffix}"))
    env = BenchEnv(dsn, f"bench_{suffix}", f"bench-{suffix}-x", f"bench-{suffix}-q")
    queues = {ROUTING_KEY: env.queue} | {k: f"{env.queue}-{k}" for k in keys}
    try:
        await env.set_mode(DEFAULT_MODE)
        async with channel() as ch:
            x = await ch.declare_exchange(env.exchange, aio_pika.ExchangeType.DIRECT,
                                          durable=True)
            for key, queue in queues.items():
                await (await ch.declare_queue(queue, durable=True)).bind(x, key)
        yield env
    finally:
        async with channel() as ch:
            for queue in queues.values():
                await ch.queue_delete(queue)
            await ch.exchange_delete(env.exchange)
        await sql(PG_ADMIN_DSN, f'DROP DATABASE IF EXISTS "{env.database}" WITH (FORCE)')


async def insert_backlog(conn: asyncpg.Connection, env: BenchEnv, rows: int,
                         options_sql: str = "NULL", *, analyze: bool = True) -> float:
    """`rows` rows in one INSERT ... SELECT (options: SQL of `g`); the commit's monotonic time.
    analyze: then ANALYZE, as autoanalyze would soon (False: a bulk it has not seen yet)."""
    await conn.execute(
        f"INSERT INTO queue_message (exchange, routing_key, content, options) "
        f"SELECT $1, $2, {BODY_SQL}, {options_sql} FROM generate_series(1, $3) AS g",
        env.exchange, ROUTING_KEY, rows)
    committed = time.monotonic()
    if analyze and rows >= 10_000:  # what autovacuum's analyze threshold does by default
        await conn.execute("ANALYZE queue_message")
    return committed


async def wait_empty(conn: asyncpg.Connection, timeout_s: float) -> float:
    """Until the outbox is empty; the monotonic time it was first seen so."""
    deadline = time.monotonic() + timeout_s
    while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queue_message)"):
        if time.monotonic() > deadline:
            left = await conn.fetchval("SELECT count(*) FROM queue_message")
            raise TimeoutError(f"outbox not drained after {timeout_s}s ({left} rows left)")
        await asyncio.sleep(0.01)
    return time.monotonic()


async def wait_drained(conn: asyncpg.Connection, env: BenchEnv, rows: int,
                       timeout_s: float) -> float:
    """Until `rows` messages are in the queue and the outbox is empty. The broker's count is
    watched first: polling the table during a drain scans its dead rows and loads the server."""
    deadline = time.monotonic() + timeout_s
    await wait_queued(env, rows, timeout_s)
    return await wait_empty(conn, max(deadline - time.monotonic(), 1.0))


async def wait_queued(env: BenchEnv, n: int, timeout_s: float, interval_s: float = 0.05,
                      ) -> float:
    """Until the scenario's queue holds `n` messages; the monotonic time it was first seen so."""
    deadline = time.monotonic() + timeout_s
    async with channel() as ch:
        while (count := (await ch.declare_queue(env.queue, passive=True))
               .declaration_result.message_count or 0) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {count} of {n} messages reached the queue "
                                   f"after {timeout_s:g}s")
            await asyncio.sleep(interval_s)
    return time.monotonic()


@asynccontextmanager
async def relays(env: BenchEnv, n: int, tag: str, *, consume: str = "",
                 extra_env: dict[str, str] | None = None, **settings: Any,
                 ) -> AsyncIterator[Receipts]:
    """`n` started `relay run`s at their defaults but `settings` (logs under log_dir(tag)), and
    this process consuming `consume`: yields what arrived when, and the relays' pids."""
    logs, received = log_dir(tag), Receipts()
    command, variables = [RELAY_BIN, "run"], env.relay_env(**settings) | (extra_env or {})
    if RELAY_SRC:
        command = [sys.executable, "-m", "relay.cli", "run"]
        variables |= {"PYTHONPATH": RELAY_SRC}
    procs = [_spawn(command, variables, logs / f"relay-{i}.log") for i in range(n)]
    received.pids = [p.pid for p in procs]
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        if consume:
            ch = await amqp.channel()
            await ch.set_qos(prefetch_count=5000)
            await (await ch.get_queue(consume)).consume(received.note, no_ack=True)
        deadline = time.monotonic() + 30
        while not all(_started(p, logs / f"relay-{i}.log") for i, p in enumerate(procs)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"a relay did not log relay_started within 30 s ({logs})")
            await asyncio.sleep(0.05)
        yield received
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        await amqp.close()


def _spawn(command: list[str], variables: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, env=variables, stdout=out, stderr=subprocess.STDOUT,
                                cwd=RELAY_SRC or None)


def _started(proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"relay exited: {log.read_text()[-2000:]}")
    return any(line.startswith("{") and json.loads(line).get("event") == "relay_started"
               for line in log.read_text(errors="replace").splitlines())


def builds(before_src: str) -> Iterator[str]:
    """"before" (relays started from `before_src`), then "after" (this tree)."""
    global RELAY_SRC  # noqa: PLW0603 - read by every Relay started meanwhile
    given = RELAY_SRC
    try:
        for build, src in (("before", before_src), ("after", "")):
            RELAY_SRC = src
            yield build
    finally:
        RELAY_SRC = given


_CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) process `pid` used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK


def _comm(entry: Path) -> str:
    try:
        return (entry / "comm").read_text().strip()
    except OSError:
        return ""


def _pids_named(name: str) -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _comm(e) == name]


def _machine_busy_s() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / _CLK


@contextmanager
def cpu_split(relay_pids: list[int]) -> Iterator[dict[str, float]]:
    """Cores used over the block by the relays, every postgres process, RabbitMQ (beam.smp),
    the whole machine and the rest; the servers' figures include other work of the machine."""
    groups: dict[str, Callable[[], list[int]]] = {
        "relay": lambda: relay_pids, "postgres": lambda: _pids_named("postgres"),
        "rabbitmq": lambda: _pids_named("beam.smp")}
    start = {k: {p: cpu_s(p) for p in f()} for k, f in groups.items()}
    busy0, t0 = _machine_busy_s(), time.monotonic()
    out: dict[str, float] = {}
    yield out
    wall = max(time.monotonic() - t0, 1e-6)
    for key, f in groups.items():
        used = sum(cpu_s(p) - start[key].get(p, 0.0) for p in set(f()) | set(start[key]))
        out[key] = round(used / wall, 3)
    out["machine_busy"] = round((_machine_busy_s() - busy0) / wall, 3)
    out["window_s"] = round(wall, 3)
    out["other"] = round(out["machine_busy"] - out["relay"] - out["postgres"] - out["rabbitmq"], 3)


def load_before() -> list[float]:
    """The load average (1, 5, 15 min) right before a run."""
    return [round(x, 2) for x in os.getloadavg()]


async def wait_quiet(below: float | None, most_s: float = 300.0) -> None:
    """Wait (at most `most_s`) until the 1-minute load average is under `below`."""
    for _ in range(int(most_s / 2)):
        if below is None or os.getloadavg()[0] < below:
            return
        await asyncio.sleep(2)


def machine() -> dict[str, Any]:
    """CPU model, cores (nproc), memory, kernel."""
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {"cpu": model, "nproc": os.cpu_count(), "memory_gb": round(mem_kb / 1e6, 1),
            "kernel": os.uname().release}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in percent)."""
    ordered = sorted(values)
    return ordered[min(max(1, round(q / 100 * len(ordered))), len(ordered)) - 1]


def tail_ms(ms: list[float], prefix: str = "") -> dict[str, float | None]:
    """p50, p95, p99 and max of latencies in ms (`<prefix>p50_ms`...); None when none."""
    return {f"{prefix}{name}_ms": round(percentile(ms, q), 2) if ms else None
            for name, q in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}


class Receipts(dict[str, float]):
    """When each message id first reached this process (CLOCK_MONOTONIC: one clock for every
    process of the machine)."""

    pids: list[int]

    async def note(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """The first arrival of a message id."""
        self.setdefault(str(message.message_id), time.monotonic())

    async def wait_for(self, ids: Iterable[str] = (), count: int = 0,
                       timeout_s: float = 60.0) -> None:
        """Until every one of `ids` (or `count` messages) arrived."""
        wanted, deadline = set(ids), time.monotonic() + timeout_s
        while missing := len(wanted - self.keys()) + max(count - len(self), 0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{missing} of {len(wanted) or count} messages did not "
                                   f"arrive within {timeout_s:g} s")
            await asyncio.sleep(0.05)


# The one results file: the suite's block (from results.json beside it) and one block of each
# scenario with a report of its own, each written by its run.
RESULTS = Path(__file__).with_name("RESULTS.md")


def block_markers(name: str) -> tuple[str, str]:
    """The comments around the block `name` of a Markdown file."""
    return (f"<!-- python -m bench writes this block: {name} -->",
            f"<!-- end of the block: {name} -->")


def with_block(text: str, name: str, body: str, *, append: bool = True) -> str:
    """`text` with its block `name` replaced by `body`; one not there yet is added at the end,
    or with `append=False` is a ValueError (README's blocks stay where they are)."""
    start, end = block_markers(name)
    block = f"{start}\n\n{body.strip()}\n\n{end}"
    if start in text:
        i = text.index(start)
        return text[:i] + block + text[text.index(end, i) + len(end):]
    if not append:
        raise ValueError(f"no block {name!r} to replace (its marker: {start})")
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_block(path: Path, name: str, body: str) -> None:
    """Replace (or add) the block `name` of the results file `path`, keeping the others."""
    text = path.read_text() if path.exists() else (
        "# Benchmark results\n\nEvery block here is written by a run of `python -m bench` (do "
        "not edit by hand), with the command, the date, the machine and the load average.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(with_block(text, name, body))
    print(f"wrote the block {name!r} of {path}")
