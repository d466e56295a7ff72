"""Lifecycle of `relay run`: wait for both servers (bounded), run listener and worker, stop.

Start in any order: a server that does not answer yet is waited for, with backoff, up to
RELAY_STARTUP_TIMEOUT_S (then `GaveUp`, its own exit code); a bad setting, a wrong password or a
missing table fails at once. Every connection the relay keeps has a Supervisor (relay/supervise.py)
under one stop event; their states are part of /healthz.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import structlog

from relay.amqp.encoder import Encoder
from relay.amqp.pipeline import AmqpPublisher, BulkPublisher, Pipeline
from relay.deadlines import Deadlines
from relay.dsn import redact
from relay.errors import BrokerRefusedAtStart, ConfigError, DatabaseUnavailable
from relay.interfaces import EXPRESS_IN_FLIGHT, ClaimOptions, OnSuccess
from relay.lifecycle import Services
from relay.loop.express import ExpressLane
from relay.loop.leader import Leadership, run_when_leader
from relay.loop.retry import RetryPolicy
from relay.loop.sleep import Doorbell
from relay.loop.worker import Worker, WorkerConfig
from relay.ops.admin import AdminApi
from relay.ops.http import Health, HttpServer
from relay.ops.metrics import BacklogPoller, RelayMetrics
from relay.ops.statuspage import StatusPage
from relay.ops.stuck import waiting_tasks
from relay.pg.archive import PartitionKeeper
from relay.pg.config import DatabaseConfig
from relay.pg.connection import connect
from relay.pg.leaderlock import LeaderLock
from relay.pg.listener import Listener
from relay.pg.queries import TableNames
from relay.pg.status import StatusSource
from relay.pg.store import Outbox
from relay.pg.streams import StreamStore
from relay.pg.wakeup import WakeupLockSession
from relay.settings import OnDeadKey, PublisherKind, RelayMode, Settings
from relay.supervise import Backoff, Stopping, Supervisor, Supervisors
from relay.tracing import Tracing
from relay.tracing import from_environment as tracing_from_environment

if TYPE_CHECKING:
    # The stream driver (and its client library, rstream: a tenth of a second of every
    # relay's start-up) is imported only by a relay with streams on.
    from relay.streams.worker import StreamConfig, StreamWorker

log = structlog.get_logger("relay.app")


def deadlines(settings: Settings) -> Deadlines:
    """Every bound of a batch (relay/deadlines.py), from the settings they depend on."""
    return Deadlines.derive(publish_budget_s=settings.publish_timeout_s,
                            statement_timeout_s=settings.statement_timeout_s,
                            poll_interval_s=settings.poll_interval_s)


def database_config(settings: Settings) -> DatabaseConfig:
    """What relay/pg needs of the settings (relay/pg/config.py): the one place it is read."""
    # The pool: a connection per lane and per express batch in flight, one for the express
    # lane's looks, one for the rest (status, due times).
    express = EXPRESS_IN_FLIGHT + 1 if settings.express_lane else 0
    return DatabaseConfig(
        dsn=settings.pg_dsn,
        names=TableNames(settings.table_schema, settings.table_name, settings.notify_channel),
        table=settings.table,
        deadlines=deadlines(settings),
        lock_command_timeout_s=max(30.0, settings.publish_timeout_s * 2),
        reconnect_max_s=settings.reconnect_max_s,
        startup_timeout_s=settings.startup_timeout_s,
        on_success=settings.on_success,
        claim=ClaimOptions(
            keys_per_batch=settings.ordering_keys_per_batch,
            block_on_dead=settings.ordering_on_dead is OnDeadKey.BLOCK,
            fence=settings.mode is RelayMode.SINGLE_ACTIVE,
            max_bytes=settings.batch_max_bytes,
            max_message_bytes=settings.max_message_bytes,
        ),
        pool_size=settings.concurrency + express + 1,
        # The single-active leader's lock session: a standby polls and a leader pings every
        # poll interval, so ten intervals of silence (30 s at least) is a relay cut off.
        leader_idle_session_ms=int(max(30.0, 10 * settings.leader_poll_interval_s) * 1000),
    )


def stream_config(settings: Settings) -> StreamConfig:
    """What the stream worker needs of the settings: the stream port on the broker's host, as
    the broker's user."""
    from relay.streams.producer import StreamServer
    from relay.streams.worker import StreamConfig

    parts = urlsplit(settings.amqp_url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return StreamConfig(
        server=StreamServer(host=parts.hostname or "localhost", port=settings.stream_port,
                            username=unquote(parts.username or "guest"),
                            password=unquote(parts.password or "guest"), vhost=vhost),
        producer_prefix=settings.table_name, slots=settings.stream_producers,
        lease_s=settings.stream_lease_s)


def stream_worker(settings: Settings, db: DatabaseConfig) -> StreamWorker:
    """The stream worker of this relay process, named for the slots' leases."""
    from relay.streams.worker import StreamWorker

    owner = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    return StreamWorker(stream_config(settings), lambda: StreamStore.open(db, owner))


def worker_config(settings: Settings) -> WorkerConfig:
    """The worker's knobs from the settings."""
    return WorkerConfig(
        batch_size=settings.batch_size,
        # single-active promises one batch at a time, in seq order.
        concurrency=1 if settings.mode is RelayMode.SINGLE_ACTIVE else settings.concurrency,
        poll_interval_s=settings.poll_interval_s,
        poll_min_interval_s=settings.poll_min_interval_s,
        publish_budget_s=deadlines(settings).publish_budget_s,
        retry=RetryPolicy(settings.max_attempts, settings.retry_base_s, settings.retry_max_s),
        db_retry_max_s=settings.reconnect_max_s,
        ordering_block_on_dead=settings.ordering_on_dead is OnDeadKey.BLOCK,
        batch_max_bytes=settings.batch_max_bytes,
    )


def _backoff(settings: Settings) -> Backoff:
    return Backoff(base_s=0.2, max_s=settings.reconnect_max_s)


def _quick_backoff(reconnect_max_s: float) -> Backoff:
    """The LISTEN and wake-up sessions come back sooner than the others (5 s at most): while
    they are down the relay polls, and the LISTEN session's return ends the pool's backoff."""
    return Backoff(0.2, min(5.0, reconnect_max_s))


async def _worker_main(settings: Settings, db: DatabaseConfig, worker: Worker, outbox: Outbox,
                       supervisors: Supervisors) -> None:
    """The worker, behind the leader lock in single-active mode."""
    if settings.mode is not RelayMode.SINGLE_ACTIVE:
        await worker.run()
        return
    leadership = Leadership(
        LeaderLock(db),
        poll_interval_s=settings.leader_poll_interval_s,
        supervisor=supervisors.add("leader"),
    )
    try:
        await run_when_leader(worker, leadership, outbox.terminate)
    finally:
        await leadership.close()


def make_listener(db: DatabaseConfig, supervisors: Supervisors,
                  wake: Callable[[], None]) -> Listener:
    """The LISTEN session. It is the one session that reconnects during a database outage
    whether or not the worker is busy, so it comes back within 5 s of the server and then
    ends the worker pool's backoff (which may have grown to `reconnect_max_s`)."""
    return Listener(
        lambda: connect(db, "listener"),
        db.names.channel,
        wake,
        supervisor=supervisors.add("listener", backoff=_quick_backoff(db.reconnect_max_s)),
        ping_sql=db.queries["ping"],
        on_up=supervisors.get("database").wake,
    )


def make_publisher(settings: Settings, supervisor: Supervisor, role: str = "") -> Pipeline:
    """The publish pipeline over the configured transport; `supervisor` drives its connection
    (start-up wait, reconnects, the state /healthz shows); `role` names a second connection."""
    kind = BulkPublisher if settings.publisher is PublisherKind.BULK else AmqpPublisher
    return kind(
        settings.amqp_url,
        publish_timeout_s=deadlines(settings).publish_budget_s,
        reconnect_max_s=settings.reconnect_max_s,
        encoder=Encoder(mandatory=settings.mandatory,
                        max_message_bytes=settings.max_message_bytes),
        supervisor=supervisor,
        role=role,
    )


async def _open_servers(
    settings: Settings, db: DatabaseConfig, supervisors: Supervisors
) -> tuple[Outbox, Pipeline]:
    """The pool and the broker connection, each waited for up to the start-up bound."""
    database = supervisors.add("database", describe=redact(settings.pg_dsn), bounded=True)
    outbox = await database.establish(lambda: Outbox.open(db),
                                      retry_on=(DatabaseUnavailable,))
    broker = supervisors.add("broker", describe=redact(settings.amqp_url), bounded=True)
    publisher = make_publisher(settings, broker)
    try:
        # Supervised by `broker` (the start-up wait here, every later reconnect too). A
        # certificate the CA file does not vouch for, or credentials the broker refuses, will
        # not change by waiting: the connection raises at once, a configuration error.
        await publisher.connect()
    except BrokerRefusedAtStart as exc:
        await outbox.close()
        raise ConfigError(f"RELAY_AMQP_URL: {exc}") from exc
    except BaseException:
        await outbox.close()
        raise
    return outbox, publisher


async def _open_express(settings: Settings, supervisors: Supervisors, outbox: Outbox,
                        publisher: Pipeline) -> tuple[ExpressLane, Pipeline] | None:
    """The express lane (relay/loop/express.py) with its own broker connection, opened; None
    when it is off, or in single-active mode (strict seq order). On failure, closes the
    servers `_open_servers` opened."""
    if not settings.express_lane or settings.mode is RelayMode.SINGLE_ACTIVE:
        return None
    express = make_publisher(settings, supervisors.add(
        "broker-express", describe=redact(settings.amqp_url), bounded=True), role="express")
    try:
        await express.connect()
    except BaseException:
        await publisher.close()
        await outbox.close()
        raise
    return ExpressLane(outbox.express(), express, settings.express_poll_interval_s,
                       main=publisher), express


async def run(settings: Settings) -> None:
    """Run the relay until SIGTERM/SIGINT; raises RelayError subclasses when start-up fails
    (`GaveUp` when a server stayed away past RELAY_STARTUP_TIMEOUT_S)."""
    supervisors = Supervisors(backoff=_backoff(settings),
                              give_up_after_s=settings.startup_timeout_s)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop_requested.set()
        supervisors.stop()  # ends every backoff sleep, the start-up wait included

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGUSR1, _log_waiting_tasks)
    try:
        # Before the servers: a tracing variable it cannot serve stops start-up at once.
        tracing = tracing_from_environment(os.environ, table=settings.table)
        db = database_config(settings)
        try:
            outbox, publisher = await _open_servers(settings, db, supervisors)
            express = await _open_express(settings, supervisors, outbox, publisher)
        except Stopping:
            log.info("relay_stopped", published=0)
            return
        await _serve(settings, db, supervisors, outbox, publisher, stop_requested=stop_requested,
                     tracing=tracing, express=express)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


