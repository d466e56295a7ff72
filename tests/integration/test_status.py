"""`relay status --watch`: rates in and out, ETA and dead letters by reason; one JSON line per
tick off a terminal, redrawn in place on one."""

from __future__ import annotations

import json
import os
import pty
import subprocess

from tests.helpers import RELAY_BIN, Env, pg_session
from tests.kit.producer import add_dead_letters, insert_rows


async def _sql(dsn: str, sql: str) -> None:
    # Closing the session flushes its statistics, which the rates come from.
    async with pg_session(dsn) as conn:
        await conn.execute(sql)


async def test_status_watch__one_json_line_per_tick_with_rates_eta_and_dead_reasons(
    env: Env,
) -> None:
    await add_dead_letters(env.pg_dsn, 3, reason="exchange_not_found: x")
    await add_dead_letters(env.pg_dsn, 2, reason="unroutable: rk")
    proc = subprocess.Popen(  # noqa: ASYNC220 - read line by line while the test writes rows
        [RELAY_BIN, "status", "--watch", "--interval-s", "1", "--count", "3"],
        env=env.relay_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    await insert_rows(env.pg_dsn, "x", "rk", [{}] * 3000)
    await _sql(env.pg_dsn, "DELETE FROM queue_message WHERE seq IN "
               "(SELECT seq FROM queue_message ORDER BY seq LIMIT 1000)")
    rest = [json.loads(line) for line in proc.stdout]
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    ticks = [first, *rest]
    assert len(ticks) == 3
    assert first["in_per_s"] is None  # one sample has no rate yet
    assert first["dead_by_reason"] == {"exchange_not_found": 3, "unroutable": 2}
    moving = [t for t in ticks[1:] if t["in_per_s"]]
    assert moving, ticks
    assert moving[0]["in_per_s"] > 0
    assert moving[0]["out_per_s"] > 0
    assert ticks[-1]["due"] == 2000
    for key in ("oldest_due_age_s", "eta_s", "relays", "notify_mode", "dead"):
        assert key in ticks[-1]


def test_status_watch__redraws_in_place_on_a_terminal(env: Env) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [RELAY_BIN, "status", "--watch", "--interval-s", "0.2", "--count", "3"],
        env=env.relay_env(), stdout=follower, stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    screen = b"".join(chunks).decode()
    assert screen.count("rate in / out") == 3
    assert screen.count("\x1b[J") == 2  # cursor back up and clear, before each redraw
    assert not screen.lstrip().startswith("{")


async def test_status__oldest_due_age_by_class_of_transaction(env: Env) -> None:
    """A bulk transaction's rows (1,000 or more) and a one-row transaction's: `relay status`
    shows each class's oldest due row on its own, so a live-lag alert ignores a backfill."""
    # Hand-written: rows created in the past (created_at is the subject).
    await _sql(env.pg_dsn, "INSERT INTO queue_message (exchange, routing_key, content, "
               "created_at) SELECT 'x', 'rk', '{}', now() - interval '1 hour' "
               "FROM generate_series(1, 1500)")
    await _sql(env.pg_dsn, "INSERT INTO queue_message (exchange, routing_key, content, "
               "created_at) VALUES ('x', 'rk', '{}', now() - interval '30 seconds')")
    out = subprocess.run([RELAY_BIN, "status", "--json"], env=env.relay_env(),  # noqa: ASYNC221 - one short command, nothing else runs meanwhile
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["due"] == 1501
    assert 3500 < doc["oldest_bulk_due_age_s"] < 3700
    assert 25 < doc["oldest_live_due_age_s"] < 100
    assert doc["oldest_due_age_s"] == doc["oldest_bulk_due_age_s"]
