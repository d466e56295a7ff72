#!/usr/bin/env bash
# tests/integration/test_tls.py makes a throw-away certificate with the openssl command;
# tests/integration/test_status_page.py needs Chromium (below).
# Everything else the operations tests need (hadolint, the Compose and Kubernetes schemas,
# prometheus-client) comes from pip through the `test` extra. Idempotent; runs as root.
set -euo pipefail

if ! command -v openssl >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openssl
fi
openssl version

# tests/integration/test_status_page.py renders the relay's status page in a real headless
# browser and takes a screenshot: Debian's Chromium.
if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
chromium --version
