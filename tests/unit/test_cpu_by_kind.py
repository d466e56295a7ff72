"""tests/cpu_by_kind.py: what each process counts as, and that a command's own CPU is seen."""

from __future__ import annotations

import sys

import pytest

from tests import cpu_by_kind


@pytest.mark.parametrize(("comm", "cmdline", "expected"), [
    ("python", "/r/.venv/bin/python -m relay.cli run", "relay"),
    ("relay", "/r/.venv/bin/python /r/.venv/bin/relay run --once", "relay"),
    ("java", "/usr/bin/java -cp /r/.venv/spark-3.5/lib/pyspark/jars/*", "Spark JVM (3.5)"),
    ("java", "/usr/bin/java -cp /r/.venv/lib/python3.11/site-packages/pyspark/jars/*",
     "JVM (Spark 4)"),
    ("python3", "python3 -m pyspark.daemon", "Spark's Python workers"),
    ("beam.smp", "/usr/lib/erlang/erts/bin/beam.smp -- -root /usr/lib/erlang", "Erlang (RabbitMQ)"),
    ("postgres", "postgres: 15/main: root db 127.0.0.1(5000) idle", "PostgreSQL"),
    ("python", "/r/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))",
     "pytest and its workers"),
    ("python", "/r/.venv/bin/python -m pytest -n 3", "pytest and its workers"),
    ("python3", "python3 bench/x.py --rows 5", "other Python: bench/x.py --rows"),
    ("bash", "bash .ci/run", "other: bash"),
])
def test_kind__names_each_process_by_what_it_is(comm: str, cmdline: str, expected: str) -> None:
    assert cpu_by_kind.kind(comm, cmdline) == expected


def test_main__counts_the_commands_cpu_and_returns_its_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A second of CPU, then alive and idle for three: the sampler (once a second, and late
    # on a loaded machine) sees all of it; a process that ends between two samples loses what
    # it used since the last one.
    spin = ("spinner=1;import time\nend = time.process_time() + 1.0\n"
            "while time.process_time() < end: pass\ntime.sleep(3)")
    status = cpu_by_kind.main(["--", sys.executable, "-c", spin + "\nraise SystemExit(3)"])
    out = capsys.readouterr().out
    assert status == 3
    spun = [line for line in out.splitlines() if "other Python: -c spinner=1;import" in line]
    assert spun, out
    assert float(spun[0].split()[0]) >= 0.9, out
