"""Settings and CLI start-up errors, without servers."""

from __future__ import annotations

import pytest

from relay import cli
from relay.dsn import redact
from relay.errors import ConfigError
from relay.settings import Settings
from tests.kit.fakes import clean_env  # noqa: F401 - the fixture, used by pytestmark

pytestmark = pytest.mark.usefixtures("clean_env")


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
    assert secret not in redact(dsn)
    assert "***" in redact(dsn)


# ---------------------------------------------------------------- mistakes caught at start-up


@pytest.mark.parametrize(
    ("var", "closest"),
    [("RELAY_BATCHSIZE", "RELAY_BATCH_SIZE"), ("RELAY_PGDSN", "RELAY_PG_DSN"),
     ("RELAY_POLL_INTERVALL_S", "RELAY_POLL_INTERVAL_S")],
)
def test_cli__unknown_variable_is_an_error_naming_the_closest_known_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], var: str, closest: str
) -> None:
    monkeypatch.setenv(var, "5")
    assert cli.main(["config"]) == 2
    err = capsys.readouterr().err
    assert f"{var} (did you mean {closest}?)" in err
    assert "Traceback" not in err


def test_load_settings__unknown_key_in_dot_env_is_an_error_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / ".env").write_text("RELAY_BATCH_SIZE=42\nRELAY_CONCURENCY=4\nOTHER_APP_KEY=1\n")
    with pytest.raises(ConfigError) as exc:
        cli.load_settings()
    assert "RELAY_CONCURENCY (did you mean RELAY_CONCURRENCY?) in .env" in str(exc.value)
    assert "OTHER_APP_KEY" not in str(exc.value)


def test_load_settings__test_suite_variables_and_unit_aliases_are_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_TEST_PG_DSN", "postgresql://localhost/x")
    monkeypatch.setenv("RELAY_POLL_INTERVAL", "3")
    assert cli.load_settings().poll_interval_s == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"RELAY_RETRY_BASE_S": "60", "RELAY_RETRY_MAX_S": "10"},
         "RELAY_RETRY_BASE_S (60) must not exceed RELAY_RETRY_MAX_S (10)"),
        ({"RELAY_POLL_INTERVAL_S": "0.01"},
         "RELAY_POLL_MIN_INTERVAL_S (0.05) must not exceed RELAY_POLL_INTERVAL_S (0.01)"),
        ({"RELAY_ADMIN_PORT": "9001", "RELAY_HTTP_PORT": "9000"},
         "RELAY_ADMIN_PORT is set but RELAY_ADMIN_TOKEN is not"),
        ({"RELAY_ADMIN_PORT": "9001", "RELAY_ADMIN_TOKEN": "a" * 32},
         "RELAY_ADMIN_PORT needs RELAY_HTTP_PORT"),
        ({"RELAY_ADMIN_PORT": "9000", "RELAY_HTTP_PORT": "9000", "RELAY_ADMIN_TOKEN": "a" * 32},
         "RELAY_ADMIN_PORT (9000) must differ from RELAY_HTTP_PORT (9000)"),
    ],
)
def test_load_settings__settings_that_contradict_each_other_are_refused(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], message: str
) -> None:
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as exc:
        cli.load_settings()
    assert message in str(exc.value)


def test_load_settings__keyword_dsn_with_tls_files_and_a_quoted_password_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = "host=db dbname=app user=relay password='a b' sslmode=verify-full sslrootcert=/ca"
    monkeypatch.setenv("RELAY_PG_DSN", value)
    assert cli.load_settings().pg_dsn == value


def test_cli__bad_dsn_is_named_without_a_traceback_or_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_PG_DSN", "host=db password=hunter two dbname=app")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "RELAY_PG_DSN" in err
    assert "quoted" in err
    for fragment in ("hunter", "two"):
        assert fragment not in err
    assert "Traceback" not in err


def test_cli__version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"relay {version('outbox-relay')}"


def test_cli_config__prints_effective_settings_with_sources_and_secrets_redacted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import json

    (tmp_path / ".env").write_text("RELAY_CONCURRENCY=7\n")
    monkeypatch.setenv("RELAY_PG_DSN", "postgresql://relay:p%23ss@db/app")
    monkeypatch.setenv("RELAY_AMQP_URL", "amqp://relay:s3cr#t/@mq:5672/")
    monkeypatch.setenv("RELAY_BATCH_SIZE", "250")
    assert cli.main(["config"]) == 0
    table = capsys.readouterr().out
    assert "RELAY_BATCH_SIZE" in table
    assert "environment" in table
    assert ".env" in table
    assert "default" in table
    assert cli.main(["config", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["RELAY_BATCH_SIZE"] == "250"
    assert doc["settings"]["RELAY_CONCURRENCY"] == "7"
    assert doc["settings"]["RELAY_PG_DSN"] == "postgresql://relay:***@db/app"
    assert doc["settings"]["RELAY_AMQP_URL"] == "amqp://relay:***@mq:5672/"
    assert "s3cr" not in table + json.dumps(doc)


def test_metrics__build_info_carries_the_version() -> None:
    from importlib.metadata import version

    from relay.ops.metrics import RelayMetrics

    text = RelayMetrics().render().decode()
    assert 'relay_build_info{python="' in text
    assert f'version="{version("outbox-relay")}"' in text
