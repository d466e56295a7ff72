"""Settings and CLI start-up errors, without servers."""

from __future__ import annotations

import pytest

from relay import cli
from relay.errors import ConfigError
from relay.settings import Settings, redact_url


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for key in list(__import__("os").environ):
        if key.startswith("RELAY_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_settings__defaults_work_beside_local_servers() -> None:
    s = Settings()
    assert s.amqp_url == "amqp://guest:guest@localhost:5672/"
    assert s.table == "queue_message"
    assert s.batch_size == 500
    assert s.pg_dsn is None  # libpq variables apply


def test_settings__reads_prefixed_env_and_unitless_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_BATCH_SIZE", "250")
    monkeypatch.setenv("RELAY_POLL_INTERVAL", "1.5")
    monkeypatch.setenv("RELAY_TABLE", "outbox.events")
    s = Settings()
    assert (s.batch_size, s.poll_interval_s) == (250, 1.5)
    assert (s.table_schema, s.table_name) == ("outbox", "events")


def test_settings__reads_dot_env_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / ".env").write_text("RELAY_BATCH_SIZE=42\n")
    assert Settings().batch_size == 42


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("RELAY_BATCH_SIZE", "lots"),
        ("RELAY_BATCH_SIZE", "0"),
        ("RELAY_TABLE", "drop table x;"),
        ("RELAY_AMQP_URL", "http://localhost"),
        ("RELAY_POLL_INTERVAL_S", "-1"),
        ("RELAY_LOG_LEVEL", "loud"),
    ],
)
def test_load_settings__bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as exc:
        cli.load_settings()
    assert var.removesuffix("_S") in str(exc.value)


def test_cli__bad_setting_exits_2_with_a_message_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_BATCH_SIZE", "lots")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "RELAY_BATCH_SIZE" in err
    assert "Traceback" not in err


def test_cli__help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    for name in ("RELAY_PG_DSN", "RELAY_AMQP_URL", "RELAY_BATCH_SIZE", "RELAY_POLL_INTERVAL_S",
                 "RELAY_TABLE"):
        assert name in out


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://relay:s3cret@db:5432/app", "s3cret"),
        ("amqp://guest:hunter2@mq:5672/", "hunter2"),
        ("host=db user=relay password=s3cret dbname=app", "s3cret"),
        ("postgresql://db/app?password=s3cret", "s3cret"),
    ],
)
def test_redact_url__hides_passwords(dsn: str, secret: str) -> None:
    assert secret not in redact_url(dsn)
    assert "***" in redact_url(dsn)
