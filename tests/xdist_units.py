"""How the suite's tests are handed to pytest-xdist's workers (tests/run.py: `--dist loadfile`).

xdist's loadfile hands out a module at a time. The modules that share the local Spark session
(tests/spark/conftest.py, one per worker process: a JVM of several seconds' start-up and
about 700 MB) are one unit here instead, so that one worker starts one JVM for all of them,
rather than each of the three workers starting its own as the modules land on it. The
standalone cluster's and Spark 3.5's modules start JVMs of their own and stay units of their own.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

# Modules whose tests take the session-scoped `spark` fixture.
LOCAL_SPARK_MODULES = frozenset({
    "tests/spark/test_write_outbox.py",
    "tests/spark/test_ids_and_order.py",
    "tests/spark/test_spark_role.py",
    "tests/spark/test_streaming.py",
})
LOCAL_SPARK_UNIT = "tests/spark (the local Spark session's modules)"


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the local Spark session's unit."""
    module = nodeid.split("::", 1)[0]
    return LOCAL_SPARK_UNIT if module in LOCAL_SPARK_MODULES else module


class SuiteScheduling(LoadFileScheduling):
    """loadfile, with the local Spark session's modules as one unit (unit_of)."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
