"""The Spark tests again under Spark 3.5 (the extra accepts >=3.5,<5), in the second virtual
environment .ci/spark35-venv.sh builds: every test of tests/spark but this one, on PostgreSQL 15
(the server's version is not Spark's: 4.x runs each test on 15 and 18), and of the standalone
cluster's spark-submits the executor killed in copy mode only (the mode whose own code runs on
the executors; staged and append write with Spark's own JDBC writer, which the local-mode tests
run under 3.5). Each spark-submit is a minute of JVMs on a 2-core machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "spark-3.5"

ONLY = "not pg18 and not append_mode_writes_every_event"


def test_spark_3_5__every_spark_test_passes() -> None:
    python = VENV / "bin" / "python"
    # The Spark tests run the relay of the environment they run in: the project installed.
    if not python.exists() or not (VENV / "bin" / "relay").exists():
        pytest.fail(f"{VENV} is missing: run `bash .ci/spark35-venv.sh` (it builds it)",
                    pytrace=False)
    version = subprocess.run([str(python), "-c", "import pyspark; print(pyspark.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("3.5."), version
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}

    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/spark",
         "--ignore", str(Path(__file__).relative_to(ROOT)), "-k", ONLY],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700, check=False,
    )

    assert done.returncode == 0, f"pyspark {version}:\n{done.stdout[-6000:]}"
    print(f"pyspark {version}: {done.stdout.strip().splitlines()[-1]}")
