"""The one libpq connection-string parser of the project (the relay and relay.spark use it).

Both forms libpq reads, with its rules: `key=value key='quoted \\' value'` (backslash escapes,
whitespace around `=`) and `postgresql://user:password@h1:5432,h2:5433/db?key=value`
(percent-decoding, IPv6 in brackets, several hosts). The result maps libpq keywords to values,
exactly what libpq's own PQconninfoParse returns for the same text.

No error message repeats any part of the text: a misparse can put a password anywhere.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from relay.errors import ConfigError

# Every keyword libpq 18 knows (PQconndefaults).
LIBPQ_KEYWORDS = (
    "service", "user", "password", "passfile", "channel_binding", "connect_timeout", "dbname",
    "host", "hostaddr", "port", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "sslmode", "sslnegotiation", "sslcompression",
    "sslcert", "sslkey", "sslcertmode", "sslpassword", "sslrootcert", "sslcrl", "sslcrldir",
    "sslsni", "requirepeer", "require_auth", "min_protocol_version", "max_protocol_version",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode", "krbsrvname", "gsslib",
    "gssdelegation", "replication", "target_session_attrs", "load_balance_hosts",
    "scram_client_key", "scram_server_key", "oauth_issuer", "oauth_client_id",
    "oauth_client_secret", "oauth_scope", "sslkeylogfile",
)

# Keywords the relay's driver (asyncpg) honours; the others are refused by name rather than
# silently dropped. fallback_application_name is accepted: the relay always names its sessions,
# so a fallback never applies.
SUPPORTED = frozenset({
    "host", "port", "dbname", "user", "password", "passfile", "service", "connect_timeout",
    "options", "application_name", "fallback_application_name", "client_encoding",
    "sslmode", "sslnegotiation", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs",
    "krbsrvname", "gsslib",
})

SECRET_KEYWORDS = frozenset({"password", "sslpassword", "oauth_client_secret",
                             "scram_client_key", "scram_server_key"})
# Passed to asyncpg through a query-only DSN: it reads these from a DSN (or PG* variables) only.
_SSL_FILE_KEYS = ("sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
                  "ssl_min_protocol_version", "ssl_max_protocol_version", "sslnegotiation")
_SSLMODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}
_TARGETS = {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}
_URI_PREFIXES = ("postgresql://", "postgres://")
DEFAULT_PORT = 5432


class DsnError(ConfigError):
    """A PostgreSQL connection string is invalid."""


def _fail(setting: str, problem: str) -> DsnError:
    return DsnError(f"{setting}: {problem}")


def _unknown(setting: str, key: str, where: str) -> DsnError:
    close = difflib.get_close_matches(key, LIBPQ_KEYWORDS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return _fail(setting, f"unknown {where} {key!r}{hint}")


# ---------------------------------------------------------------------- keyword form


def _parse_keywords(text: str, setting: str) -> dict[str, str]:
    """libpq's conninfo_parse, step by step (fe-connect.c)."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        start = i
        while i < n and text[i] != "=" and not text[i].isspace():
            i += 1
        key = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        if i >= n or text[i] != "=":
            raise _bad_key(setting, key, out, "expected key=value: missing '='")
        i += 1
        while i < n and text[i].isspace():
            i += 1
        value, i = _read_value(text, i)
        if value is None:
            raise _bad_key(setting, key, out, "unterminated quoted value")
        if key not in LIBPQ_KEYWORDS:
            raise _bad_key(setting, key, out, "unknown parameter")
        out[key] = value
    return out


def _read_value(text: str, i: int) -> tuple[str | None, int]:
    """One value from position i: 'quoted' or bare, backslash escapes the next character.

    Returns (None, i) for an unterminated quote.
    """
    n = len(text)
    quoted = i < n and text[i] == "'"
    i += quoted
    value: list[str] = []
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 < n:
                value.append(text[i + 1])
            i += 2
        elif (ch == "'") if quoted else ch.isspace():
            return "".join(value), i + 1
        else:
            value.append(ch)
            i += 1
    return (None if quoted else "".join(value)), i


