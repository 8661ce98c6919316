#!/usr/bin/env bash
# Makes what the images need on a machine that reaches neither Docker Hub nor PyTorch's index,
# only Debian's mirror and the Python package index it is configured for:
#   1. the base image poolwire-base:bookworm-py311: Debian bookworm's Python 3.11 in a venv at
#      /opt/venv (first on PATH, so `pip` and `python` in the Dockerfiles are its own), made by
#      mmdebstrap from this machine's apt sources and loaded with `docker import`;
#   2. a wheelhouse: torch==$TORCH_VERSION and every package the images install, fetched with
#      this machine's own `pip download` (its configuration decides where from: here the CPU
#      build of torch lies on the disk), laid out as a PEP 503 index (simple/<name>/<file>)
#      that deploy/images/build.sh serves on 127.0.0.1 to `docker build --network host`.
# Both are kept under $POOLWIRE_IMAGE_CACHE (default ~/.cache/poolwire/images) and made again
# only when missing or when the package list changed. Needs root (mmdebstrap, dockerd).
#   deploy/images/make_base.sh            # prints the base image's name and the index folder
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${POOLWIRE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/poolwire/images}
BASE_IMAGE=${POOLWIRE_BASE_IMAGE:-poolwire-base:bookworm-py311}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PYTHON=${PYTHON:-python3}
mkdir -p "$CACHE"

log() { echo "make_base: $*" >&2; }

# --- 1. the base image -------------------------------------------------------------------
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "$BASE_IMAGE is already loaded"
else
    tarball=$CACHE/bookworm-py311.tar
    # Anything but a non-empty regular file there is what an interrupted or older run left.
    [ -f "$tarball" ] && [ -s "$tarball" ] || rm -rf "$tarball" "$tarball.part"
    if [ ! -f "$tarball" ]; then
        command -v mmdebstrap >/dev/null || {
            log "installing mmdebstrap (Debian package)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
        }
        # The machine's own apt sources, so the root filesystem comes from the mirror this
        # machine reaches; Debian's default mirror where it has no deb822 file.
        sources=/etc/apt/sources.list.d/debian.sources
        [ -f "$sources" ] || sources=http://deb.debian.org/debian
        log "mmdebstrap bookworm (python3.11, venv, wget for the NATS healthcheck, useradd)"
        start=$(date +%s)
        # minbase: Essential packages and apt only (apt stays, for Dockerfile.gpu's compiler).
        # The venv: Debian's own Python refuses a system-wide `pip install` (PEP 668).
        # --format=tar: mmdebstrap otherwise picks the format from the file name, and
        # "*.tar.part" names none, so it would write a directory.
        mmdebstrap --quiet --variant=minbase --format=tar \
            --include=python3,python3-venv,ca-certificates,wget,passwd \
            --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
            bookworm "$tarball.part" "$sources"
        mv "$tarball.part" "$tarball"
        log "root filesystem made in $(( $(date +%s) - start )) s"
    fi
    docker import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python"]' \
        "$tarball" "$BASE_IMAGE" >/dev/null
    log "imported $BASE_IMAGE"
fi

# --- 2. the wheelhouse -------------------------------------------------------------------
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    log "$PYTHON is not Python 3.11 (the images' Python): set PYTHON=python3.11"; exit 1; }
# Exactly what the Dockerfiles install: their own RUN line lists the requirements (so this
# list cannot drift from them), plus torch, the build backend of `pip install .` and, for
# Dockerfile.gpu, Triton.
requirements=$CACHE/requirements.txt
{
    echo "torch==$TORCH_VERSION"
    "$PYTHON" -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'][0])"
    for dockerfile in Dockerfile Dockerfile.gpu; do
        program=$(sed -n 's/^RUN python -c "\(.*\)" > \/tmp\/requirements.txt.*/\1/p' "$dockerfile")
        "$PYTHON" -c "$program"
    done
} | sort -u > "$requirements.new"
wheels=$CACHE/wheels
if [ -f "$requirements" ] && cmp -s "$requirements" "$requirements.new" && [ -d "$CACHE/simple" ]; then
    rm "$requirements.new"
    log "wheelhouse is up to date ($(ls "$wheels" | wc -l) files)"
else
    mv "$requirements.new" "$requirements"
    log "pip download into $wheels"
    start=$(date +%s)
    mkdir -p "$wheels"
    # (pip's warnings about this machine's empty extra indexes are noise here.)
    "$PYTHON" -m pip download --quiet --dest "$wheels" -r "$requirements" 2>&1 \
        | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2 \
        || { log "pip download failed"; exit 1; }
    rm -rf "$CACHE/simple"
    # PEP 503: one folder per normalized project name. The folder listing that
    # `python -m http.server` makes of it is the page pip reads.
    "$PYTHON" - "$wheels" "$CACHE/simple" <<'EOF'
import os, re, sys
from pathlib import Path
wheels, simple = Path(sys.argv[1]), Path(sys.argv[2])
for f in sorted(wheels.iterdir()):
    name = f.name[:-len(".tar.gz")].rsplit("-", 1)[0] if f.name.endswith(".tar.gz") else f.name.split("-")[0]
    folder = simple / re.sub(r"[-_.]+", "-", name).lower()
    folder.mkdir(parents=True, exist_ok=True)
    os.link(f, folder / f.name)
EOF
    log "wheelhouse filled in $(( $(date +%s) - start )) s: $(ls "$wheels" | wc -l) files, $(du -sh "$wheels" | cut -f1)"
fi
ls "$wheels" | grep -q "^torch-$TORCH_VERSION" || {
    log "the wheelhouse has no torch $TORCH_VERSION wheel"; exit 1; }
echo "BASE_IMAGE=$BASE_IMAGE"
echo "INDEX_DIR=$CACHE"
