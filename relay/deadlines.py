"""Every deadline of a batch, derived in one place from the settings.

A claim holds its rows locked in an open transaction while it publishes. The server frees those
locks once the session has been idle in transaction for `idle_in_transaction_s`: the batch's
whole publish (every pass, waiting out connection.blocked included) is bounded by
`publish_budget_s`, which is always shorter, so a relay never publishes rows the server already
handed to another relay. Each claim or settle statement is bounded by `statement_timeout_s` (on
the server and on the client); liveness calls the loop stalled only after a whole batch could
have taken its longest path (`stall_after_s`). Where the server has it (PostgreSQL 17+), the
whole claim's transaction is bounded too (`transaction_s`: its longest path plus the idle
margin), which also ends a backend that waits for a client in the middle of a statement, where
neither of the two timers runs.
"""

from __future__ import annotations

from dataclasses import dataclass

# Beyond the publish budget, the transaction also idles while the event loop runs other lanes'
# callbacks between the last confirm and the settle statement: a margin, never below this.
IDLE_MARGIN_MIN_S = 5.0
STALL_FLOOR_S = 120.0


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The bounds of one batch; see the module docstring."""

    publish_budget_s: float
    statement_timeout_s: float
    idle_in_transaction_s: float
    transaction_s: float
    stall_after_s: float

    @classmethod
    def derive(cls, *, publish_budget_s: float, statement_timeout_s: float,
               poll_interval_s: float) -> Deadlines:
        """Derive the bounds from the two settings they depend on."""
        idle_s = publish_budget_s + max(IDLE_MARGIN_MIN_S, publish_budget_s * 0.5)
        # claim + publish + settle (reschedule, dead-letter, delete) + commit, and the loop
        # wakes at least every poll interval when idle.
        batch_s = publish_budget_s + 4 * statement_timeout_s
        return cls(
            publish_budget_s=publish_budget_s,
            statement_timeout_s=statement_timeout_s,
            idle_in_transaction_s=idle_s,
            transaction_s=batch_s + (idle_s - publish_budget_s),
            stall_after_s=max(STALL_FLOOR_S, 3 * poll_interval_s + batch_s),
        )

    @property
    def idle_in_transaction_ms(self) -> int:
        """idle_in_transaction_session_timeout, as the server reads it."""
        return int(self.idle_in_transaction_s * 1000)

    @property
    def transaction_ms(self) -> int:
        """transaction_timeout (PostgreSQL 17+), as the server reads it."""
        return int(self.transaction_s * 1000)

    @property
    def statement_timeout_ms(self) -> int:
        """statement_timeout, as the server reads it."""
        return int(self.statement_timeout_s * 1000)