def _bad_key(setting: str, key: str, seen: Mapping[str, str], problem: str) -> DsnError:
    """An unknown or incomplete key, named only when it is (close to) a real keyword.

    Anything else may be a password's tail (an unquoted space in it): never repeat it.
    """
    last = list(seen)[-1] if seen else None
    if key in LIBPQ_KEYWORDS:
        return _fail(setting, f"{problem} of {key!r}")
    close = difflib.get_close_matches(key, LIBPQ_KEYWORDS, n=1)
    if close:
        return _fail(setting, f"{problem} {key!r} (did you mean {close[0]}?)")
    if last in SECRET_KEYWORDS:
        return _fail(setting, f"{problem} after {last} (a value with spaces or quotes must be "
                     f"quoted: {last}='...', with \\ before ' and \\)")
    where = f" after {last!r}" if last else ""
    return _fail(setting, f"{problem}{where}")


# ---------------------------------------------------------------------- URL form


def _decode(text: str, setting: str, what: str) -> str:
    """libpq's conninfo_uri_decode: %XX only ('+' stays), %00 refused."""
    out = bytearray()
    i, raw = 0, text.encode()
    while i < len(raw):
        if raw[i] == ord("%"):
            hexpart = raw[i + 1 : i + 3]
            try:
                if len(hexpart) != 2:
                    raise ValueError
                byte = int(hexpart, 16)
            except ValueError:
                raise _fail(setting, f"invalid percent-encoding in the {what}") from None
            if byte == 0:
                raise _fail(setting, f"forbidden %00 in the {what}")
            out.append(byte)
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise _fail(setting, f"percent-encoding in the {what} is not UTF-8") from None


def _parse_netlocs(rest: str, setting: str) -> tuple[str, str, str]:
    """Hosts and ports of a URL (h1:p1,[v6]:p2,...); returns host list, port list, the rest."""
    hosts: list[str] = []
    ports: list[str] = []
    i, n = 0, len(rest)
    while True:
        if i < n and rest[i] == "[":
            end = rest.find("]", i)
            if end < 0:
                raise _fail(setting, "unterminated [ in the host of the URL")
            if end == i + 1:
                raise _fail(setting, "empty [] host in the URL")
            host = rest[i + 1 : end]
            i = end + 1
            if i < n and rest[i] not in ":/?,":
                raise _fail(setting, "unexpected character after ] in the URL")
        else:
            start = i
            while i < n and rest[i] not in ":/?,":
                i += 1
            host = rest[start:i]
        hosts.append(host)
        port = ""
        if i < n and rest[i] == ":":
            start = i + 1
            i = start
            while i < n and rest[i] not in "/?,":
                i += 1
            port = rest[start:i]
        ports.append(port)
        if i < n and rest[i] == ",":
            i += 1
            continue
        return ",".join(hosts), ",".join(ports), rest[i:]


def _parse_url(text: str, setting: str) -> dict[str, str]:
    """libpq's conninfo_uri_parse_options: credentials, hosts, database, query."""
    prefix = next(p for p in _URI_PREFIXES if text.startswith(p))
    rest = text[len(prefix):]
    out: dict[str, str] = {}
    stop = min((rest.find(c) for c in "@/" if c in rest), default=-1)
    if stop >= 0 and rest[stop] == "@":
        userinfo, rest = rest[:stop], rest[stop + 1 :]
        user, colon, _ = userinfo.partition(":")
        # The password runs to the first '@' after the user: a raw ':' belongs to it.
        if user:
            out["user"] = _decode(user, setting, "user")
        if colon:
            password = userinfo[len(user) + 1 :]
            if password:
                out["password"] = _decode(password, setting, "password")
    hosts, ports, rest = _parse_netlocs(rest, setting)
    if hosts:
        out["host"] = _decode(hosts, setting, "host")
    if ports:
        out["port"] = _decode(ports, setting, "port")
    if rest.startswith("/"):
        dbname, _, query = rest[1:].partition("?")
        if dbname:
            out["dbname"] = _decode(dbname, setting, "database name")
        has_query = "?" in rest
    else:
        query, has_query = rest[1:], rest.startswith("?")
    if has_query:
        out.update(_parse_query(query, setting))
    return out


