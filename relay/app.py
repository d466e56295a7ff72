"""Lifecycle of `relay run`: open both servers (fail fast), run listener and worker, stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog

from relay.listener import Listener
from relay.outbox import Outbox, connect, table_names
from relay.publisher import AmqpPublisher
from relay.queries import Queries
from relay.retry import RetryPolicy
from relay.settings import Settings, redact_url
from relay.worker import Worker, WorkerConfig

log = structlog.get_logger("relay.app")


def worker_config(settings: Settings) -> WorkerConfig:
    """The worker's knobs from the settings."""
    return WorkerConfig(
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        poll_interval_s=settings.poll_interval_s,
        mandatory=settings.mandatory,
        retry=RetryPolicy(settings.max_attempts, settings.retry_base_s, settings.retry_max_s),
        db_retry_max_s=settings.reconnect_max_s,
    )


async def run(settings: Settings) -> None:
    """Run the relay until SIGTERM/SIGINT; raises RelayError subclasses when start-up fails."""
    outbox = await Outbox.open(settings)
    publisher = AmqpPublisher(
        settings.amqp_url,
        publish_timeout_s=settings.publish_timeout_s,
        reconnect_max_s=settings.reconnect_max_s,
    )
    try:
        await publisher.connect()
    except BaseException:
        await outbox.close()
        raise
    worker = Worker(outbox, publisher, worker_config(settings))
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
    )
    worker_task = asyncio.ensure_future(worker.run())
    listener_task = asyncio.ensure_future(listener.run())
    stop_task = asyncio.ensure_future(stop_requested.wait())
    try:
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
        for task in (listener_task, stop_task, worker_task):
            task.cancel()
        await asyncio.gather(listener_task, stop_task, worker_task, return_exceptions=True)
        await listener.close()
        await publisher.close()
        await outbox.close()
        log.info("relay_stopped", published=worker.published_total)
