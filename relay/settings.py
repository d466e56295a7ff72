"""Configuration: environment variables with the RELAY_ prefix, a .env file, libpq fallback."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from relay.interfaces import OnSuccess

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"^(?:({_IDENT})\.)?({_IDENT})$")


class PublisherKind(StrEnum):
    """Which publish path: whole batches as one write (bulk) or one aiormq publish per message."""

    BULK = "bulk"
    SIMPLE = "simple"


class NotifyMode(StrEnum):
    """How producers wake relays: always, only while a relay sleeps, or never (polling)."""

    CONDITIONAL = "conditional"
    ALWAYS = "always"
    OFF = "off"


class RelayMode(StrEnum):
    """parallel: every replica publishes; single-active: one leader publishes, others stand by."""

    PARALLEL = "parallel"
    SINGLE_ACTIVE = "single-active"


class OnDeadKey(StrEnum):
    """What a dead-lettered row of an ordering key does to the key's later rows."""

    SKIP = "skip"
    BLOCK = "block"


def _env(name: str) -> Any:
    """Accept RELAY_<NAME>_S and the unit-less RELAY_<NAME> spelling of a duration."""
    return AliasChoices(f"RELAY_{name}_S", f"RELAY_{name}")


Seconds = Annotated[float, Field(gt=0)]


ADMIN_TOKEN_MIN = 16  # characters of RELAY_ADMIN_TOKEN


