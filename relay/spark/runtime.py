"""A SparkSession with the PostgreSQL JDBC driver, added to what the cluster configured."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay.spark.config import load_settings
from relay.spark.dsn import JDBC_DRIVER_CLASS
from relay.spark.errors import JdbcDriverNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Where Debian's libpostgresql-jdbc-java puts the driver.
DEBIAN_JDBC_JAR = "/usr/share/java/postgresql.jar"
#: The Maven coordinates of the driver (for spark.jars.packages / --packages).
JDBC_PACKAGE = "org.postgresql:postgresql"

_HOW_TO_FIX = (
    "Install it with `apt-get install libpostgresql-jdbc-java` (it lands at "
    f"{DEBIAN_JDBC_JAR}), or set RELAY_SPARK_JDBC_JAR to the path of a postgresql-*.jar, "
    "or pass spark.jars yourself."
)
_HOW_TO_SUBMIT = (
    f"spark-submit started the driver without it: add `--jars {DEBIAN_JDBC_JAR}` (any "
    f"postgresql-*.jar) or `--packages {JDBC_PACKAGE}:<version>` to the spark-submit command."
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


def driver_configured(conf: Mapping[str, str]) -> bool:
    """True when the Spark configuration already brings the driver: a postgresql jar in
    spark.jars or a class path setting, or the Maven package in spark.jars.packages."""
    return (
        JDBC_PACKAGE in conf.get("spark.jars.packages", "")
        or any(
            _has_postgres_jar(conf.get(key))
            for key in ("spark.jars", "spark.driver.extraClassPath",
                        "spark.executor.extraClassPath")
        )
    )


def spark_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """spark-defaults.conf of SPARK_CONF_DIR, else of SPARK_HOME/conf (pyspark's own folder
    when SPARK_HOME is unset): what spark-submit would read."""
    env = os.environ if environ is None else environ
    conf_dir = env.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = env.get("SPARK_HOME")
        if not home:
            import pyspark

            home = str(Path(pyspark.__file__).parent)
        conf_dir = str(Path(home) / "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    values: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.strip().split(None, 1)
            if len(parts) == 2 and not parts[0].startswith("#"):
                values[parts[0]] = parts[1].strip()
    return values


def under_spark_submit() -> bool:
    """True in a Python driver that spark-submit (or a platform) started: its JVM and
    configuration exist already."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _submitted_conf() -> dict[str, str]:
    """The configuration spark-submit gave the running JVM (its args and spark-defaults)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to the JVM spark-submit started
    return {str(k): str(v) for k, v in SparkConf().getAll()}


def _driver_on_class_path() -> bool:
    """True when the running driver JVM can load the JDBC driver (a platform's own copy)."""
    from pyspark import SparkContext

    jvm: Any = SparkContext._jvm
    try:
        jvm.java.lang.Class.forName(JDBC_DRIVER_CLASS)
    except Exception:  # py4j raises Py4JJavaError(ClassNotFoundException)
        return False
    return True


def session(app_name: str = "outbox-job", master: str | None = None, **conf: Any) -> SparkSession:
    """A SparkSession with the JDBC driver, configured around what is already there.

    Under spark-submit the submitted configuration is left alone (the driver must come with
    it: --jars, --packages or the platform's class path). Otherwise spark-defaults.conf and
    `conf` are kept, the jar is appended to spark.jars, the master is `master`, else the one
    spark-defaults names, else local[*]; a local master also gets PYSPARK_PYTHON (this
    interpreter) and SPARK_LOCAL_IP=127.0.0.1 when unset. `conf`: `**{"spark.x.y": "v"}`.
    """
    from pyspark.sql import SparkSession

    settings = {str(k): str(v) for k, v in conf.items()}
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if under_spark_submit():
        submitted = _submitted_conf() | settings
        if not driver_configured(submitted) and not _driver_on_class_path():
            raise JdbcDriverNotFound(f"the PostgreSQL JDBC driver is not loaded. {_HOW_TO_SUBMIT}")
    else:
        merged = spark_defaults() | settings
        effective = master or merged.get("spark.master") or "local[*]"
        if master is None and "spark.master" not in merged:
            builder = builder.master(effective)
        if effective.startswith("local"):
            # Local workers must run the driver's interpreter (the one with relay installed);
            # the loopback avoids a host name lookup warning on machines like CI runners.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if not driver_configured(merged) or load_settings().spark_jdbc_jar:
            jars = merged.get("spark.jars", "")
            jar = jdbc_jar()
            settings["spark.jars"] = jar if not jars else (
                jars if jar in jars.split(",") else f"{jars},{jar}"
            )
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def master_is_local(master: str) -> bool:
    """True when every executor of `master` runs on this machine: local[...], or a standalone
    master on a loopback address (whose workers a test or a laptop runs here)."""
    from relay.spark.dsn import is_loopback

    if master.startswith("local"):
        return True
    if master.startswith("spark://"):
        hosts = [spec.rsplit(":", 1)[0] for spec in master[len("spark://"):].split(",")]
        return all(is_loopback(h) and h for h in hosts)
    return False
