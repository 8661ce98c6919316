#!/usr/bin/env bash
# Check the Triton kernels on a CUDA machine, in under 5 minutes: the gpu-marked kernel tests
# (compiled kernels against the PyTorch references), then one benchmark table.
#
#   bash bench/gpu_check.sh            # PYTHON=/path/to/python picks the interpreter (default python3)
#
# Works on a bare machine that may have no network: it installs only what is not importable yet,
# and goes on when an install fails but the package is there. Exit status: 0 all good, 1 a test or
# a benchmark check failed, 2 no usable CUDA / torch / triton.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PY=${PYTHON:-python3}
DEADLINE=285 # seconds for the whole script, leaving a margin under 5 minutes
# Compiled kernels: the interpreter would only re-test the CPU path, and the benchmark refuses it.
export TRITON_INTERPRET=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

missing_modules() {
    local m out=()
    for m in torch triton pytest hypothesis; do
        "$PY" -c "import $m" >/dev/null 2>&1 || out+=("$m")
    done
    echo "${out[@]:-}"
}

pip_install() {
    # Fail fast without a network (no retries), then try the variants an externally managed
    # (PEP 668) system python needs; whichever works first wins.
    local opts=(-q --retries 0 --timeout 15)
    "$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip --upgrade >/dev/null 2>&1 || true
    timeout 150 "$PY" -m pip install "${opts[@]}" "$@" ||
        timeout 150 "$PY" -m pip install "${opts[@]}" --break-system-packages "$@" ||
        timeout 150 "$PY" -m pip install "${opts[@]}" --user --break-system-packages "$@"
}

log "environment"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
need=$(missing_modules)
if [[ -n "$need" ]]; then
    log "installing: $need"
    # shellcheck disable=SC2086  # one word per package
    pip_install $need || echo "pip could not install everything; going on with what is importable"
fi
if ! "$PY" - <<'EOF'; then
import sys
try:
    import hypothesis, pytest, torch, triton
except ImportError as exc:
    sys.exit(f"missing {exc.name}: install torch (CUDA build), triton, pytest and hypothesis for {sys.executable}")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda})")
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, device {torch.cuda.get_device_name()}")
EOF
    exit 2
fi

log "kernel tests on CUDA (-m gpu)"
# --noconftest and an empty addopts keep this check independent of the rest of the suite's
# fixtures and plugins (NATS, asyncio), which a bare GPU box may lack; the kernel test modules
# set TRITON_INTERPRET themselves and need nothing from conftest.
timeout 150 "$PY" -m pytest tests/test_kernels.py -m gpu -q -p no:cacheprovider --noconftest \
    -o addopts="" -W ignore::pytest.PytestUnknownMarkWarning
tests_rc=$?

left=$((DEADLINE - SECONDS))
quick=()
((left < 120)) && quick=(--quick) # a long install or compile ate the time: a shorter table
log "benchmark ${quick[*]:-}(limit ${left}s)"
if ((left > 20)); then
    timeout "$left" "$PY" bench/kernels.py "${quick[@]}"
    bench_rc=$?
else
    echo "no time left for the benchmark"
    bench_rc=1
fi

log "done: tests exit $tests_rc, benchmark exit $bench_rc"
((tests_rc == 0 && bench_rc == 0)) && exit 0
((bench_rc == 2)) && exit 2
exit 1
