"""Every stderr line is one structlog event: the relay's own and stdlib logging's alike."""

from __future__ import annotations

import asyncio
import json
import logging
import warnings

import pytest
import structlog

from relay import cli
from relay.ops import logs
from tests.kit.fakes import clean_env  # noqa: F401 - the fixture, used by pytestmark

pytestmark = pytest.mark.usefixtures("clean_env")


def _events(text: str) -> list[dict[str, object]]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]  # fails on any plain-text line


def test_logs__stdlib_records_of_libraries_come_out_as_json_events(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "json")
    structlog.get_logger("relay.test").info("batch_published", count=500)
    logging.getLogger("aiormq.channel").error("Unexpected connection close from remote")
    logging.getLogger("asyncpg.connection").warning("pool %s is closing", "p1")
    logging.getLogger("asyncio").error("Task exception was never retrieved")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("aio_pika.channel").exception("reconnect failed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    captured = capsys.readouterr()
    assert captured.out == ""  # logs never mix with command output
    events = _events(captured.err)
    by_event = {e["event"]: e for e in events}
    assert by_event["batch_published"]["count"] == 500
    assert by_event["batch_published"]["logger"] == "relay.test"
    assert by_event["Unexpected connection close from remote"]["logger"] == "aiormq.channel"
    assert by_event["pool p1 is closing"]["level"] == "warning"
    assert "Task exception was never retrieved" in by_event
    assert "ValueError: boom" in str(by_event["reconnect failed"]["exception"])
    assert any("deprecated thing" in str(e["event"]) for e in events)
    assert all("timestamp" in e for e in events)


def test_logs__library_info_chatter_stays_out_at_info_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "json")
    logging.getLogger("asyncpg").info("connection established")
    structlog.get_logger("relay.test").debug("not shown")
    structlog.get_logger("relay.test").info("shown")
    assert [e["event"] for e in _events(capsys.readouterr().err)] == ["shown"]


def test_cli__a_failing_command_ends_with_one_json_event_when_not_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_LOG_FORMAT", "json")
    monkeypatch.setenv("RELAY_BATCH_SIZE", "lots")
    assert cli.main(["status"]) == 2
    (event,) = _events(capsys.readouterr().err)
    assert event["event"] == "relay_failed"
    assert event["exit_code"] == 2
    assert "RELAY_BATCH_SIZE" in str(event["error"])


def test_cli__console_format_says_relay_colon_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_LOG_FORMAT", "console")
    monkeypatch.setenv("RELAY_BATCH_SIZE", "lots")
    assert cli.main(["status"]) == 2
    assert capsys.readouterr().err.startswith("relay: invalid setting: RELAY_BATCH_SIZE")


async def test_logs__asyncio_unretrieved_task_errors_are_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "json")
    loop = asyncio.get_running_loop()
    loop.call_exception_handler({"message": "Task exception was never retrieved",
                                 "exception": RuntimeError("lost")})
    events = _events(capsys.readouterr().err)
    assert events[0]["logger"] == "asyncio"
    assert "RuntimeError: lost" in str(events[0]["exception"])