class Settings(BaseSettings):
    """Every knob of the relay. Each field reads RELAY_<FIELD> from the environment or .env."""

    model_config = SettingsConfigDict(
        env_prefix="RELAY_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        secrets_dir=None,
        populate_by_name=True,
    )

    pg_dsn: str | None = Field(
        default=None,
        description="PostgreSQL DSN or URL. Unset: the libpq variables (PGHOST, PGDATABASE, "
        "PGUSER, PGPASSWORD, PGPORT) apply, as for psql.",
    )
    amqp_url: str = Field(
        default="amqp://guest:guest@localhost:5672/",
        description="RabbitMQ URL (amqp:// or amqps://).",
    )
    table: str = Field(
        default="queue_message",
        description="Outbox table, optionally schema-qualified (schema.table).",
    )
    notify_channel: str = Field(
        default="queue_message_notify",
        description="LISTEN/NOTIFY channel the trigger notifies.",
    )
    batch_size: int = Field(
        default=500, ge=1, le=10_000, description="Rows claimed and published per batch."
    )
    concurrency: int = Field(
        default=3, ge=1, le=64,
        description="Batches in flight per process (one DB connection each).",
    )
    poll_interval_s: Seconds = Field(
        default=5.0,
        validation_alias=_env("POLL_INTERVAL"),
        description="Seconds between safety sweeps when no notification arrives.",
    )
    publish_timeout_s: Seconds = Field(
        default=15.0,
        validation_alias=_env("PUBLISH_TIMEOUT"),
        description="Seconds a batch's whole publish may take (every pass, waiting out "
        "connection.blocked included); rows still unconfirmed then are left for a later batch. "
        "The claim's idle-in-transaction limit is derived from it (relay/deadlines.py).",
    )
    mandatory: bool = Field(
        default=True,
        description="Publish with mandatory: an unroutable message is a failure, not a success.",
    )
    max_attempts: int = Field(
        default=10, ge=1, description="Publish attempts before a row is dead-lettered."
    )
    retry_base_s: Seconds = Field(
        default=1.0,
        validation_alias=_env("RETRY_BASE"),
        description="Seconds of the first retry delay; doubles per attempt, with jitter.",
    )
    retry_max_s: Seconds = Field(
        default=300.0,
        validation_alias=_env("RETRY_MAX"),
        description="Seconds: upper bound of a retry delay.",
    )
    batch_max_bytes: int = Field(
        default=24 * 1024 * 1024,
        ge=1,
        description="Bytes: a batch claims rows until their content and options reach "
        "this (the first row always goes, however large), so memory has a ceiling: give the "
        "container at least 100 MiB + RELAY_CONCURRENCY x 2 x (RELAY_BATCH_MAX_BYTES + "
        "RELAY_MAX_MESSAGE_BYTES) (README, Memory).",
    )
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="Bytes: a row whose content is larger goes straight to dead letters "
        "(too_large), its content never read out of the database. Keep it "
        "at or below the broker's max_message_size (RabbitMQ: 16 MiB from 4.0, 128 MiB before).",
    )
    on_success: OnSuccess = Field(
        default=OnSuccess.DELETE,
        description="delete: remove published rows; archive: move them to <table>_archive.",
    )
    notify: NotifyMode = Field(
        default=NotifyMode.CONDITIONAL,
        description="Trigger mode installed by migrate: conditional (notify only while a "
        "relay sleeps), always, off (polling). Running relays follow the installed mode.",
    )
    express_lane: bool = Field(
        default=True,
        description="While a backlog drains, publish the rows that newer transactions commit "
        "at once, over a broker connection of its own, instead of behind the drain's batches "
        "(docs/fairness.md). Off: they go with the drain's next batches.",
    )
    streams: bool = Field(
        default=False,
        description="Also publish the rows of <table>_stream to RabbitMQ streams over the "
        "stream protocol, deduplicated by the broker (docs/streams.md); needs the "
        "rabbitmq_stream plugin.",
    )
    stream_port: int = Field(
        default=5552, ge=1, le=65535,
        description="Port of RabbitMQ's stream protocol on the host of RELAY_AMQP_URL (its "
        "user, password and vhost too).",
    )
    stream_producers: int = Field(
        default=4, ge=1, le=256,
        description="Named stream producers (slots) the relays share; each is owned by one "
        "relay at a time. The same on every relay of a table.",
    )
    stream_lease_s: Seconds = Field(
        default=10.0,
        validation_alias=_env("STREAM_LEASE"),
        description="Seconds a relay that stopped answering keeps its stream producers before "
        "another relay takes them over.",
    )
    express_poll_interval_s: Seconds = Field(
        default=0.002,
        validation_alias=_env("EXPRESS_POLL_INTERVAL"),
        description="Seconds between the express lane's looks for a newly committed "
        "transaction while a backlog drains (one index entry of the outbox each).",
    )
    poll_min_interval_s: Seconds = Field(
        default=0.05,
        validation_alias=_env("POLL_MIN_INTERVAL"),
        description="Seconds between sweeps in notify mode off while sweeps find rows; "
        "doubles up to the poll interval while they find none.",
    )
    shutdown_timeout_s: Seconds = Field(
        default=20.0,
        validation_alias=_env("SHUTDOWN_TIMEOUT"),
        description="Seconds a stop may take to finish in-flight batches before rolling back.",
    )
    reconnect_max_s: Seconds = Field(
        default=30.0,
        validation_alias=_env("RECONNECT_MAX"),
        description="Seconds: upper bound of the reconnect backoff to either server.",
    )
    http_port: int = Field(
        default=0, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz; 0 = off."
    )
    http_host: str = Field(default="0.0.0.0", description="Address the HTTP endpoint binds.")  # noqa: S104
    admin_port: int = Field(
        default=0, ge=0, le=65535,
        description="Port of the admin API and the status page with its buttons, apart from "
        "the metrics and probes: operators keep RELAY_HTTP_PORT open to the cluster and this "
        "one on the loopback. Needs RELAY_ADMIN_TOKEN and RELAY_HTTP_PORT. 0 (default): the "
        "admin API is on RELAY_HTTP_PORT.",
    )
    admin_host: str = Field(
        default="127.0.0.1",
        description="Address RELAY_ADMIN_PORT binds: the loopback by default (reached from "
        "the pod itself, `kubectl port-forward`).",
    )
    admin_token: str | None = Field(
        default=None,
        description="Turns on the admin API on the HTTP port (/admin/dead: list, show, replay, "
        "purge dead letters); every call must carry `Authorization: Bearer <token>`. At least "
        "16 characters, no spaces; a file `relay_admin_token` in the secrets folder works too. "
        "Unset (default): the admin API is off.",
    )
    ready_max_lag_s: float = Field(
        default=0.0,
        ge=0,
        validation_alias=_env("READY_MAX_LAG"),
        description="Seconds: when set, /readyz also fails while the oldest due row is older "
        "than this. 0 (default): lag never affects readiness, since it is the table's and "
        "would make every replica unready at once; alert on relay_oldest_due_age_seconds.",
    )
    backlog_poll_interval_s: Seconds = Field(
        default=5.0,
        validation_alias=_env("BACKLOG_POLL_INTERVAL"),
        description="Seconds between backlog queries behind /metrics and /readyz (per relay).",
    )
    spark_jdbc_jar: str | None = Field(
        default=None,
        description="Path of the PostgreSQL JDBC driver jar for relay.spark jobs; unset: "
        "spark.jars as given, else /usr/share/java/postgresql.jar (libpostgresql-jdbc-java).",
    )
    publisher: PublisherKind = Field(
        default=PublisherKind.BULK,
        description="bulk: encode a batch's frames at once, one write, settle from multiple "
        "acks; simple: one aiormq publish (and future) per message.",
    )
    mode: RelayMode = Field(
        default=RelayMode.PARALLEL,
        description="parallel: all replicas publish; single-active: one leader (advisory lock) "
        "publishes one batch at a time, the others stand by (docs/ordering.md).",
    )
    ordering_on_dead: OnDeadKey = Field(
        default=OnDeadKey.SKIP,
        description="A dead-lettered row of an ordering key: skip (later rows of the key go on) "
        "or block (the key waits until that dead letter is replayed or purged).",
    )
    ordering_keys_per_batch: int = Field(
        default=64, ge=1, le=1000,
        description="Ordering keys one batch may take (an advisory lock each, held per batch).",
    )
    leader_poll_interval_s: Seconds = Field(
        default=1.0,
        validation_alias=_env("LEADER_POLL_INTERVAL"),
        description="Seconds between a standby's tries for the leader lock and between the "
        "leader's checks of its lock connection (single-active).",
    )
    # Supervision and high availability (relay/supervise.py, docs/operations.md)
    startup_timeout_s: Seconds = Field(
        default=60.0,
        validation_alias=_env("STARTUP_TIMEOUT"),
        description="Seconds `relay run` and `relay migrate` wait at start for PostgreSQL and "
        "RabbitMQ to answer before giving up (exit code 75); a server lost later is retried "
        "for as long as the relay runs.",
    )
    # Deadlines (relay/deadlines.py derives the rest from these).
    statement_timeout_s: Seconds = Field(
        default=30.0,
        validation_alias=_env("STATEMENT_TIMEOUT"),
        description="Seconds: bound of each claim and settle statement (server statement_timeout "
        "and client timeout).",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    log_format: str = Field(
        default="auto", description="json, console, or auto (console on a terminal)."
    )

    @field_validator("table")
    @classmethod
    def _table_is_identifier(cls, value: str) -> str:
        if not _TABLE_RE.match(value):
            raise ValueError("must be an identifier or schema.identifier (letters, digits, _)")
        return value

    @field_validator("admin_token")
    @classmethod
    def _token_is_strong(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if len(value) < ADMIN_TOKEN_MIN or any(c.isspace() for c in value):
            raise ValueError(f"must be at least {ADMIN_TOKEN_MIN} characters with no spaces "
                             "(e.g. `openssl rand -hex 32`)")
        return value

    @field_validator("notify_channel")
    @classmethod
    def _channel_is_identifier(cls, value: str) -> str:
        if not re.fullmatch(_IDENT, value):
            raise ValueError("must be an identifier (letters, digits, _)")
        return value

    @field_validator("amqp_url")
    @classmethod
    def _amqp_scheme(cls, value: str) -> str:
        # A comma-separated list of nodes is allowed (relay/amqp/nodes.py): check each one.
        urls = [part.strip() for part in value.split(",") if part.strip()] or [value]
        if any(urlsplit(url).scheme not in {"amqp", "amqps"} for url in urls):
            raise ValueError("must start with amqp:// or amqps://")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be debug, info, warning or error")
        return value.lower()

    @field_validator("log_format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value.lower() not in {"json", "console", "auto"}:
            raise ValueError("must be json, console or auto")
        return value.lower()

    # ---- ops: validation of connection strings and of settings that depend on each other

    @field_validator("pg_dsn")
    @classmethod
    def _pg_dsn_parses(cls, value: str | None) -> str | None:
        if value:
            from relay import dsn

            try:
                dsn.parse(value).check_supported()
            except dsn.DsnError as exc:
                raise ValueError(str(exc).removeprefix("RELAY_PG_DSN: ")) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        pairs = [
            ("retry_base_s", "retry_max_s"),
            ("poll_min_interval_s", "poll_interval_s"),
        ]
        for low, high in pairs:
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"RELAY_{low.upper()} ({getattr(self, low):g}) must not exceed "
                    f"RELAY_{high.upper()} ({getattr(self, high):g})"
                )
        if self.admin_port:
            if self.admin_token is None:
                raise ValueError("RELAY_ADMIN_PORT is set but RELAY_ADMIN_TOKEN is not: "
                                 "without a token the admin API is off")
            if not self.http_port:
                raise ValueError("RELAY_ADMIN_PORT needs RELAY_HTTP_PORT (the metrics' and "
                                 "probes' port) set as well")
            if self.admin_port == self.http_port:
                raise ValueError(f"RELAY_ADMIN_PORT ({self.admin_port}) must differ from "
                                 f"RELAY_HTTP_PORT ({self.http_port})")
        return self

    # Deadlines: a stop must leave in-flight batches the time their publish may take.
    @field_validator("shutdown_timeout_s")
    @classmethod
    def _shutdown_outlasts_a_publish(cls, value: float, info: ValidationInfo) -> float:
        publish_s = info.data.get("publish_timeout_s")
        if publish_s is not None and value <= publish_s:
            raise ValueError(
                f"must exceed RELAY_PUBLISH_TIMEOUT_S ({publish_s:g}): a stop lets in-flight "
                "batches finish their publish"
            )
        return value

    @property
    def table_schema(self) -> str | None:
        """The schema part of `table`, or None for the search path."""
        match = _TABLE_RE.match(self.table)
        assert match is not None
        return match.group(1)

    @property
    def table_name(self) -> str:
        """The unqualified table name."""
        match = _TABLE_RE.match(self.table)
        assert match is not None
        return match.group(2)


# Settings whose value may carry a password: never repeated in an error or a listing.
SECRET_FIELDS = frozenset({"pg_dsn", "amqp_url", "admin_token"})

