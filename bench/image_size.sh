#!/usr/bin/env bash
# What the CPU image installs on top of python:3.11-slim, measured without a Docker engine: the
# same dependency list as the Dockerfile (torch's CPU build, no Triton) installed into a fresh
# virtualenv, then its size on disk. Prints MiB per largest package and the total.
#   bash bench/image_size.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt)
python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.startswith('triton')))" > "$tmp/requirements.txt"
"${pip[@]}" -r "$tmp/requirements.txt" 2> >(grep -v 'is ignored' >&2)
"${pip[@]}" --no-deps . 2> >(grep -v 'is ignored' >&2)
site=$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
echo "largest installed packages (MiB):"
du -sm "$site"/* | sort -rn | head -8 | sed "s|$site/||"
echo "total site-packages: $(du -sm "$site" | cut -f1) MiB (the CPU image adds this to python:3.11-slim)"
