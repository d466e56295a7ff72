"""structlog set-up: JSON lines when stdout is not a terminal, console output when it is."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog and the stdlib logging that libraries use."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    # Library loggers (aiormq, asyncpg) speak through stdlib logging; keep them quiet but visible.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    logging.getLogger("aio_pika").setLevel(logging.ERROR)
