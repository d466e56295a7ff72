"""libpq DSN or URL -> JDBC URL and connection properties (pure; no Spark, no driver).

The relay and its jobs share one setting (RELAY_PG_DSN, else the libpq variables), but the JDBC
driver speaks neither libpq syntax nor unix sockets. The password goes into the connection
properties, never into the URL, so no URL that Spark logs or puts in an error carries it.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

from relay.dsn import parse as parse_dsn

# libpq environment variables that fill keywords the DSN leaves out, as libpq itself does.
_ENV = {
    "host": "PGHOST",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "sslmode": "PGSSLMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "connect_timeout": "PGCONNECT_TIMEOUT",
    "options": "PGOPTIONS",
}

# libpq keyword -> pgjdbc URL parameter, for the ones with a JDBC equivalent.
_JDBC_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "connect_timeout": "connectTimeout",
    "options": "options",
    "application_name": "ApplicationName",
}

# What every outbox write needs from the driver: text parameters typed by the server (so a
# Spark string goes into jsonb and uuid columns) and multi-row INSERTs instead of one per row.
_FIXED_PARAMS = {"stringtype": "unspecified", "reWriteBatchedInserts": "true"}

JDBC_DRIVER_CLASS = "org.postgresql.Driver"
LOOPBACK = "127.0.0.1"

def libpq_params(dsn: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The libpq keywords a DSN means, with PG* environment variables and defaults filled in."""
    env = os.environ if environ is None else environ
    # The relay's own parser (relay/dsn.py): libpq's rules, a DsnError naming any problem.
    params: dict[str, str] = dict(parse_dsn(dsn).params) if dsn else {}
    for key, var in _ENV.items():
        if not params.get(key) and env.get(var):
            params[key] = env[var]
    params.setdefault("user", env.get("PGUSER") or getpass.getuser())
    params.setdefault("dbname", params["user"])
    return params


def _tcp_host(host: str) -> str:
    """JDBC has no unix sockets: a socket directory (or no host) becomes the loopback."""
    if not host or host.startswith(("/", "@")):
        return LOOPBACK
    if host == "localhost":
        # "localhost" may resolve to ::1 first while the server listens on 127.0.0.1 only.
        return LOOPBACK
    return host


@dataclass(frozen=True)
class JdbcTarget:
    """A JDBC URL (without the password) and the connection properties Spark passes along."""

    url: str
    user: str
    password: str | None = field(default=None, repr=False)

    def properties(self) -> dict[str, str]:
        """Properties for DataFrameWriter.jdbc: driver class, user and (if any) password."""
        props = {"driver": JDBC_DRIVER_CLASS, "user": self.user}
        if self.password is not None:
            props["password"] = self.password
        return props

    def __str__(self) -> str:
        return f"{self.url} (user {self.user})"


def jdbc_target(
    dsn: str | None,
    environ: Mapping[str, str] | None = None,
    application_name: str = "outbox-relay-spark",
) -> JdbcTarget:
    """Turn a libpq DSN or URL (or None: the PG* variables) into a JDBC target."""
    return jdbc_target_of(libpq_params(dsn, environ), application_name)


def jdbc_target_of(
    params: Mapping[str, str], application_name: str = "outbox-relay-spark"
) -> JdbcTarget:
    """The JDBC target of libpq keywords already resolved (see `libpq_params`)."""
    hosts = (params.get("host") or "").split(",")
    ports = (params.get("port") or "").split(",")
    specs = []
    for i, host in enumerate(hosts):
        port = ports[i] if i < len(ports) else ports[-1]
        tcp = _tcp_host(host)
        if ":" in tcp and not tcp.startswith("["):
            tcp = f"[{tcp}]"  # a bare IPv6 address from a key=value DSN
        specs.append(f"{tcp}:{port or '5432'}")
    query = dict(_FIXED_PARAMS)
    query["ApplicationName"] = application_name
    for key, jdbc_key in _JDBC_PARAMS.items():
        if params.get(key):
            query[jdbc_key] = params[key]
    url = (
        f"jdbc:postgresql://{','.join(specs)}/{quote(params['dbname'], safe='')}"
        f"?{urlencode(query)}"
    )
    return JdbcTarget(url=url, user=params["user"], password=params.get("password"))


def is_loopback(host: str) -> bool:
    """True for a host that names the machine it is read on: none, a unix socket directory,
    localhost or a loopback address. On an executor that is the executor itself."""
    name = host.strip().strip("[]").lower()
    return (
        not name
        or name.startswith(("/", "@"))
        or name == "localhost"
        or name.startswith("127.")
        or name == "::1"
    )


def loopback_hosts(params: Mapping[str, str]) -> list[str]:
    """The hosts of resolved libpq keywords that are loopback (see `is_loopback`)."""
    return [h or "(none)" for h in (params.get("host") or "").split(",") if is_loopback(h)]


def conninfo(params: Mapping[str, str]) -> str:
    """A libpq `key='value'` string spelling out every resolved keyword, so a process that
    reads it (an executor) needs no PG* variables of its own."""

    def quoted(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{key}={quoted(value)}" for key, value in params.items())
