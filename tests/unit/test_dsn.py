"""relay/dsn.py, the one libpq DSN parser, checked against libpq itself.

psycopg's conninfo_to_dict calls libpq's PQconninfoParse: every generated DSN must parse to
exactly what libpq reads, and redaction must never show the password.
"""

from __future__ import annotations

import string
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from relay import dsn
from relay.dsn import redact

# Any printable character, the ones that break naive parsers first.
NASTY = "#/?@:'\\ =&%+,[]\"\t"
value_chars = st.sampled_from(string.ascii_letters + string.digits + NASTY + "é€")
values = st.text(value_chars, min_size=0, max_size=12)
secrets_ = st.text(value_chars, min_size=1, max_size=16).map(lambda s: "Pw" + s)
hostnames = st.sampled_from(["db", "127.0.0.1", "h-1.example.com", "/var/run/postgresql"])
ports = st.integers(min_value=1, max_value=65535).map(str)
PLAIN_KEYS = ["dbname", "user", "application_name", "options", "sslmode", "sslrootcert",
              "sslcert", "sslkey", "connect_timeout", "target_session_attrs", "passfile",
              "krbsrvname"]


def keyword_dsn(params: dict[str, str], spaces: str) -> str:
    return spaces.join(f"{k}{' = ' if spaces == '  ' else '='}{dsn.quote_value(v)}"
                       for k, v in params.items())


@st.composite
def keyword_params(draw: st.DrawFn) -> dict[str, str]:
    params: dict[str, str] = {}
    hosts = draw(st.lists(hostnames, min_size=1, max_size=3))
    params["host"] = ",".join(hosts)
    if draw(st.booleans()):
        params["port"] = ",".join(draw(st.lists(ports, min_size=len(hosts),
                                                max_size=len(hosts))))
    for key in draw(st.lists(st.sampled_from(PLAIN_KEYS), unique=True, max_size=4)):
        params[key] = draw(values)
    params["password"] = draw(secrets_)
    return params


@given(params=keyword_params(), spaces=st.sampled_from([" ", "  ", " \t "]))
@settings(max_examples=400, deadline=None)
def test_keyword_form__parses_exactly_as_libpq(params: dict[str, str], spaces: str) -> None:
    text = keyword_dsn(params, spaces)
    assert dict(dsn.parse(text).params) == conninfo_to_dict(text) == params


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str]:
    user = draw(st.text(value_chars, max_size=6))
    password = draw(secrets_)
    netlocs = []
    for _ in range(draw(st.integers(1, 3))):
        host = draw(st.sampled_from(["db", "127.0.0.1", "[::1]", "[fe80::1]", "h.example"]))
        port = draw(st.one_of(st.just(""), ports.map(lambda p: ":" + p)))
        netlocs.append(host + port)
    query = {k: draw(values) for k in draw(st.lists(st.sampled_from(PLAIN_KEYS), unique=True,
                                                     max_size=3))}
    qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    scheme = draw(st.sampled_from(["postgresql://", "postgres://"]))
    text = (f"{scheme}{quote(user, safe='')}:{quote(password, safe='')}@{','.join(netlocs)}"
            f"/{quote(draw(values), safe='')}" + (f"?{qs}" if qs else ""))
    return text, password


@given(case=urls())
@settings(max_examples=400, deadline=None)
def test_url_form__parses_exactly_as_libpq(case: tuple[str, str]) -> None:
    text, password = case
    parsed = dsn.parse(text)
    assert dict(parsed.params) == conninfo_to_dict(text)
    assert parsed.password == password


@given(params=keyword_params())
@settings(max_examples=300, deadline=None)
def test_redaction__never_shows_a_keyword_dsn_password(params: dict[str, str]) -> None:
    text = keyword_dsn(params, " ")
    shown = redact(text)
    assert params["password"] not in shown
    assert dsn.quote_value(params["password"]) not in shown
    assert conninfo_to_dict(shown)["password"] == "***"  # the rest stays readable


@given(password=secrets_, scheme=st.sampled_from(["amqp", "amqps", "postgresql"]),
       encode=st.booleans())
@example(password="Pwa#b/c?d@e", scheme="amqp", encode=False)
@example(password="Pw/ss", scheme="postgresql", encode=False)
@settings(max_examples=300, deadline=None)
def test_redaction__never_shows_a_url_password_whatever_its_characters(
    password: str, scheme: str, encode: bool
) -> None:
    shown_password = quote(password, safe="") if encode else password
    text = f"{scheme}://relay:{shown_password}@mq.example:5672/vhost?heartbeat=30"
    shown = redact(text)
    assert password not in shown
    assert shown_password not in shown
    assert shown.startswith(f"{scheme}://relay:***@")


# ---------------------------------------------------------------------- found cases, kept


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password='a b' dbname=app", {"password": "a b", "dbname": "app"}),
        (r"password='it\'s' user=x", {"password": "it's", "user": "x"}),
        (r"password=a\ b", {"password": "a b"}),
        ("host = db  port= 5433", {"host": "db", "port": "5433"}),
        ("host=h1,h2 port=5432,5433 target_session_attrs=read-write",
         {"host": "h1,h2", "port": "5432,5433", "target_session_attrs": "read-write"}),
        ("postgresql://u:a:b@h1:5432,h2:5433/db?sslmode=verify-full",
         {"user": "u", "password": "a:b", "host": "h1,h2", "port": "5432,5433",
          "dbname": "db", "sslmode": "verify-full"}),
        ("postgresql://h1,h2:5433/db", {"host": "h1,h2", "port": ",5433", "dbname": "db"}),
        ("postgres://[::1]:5432/x?ssl=true", {"host": "::1", "port": "5432", "dbname": "x",
                                              "sslmode": "require"}),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql/db?application_name=a+b",
         {"host": "/var/run/postgresql", "dbname": "db", "application_name": "a+b"}),
        ("postgresql://u:p/ss@h/d", {"host": "u", "port": "p", "dbname": "ss@h/d"}),
        ("postgresql://", {}),
    ],
)
def test_parse__found_cases_match_libpq(text: str, expected: dict[str, str]) -> None:
    assert dict(dsn.parse(text).params) == expected == conninfo_to_dict(text)