def _parse_query(query: str, setting: str) -> dict[str, str]:
    out: dict[str, str] = {}
    items = query.split("&")
    if items[-1] == "":
        items.pop()  # libpq stops at a trailing '&'
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise _fail(setting, "URL query parameter without '='")
        if "=" in value:
            raise _fail(setting, f"extra '=' in the URL query parameter {key!r}"
                        if key in LIBPQ_KEYWORDS else "extra '=' in a URL query parameter")
        key = _decode(key, setting, "query")
        value = _decode(value, setting, "query")
        if key == "ssl" and value == "true":
            key, value = "sslmode", "require"
        if key not in LIBPQ_KEYWORDS:
            raise _unknown(setting, key, "URL query parameter")
        out[key] = value
    return out


# ---------------------------------------------------------------------- the result


@dataclass(frozen=True)
class ConnInfo:
    """libpq keywords and their values, as given (no defaults, no PG* variables)."""

    params: Mapping[str, str]
    setting: str = "RELAY_PG_DSN"

    def __repr__(self) -> str:
        return f"ConnInfo({self.redacted()!r})"

    @property
    def password(self) -> str | None:
        """The password, if the text carries one."""
        return self.params.get("password")

    def hosts(self) -> list[tuple[str, int | None]]:
        """(host, port) per host of a multi-host string; port None = libpq's default rule."""
        hosts = self.params.get("host", "").split(",") if "host" in self.params else [""]
        raw_ports = self.params.get("port", "").split(",") if "port" in self.params else [""]
        if len(raw_ports) == 1:
            raw_ports = raw_ports * len(hosts)
        if len(raw_ports) != len(hosts):
            raise _fail(self.setting, f"{len(raw_ports)} ports for {len(hosts)} hosts: give "
                        "one port, or one per host")
        out: list[tuple[str, int | None]] = []
        for host, port in zip(hosts, raw_ports, strict=True):
            out.append((host, self._port(port)))
        return out

    def _port(self, text: str) -> int | None:
        if not text.strip():
            return None
        try:
            port = int(text)
        except ValueError:
            raise _fail(self.setting, "port is not an integer") from None
        if not 1 <= port <= 65535:
            raise _fail(self.setting, "port is out of range (1-65535)")
        return port

    def check_supported(self) -> None:
        """Refuse, by name, every keyword the relay's driver would not honour."""
        refused = sorted(k for k in self.params if k not in SUPPORTED)
        if refused:
            raise _fail(self.setting, f"{', '.join(refused)}: not supported by the relay's "
                        "PostgreSQL driver (asyncpg); remove it")
        mode = self.params.get("sslmode")
        if mode is not None and mode not in _SSLMODES:
            raise _fail(self.setting, f"sslmode must be one of {', '.join(sorted(_SSLMODES))}")
        target = self.params.get("target_session_attrs")
        if target is not None and target not in _TARGETS:
            raise _fail(self.setting, "target_session_attrs must be one of "
                        + ", ".join(sorted(_TARGETS)))
        encoding = self.params.get("client_encoding")
        if encoding is not None and encoding.replace("-", "").lower() != "utf8":
            raise _fail(self.setting, "client_encoding: the relay speaks UTF8 only")
        timeout = self.params.get("connect_timeout")
        if timeout is not None and timeout.strip():
            try:
                int(timeout)
            except ValueError:
                raise _fail(self.setting, "connect_timeout is not an integer") from None

    def asyncpg_args(self) -> dict[str, Any]:
        """asyncpg.connect() arguments (PG* variables still fill what is absent)."""
        self.check_supported()
        p = self.params
        args: dict[str, Any] = {}
        pairs = self.hosts()
        if "host" in p:
            args["host"] = [h or "localhost" for h, _ in pairs]
        if "port" in p:
            args["port"] = [port or DEFAULT_PORT for _, port in pairs]
        if len(pairs) == 1:
            args = {k: v[0] for k, v in args.items()}
        for key, arg in (("dbname", "database"), ("user", "user"), ("password", "password"),
                         ("passfile", "passfile"), ("service", "service"),
                         ("target_session_attrs", "target_session_attrs"),
                         ("krbsrvname", "krbsrvname"), ("gsslib", "gsslib"),
                         ("sslmode", "ssl")):
            if p.get(key):
                args[arg] = p[key]
        if p.get("connect_timeout", "").strip():
            # libpq: 0 or negative = wait forever; 1 is raised to 2 seconds.
            seconds = int(p["connect_timeout"])
            if seconds > 0:
                args["timeout"] = float(max(seconds, 2))
        server_settings = {k: p[k] for k in ("application_name", "options") if p.get(k)}
        if server_settings:
            args["server_settings"] = server_settings
        ssl_query = "&".join(f"{k}={quote(p[k], safe='')}" for k in _SSL_FILE_KEYS if p.get(k))
        if ssl_query:
            args["dsn"] = f"postgresql://?{ssl_query}"
        return args

    def keyword_form(self, *, redact: bool = False) -> str:
        """The keyword form of these parameters, libpq-quoted (secrets as *** when redact)."""
        parts = []
        for key, value in self.params.items():
            shown = "***" if redact and key in SECRET_KEYWORDS else value
            parts.append(f"{key}={quote_value(shown)}")
        return " ".join(parts)

    def redacted(self) -> str:
        """The keyword form with every secret replaced by ***."""
        return self.keyword_form(redact=True)


