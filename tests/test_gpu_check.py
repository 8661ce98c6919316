"""bench/gpu_check.sh's argument handling and its plan, checked on a CPU machine with --dry-run
(which prints each command instead of running it): no GPU is needed to see that the one
command runs the kernel tests, the kernel benchmark and the end-to-end benchmark as asked."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh"


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})


def test_help_describes_the_three_steps():
    out = gpu_check("--help")
    assert out.returncode == 0
    assert "kernel tests" in out.stdout and "bench/kernels.py" in out.stdout
    assert "in each precision" in out.stdout and "--dry-run" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown option '--bogus'"),
    (["--texts", "0"], "--texts needs a positive whole number, got '0'"),
    (["--texts"], "--texts needs a value"),
    (["--device", "cpu"], "--device cpu: the kernel steps need CUDA; add --skip-kernels"),
])
def test_bad_arguments_exit_2_naming_the_value(args, message):
    out = gpu_check(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_the_plan_runs_kernel_tests_kernel_benchmark_and_every_precision_mode():
    out = gpu_check("--dry-run")
    assert out.returncode == 0, out.stderr
    commands = [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]
    assert any("pytest tests/test_kernels.py -m gpu" in c for c in commands), commands
    assert any("bench/kernels.py" in c for c in commands), commands
    e2e = [c for c in commands if "bench/throughput.py" in c]
    assert len(e2e) == 1 and "--device cuda --modes exact,fast,float16" in e2e[0]
    assert "--configs inprocess,c1,c64,4x32 --texts 2000" in e2e[0]
    assert any("bench/ceiling.py --device cuda" in c for c in commands), commands
    service = [c for c in commands if "bench/service_cost.py" in c]
    assert len(service) == 2 and all("--worker-args=--device cuda" in c for c in service)
    assert "--processes" not in service[0] and "--processes 2" in service[1]  # one GPU, two processes


def test_the_throughput_step_alone_on_a_cpu():
    out = gpu_check("--dry-run", "--skip-kernels", "--device", "cpu", "--texts", "40",
                    "--modes", "exact,fast", "--configs", "inprocess,c1")
    assert out.returncode == 0, out.stderr
    commands = [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]
    assert not any("kernels" in c for c in commands), commands
    assert any(c.endswith("bench/throughput.py --device cpu --modes exact,fast --configs "
                          "inprocess,c1 --texts 40 --settle-s 0 --latency-reps 200")
               for c in commands), commands
