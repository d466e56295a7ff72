"""A small status page on the HTTP port (GET / or /status), rendered by the relay.

Plain HTML with inline CSS, no external resource: it works behind any proxy and in a
locked-down browser, and it refreshes itself every few seconds. Every value is escaped.
Read-only and without script unless the admin API is on (RELAY_ADMIN_TOKEN): then each dead
letter reason gets Replay and Purge buttons, and a few lines of inline script send them to the
admin API (relay/ops/admin.py) with the token the operator types in (kept for the browser tab
only, in sessionStorage; the page itself never holds it).
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
.admin { margin-top: 1rem; }
#admin-result { margin-left: 1rem; color: #1f6f43; }
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


_ADMIN_SCRIPT = """
const token = document.getElementById('token');
const out = document.getElementById('admin-result');
token.value = sessionStorage.getItem('relay-admin-token') || '';
out.textContent = sessionStorage.getItem('relay-admin-result') || '';
token.addEventListener('input', () => sessionStorage.setItem('relay-admin-token', token.value));
async function call(act, body) {
  const r = await fetch('/admin/dead/' + act, {method: 'POST', headers: {
    'Authorization': 'Bearer ' + token.value, 'Content-Type': 'application/json'},
    body: JSON.stringify(body)});
  const j = await r.json();
  if (!r.ok) throw new Error(j.error || r.status);
  return j;
}
for (const b of document.querySelectorAll('button[data-act]')) {
  b.addEventListener('click', async () => {
    const act = b.dataset.act, reason = b.dataset.reason;
    let msg;
    try {
      // How many letters of exactly this reason code the action touches, asked at the click.
      const n = (await call(act, {reason: reason, dry_run: true})).would;
      const verb = act === 'purge' ? 'Delete' : 'Replay';
      if (!confirm(verb + ' ' + n + ' dead letter(s) of reason "' + reason + '"?')) return;
      const j = await call(act, {reason: reason});
      msg = act + ' ' + reason + ': ' + (act === 'replay'
            ? 'replayed ' + j.replayed.length + ', left ' + j.left.length
            : 'purged ' + j.purged);
    } catch (e) { msg = act + ' ' + reason + ': ' + e.message; }
    sessionStorage.setItem('relay-admin-result', msg);
    out.textContent = msg;
  });
}
"""


def _reason_rows(reasons: dict[str, int], admin: bool) -> str:
    if not reasons:
        return f'<tr><td colspan="{3 if admin else 2}">none</td></tr>'
    out = []
    for r, n in reasons.items():
        text = html.escape(str(r))
        buttons = (f'<td><button data-act="replay" data-reason="{text}">Replay</button> '
                   f'<button data-act="purge" data-reason="{text}">Purge</button></td>'
                   if admin else "")
        out.append(f'<tr><td>{text}</td><td class="n">{n:,}</td>{buttons}</tr>')
    return "".join(out)


def render(doc: dict[str, Any], broker_node: tuple[str | None, int] | None = None, *,
           admin: bool = False) -> str:
    """The page for one status document (relay/pg/status.py document()); `broker_node`: the
    node this relay's broker connection is on, and its failovers so far; `admin`: the admin
    API is on (buttons and the token field)."""
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
        _card("Recurring rows", f"{doc.get('recurring', 0):,}"),
        _card("Rows for streams", f"{doc.get('stream_rows', 0):,}"),
        _card("Stream rows parked", f"{doc.get('stream_dead_rows', 0):,}",
              warn=bool(doc.get("stream_dead_rows"))),
    ]
    if broker_node is not None:
        node, failovers = broker_node
        cards.append(_card("This relay's broker node",
                           f"{node or 'none yet'} · {failovers} failover"
                           + ("" if failovers == 1 else "s")))
    reasons = doc.get("dead_by_reason") or {}
    actions = "<th>Admin</th>" if admin else ""
    table = ("<table><thead><tr><th>Dead letters by reason</th><th>Rows</th>"
             f"{actions}</tr></thead><tbody>{_reason_rows(reasons, admin)}</tbody></table>")
    if admin:
        table += ('<div class="admin"><label>Admin token <input id="token" type="password" '
                  'autocomplete="off" size="40"></label> <span id="admin-result"></span></div>'
                  f"<script>{_ADMIN_SCRIPT}</script>")
    return _page(doc["table"], '<div class="cards">' + "".join(cards) + "</div>" + table,
                 admin=admin)


def render_error(table: str, message: str) -> str:
    """The page while the database cannot be read."""
    return _page(table, f'<div class="error">{html.escape(message)}</div>')


def _page(table: str, body: str, *, admin: bool = False) -> str:
    title = f"outbox-relay · {table}"
    mode = "admin API on" if admin else "read-only"
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>outbox-relay</h1><div class=\"sub\">table <b>{html.escape(table)}</b> · "
        f"refreshes every {REFRESH_S} s · {mode}</div>{body}</body></html>"
    )


class StatusPage:
    """Renders the page from a source of status documents."""

    def __init__(self, source: Callable[[], Awaitable[dict[str, Any]]], table: str,
                 close: Callable[[], Awaitable[None]] | None = None, *,
                 broker_node: Callable[[], tuple[str | None, int]] | None = None,
                 admin: bool = False) -> None:
        self._source = source
        self._table = table
        self._close = close
        self._broker_node = broker_node
        self._admin = admin

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
        return 200, render(doc, node, admin=self._admin).encode()

    async def close(self) -> None:
        """Release what the source holds."""
        if self._close is not None:
            await self._close()