def test_asyncpg_args__multi_host_ssl_files_timeout_and_options() -> None:
    args = dsn.parse(
        "host=h1,h2 port=5432,5433 user=relay password='a b' dbname=app sslmode=verify-full "
        "sslrootcert=/certs/ca+1.crt connect_timeout=1 options='-c search_path=x' "
        "target_session_attrs=primary"
    ).asyncpg_args()
    assert args == {
        "host": ["h1", "h2"], "port": [5432, 5433], "user": "relay", "password": "a b",
        "database": "app", "ssl": "verify-full", "timeout": 2.0,
        "target_session_attrs": "primary",
        "server_settings": {"options": "-c search_path=x"},
        # asyncpg reads the certificate paths from a DSN only; '+' must stay a '+'.
        "dsn": "postgresql://?sslrootcert=%2Fcerts%2Fca%2B1.crt",
    }


def test_asyncpg_args__one_port_applies_to_every_host() -> None:
    args = dsn.parse("host=a,b port=6432").asyncpg_args()
    assert (args["host"], args["port"]) == (["a", "b"], [6432, 6432])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("host=db sslrotcert=/ca", "unknown parameter 'sslrotcert' (did you mean sslrootcert?)"),
        ("postgresql://db/app?foo=1", "unknown URL query parameter 'foo'"),
        ("host=db keepalives=1", "keepalives: not supported by the relay's PostgreSQL driver"),
        ("host=db hostaddr=10.0.0.1", "hostaddr: not supported"),
        ("host=a,b,c port=1,2", "2 ports for 3 hosts"),
        ("host=db port=fifty", "port is not an integer"),
        ("host=db sslmode=verify", "sslmode must be one of"),
        ("host=db client_encoding=latin1", "client_encoding: the relay speaks UTF8 only"),
        ("mysql://db/app", "must start with postgresql:// or postgres://"),
    ],
)
def test_parse__refuses_with_a_message_naming_the_parameter(text: str, message: str) -> None:
    with pytest.raises(dsn.DsnError) as exc:
        dsn.parse(text).asyncpg_args()
    assert message in str(exc.value)
    assert str(exc.value).startswith("RELAY_PG_DSN: ")


@pytest.mark.parametrize(
    "text",
    [
        "host=db password=se cret dbname=app",       # unquoted space: 'cret' is the tail
        "host=db password='secret9 never closed",
        "host=db password=secret9 x_y=1",
        "postgresql://u:secret9@h/d?a=b=secret9",
        "postgresql://u:%zzsecret9@h/d",
    ],
)
def test_parse__errors_never_repeat_a_password_fragment(text: str) -> None:
    with pytest.raises(dsn.DsnError) as exc:
        dsn.parse(text)
    message = str(exc.value)
    for fragment in ("cret", "secret9", "never", "zz"):
        assert fragment not in message.split(": ", 1)[1], message


def test_redaction__keyword_dsn_whose_password_holds_a_scheme_separator() -> None:
    # Found by the property test: "://" inside a keyword DSN's password made it look like a URL.
    shown = redact("host=db password=Pw://")
    assert "Pw://" not in shown
    assert "host=db" in shown


@pytest.mark.parametrize(
    ("text", "password"),
    [
        ("host=db password='x://y@z' dbname=app", "x://y@z"),   # found by the property test
        (r"host=db password=a\ b://c dbname=app", "a b://c"),
        ("postgresql://relay:p%2F%3F%23@db/app", "p%2F%3F%23"),
        ("postgresql://relay:p/?#ss@db/app", "p/?#ss"),
        ("amqps://relay:p@ss@mq:5671/vhost", "p@ss"),
    ],
)
def test_redaction__found_cases_hide_the_password(text: str, password: str) -> None:
    shown = redact(text)
    assert password not in shown
    assert "***" in shown


@pytest.mark.parametrize(
    "text",
    [
        "host=db dbname=app user=u password='a b\\'c' sslmode=require",
        "postgresql://u:p%2Bq@h1:5432,h2:5433/app?application_name=a+b&sslmode=verify-full",
        "postgresql://u@h1,h2/app",
    ],
)
def test_spark__reads_a_dsn_exactly_as_the_relay_does(text: str) -> None:
    from relay.spark.dsn import libpq_params

    params = libpq_params(text, environ={})
    assert dict(dsn.parse(text).params).items() <= params.items()
    assert conninfo_to_dict(text).items() <= params.items()


def test_spark__a_bad_dsn_is_the_relay_s_named_error_without_the_password() -> None:
    from relay.spark.dsn import libpq_params

    with pytest.raises(dsn.DsnError) as exc:
        libpq_params("host=db password=se cret sslrotcert=x", environ={})
    assert "cret" not in str(exc.value)
