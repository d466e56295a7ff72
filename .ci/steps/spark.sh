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
