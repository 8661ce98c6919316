"""The machine a benchmark ran on, in one line for its report: cores, CPU model, the CPU flags
that decide which kernels the backends can use, and Python's version."""

import os
import platform
from pathlib import Path

# The CPU flags that decide which kernels the backends can use.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
         "amx_int8", "amx_tile")


def describe() -> str:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass  # no /proc (not Linux): the model as platform names it, no flags
    shown = [f for f in FLAGS if f in flags]
    bf16 = "" if {"avx512_bf16", "amx_bf16"} & flags else "; no native bfloat16"
    return (f"{os.cpu_count()} CPU cores ({model}; flags {' '.join(shown) or 'none listed'}{bf16}), "
            f"Python {platform.python_version()}")
