"""Latency scenario alone (a quick check while developing; the suite is bench/run.py).

    python -m bench.latency_only --rates 1000:4,3000:16 --runs 3 --seconds 10 [--mode always]

Each rate is `commits_per_s:producer_connections`. Prints one JSON line per run, with the
notify mode and the load average before it.
"""

from __future__ import annotations

import argparse
import json

import uvloop

from bench.common import DEFAULT_MODE, create_env, drop_env, parse_rates
from bench.latency import latency_once
from relay.settings import NotifyMode


async def main(rates: list[tuple[int, int]], runs: int, seconds: float, mode: NotifyMode,
               relay_settings: dict[str, str]) -> None:
    """Print one JSON line per run."""
    env = await create_env("latency", mode)
    try:
        for rate, connections in rates:
            for i in range(runs):
                result = await latency_once(env, rate, seconds, connections=connections,
                                            **relay_settings)
                print(json.dumps({"run": i + 1, "mode": mode.value, **result}), flush=True)
    finally:
        await drop_env(env)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.latency_only")
    parser.add_argument("--rates", default="1000:4,3000:16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mode", type=NotifyMode, default=DEFAULT_MODE)
    parser.add_argument("--relay-setting", action="append", default=[],
                        help="NAME=VALUE for the relay, e.g. CONCURRENCY=3")
    args = parser.parse_args()
    pairs = parse_rates(args.rates)
    settings = dict(kv.split("=", 1) for kv in args.relay_setting)
    uvloop.run(main(pairs, args.runs, args.seconds, args.mode,  # type: ignore[arg-type]
                    {k.lower(): v for k, v in settings.items()}))
