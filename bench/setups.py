"""The setups of `--configs`, as values: the in-process runs by name (`inprocess`, `peers`) and
each poolwire load shape as a Setup (`cN`, `KxM`, `clsN`)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

DEFAULT_CONFIGS = "inprocess,peers,c1,c16,c64,4x32"


@dataclass(frozen=True)
class Setup:
    """One poolwire load shape: `connections` x `in_flight` requests of `per_request` texts."""

    key: str
    connections: int
    in_flight: int            # concurrent requests per connection
    per_request: int
    task: str = "embed"       # the subject P.<task> and the worker's --task

    @property
    def label(self) -> str:
        if self.task != "embed":
            return f"poolwire {self.task}, concurrency {self.in_flight}, 1 text/request"
        if self.connections == 1 and self.per_request == 1:
            return f"poolwire, concurrency {self.in_flight}, 1 text/request"
        per = "1 text" if self.per_request == 1 else f"{self.per_request} texts"
        flight = f" x {self.in_flight} in flight" if self.in_flight > 1 else ""
        return f"poolwire, {self.connections} clients{flight}, {per}/request"


def parse_configs(spec: str) -> list[str | Setup]:
    """`inprocess`, `peers`, `service` (bench/service_cost.py), `cN` (N in flight, one text
    each), `KxM` (K clients, M texts each) and `clsN` (classify, N in flight, one text each)."""
    out: list[str | Setup] = []
    for raw in spec.split(","):
        key = raw.strip().lower()
        if not key:
            continue
        if key in ("inprocess", "peers", "service"):
            out.append(key)
        elif m := re.fullmatch(r"c(\d+)", key):
            out.append(Setup(key, 1, int(m.group(1)), 1))
        elif m := re.fullmatch(r"(\d+)x(\d+)", key):
            out.append(Setup(key, int(m.group(1)), 1, int(m.group(2))))
        elif m := re.fullmatch(r"cls(\d+)", key):
            out.append(Setup(key, 1, int(m.group(1)), 1, "classify"))
        else:
            raise argparse.ArgumentTypeError(
                f"unknown setup {raw!r} in --configs: use inprocess, peers, service, cN (N requests in flight, "
                f"one text each), KxM (K clients, M texts per request) or clsN (classify, N "
                f"requests in flight), e.g. {DEFAULT_CONFIGS}")
        if isinstance(out[-1], Setup) and min(out[-1].connections, out[-1].in_flight,
                                               out[-1].per_request) < 1:
            raise argparse.ArgumentTypeError(f"setup {raw!r}: every count must be at least 1")
    if not out:
        raise argparse.ArgumentTypeError("--configs names no setup")
    return out
