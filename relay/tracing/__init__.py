"""Tracing: OpenTelemetry spans for the relay's batches and wake-ups, off unless asked for.

The standard OTEL_* variables turn it on and configure it (docs/tracing.md): it is on when
OTEL_TRACES_EXPORTER names an exporter other than `none`, or an OTLP endpoint is set
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless OTEL_SDK_DISABLED is
true. Off, the relay imports nothing of OpenTelemetry and the loop's calls below do nothing.

The loop sees three small objects: a `Tracing` for the process, a `SweepTrace` per wake-up (its
span exists only once a batch finds rows), and a `BatchTrace` per batch that found rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from relay.interfaces import Message, OutboxRow, Verdict

# The W3C Trace Context headers a producer puts in the row's options.headers.
TRACE_HEADERS = ("traceparent", "tracestate")


class BatchTrace(Protocol):
    """The span of one batch that found rows, from its claim to its commit."""

    def event(self, name: str) -> None:
        """A step of the batch reached now (publish, confirmed, settled)."""

    def finish(self, verdicts: Sequence[Verdict], held: int) -> None:
        """The batch committed: record its verdicts and end the span."""

    def fail(self, error: BaseException) -> None:
        """The batch rolled back: record the error and end the span."""


class SweepTrace(Protocol):
    """One wake-up: the parent of the batches it runs."""

    def batch(self, started_ns: int, claimed_ns: int, rows: Sequence[OutboxRow],
              messages: Sequence[Message]) -> BatchTrace:
        """A batch that claimed `rows` (started at `started_ns`, its claim back at
        `claimed_ns`, both epoch nanoseconds); its span is current until finish or fail."""

    def end(self) -> None:
        """The wake-up's drain ended."""


class Tracing(Protocol):
    """Where the loop's spans go."""

    enabled: bool

    def sweep(self) -> SweepTrace:
        """A wake-up begins."""

    async def close(self) -> None:
        """Export what is pending (bounded in time) and stop."""


class _NoBatch:
    def event(self, name: str) -> None:
        pass

    def finish(self, verdicts: Sequence[Verdict], held: int) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass


class _NoSweep:
    def batch(self, started_ns: int, claimed_ns: int, rows: Sequence[OutboxRow],
              messages: Sequence[Message]) -> BatchTrace:
        return NO_BATCH

    def end(self) -> None:
        pass


class NoTracing:
    """Tracing off: every call is a no-op."""

    enabled = False

    def sweep(self) -> SweepTrace:
        return NO_SWEEP

    async def close(self) -> None:
        pass


NO_BATCH: BatchTrace = _NoBatch()
NO_SWEEP: SweepTrace = _NoSweep()


def wanted(environ: Mapping[str, str]) -> bool:
    """The OTEL_* variables ask for traces (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(environ.get(name, "").strip() for name in
               ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def from_environment(environ: Mapping[str, str], *, table: str) -> Tracing:
    """The process's tracing: NoTracing unless the OTEL_* variables ask for traces; then the
    SDK (imported only here), or ConfigError naming the variable that cannot be served."""
    if not wanted(environ):
        return NoTracing()
    from relay.tracing.otel import OtelTracing  # the SDK: only when tracing is on

    return OtelTracing.from_environment(environ, table=table)
