"""Property: the table's CHECK on `repeat` (sql/migrations/0015_recurring.sql) reads a cron
expression as the relay's parser does (cronsim, relay/schedule.py). Whatever a producer writes,
built from the grammar's own pieces (numbers in and out of range, names, *, -, /, ',', L, W, #,
any number of fields and blanks) or any printable text: the table accepts it exactly when
cronsim can read it. So a row the table takes can always be scheduled (or, when no time comes in
cronsim's 50 years, parked with that reason), and no expression the relay could run is refused.
Intervals: the table accepts plain ISO 8601 intervals of at least one second.

Real PostgreSQL, the test's own migrated database; the cases found stay as examples."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime

import asyncpg
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relay.pg.queries import TableNames

PROBLEM_FN = TableNames(None, "queue_message", "queue_message_notify").placeholders()[
    "repeat_problem_fn"]

_atom = st.one_of(
    st.integers(0, 70).map(str),
    st.sampled_from(["*", "L", "LW", "W", "?", "", "00", "007", "99999999999",
                     "JAN", "dec", "Feb", "SUN", "mon", "sat", "XYZ", "5L", "L5", "1#2", "MON#5",
                     "7#1", "1#6", "#", "0L"]),
)
_term = st.one_of(
    _atom,
    st.tuples(_atom, _atom).map("-".join),
    st.tuples(_atom, st.integers(0, 70)).map(lambda t: f"{t[0]}/{t[1]}"),
    st.tuples(_atom, _atom, st.integers(0, 70)).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
)
_field = st.lists(_term, min_size=1, max_size=3).map(",".join)
_cron = st.tuples(st.lists(_field, min_size=4, max_size=7),
                  st.sampled_from([" ", "  ", "\t", " \t "])).map(lambda t: t[1].join(t[0]))
_printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


def _cronsim_reads(expr: str) -> bool:
    try:
        CronSim(expr, datetime(2026, 1, 1))
    except (CronSimError, ValueError, IndexError):
        return False
    return True


async def _problems(dsn: str, exprs: list[str]) -> list[str | None]:
    conn = await asyncpg.connect(dsn)
    try:
        return [await conn.fetchval(f"SELECT {PROBLEM_FN}($1)", e) for e in exprs]
    finally:
        await conn.close()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(exprs=st.lists(st.one_of(_cron, _printable), min_size=1, max_size=20))
@example(exprs=["* * */20 * 1L", "0 0 31 2 *", "0 0 30 2 MON", "0-59/99999999999999 * * * *",
                "* * L/2 * *", "* * * * 7-0", "* * * * MON#6", "* * * jan-DEC *", "1, * * * *",
                "*/0 * * * *", "5/5 * * * *", "-5 * * * *", "* * * * 5L/2", "* * * * MON#2/3"])
def test_repeat__the_table_accepts_a_cron_expression_exactly_when_cronsim_reads_it(
    db: str, exprs: list[str]
) -> None:
    problems = asyncio.run(_problems(db, exprs))
    for expr, problem in zip(exprs, problems, strict=True):
        if expr.strip(" \t").upper().startswith("P"):
            continue  # an interval: the next test's
        assert (problem is None) == _cronsim_reads(expr), (expr, problem)


_intervals = st.one_of(
    st.sampled_from(["PT1S", "PT0.5S", "PT0S", "P1D", "P1W", "PT1H30M", "P1Y2M3DT4H5M6.5S",
                     "P", "PT", "P1DT", "PT-1S", "P-1D", "PT1.5S", "pt30s", "P0D", "PT1M0S"]),
    st.tuples(st.integers(0, 100), st.sampled_from(["S", "M", "H", "D", "W"])).map(
        lambda t: f"P{'T' if t[1] in 'SMH' else ''}{t[0]}{t[1]}"),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.lists(_intervals, min_size=1, max_size=10))
@example(values=["pt30s", " PT1S\t"])  # lower case and blanks: the table took them, a bare
# ::interval did not (the settle failed and the batch rolled back, again and again)
def test_repeat__an_interval_is_accepted_when_it_is_iso_8601_and_at_least_a_second(
    db: str, values: list[str]
) -> None:
    async def run() -> list[tuple[str | None, float | None]]:
        conn = await asyncpg.connect(db)
        try:
            out = []
            for v in values:
                problem = await conn.fetchval(f"SELECT {PROBLEM_FN}($1)", v)
                # As the settle reads it (sql/queries.sql reschedule_repeating).
                secs = None if problem else await conn.fetchval(
                    "SELECT EXTRACT(EPOCH FROM upper(btrim($1::text, E' \\t'))::interval)"
                    "::float8", v)
                out.append((problem, secs))
            return out
        finally:
            await conn.close()

    for value, (problem, secs) in zip(values, asyncio.run(run()), strict=True):
        assert (problem is None) == _at_least_a_second(value), (value, problem)
        if problem is None:
            assert secs is not None
            assert secs >= 1, value


_ISO = re.compile(r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?"
                  r"(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def _at_least_a_second(value: str) -> bool:
    """ISO 8601 with designators, no signs, something after P (and after T), >= 1 s."""
    v = value.strip().upper()
    m = _ISO.match(v)
    if m is None or v in ("P", "PT") or v.endswith("T"):
        return False
    *whole, seconds = m.groups()
    return any(int(g) > 0 for g in whole if g) or float(seconds or 0) >= 1
