#!/usr/bin/env bash
# Builds the project's two images (runtime, spark) with a local Docker engine and exercises them
# against the machine's PostgreSQL and RabbitMQ, alone and as the compose demo's services
# (tests/image/). Idempotent.
#
#   bash .ci/image.sh          # both phases
#   bash .ci/image.sh packages # only the engine's Debian packages (apt: one installer at a time)
#   bash .ci/image.sh build    # the engine's packages, the base image and both images
#   bash .ci/image.sh test     # tests/image against the images built (needs .venv)
#
# .ci/run builds while the machine sets up, lints and runs the mutation check (network and disk
# mostly), and runs the images' tests after the suite, so that no test runs beside a build.
#
# No image registry answers here, so the base image is made locally: a Debian bookworm with
# Python 3.11 by debootstrap from the mirror apt uses, with this machine's CA bundle (the
# package index is reached through it), imported as outbox-relay-ci-base. The engine is
# Debian's docker.io run with host networking only and the overlay2 storage driver (vfs where
# overlay mounts are refused); its data, the base and the logs live under $STATE. Whatever a
# killed run left (engine, containers) is stopped first; the engine stops when this script
# ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
PHASES=${1:-all}
case "$PHASES" in all|packages|build|test) ;; *) echo "usage: $0 [packages|build|test]" >&2; exit 2 ;; esac

STATE=${RELAY_CI_DOCKER_STATE:-/var/tmp/outbox-relay-ci-docker}
export DOCKER_HOST="unix://$STATE/docker.sock"
BASE=outbox-relay-ci-base
log() { printf '==> image: %s\n' "$*"; }

stop_engine() {
  if [ -S "$STATE/docker.sock" ]; then
    docker ps -aq --filter label=outbox-relay-ci | xargs -r docker rm -f >/dev/null 2>&1 || true
  fi
  if [ -f "$STATE/dockerd.pid" ]; then
    kill "$(cat "$STATE/dockerd.pid")" 2>/dev/null || true
    for _ in $(seq 1 30); do [ -f "$STATE/dockerd.pid" ] || break; sleep 1; done
    rm -f "$STATE/dockerd.pid"
  fi
}

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
# Compose v1 (Debian's; v2 cannot be installed here) for tests/image/test_compose.py.
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[ "$PHASES" != packages ] || exit 0

mkdir -p "$STATE"
stop_engine  # what an interrupted run left
trap stop_engine EXIT
start_engine() {  # start_engine <storage driver>: 0 once it answers, 1 if it exits first
  dockerd --iptables=false --bridge=none --storage-driver="$1" \
    --data-root "$STATE/data" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pid" \
    -H "$DOCKER_HOST" >"$STATE/dockerd.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 1
  done
  docker info >/dev/null
}
# overlay2 where the machine lets the engine mount overlays (each layer and container a mount:
# a build and a container's start take seconds); vfs otherwise (each one a full copy of the
# image: minutes for the Spark image).
if start_engine overlay2; then
  log "engine (overlay2, host network only)"
else
  tail -n 3 "$STATE/dockerd.log"
  stop_engine
  start_engine vfs
  log "engine (vfs: overlay2 refused, host network only)"
fi

build() {  # build <target> <tag>
  local started=$SECONDS
  docker build --network host --build-arg "PYTHON_IMAGE=$BASE" --target "$1" -t "$2" . \
    >"$STATE/build-$1.log" 2>&1 || { tail -n 40 "$STATE/build-$1.log"; return 1; }
  log "built $2 in $((SECONDS - started)) s: $(docker image inspect -f '{{.Size}}' "$2" \
    | awk '{printf "%.0f MB", $1 / 1e6}')"
}

if [ "$PHASES" != test ]; then
  if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    # The mirror apt uses for bookworm's main component.
    mirror=$(apt-cache policy | awk '$3 == "bookworm/main" {print $2; exit}')
    log "base image from debootstrap ($mirror)"
    rootfs="$STATE/rootfs"
    rm -rf "$rootfs"
    debootstrap --variant=minbase \
      --include=python3,python3-venv,python-is-python3,ca-certificates \
      bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$STATE/debootstrap.log" 2>&1
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    tar -C "$rootfs" -c . | docker import - "$BASE" >/dev/null
    rm -rf "$rootfs"
  fi
  build runtime outbox-relay:ci
  build spark outbox-relay-spark:ci
fi

if [ "$PHASES" != build ]; then
  for image in outbox-relay:ci outbox-relay-spark:ci; do
    docker image inspect "$image" >/dev/null 2>&1 \
      || { echo "image $image is not built: run bash .ci/image.sh build" >&2; exit 1; }
  done
  log "exercising both images (tests/image)"
  RELAY_TEST_IMAGE=outbox-relay:ci RELAY_TEST_SPARK_IMAGE=outbox-relay-spark:ci \
    .venv/bin/pytest -q -s -p no:cacheprovider --durations=3 tests/image
fi
