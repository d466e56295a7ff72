"""The whole Spark test module again under Spark 3.5 (the extra accepts >=3.5,<5), in the
second virtual environment .ci/steps/spark.sh builds: every test of tests/spark but this one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "spark-3.5"


def test_spark_3_5__every_spark_test_passes() -> None:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{VENV} is missing: run `bash .ci/steps/spark.sh` (it builds it)",
                    pytrace=False)
    version = subprocess.run([str(python), "-c", "import pyspark; print(pyspark.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("3.5."), version
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}

    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/spark",
         "--ignore", str(Path(__file__).relative_to(ROOT))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700, check=False,
    )

    assert done.returncode == 0, f"pyspark {version}:\n{done.stdout[-6000:]}"
    print(f"pyspark {version}: {done.stdout.strip().splitlines()[-1]}")
