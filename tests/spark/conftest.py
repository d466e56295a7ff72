"""One local Spark session for every Spark test (start-up takes several seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

try:
    import pyspark  # noqa: F401
except ImportError:  # never skip: say how to get what is missing
    pytest.fail(
        "tests/spark need pyspark and psycopg: pip install -e '.[test,spark]' "
        "(and .ci/steps/spark.sh for Java and the JDBC jar)",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """local[2,2]: two threads, and a failed task is retried once (local mode's maxFailures)."""
    from relay.spark import session

    s = session(
        "relay-tests",
        master="local[2,2]",
        **{
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.driver.memory": "768m",
        },
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone master and one worker (2 cores) on 127.0.0.1, stopped at the end."""
    from tests.spark.standalone import Standalone

    cluster = Standalone(tmp_path_factory.mktemp("standalone"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
