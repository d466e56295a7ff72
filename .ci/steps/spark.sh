#!/usr/bin/env bash
# Spark tests and jobs need a Java runtime (pyspark 4 needs Java 17+) and the PostgreSQL JDBC
# driver, which relay.spark finds at Debian's /usr/share/java/postgresql.jar.
# Idempotent: installs only what is absent. Runs as root.
set -euo pipefail

need=()
if ! command -v java >/dev/null 2>&1; then
    # Debian 12's default JRE is 17; fall back to the explicit package elsewhere.
    if apt-cache show default-jre-headless >/dev/null 2>&1; then
        need+=(default-jre-headless)
    else
        need+=(openjdk-17-jre-headless)
    fi
fi
if [ ! -e /usr/share/java/postgresql.jar ]; then
    need+=(libpostgresql-jdbc-java)
fi

if [ "${#need[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

java -version 2>&1 | head -1
ls -l /usr/share/java/postgresql.jar

# A second virtual environment with Spark 3.5 (the extra accepts >=3.5,<5): tests/spark/
# test_spark35.py runs every test of tests/spark again in it. Created once, then checked.
cd "$(dirname "$0")/../.."
venv35=.venv/spark-3.5
if [ ! -x "$venv35/bin/pytest" ]; then
    echo "==> $venv35 (pyspark 3.5)"
    "${PYTHON:-python3}" -m venv "$venv35"
    "$venv35/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
    # The tested versions of everything else (constraints.txt), pyspark 3.5 instead of 4; its
    # [sql] extra wants numpy below 2, and pyarrow 21 and later need numpy 2: both older here.
    grep -v -i -E '^(pyspark|py4j|numpy|pyarrow)==' constraints.txt > "$venv35/constraints-3.5.txt"
    "$venv35/bin/python" -m pip install -q -c "$venv35/constraints-3.5.txt" \
        -e ".[test,spark]" "pyspark>=3.5.2,<3.6" "pyarrow<21" 2>&1 | grep -v "is ignored" || true
fi
"$venv35/bin/python" -c "import pyspark; print('pyspark', pyspark.__version__, 'in $venv35')"