def quote_value(value: str) -> str:
    """A value quoted for the keyword form so that libpq reads it back unchanged."""
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def is_url(text: str) -> bool:
    """True for the URL form (libpq recognises exactly these two prefixes)."""
    return text.startswith(_URI_PREFIXES)


def parse(text: str, setting: str = "RELAY_PG_DSN") -> ConnInfo:
    """Parse a libpq connection string (keyword or URL form); DsnError names the problem."""
    if is_url(text):
        return ConnInfo(_parse_url(text, setting), setting)
    if "://" in text.split("=", 1)[0]:
        raise _fail(setting, "a URL must start with postgresql:// or postgres://")
    return ConnInfo(_parse_keywords(text, setting), setting)


def redact(text: str | None, setting: str = "RELAY_PG_DSN") -> str:
    """Any connection string safe to print, secrets as ***: a libpq DSN (keyword or URL form),
    an AMQP URL, or a comma-separated list of URLs (RELAY_AMQP_URL's nodes). The one place the
    relay hides passwords; unparsable keyword text is not shown at all.

    URLs are scrubbed without parsing (_redact_url): a raw '/' in a URL's password makes libpq
    read it as a host and port, but it is still the user's password.
    """
    if not text:
        return "<libpq defaults>"
    if _URL_START.match(text):
        return ",".join(_redact_url(url) for url in _URLS.split(text))
    try:
        info = parse(text, setting)
    except DsnError:
        return "<connection string not shown: it does not parse>"
    if not info.params.keys() & SECRET_KEYWORDS:
        return text
    return info.redacted()


_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&;])(?:ssl)?password=)[^&;#]*")


_URL_START = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\-]*://")
# A list of node URLs: a comma followed by the next URL's scheme (a multi-host PostgreSQL URL
# keeps its commas: its hosts have no scheme).
_URLS = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def _redact_url(text: str) -> str:
    """One connection URL (amqp://, postgresql://) with its secrets as ***.

    Not a URL parser: userinfo runs to the LAST '@', so a password holding '#', '/', '?' or
    '@' unencoded is hidden too; at worst more than the password is hidden.
    """
    if not text:
        return "<libpq defaults>"
    if not _URL_START.match(text):
        # A keyword DSN, even one whose password holds "://".
        return redact(text)
    scheme, _, rest = text.strip().partition("://")
    at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, _ = userinfo.partition(":")
        shown = "***" if "@" in user or "/" in user else user
        rest = f"{shown}{':***' if colon else ''}@{rest}"
    return f"{scheme}://{_QUERY_SECRET.sub(lambda m: m.group(1) + '***', rest)}"
