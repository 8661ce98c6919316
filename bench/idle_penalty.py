"""`bench/idle_penalty.py`: what one piece of the worker's own work costs on this machine warm,
right after the CPU idled, and while other processes keep every core busy. It is the machine's
part in `bench/service_cost.py`'s figures, measured apart from NATS and the event loop.

    python bench/idle_penalty.py            # about a minute
    python bench/idle_penalty.py --gap-ms 1 --calls 300

The pieces are service_cost's near-zero model loaded as `poolwire serve` loads it (backend
`auto`: OpenVINO where installed, with its default threads) and the engine's own calls:
- the Rust tokenizer on one short text, as the engine encodes a lone request;
- `run_batch` on one short text: padding, the backend's forward pass, pooling;
- `run_batch` on 22 short texts: the batch size seen at 64 requests in flight;
- mean pooling of those 22 texts' hidden states, with the PyTorch reference and with the NumPy
  op the forward thread runs on CPU (`kernels/numpy_ops.py`).

Each runs `--calls` times in four conditions, and the median CPU of the calling thread per call
is printed, with its ratio to the warm figure:
- **back to back**: warm caches, a busy core;
- **after an idle gap**: a `--gap-ms` sleep before each call, as one request at a time leaves
  the worker idle between requests (on a VM the core may be given to other work meanwhile);
- **beside busy cores**: one spinning process per core, stopped by PID afterwards, as the
  client and nats-server keep the cores busy at 64 requests in flight;
- **beside a busy event loop**: a thread of this process running Python without a pause, at
  the worker's GIL switch interval, as the event loop does beside the forward thread under
  load. Here the median wall time per call is printed with its ratio to the warm wall time: a
  call that releases the GIL waits to take it back, which costs time, not CPU.

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
import threading
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


def timed(call, calls: int, gap_s: float) -> tuple[float, float, float]:
    """Median CPU seconds of this thread per call, the process's CPU per call, and the median
    wall seconds per call."""
    for _ in range(max(3, calls // 10)):  # warm up in the same condition
        call()
        if gap_s:
            time.sleep(gap_s)
    own, wall = [], []
    process_before = time.process_time()
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        started, started_wall = time.thread_time(), time.perf_counter()
        call()
        own.append(time.thread_time() - started)
        wall.append(time.perf_counter() - started_wall)
    return (statistics.median(own), (time.process_time() - process_before) / calls,
            statistics.median(wall))


def beside_busy_loop(call, calls: int) -> tuple[float, float, float]:
    """`timed` while another thread of this process runs Python without a pause, at the
    worker's switch interval (actors/worker.py), as the event loop does under load."""
    from poolwire.actors.worker import SWITCH_INTERVAL_S

    stop = threading.Event()

    def spin() -> None:
        turns = 0  # pure Python that never waits, as the event loop's work under load
        while not stop.is_set():
            turns += 1

    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    spinner = threading.Thread(target=spin, name="busy-loop", daemon=True)
    spinner.start()
    try:
        return timed(call, calls, 0.0)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(previous)


def spinners(cores: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]


def pieces(folder: Path):
    """(name, call) for each piece of work, on the model as the worker loads it."""
    from poolwire.kernels import seq_pool_numpy, seq_pool_reference
    from poolwire.models.backend_choice import build_backend
    from poolwire.models.forward import pad_batch, run_batch
    from poolwire.models.model import load_model
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import Tokenizing

    model = load_model(folder)
    backend = build_backend("auto", model, "exact", "float32", folder / "openvino-cache")
    tokenizing = Tokenizing(model.tokenizer, model.max_length)
    texts = [t for t in mixed_texts(200, seed=7) if is_short(t)][:BATCH]
    seqs = tokenizing.texts(texts, None, "right")
    spec = PoolSpec(Forward.HIDDEN, method="mean", normalize=True)
    ids, mask, types, lengths = pad_batch(seqs, model.tokenizer.pad_token_id or 0)
    hidden = backend.run(Forward.HIDDEN, ids, mask, types)
    return backend.describe(), [
        ("tokenize one short text", lambda: tokenizing.texts(texts[:1], None, "right")),
        ("run_batch, 1 short text", lambda: run_batch(backend, seqs[:1], [spec])),
        (f"run_batch, {BATCH} short texts", lambda: run_batch(backend, seqs, [spec] * BATCH)),
        (f"mean pool {BATCH} texts, PyTorch reference",
         lambda: seq_pool_reference(hidden, lengths, "mean", normalize=True)),
        (f"mean pool {BATCH} texts, NumPy",
         lambda: seq_pool_numpy(hidden, lengths, "mean", normalize=True)),
    ]


def table(rows, gap_ms: float, cores: int) -> str:
    """rows: (work, back to back, after the gap, beside busy cores, beside a busy event loop),
    each figure a triple of (this thread's CPU s, the process's CPU s, wall s) per call."""
    def cell(figures, warm):
        own, process, _ = figures
        return f"{own * 1e6:,.0f} us ({own / warm[0]:.1f}x); process {process * 1e6:,.0f} us"

    def wall_cell(figures, warm):
        own, _, wall = figures
        return f"{wall * 1e6:,.0f} us wall ({wall / warm[2]:.1f}x); CPU {own * 1e6:,.0f} us"

    lines = [f"| work | back to back | after a {gap_ms:g} ms idle gap | beside {cores} busy "
             f"cores | beside a busy event loop |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, warm, idle, crowded, looped in rows:
        lines.append(f"| {name} | {warm[0] * 1e6:,.0f} us; process {warm[1] * 1e6:,.0f} us "
                     f"| {cell(idle, warm)} | {cell(crowded, warm)} | {wall_cell(looped, warm)} |")
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
            rows.append((name, warm, idle, crowded, beside_busy_loop(call, args.calls)))
    command = " ".join(["python bench/idle_penalty.py",
                        *(argv if argv is not None else sys.argv[1:])])
    print(f"CPU: {describe()}")
    print(f"Model: the near-zero model of bench/service_cost.py, {backend}")
    print()
    print(table(rows, args.gap_ms, cores))
    print()
    print("CPU of the calling thread per call (median), its ratio to back to back, and the "
          "process's CPU per call (all threads: a backend thread spinning while the caller "
          "sleeps shows there); beside a busy event loop, the median wall time per call against "
          "the back-to-back wall time, and the calling thread's CPU.")
    print(f"command: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
