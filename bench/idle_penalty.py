"""`bench/idle_penalty.py`: what one piece of the worker's own work costs on this machine warm,
right after the CPU idled, and while other processes keep every core busy. It is the machine's
part in `bench/service_cost.py`'s figures, measured apart from NATS and the event loop.

    python bench/idle_penalty.py            # about a minute
    python bench/idle_penalty.py --gap-ms 1 --calls 300

The pieces are service_cost's near-zero model loaded as `poolwire serve` loads it (backend
`auto`: OpenVINO where installed, with its default threads) and the engine's own calls:
- the Rust tokenizer on one short text, as the engine encodes a lone request;
- `run_batch` on one short text: padding, the backend's forward pass, pooling;
- `run_batch` on 22 short texts: the batch size seen at 64 requests in flight.

Each runs `--calls` times in three conditions, and the median CPU of the calling thread per call
is printed, with its ratio to the warm figure:
- **back to back**: warm caches, a busy core;
- **after an idle gap**: a `--gap-ms` sleep before each call, as one request at a time leaves
  the worker idle between requests (on a VM the core may be given to other work meanwhile);
- **beside busy cores**: one spinning process per core, stopped by PID afterwards, as the
  client and nats-server keep the cores busy at 64 requests in flight.

The process's CPU per call (every thread's, so a backend thread that spins while the caller
sleeps is counted) is printed beside it. Numbers to compare on one machine, never assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402
from bench.children import stop_process  # noqa: E402
from bench.machine import describe  # noqa: E402
from bench.service_cost import build_near_zero_model  # noqa: E402
from bench.workload import is_short, mixed_texts  # noqa: E402

BATCH = 22  # the mean batch at 64 requests in flight, one text each (bench/service_cost.py)
SPIN = "while True: pass"


def timed(call, calls: int, gap_s: float) -> tuple[float, float]:
    """Median CPU seconds of this thread per call, and the process's CPU per call."""
    for _ in range(max(3, calls // 10)):  # warm up in the same condition
        call()
        if gap_s:
            time.sleep(gap_s)
    own = []
    process_before = time.process_time()
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        started = time.thread_time()
        call()
        own.append(time.thread_time() - started)
    return statistics.median(own), (time.process_time() - process_before) / calls


def spinners(cores: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]


def pieces(folder: Path):
    """(name, call) for each piece of work, on the model as the worker loads it."""
    from poolwire.models.backend_choice import build_backend
    from poolwire.models.forward import run_batch
    from poolwire.models.model import load_model
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import Tokenizing

    model = load_model(folder)
    backend = build_backend("auto", model, "exact", "float32", folder / "openvino-cache")
    tokenizing = Tokenizing(model.tokenizer, model.max_length)
    texts = [t for t in mixed_texts(200, seed=7) if is_short(t)][:BATCH]
    seqs = tokenizing.texts(texts, None, "right")
    spec = PoolSpec(Forward.HIDDEN, method="mean", normalize=True)
    return backend.describe(), [
        ("tokenize one short text", lambda: tokenizing.texts(texts[:1], None, "right")),
        ("run_batch, 1 short text", lambda: run_batch(backend, seqs[:1], [spec])),
        (f"run_batch, {BATCH} short texts", lambda: run_batch(backend, seqs, [spec] * BATCH)),
    ]


def table(rows, gap_ms: float, cores: int) -> str:
    """rows: (work, back to back, after the gap, beside busy cores), each figure a pair of
    (this thread's CPU s, the process's CPU s) per call."""
    def cell(figures, warm_s):
        own, process = figures
        return f"{own * 1e6:,.0f} us ({own / warm_s:.1f}x); process {process * 1e6:,.0f} us"

    lines = [f"| work | back to back | after a {gap_ms:g} ms idle gap | beside {cores} busy "
             f"cores |", "| --- | ---: | ---: | ---: |"]
    for name, warm, idle, crowded in rows:
        lines.append(f"| {name} | {warm[0] * 1e6:,.0f} us; process {warm[1] * 1e6:,.0f} us "
                     f"| {cell(idle, warm[0])} | {cell(crowded, warm[0])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=count, default=200, help="timed calls per condition")
    p.add_argument("--gap-ms", type=float, default=4.0,
                   help="the idle gap before each call (default 4: one request at a time's "
                        "round trip)")
    args = p.parse_args(argv)
    if args.gap_ms <= 0:
        p.error(f"--gap-ms must be above 0, got {args.gap_ms}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="poolwire-idle-") as tmp:
        backend, work = pieces(build_near_zero_model(Path(tmp) / "near-zero"))
        rows = []
        for name, call in work:
            warm = timed(call, args.calls, 0.0)
            idle = timed(call, args.calls, args.gap_ms / 1000)
            busy = spinners(cores)
            try:
                crowded = timed(call, args.calls, 0.0)
            finally:
                for proc in busy:
                    stop_process(proc, timeout=5)
            rows.append((name, warm, idle, crowded))
    command = " ".join(["python bench/idle_penalty.py",
                        *(argv if argv is not None else sys.argv[1:])])
    print(f"CPU: {describe()}")
    print(f"Model: the near-zero model of bench/service_cost.py, {backend}")
    print()
    print(table(rows, args.gap_ms, cores))
    print()
    print("CPU of the calling thread per call (median), its ratio to back to back, and the "
          "process's CPU per call (all threads: a backend thread spinning while the caller "
          "sleeps shows there).")
    print(f"command: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
