"""A small read-only status page on the HTTP port (GET / or /status), rendered by the relay.

Plain HTML with inline CSS, no script, no external resource: it works behind any proxy and
in a locked-down browser, and it refreshes itself every few seconds. Every value is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from typing import Any

from relay.errors import DatabaseUnavailable, RelayError

REFRESH_S = 5

_CSS = """
body { font: 15px/1.4 "DejaVu Sans", system-ui, sans-serif; margin: 2rem; color: #1d2330;
       background: #f5f6f8; }
h1 { font-size: 1.4rem; margin: 0 0 .2rem; }
.sub { color: #5b6475; margin-bottom: 1.4rem; }
.cards { display: grid; grid-template-columns: repeat(3, minmax(12rem, 1fr)); gap: .8rem;
         max-width: 52rem; }
.card { background: #fff; border-radius: 8px; padding: .8rem 1rem;
        box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.card .label { color: #5b6475; font-size: .8rem; text-transform: uppercase;
               letter-spacing: .04em; }
.card .value { font-size: 1.6rem; font-weight: 600; margin-top: .2rem; }
.warn .value { color: #b42318; }
table { border-collapse: collapse; margin-top: 1.4rem; min-width: 24rem; background: #fff;
        box-shadow: 0 1px 2px rgba(0,0,0,.08); border-radius: 8px; overflow: hidden; }
th, td { text-align: left; padding: .45rem 1rem; border-bottom: 1px solid #e6e8ec; }
th { background: #eef0f3; font-size: .8rem; text-transform: uppercase; color: #5b6475; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.error { background: #fdecea; color: #b42318; padding: .8rem 1rem; border-radius: 8px;
         max-width: 50rem; }
"""


def _age(seconds: Any) -> str:
    if seconds is None:
        return "–"
    s = float(seconds)
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _rate(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.0f}/s"


def _eta(doc: dict[str, Any]) -> str:
    if not doc.get("due"):
        return "empty"
    if doc.get("in_per_s") is None:
        return "measuring…"
    return "not draining" if doc.get("eta_s") is None else _age(doc["eta_s"])


def _card(label: str, value: str, warn: bool = False) -> str:
    cls = "card warn" if warn else "card"
    return (f'<div class="{cls}"><div class="label">{html.escape(label)}</div>'
            f'<div class="value">{html.escape(value)}</div></div>')


def render(doc: dict[str, Any], broker_node: tuple[str | None, int] | None = None) -> str:
    """The page for one status document (relay/pg/status.py document()); `broker_node`: the
    node this relay's broker connection is on, and its failovers so far."""
    cards = [
        _card("Due rows", f"{doc['due']:,}"),
        _card("Oldest due row", _age(doc.get("oldest_due_age_s")),
              warn=float(doc.get("oldest_due_age_s") or 0) > 300),
        _card("Oldest due row, live transactions", _age(doc.get("oldest_live_due_age_s")),
              warn=float(doc.get("oldest_live_due_age_s") or 0) > 60),
        _card("Oldest due row, bulk transactions", _age(doc.get("oldest_bulk_due_age_s"))),
        _card("Rate in / out", f"{_rate(doc.get('in_per_s'))} / {_rate(doc.get('out_per_s'))}"),
        _card("Empty in", _eta(doc)),
        _card("Dead letters", f"{doc['dead']:,}", warn=bool(doc["dead"])),
        _card("Relays connected", str(doc["relays"]), warn=not doc["relays"]),
        _card("Notify mode", str(doc["notify_mode"])),
        _card("Delayed rows", f"{doc['delayed']:,}"),
        _card("Rows retrying", f"{doc['retrying']:,}"),
    ]
    if broker_node is not None:
        node, failovers = broker_node
        cards.append(_card("This relay's broker node",
                           f"{node or 'none yet'} · {failovers} failover"
                           + ("" if failovers == 1 else "s")))
    reasons = doc.get("dead_by_reason") or {}
    rows = "".join(f'<tr><td>{html.escape(str(r))}</td><td class="n">{n:,}</td></tr>'
                   for r, n in reasons.items()) or '<tr><td colspan="2">none</td></tr>'
    table = ("<table><thead><tr><th>Dead letters by reason</th><th>Rows</th></tr></thead>"
             f"<tbody>{rows}</tbody></table>")
    return _page(doc["table"], '<div class="cards">' + "".join(cards) + "</div>" + table)


def render_error(table: str, message: str) -> str:
    """The page while the database cannot be read."""
    return _page(table, f'<div class="error">{html.escape(message)}</div>')


def _page(table: str, body: str) -> str:
    title = f"outbox-relay · {table}"
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>outbox-relay</h1><div class=\"sub\">table <b>{html.escape(table)}</b> · "
        f"refreshes every {REFRESH_S} s · read-only</div>{body}</body></html>"
    )


class StatusPage:
    """Renders the page from a source of status documents."""

    def __init__(self, source: Callable[[], Awaitable[dict[str, Any]]], table: str,
                 close: Callable[[], Awaitable[None]] | None = None, *,
                 broker_node: Callable[[], tuple[str | None, int]] | None = None) -> None:
        self._source = source
        self._table = table
        self._close = close
        self._broker_node = broker_node

    async def html(self) -> tuple[int, bytes]:
        """HTTP status and page; 503 with the reason while the database cannot be read."""
        try:
            doc = await self._source()
        except RelayError as exc:
            # The error's text names the server (host, user, database): it goes to the log
            # (relay/pg/status.py), and the page, which anyone who reaches the port can read,
            # says only what kind of failure it is.
            what = ("the database cannot be reached" if isinstance(exc, DatabaseUnavailable)
                    else "the database did not answer the status queries")
            return 503, render_error(
                self._table, f"cannot read the status: {what} (the relay's log has the "
                "details)").encode()
        node = None if self._broker_node is None else self._broker_node()
        return 200, render(doc, node).encode()

    async def close(self) -> None:
        """Release what the source holds."""
        if self._close is not None:
            await self._close()