def _log_waiting_tasks() -> None:
    """SIGUSR1: log where every task of the process waits (a relay that seems stuck)."""
    log.warning("tasks_waiting", tasks=waiting_tasks(limit=200))


async def _serve(settings: Settings, db: DatabaseConfig, supervisors: Supervisors,
                 outbox: Outbox, publisher: Pipeline, *, stop_requested: asyncio.Event,
                 tracing: Tracing, express: tuple[ExpressLane, Pipeline] | None = None,
                 ) -> None:
    """Run the worker and the services around it over open servers until a stop is
    requested; then stop the worker gracefully and every service (relay/lifecycle.py)."""
    services = Services()
    services.hold(tracing)  # closed last: the final batches' spans still leave
    services.hold(outbox)
    services.hold(publisher)
    if express is not None:
        services.hold(express[1])
    metrics = RelayMetrics() if settings.http_port else None
    doorbell = Doorbell()
    lock = services.hold(WakeupLockSession(
        lambda: connect(db, "wakeup"),
        db.queries,
        doorbell.ring,
        supervisor=supervisors.add("wakeup", backoff=_quick_backoff(db.reconnect_max_s)),
    ))
    worker = Worker(outbox, publisher, worker_config(settings), metrics=metrics, lock=lock,
                    doorbell=doorbell, db_supervisor=supervisors.get("database"),
                    tracing=tracing, express=express[0] if express is not None else None)
    listener = services.start(make_listener(db, supervisors, doorbell.ring))
    if settings.on_success is OnSuccess.ARCHIVE:
        services.start(PartitionKeeper(
            outbox.partitions_ahead,
            on_failures=metrics.archive_upkeep_failures.set if metrics is not None else None))
    if settings.streams:
        services.start(stream_worker(settings, db))
    log.info(
        "relay_started",
        table=settings.table,
        pg=redact(settings.pg_dsn),
        amqp=redact(settings.amqp_url),
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        publisher=settings.publisher.value,
        mode=settings.mode.value,
    )
    worker_task = asyncio.ensure_future(
        _worker_main(settings, db, worker, outbox, supervisors))
    try:
        if metrics is not None:
            poller = services.start(
                BacklogPoller(outbox.backlog, metrics, settings.backlog_poll_interval_s))
            for server in await start_http(
                settings, db, metrics=metrics, poller=poller, worker=worker,
                worker_task=worker_task, publisher=publisher, listener=listener,
                supervisors=supervisors,
            ):
                services.hold(server)
        await _stop_worker_when_asked(settings, worker, worker_task, stop_requested,
                                      supervisors, hard_stop=outbox.terminate)
    finally:
        worker_task.cancel()
        await _wait_bounded(worker_task, outbox.terminate)
        await services.stop()
        log.info("relay_stopped", published=worker.published_total)


