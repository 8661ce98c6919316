#!/usr/bin/env bash
# Builds poolwire's images on a machine without Docker Hub or PyTorch's index (docs/DEPLOYMENT.md):
# the base image and the wheelhouse from make_base.sh, the wheelhouse served as a package index
# on 127.0.0.1 for the length of the build, `docker build --network host` so the build reaches it
# (and, for Dockerfile.gpu's compiler, Debian's mirror) the way this machine does.
#   deploy/images/build.sh          # poolwire:cpu
#   deploy/images/build.sh --gpu    # also poolwire:gpu-check: Dockerfile.gpu's steps on the same
#                                   # local base with the CPU torch (no CUDA base can be had here)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
gpu=0
[ "${1:-}" = "--gpu" ] && gpu=1

made=$(deploy/images/make_base.sh)
eval "$made"   # BASE_IMAGE and INDEX_DIR

# A fixed port: the index URL is a build argument, part of each RUN's cache key, so a port that
# changed would rebuild every layer from torch on. Another one only when that port is taken.
port=${POOLWIRE_INDEX_PORT:-38517}
"$PYTHON" -c "import socket; socket.socket().bind(('127.0.0.1', $port))" 2>/dev/null || {
    port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "build: port ${POOLWIRE_INDEX_PORT:-38517} is taken, the index is on $port (no layer cache from earlier builds)" >&2
}
"$PYTHON" -m http.server --bind 127.0.0.1 --directory "$INDEX_DIR" "$port" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/simple/', timeout=1)" 2>/dev/null && break
    sleep 0.2
done
index=http://127.0.0.1:$port/simple/

build() {  # TAG DOCKERFILE
    local start old
    start=$(date +%s)
    old=$(docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true)
    # The legacy builder: Debian's docker.io has no buildx, and this build needs nothing of BuildKit.
    local log=${TMPDIR:-/tmp}/poolwire-build-${2}.log
    DOCKER_BUILDKIT=0 docker build --network host -t "$1" -f "$2" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --build-arg "TORCH_INDEX_URL=$index" \
        --build-arg "PIP_INDEX_URL=$index" . >"$log" 2>&1 || {
        tail -n 40 "$log" >&2; echo "build: $2 failed (whole log: $log)" >&2; return 1; }
    # The image this one replaces, untagged now: its layers would only fill the disk.
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$1")" ]; then
        docker image rm "$old" >/dev/null 2>&1 || true
    fi
    echo "build: $1 from $2 in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}')" >&2
}
build poolwire:cpu Dockerfile
if [ "$gpu" = 1 ]; then
    build poolwire:gpu-check Dockerfile.gpu
fi
