"""A poolwire setup: `python -m poolwire serve` started fresh for each setup and precision mode
(so its peak RSS is that setup's own), driven over NATS in the setup's shape, and made a row of
the table, its outputs compared with the in-process float32 ones."""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.children import child_env, stop_process
from bench.meters import peak_rss_mib
from bench.nats_load import PREFIX, drive
from bench.progress import log
from bench.setups import Setup
from bench.table import Row
from bench.workload import mixed_texts


class WorkerProcess:
    """`python -m poolwire serve` in a process of its own, as in production."""

    def __init__(self, url: str, model: str | None, worker_args: list[str], log_path: Path,
                 profile_path: Path | None = None, torch_threads: int | None = None,
                 program: list[str] | None = None) -> None:
        self.url = url
        # What runs in place of `-m poolwire serve` (bench/floor_worker.py), taking its options.
        self.program = program or ["-m", "poolwire", "serve"]
        self.torch_threads = torch_threads
        self.model = model
        self.worker_args = worker_args
        self.log_path = log_path
        self.profile_path = profile_path
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 180.0) -> None:
        cmd = [sys.executable]
        if self.profile_path is not None:
            cmd += ["-m", "cProfile", "-o", str(self.profile_path)]
        cmd += [*self.program, "--nats-url", self.url, "--prefix", PREFIX]
        if self.model:
            cmd += ["--model", self.model]
        cmd += self.worker_args
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT,
                                     env=child_env(self.torch_threads))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "configured task" in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.proc.returncode} before it was "
                                   f"ready; its log ({self.log_path}):\n{text[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"the worker did not print its 'configured task' line within "
                           f"{timeout} s; its log: {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self._log_file.close()


def run_poolwire(setup: Setup, url: str, texts: list[str], tokens: list[int], truncate: bool,
                 args: argparse.Namespace, workdir: Path, mode: str = "exact",
                 reference=None) -> Row:
    from bench.precision_modes import ACCURACY, MODE_ARGS

    key = setup.key if mode == "exact" else f"{setup.key}-{mode}"
    label = setup.label if mode == "exact" else f"{setup.label}, {mode}"
    profile = Path(args.profile_worker) / f"worker-{key}.prof" if args.profile_worker else None
    worker_args = ["--device", args.device, *MODE_ARGS[mode], *shlex.split(args.worker_args or "")]
    model = args.model
    if setup.task == "classify":
        model, worker_args = args.classifier, [*worker_args, "--task", "classify"]
    worker = WorkerProcess(url, model, worker_args, workdir / f"worker-{key}.log", profile,
                           args.torch_threads)
    log(f"{label}: starting a worker")
    t0 = time.perf_counter()
    try:
        worker.start()
        log(f"{label}: worker ready after {time.perf_counter() - t0:.1f} s; running")
        result = asyncio.run(drive(url, texts, tokens, setup, timeout=args.timeout_s,
                                   truncate=truncate, worker_pid=worker.pid, label=label,
                                   warmup=mixed_texts(64, seed=args.seed + 1),
                                   settle_s=args.settle_s))
        rss = peak_rss_mib(worker.pid)
    finally:
        worker.stop()
    if profile is not None and profile.exists():
        _print_profile(profile, label)
    row = Row(key, label, len(texts), sum(tokens), result.wall_s, result.latencies_ms,
              rss, requests=len(result.latencies_ms), errors=result.errors,
              worker_stats=result.worker_stats or {},
              short_latencies_ms=result.short_latencies_ms, task=setup.task,
              cpu_s={"worker_main": result.worker_cpu_s.get("main", math.nan),
                     "worker_other": result.worker_cpu_s.get("other", math.nan),
                     "client": result.client_cpu_s, "background": result.background_cores})
    served = result.served_precision
    expected = "fast" if mode == "fast" else "exact"
    row.mode = mode if served in (None, expected) else f"{mode} -> {served}"
    if reference is not None and result.vectors is not None:
        row.accuracy = ACCURACY[setup.task](reference, result.vectors)
    if result.errors:
        row.notes.append(f"{result.errors} of {row.requests} requests failed, e.g. "
                         + "; ".join(result.error_samples))
    if result.token_mismatches:
        row.notes.append(f"{result.token_mismatches} replies reported other token counts than "
                         f"the tokenizer here")
    for note in row.notes:
        log(f"{label}: {note}")
    log(f"{label}: {row.texts_per_s:.1f} texts/s, p50 {row.p50_ms:.2f} ms, "
        f"p99 {row.p99_ms:.2f} ms, peak RSS {rss or math.nan:.0f} MiB")
    return row


def _print_profile(path: Path, label: str, top: int = 25) -> None:
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).sort_stats("tottime").print_stats(top)
    log(f"{label}: cProfile of the worker's event-loop thread ({path}), by own time:\n"
        + buf.getvalue())