# After a cancel, how long the worker may take to roll its batches back before their database
# connections are closed under them (a silent link: each rollback would wait out its own
# command timeout); and again after that. The stop stays within RELAY_SHUTDOWN_TIMEOUT_S plus
# a few seconds, whatever the servers do.
CANCEL_GRACE_S = 3.0


async def _wait_bounded(task: asyncio.Future[None], hard_stop: Callable[[], None]) -> None:
    """Wait for a cancelled task to end; past CANCEL_GRACE_S, `hard_stop` (close the database
    connections at once: the server rolls their transactions back) and wait as long again."""
    done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    if not done:
        log.warning("relay_stop_forced", detail="closing the database connections of batches "
                    "that did not roll back in time", waiting=waiting_tasks())
        hard_stop()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)


async def _stop_worker_when_asked(settings: Settings, worker: Worker,
                                  worker_task: asyncio.Future[None],
                                  stop_requested: asyncio.Event,
                                  supervisors: Supervisors, *,
                                  hard_stop: Callable[[], None]) -> None:
    """Wait for a stop request (or the worker's end), then let the worker finish its batches
    for up to RELAY_SHUTDOWN_TIMEOUT_S; past that, its open batches roll back (`hard_stop`
    closes their connections if the rollback does not come in time)."""
    stop_task: asyncio.Future[Any] = asyncio.ensure_future(stop_requested.wait())
    try:
        await asyncio.wait({worker_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_task.cancel()
        await asyncio.gather(stop_task, return_exceptions=True)
    log.info("relay_stopping", timeout_s=settings.shutdown_timeout_s)
    worker.stop()
    supervisors.stop()
    done, _ = await asyncio.wait({worker_task}, timeout=settings.shutdown_timeout_s)
    if not done:
        log.warning("relay_stop_timeout", detail="rolling back in-flight batches",
                    waiting=waiting_tasks())
        worker_task.cancel()
        await _wait_bounded(worker_task, hard_stop)
    elif worker_task.exception() is not None:
        raise worker_task.exception()  # type: ignore[misc]


async def start_http(
    settings: Settings,
    db: DatabaseConfig,
    *,
    metrics: RelayMetrics,
    poller: BacklogPoller,
    worker: Worker,
    worker_task: asyncio.Future[None],
    publisher: Pipeline,
    listener: Listener,
    supervisors: Supervisors,
) -> list[HttpServer]:
    """Wire the metrics and probes to the running objects and start the HTTP endpoint, and
    the admin port when RELAY_ADMIN_PORT sets one (the admin API and the page's buttons then
    answer there only)."""
    broker = publisher.connection

    def broker_node() -> tuple[str | None, int]:
        return broker.node, broker.failovers

    metrics.watch_connections(
        postgres=lambda: listener.connected,
        rabbitmq=lambda: publisher.connected,
        blocked=lambda: publisher.blocked,
        broker_node=broker_node,
    )
    health = Health(
        worker_alive=lambda: not worker_task.done(),
        last_activity=lambda: max(worker.last_loop_at, metrics.last_batch_at),
        postgres_connected=lambda: listener.connected,
        rabbitmq_connected=lambda: publisher.connected,
        broker_blocked=lambda: publisher.blocked,
        backlog=lambda: poller.snapshot,
        ready_max_lag_s=settings.ready_max_lag_s,
        stall_after_s=db.deadlines.stall_after_s,
        backlog_stale_after_s=max(3 * settings.backlog_poll_interval_s, 30.0),
        connections=supervisors.snapshot,
    )
    admin = admin_api(settings, db)
    apart = settings.admin_port > 0
    public = admin.moved() if apart else admin
    servers = [HttpServer(settings.http_host, settings.http_port, health, metrics.render,
                          status_page(db, broker_node, admin=public.on), admin=public)]
    if apart:
        servers.append(HttpServer(settings.admin_host, settings.admin_port, health,
                                  metrics.render, status_page(db, broker_node, admin=True),
                                  admin=admin, setting="RELAY_ADMIN_PORT"))
    for server in servers:
        try:
            await server.start()
        except BaseException:
            for started in servers:
                await started.close()
            raise
    return servers


def admin_api(settings: Settings, db: DatabaseConfig) -> AdminApi:
    """The admin API on the HTTP port (relay/ops/admin.py), off without RELAY_ADMIN_TOKEN."""
    from relay.pg.deadletters import admin_action

    return AdminApi(settings.admin_token, lambda action, args: admin_action(db, action, args))


def status_page(db: DatabaseConfig,
                broker_node: Callable[[], tuple[str | None, int]] | None = None, *,
                admin: bool = False) -> StatusPage:
    """The status page on the HTTP port (its own connection, opened on first view);
    `broker_node`: this relay's broker node and failovers, shown beside the table's figures;
    `admin`: the admin API is on (the page gets its buttons)."""
    source = StatusSource(lambda: connect(db, "status"), db.queries, db.table)
    return StatusPage(source.document, db.table, source.close, broker_node=broker_node,
                      admin=admin)
