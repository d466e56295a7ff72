#!/usr/bin/env bash
# tests/integration/test_tls.py makes a throw-away certificate with the openssl command.
# Everything else the operations tests need (hadolint, the Compose and Kubernetes schemas,
# prometheus-client) comes from pip through the `test` extra. Idempotent; runs as root.
set -euo pipefail

if ! command -v openssl >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openssl
fi
openssl version
