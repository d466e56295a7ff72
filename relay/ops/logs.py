"""Logging: every line on stderr is one structlog event, the relay's and the libraries' alike.

The relay logs through structlog; aiormq, aio-pika, asyncpg and asyncio log through the
standard library. Both go through one stdlib handler whose ProcessorFormatter renders JSON
(or console output on a terminal), so nothing reaches stderr as plain text. Logs go to stderr,
command output (`relay status --json`, ...) to stdout: a script reads one without the other.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

# Libraries that are chatty at INFO; their warnings and errors still come through.
QUIET_LIBRARIES = ("aiormq", "aio_pika", "asyncpg", "asyncio")
_state = {"format": "auto"}  # the configured format, for fatal()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time of the write (tests swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current sys.stderr."""


def wants_console(fmt: str) -> bool:
    """Console output for `console`, or for `auto` on a terminal; JSON otherwise."""
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Route structlog and stdlib logging to one stderr handler with one renderer."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    _state["format"] = fmt
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if wants_console(fmt)
        else structlog.processors.JSONRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = _StderrHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(numeric, logging.WARNING))
    logging.getLogger("relay").setLevel(numeric)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    # aio-pika logs every reconnect attempt with a traceback; the relay logs outages itself.
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    logging.getLogger("aio_pika").setLevel(logging.ERROR)
    # Re-hook: captureWarnings(True) is a no-op once on, even if something (a test runner)
    # replaced warnings.showwarning since.
    logging.captureWarnings(False)
    logging.captureWarnings(True)


def fatal(message: str, exit_code: int) -> None:
    """The last word of a failing command: one event (JSON) or `relay: message` (terminal)."""
    if wants_console(_state["format"]):
        print(f"relay: {message}", file=sys.stderr)
    else:
        structlog.get_logger("relay.cli").error("relay_failed", error=message,
                                                exit_code=exit_code)


def configure_early(fmt: str | None) -> None:
    """Logging before settings are read: their errors must come out as events too."""
    known = fmt.lower() if fmt and fmt.lower() in {"json", "console"} else "auto"
    configure("info", known)
