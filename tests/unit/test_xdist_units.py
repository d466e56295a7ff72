"""tests/xdist_units.py: the local Spark session's modules are one unit of work for xdist, and
they are exactly the modules whose tests use that session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import xdist_units
from tests.kit import marks_listing

REPO = Path(__file__).resolve().parents[2]


def _modules_using(fixture: str, path: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:xdist", "-p", "tests.kit.marks_listing", path],
                         cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    modules = set()
    for line in out.stdout.splitlines():
        if line.startswith(marks_listing.FIXTURES):
            nodeid, _, names = line.removeprefix(marks_listing.FIXTURES).rpartition(" ")
            if fixture in names.split(","):
                modules.add(nodeid.split("::", 1)[0])
    return modules


def test_local_spark_unit__is_every_module_that_uses_the_spark_session() -> None:
    assert _modules_using("spark", "tests/spark") == xdist_units.LOCAL_SPARK_MODULES


def test_unit_of__groups_the_spark_session_modules_and_keeps_every_other_module() -> None:
    units = {xdist_units.unit_of(f"{m}::test_x[pg15]") for m in xdist_units.LOCAL_SPARK_MODULES}
    assert units == {xdist_units.LOCAL_SPARK_UNIT}
    for module in ("tests/spark/test_spark35.py", "tests/spark/test_standalone_cluster.py",
                   "tests/integration/test_delivery.py"):
        assert xdist_units.unit_of(f"{module}::test_y") == module
