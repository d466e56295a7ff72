"""A real `relay run`, start to stop at debug level: every line it writes is a JSON event."""

from __future__ import annotations

import json

from tests.helpers import Env
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


async def test_relay_run__every_output_line_is_a_json_event(
    env: Env, consumer: Consumer, start_relay
) -> None:
    relay = start_relay(log_level="debug")
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": i} for i in range(20)])
    await consumer.wait_for(20)
    assert relay.terminate() == 0
    lines = [line for line in relay.log_text().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # a plain-text line fails here
    names = {e["event"] for e in events}
    assert {"relay_started", "relay_stopped"} <= names
    assert all({"timestamp", "level", "logger"} <= e.keys() for e in events)
