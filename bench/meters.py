"""What a benchmark run cost, read from /proc: CPU seconds per process and per thread, peak RSS,
the whole machine's busy time, and from these how many cores other processes kept busy meanwhile
(these benchmarks run on shared development machines)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from bench.progress import log

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM: the process's peak resident set size."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process's main thread and of all its other threads."""
    main = other = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
        if int(tid) == pid:
            main += seconds
        else:
            other += seconds
    return {"main": main, "other": other}


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process, all its threads; OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                kids = [int(k) for k in Path(f"/proc/{parent}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def own_cpu_s() -> float:
    """CPU seconds of this process and every live process it started (worker, nats-server)."""
    me, total = os.getpid(), 0.0
    for pid in [me, *_descendants(me)]:
        try:
            total += process_cpu_s(pid)
        except OSError:
            pass  # it ended between the listing and the reading
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all processes, all cores)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / _CLK_TCK


class BackgroundMeter:
    """How many cores other processes kept busy while we measured: these benchmarks run on
    shared development machines, where someone else's test run halves every number."""

    def __init__(self) -> None:
        self._start = (time.perf_counter(), machine_busy_s(), own_cpu_s())

    def cores(self) -> float:
        wall = time.perf_counter() - self._start[0]
        others = (machine_busy_s() - self._start[1]) - (own_cpu_s() - self._start[2])
        return max(0.0, others / wall) if wall > 0 else math.nan


def wait_for_quiet(max_wait_s: float, threshold: float = 0.25, label: str = "") -> float:
    """Wait (up to max_wait_s) until other processes use under `threshold` cores; returns
    the last reading."""
    deadline = time.monotonic() + max_wait_s
    told = False
    while True:
        meter = BackgroundMeter()
        time.sleep(0.5)
        load = meter.cores()
        if load < threshold or time.monotonic() >= deadline:
            if told or load >= threshold:
                log(f"{label}: other processes use {load:.2f} cores; "
                    + ("going ahead" if load < threshold else f"not quiet after {max_wait_s:.0f} s, "
                       "measuring anyway"))
            return load
        if not told:
            log(f"{label}: other processes use {load:.2f} cores; waiting up to "
                f"{max_wait_s:.0f} s for the machine to be quiet")
            told = True
