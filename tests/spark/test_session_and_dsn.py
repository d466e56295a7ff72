"""session() keeps what a cluster configured; the DSN is resolved on the driver; a loopback
database host is refused where executors run elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import relay.spark
from relay.dsn import parse
from relay.errors import ConfigError
from relay.spark.dsn import conninfo, libpq_params
from relay.spark.runtime import driver_configured, master_is_local, spark_defaults
from relay.spark.writer import check_reachable

pytestmark = pytest.mark.spark


def test_relay_spark_modules__do_not_shadow_stdlib_modules_when_a_job_file_is_submitted() -> None:
    # spark-submit relay/spark/example_job.py puts relay/spark/ first on sys.path.
    names = {p.stem for p in Path(relay.spark.__file__).parent.glob("*.py")}
    assert names & sys.stdlib_module_names == set()


@pytest.mark.parametrize("master", ["yarn", "k8s://https://api:6443", "spark://10.0.0.5:7077",
                                    "spark://spark-master:7077"])
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "/var/run/postgresql", ""])
def test_check_reachable__loopback_database_with_remote_executors_is_an_error(
    master: str, host: str
) -> None:
    params = libpq_params(f"host='{host}' dbname=x user=u", environ={})
    with pytest.raises(ConfigError, match="executors can reach") as info:
        check_reachable(master, params)
    assert master in str(info.value)


@pytest.mark.parametrize("master", ["local[*]", "local[2,2]", "spark://127.0.0.1:7077"])
def test_check_reachable__loopback_database_is_fine_when_executors_run_here(master: str) -> None:
    assert master_is_local(master)
    check_reachable(master, libpq_params("host=localhost dbname=x user=u", environ={}))


def test_check_reachable__remote_database_is_fine_for_any_master() -> None:
    assert not master_is_local("yarn")
    check_reachable("yarn", libpq_params("host=db.internal dbname=x user=u", environ={}))


def test_conninfo__carries_what_pg_variables_gave_the_driver() -> None:
    environ = {"PGHOST": "db.internal", "PGPORT": "6432", "PGUSER": "spark",
               "PGPASSWORD": "it's secret", "PGSSLMODE": "require"}
    shipped = dict(parse(conninfo(libpq_params("dbname=orders", environ=environ))).params)
    assert shipped == {"dbname": "orders", "host": "db.internal", "port": "6432",
                       "user": "spark", "password": "it's secret", "sslmode": "require"}


@pytest.mark.parametrize(("conf", "expected"), [
    ({}, False),
    ({"spark.jars": "/opt/a.jar,/opt/postgresql-42.7.4.jar"}, True),
    ({"spark.jars.packages": "org.postgresql:postgresql:42.7.4"}, True),
    ({"spark.driver.extraClassPath": "/databricks/jars/postgresql.jar"}, True),
    ({"spark.jars": "/opt/delta.jar"}, False),
])
def test_driver_configured__recognises_jars_packages_and_class_path(
    conf: dict[str, str], expected: bool
) -> None:
    assert driver_configured(conf) is expected


def test_spark_defaults__read_from_spark_conf_dir(tmp_path: Path) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\nspark.master   spark://m:7077\nspark.jars /opt/a.jar\n\n")
    assert spark_defaults({"SPARK_CONF_DIR": str(tmp_path)}) == {
        "spark.master": "spark://m:7077", "spark.jars": "/opt/a.jar"}


_PROBE = """
import json, os
from relay.spark import session
s = session("probe")
conf = s.sparkContext.getConf()
print(json.dumps({"master": s.sparkContext.master, "jars": conf.get("spark.jars"),
                  "local_ip": os.environ.get("SPARK_LOCAL_IP")}))
s.stop()
"""


def test_session__keeps_spark_defaults_master_and_jars_and_appends_the_driver(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other-lib.jar"
    with zipfile.ZipFile(other, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    (tmp_path / "spark-defaults.conf").write_text(
        f"spark.master local[1]\nspark.jars {other}\nspark.ui.enabled false\n")
    env = {k: v for k, v in os.environ.items()
           if k not in {"SPARK_LOCAL_IP", "PYSPARK_GATEWAY_PORT", "RELAY_SPARK_JDBC_JAR"}}
    env["SPARK_CONF_DIR"] = str(tmp_path)

    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=180, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["master"] == "local[1]"
    jars = seen["jars"].split(",")
    assert jars[0] == str(other)
    assert any("postgresql" in j for j in jars[1:])
    assert seen["local_ip"] == "127.0.0.1"  # a local run
