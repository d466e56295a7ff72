"""Latency scenario alone (quick re-check when the machine is quieter than during a full run).

    python -m bench.latency_only --rates 1000,5000 --runs 3 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os

import uvloop

from bench.common import create_env, drop_env
from bench.latency import latency_once


async def main(rates: list[int], runs: int, seconds: float) -> None:
    """Print one JSON line per run, with the load average at its start."""
    env = await create_env("latency")
    try:
        for rate in rates:
            for i in range(runs):
                load = os.getloadavg()[0]
                result = await latency_once(env, rate, seconds)
                print(json.dumps({"run": i + 1, "load_avg_1m": load, **result}), flush=True)
    finally:
        await drop_env(env)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.latency_only")
    parser.add_argument("--rates", default="1000,5000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    uvloop.run(main([int(r) for r in args.rates.split(",")], args.runs, args.seconds))
