#!/usr/bin/env bash
# The chaos suite (tests/chaos) needs, besides the servers the other steps start:
#  - rabbitmqctl on this machine (stop_app/start_app, memory alarm of the local node);
#  - initdb and pg_ctl under /usr/lib/postgresql/*/bin (a private throwaway cluster);
#  - runuser and a `postgres` OS user (initdb refuses to run as root).
# Idempotent: installs only what is missing.
set -euo pipefail

need=()
command -v rabbitmqctl >/dev/null 2>&1 || need+=(rabbitmq-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${need[@]}"
fi
id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
echo "failure step: rabbitmqctl, initdb, runuser and the postgres user are present"
