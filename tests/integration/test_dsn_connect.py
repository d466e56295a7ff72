"""The DSN parser against a real PostgreSQL: the relay's connection (asyncpg, arguments from
relay/dsn.py) and libpq's own (psycopg, the raw text) land in the same session.

The shared server trusts every local user, so a password is parsed but not checked here;
tests/unit/test_dsn.py compares the parsed password with libpq's reading of the same text.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote, urlsplit

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import dsn
from tests.helpers import pg_session
from tests.kit.ports import free_port

FACTS = ("SELECT current_user::text, current_database()::text, "
         "current_setting('application_name'), inet_server_port(), "
         "current_setting('search_path')")

app_names = st.text(st.sampled_from("abcXYZ019 #/?@:'\\=&%+,"), max_size=20)
search_paths = st.sampled_from(["public", "pg_catalog, public", '"my schema", public'])
passwords = st.text(st.sampled_from("pw#/?@:' \\=&%+,é"), min_size=1, max_size=16)


async def _asyncpg_facts(text: str) -> tuple[object, ...]:
    async with pg_session(**dsn.parse(text).asyncpg_args()) as conn:
        row = await conn.fetchrow(FACTS)
        assert row is not None
        return tuple(row)


def _libpq_facts(text: str) -> tuple[object, ...]:
    with psycopg.connect(text) as conn:
        row = conn.execute(FACTS).fetchone()
        assert row is not None
        return tuple(row)


def _server(pg_dsn: str) -> tuple[str, int, str, str]:
    parts = urlsplit(pg_dsn)
    return (parts.hostname or "127.0.0.1", parts.port or 5432, parts.username or "postgres",
            parts.path.lstrip("/"))


@given(app=app_names, path=search_paths, password=passwords, form=st.sampled_from(["kw", "url"]),
       dead_first=st.booleans())
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_parsed_dsn__connects_to_the_same_session_as_libpq(
    db: str, *, app: str, path: str, password: str, form: str, dead_first: bool
) -> None:
    host, port, user, dbname = _server(db)
    # A first host nobody listens on: both clients must go on to the next one.
    hosts = [("127.0.0.1", free_port())] if dead_first else []
    hosts.append((host, port))
    options = f"-c search_path={path.replace(' ', chr(92) + ' ')}"
    if form == "kw":
        text = " ".join([
            f"host={','.join(h for h, _ in hosts)}",
            f"port={','.join(str(p) for _, p in hosts)}",
            f"user={user}", f"dbname={dbname}", f"password={dsn.quote_value(password)}",
            f"application_name={dsn.quote_value(app)}", f"options={dsn.quote_value(options)}",
            "connect_timeout=5",
        ])
    else:
        netlocs = ",".join(f"{h}:{p}" for h, p in hosts)
        text = (f"postgresql://{user}:{quote(password, safe='')}@{netlocs}/{dbname}"
                f"?application_name={quote(app, safe='')}&options={quote(options, safe='')}"
                "&connect_timeout=5")
    ours = asyncio.run(_asyncpg_facts(text))
    theirs = _libpq_facts(text)
    assert ours == theirs
    assert ours[:4] == (user, dbname, app, port)
