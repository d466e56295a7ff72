"""A SparkSession with the PostgreSQL JDBC driver on its class path."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay.spark.config import load_settings
from relay.spark.errors import JdbcDriverNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Where Debian's libpostgresql-jdbc-java puts the driver.
DEBIAN_JDBC_JAR = "/usr/share/java/postgresql.jar"

_HOW_TO_FIX = (
    "Install it with `apt-get install libpostgresql-jdbc-java` (it lands at "
    f"{DEBIAN_JDBC_JAR}), or set RELAY_SPARK_JDBC_JAR to the path of a postgresql-*.jar, "
    "or pass spark.jars yourself."
)


def _has_postgres_jar(jars: str | None) -> bool:
    return bool(jars) and "postgresql" in str(jars).lower()


def jdbc_jar(spark_jars: str | None = None) -> str:
    """Path of the PostgreSQL JDBC jar: RELAY_SPARK_JDBC_JAR, else a postgresql jar already in
    `spark_jars`, else Debian's /usr/share/java/postgresql.jar. Raises JdbcDriverNotFound,
    saying how to fix it, when none exists."""
    configured = load_settings().spark_jdbc_jar
    if configured:
        if not Path(configured).is_file():
            raise JdbcDriverNotFound(
                f"RELAY_SPARK_JDBC_JAR={configured} is not a file. {_HOW_TO_FIX}"
            )
        return configured
    if spark_jars and _has_postgres_jar(spark_jars):
        return next(j for j in spark_jars.split(",") if "postgresql" in j.lower()).strip()
    if Path(DEBIAN_JDBC_JAR).is_file():
        return DEBIAN_JDBC_JAR
    raise JdbcDriverNotFound(
        f"the PostgreSQL JDBC driver was not found (no RELAY_SPARK_JDBC_JAR, no postgresql jar "
        f"in spark.jars, no {DEBIAN_JDBC_JAR}). {_HOW_TO_FIX}"
    )


def session(app_name: str = "outbox-job", master: str | None = None, **conf: Any) -> SparkSession:
    """A SparkSession (local[*] when no master is given and not under spark-submit) with the
    JDBC driver on its class path. `conf` holds Spark settings: `**{"spark.x.y": "v"}`."""
    from pyspark.sql import SparkSession

    # Local workers must run the driver's interpreter (the one with relay and psycopg), and
    # binding to the loopback avoids a hostname lookup warning on machines like CI runners.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if not under_submit and (master is None or master.startswith("local")):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    jars = conf.pop("spark.jars", None)
    jar = jdbc_jar(jars)
    jars = jar if not jars else (jars if jar in jars else f"{jars},{jar}")

    builder = SparkSession.builder.appName(app_name).config("spark.jars", jars)
    if master is not None:
        builder = builder.master(master)
    elif not under_submit:
        builder = builder.master("local[*]")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    return builder.getOrCreate()
