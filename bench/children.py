"""The processes a benchmark run starts (the worker, the in-process runs): their environment,
and stopping them by PID."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child_env(torch_threads: int | None = None) -> dict[str, str]:
    """The environment of the worker and the in-process run: models from local folders only,
    and the production CPU path (TRITON_INTERPRET, which the tests set, would run the pooling
    kernels through the Triton interpreter and measure that instead)."""
    # Imported here: the child side of this module runs in the peers' virtualenv, without poolwire.
    from poolwire.telemetry_off import ENVIRONMENT as TELEMETRY_ENVIRONMENT

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bar
    # The peers' virtualenv has no poolwire to apply poolwire/telemetry_off.py: its
    # environment switches go to every child here.
    for name, value in TELEMETRY_ENVIRONMENT.items():
        env.setdefault(name, value)
    if torch_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(torch_threads)
    # No PYTHONPATH to the checkout: its entries go before the installed packages, where the
    # checkout's kernels/ stands for Hugging Face's `kernels` (bench/__init__.py). Children that
    # import bench.* run as `python -m bench.<name>` from ROOT instead.
    return env


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM by PID (the worker drains and exits), SIGKILL if it does not."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
