"""Lifecycle of `relay run`: open both servers (fail fast), run listener and worker, stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog

from relay.amqp.bulk import BulkPublisher
from relay.amqp.publisher import AmqpPublisher
from relay.loop.leader import Leadership, run_when_leader
from relay.loop.retry import RetryPolicy
from relay.loop.worker import Worker, WorkerConfig
from relay.ops.http import Health, HttpServer
from relay.ops.metrics import BacklogPoller, RelayMetrics
from relay.pg.listener import Listener
from relay.pg.queries import Queries
from relay.pg.store import Outbox, connect, table_names
from relay.pg.wakeup import AdaptivePoll, LockGate
from relay.settings import OnDeadKey, PublisherKind, RelayMode, Settings, redact_url

log = structlog.get_logger("relay.app")


def worker_config(settings: Settings) -> WorkerConfig:
    """The worker's knobs from the settings."""
    return WorkerConfig(
        batch_size=settings.batch_size,
        # single-active promises one batch at a time, in seq order.
        concurrency=1 if settings.mode is RelayMode.SINGLE_ACTIVE else settings.concurrency,
        poll_interval_s=settings.poll_interval_s,
        mandatory=settings.mandatory,
        max_message_bytes=settings.max_message_bytes,
        retry=RetryPolicy(settings.max_attempts, settings.retry_base_s, settings.retry_max_s),
        db_retry_max_s=settings.reconnect_max_s,
        ordering_block_on_dead=settings.ordering_on_dead is OnDeadKey.BLOCK,
    )


async def _worker_main(settings: Settings, worker: Worker, outbox: Outbox) -> None:
    """The worker, behind the leader lock in single-active mode."""
    if settings.mode is not RelayMode.SINGLE_ACTIVE:
        await worker.run()
        return
    queries = Queries(table_names(settings))
    leadership = Leadership(
        lambda: connect(settings, "leader"),
        queries["leader_try_lock"],
        queries["ping"],
        poll_interval_s=settings.leader_poll_interval_s,
        reconnect_max_s=settings.reconnect_max_s,
    )
    try:
        await run_when_leader(worker, leadership, outbox.terminate)
    finally:
        await leadership.close()


async def run(settings: Settings) -> None:
    """Run the relay until SIGTERM/SIGINT; raises RelayError subclasses when start-up fails."""
    outbox = await Outbox.open(settings)
    kind = BulkPublisher if settings.publisher is PublisherKind.BULK else AmqpPublisher
    publisher = kind(
        settings.amqp_url,
        publish_timeout_s=settings.publish_timeout_s,
        reconnect_max_s=settings.reconnect_max_s,
    )
    try:
        await publisher.connect()
    except BaseException:
        await outbox.close()
        raise
    metrics = RelayMetrics() if settings.http_port else None
    worker = Worker(outbox, publisher, worker_config(settings), metrics=metrics)
    worker.gate = gate = LockGate(
        lambda: connect(settings, "wakeup"),
        Queries(table_names(settings)),
        worker.wake,
        poll=AdaptivePoll(settings.poll_min_interval_s, settings.poll_interval_s),
        fallback_poll_s=min(1.0, settings.poll_interval_s),
        awake_poll_s=settings.awake_poll_interval_s,
    )
    listener = Listener(
        lambda: connect(settings, "listener"),
        settings.notify_channel,
        worker.wake,
        ping_sql=Queries(table_names(settings))["ping"],
        reconnect_max_s=settings.reconnect_max_s,
    )
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    log.info(
        "relay_started",
        table=settings.table,
        pg=redact_url(settings.pg_dsn),
        amqp=redact_url(settings.amqp_url),
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        publisher=settings.publisher.value,
        mode=settings.mode.value,
    )
    worker_task = asyncio.ensure_future(_worker_main(settings, worker, outbox))
    listener_task = asyncio.ensure_future(listener.run())
    stop_task = asyncio.ensure_future(stop_requested.wait())
    http: HttpServer | None = None
    poller_task: asyncio.Future[None] | None = None
    try:
        if metrics is not None:
            poller = BacklogPoller(outbox.backlog, metrics, settings.backlog_poll_interval_s)
            poller_task = asyncio.ensure_future(poller.run())
            http = await start_http(
                settings, metrics=metrics, poller=poller, worker=worker,
                worker_task=worker_task, publisher=publisher, listener=listener,
            )
        await asyncio.wait({worker_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        log.info("relay_stopping", timeout_s=settings.shutdown_timeout_s)
        worker.stop()
        done, _ = await asyncio.wait({worker_task}, timeout=settings.shutdown_timeout_s)
        if not done:
            log.warning("relay_stop_timeout", detail="rolling back in-flight batches")
            worker_task.cancel()
            with contextlib.suppress(BaseException):
                await worker_task
        elif worker_task.exception() is not None:
            raise worker_task.exception()  # type: ignore[misc]
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if http is not None:
            await http.close()
        tasks = [t for t in (listener_task, stop_task, worker_task, poller_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(listener.close(), gate.close())
        await publisher.close()
        await outbox.close()
        log.info("relay_stopped", published=worker.published_total)


def stall_after_s(settings: Settings) -> float:
    """Seconds without loop activity after which /healthz fails.

    A batch may legitimately take a claim query, a publish timeout and a settle query (each
    query bounded by the command timeout of relay/pg/store.py), and an idle loop wakes at least
    every poll interval; the bound sits well above the sum so a slow batch is not a restart.
    """
    command_timeout_s = max(30.0, settings.publish_timeout_s * 2)
    return max(
        120.0,
        3 * settings.poll_interval_s + settings.publish_timeout_s + 2 * command_timeout_s,
    )


async def start_http(
    settings: Settings,
    *,
    metrics: RelayMetrics,
    poller: BacklogPoller,
    worker: Worker,
    worker_task: asyncio.Future[None],
    publisher: AmqpPublisher,
    listener: Listener,
) -> HttpServer:
    """Wire the metrics and probes to the running objects and start the HTTP endpoint."""
    metrics.watch_connections(
        postgres=lambda: listener.connected,
        rabbitmq=lambda: publisher.connected,
        blocked=lambda: publisher.blocked,
    )
    health = Health(
        worker_alive=lambda: not worker_task.done(),
        last_activity=lambda: max(worker.last_loop_at, metrics.last_batch_at),
        postgres_connected=lambda: listener.connected,
        rabbitmq_connected=lambda: publisher.connected,
        broker_blocked=lambda: publisher.blocked,
        backlog=lambda: poller.snapshot,
        ready_max_lag_s=settings.ready_max_lag_s,
        stall_after_s=stall_after_s(settings),
        backlog_stale_after_s=max(3 * settings.backlog_poll_interval_s, 30.0),
    )
    http = HttpServer(settings.http_host, settings.http_port, health, metrics.render)
    await http.start()
    return http
