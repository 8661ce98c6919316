"""bench/idle_penalty.py: its table, and one tiny run end to end that measures every piece in
every condition and leaves none of its spinning processes behind. Never asserts on speed."""

import math
import os
import re

import pytest

from bench import idle_penalty
from tests.helpers import processes, usage_error


def test_table_shows_each_condition_against_back_to_back():
    rows = [("tokenize one short text", (50e-6, 60e-6, 55e-6), (200e-6, 300e-6, 400e-6),
             (100e-6, 110e-6, 120e-6), (70e-6, 400e-6, 165e-6))]
    text = idle_penalty.table(rows, 4.0, 2)
    assert text.splitlines()[0] == ("| work | back to back | after a 4 ms idle gap | beside 2 "
                                    "busy cores | beside a busy event loop |")
    assert text.splitlines()[2] == ("| tokenize one short text | 50 us; process 60 us "
                                    "| 200 us (4.0x); process 300 us "
                                    "| 100 us (2.0x); process 110 us "
                                    "| 165 us wall (3.0x); CPU 70 us |")


@pytest.mark.parametrize("args, message", [
    (["--calls", "0"], "argument --calls: must be at least 1, got 0"),
    (["--gap-ms", "0"], "--gap-ms must be above 0"),
])
def test_bad_arguments_are_refused(args, message, capsys):
    assert message in usage_error(idle_penalty.main, args, capsys)


@pytest.mark.timeout(300)
def test_a_tiny_run_measures_every_piece_and_stops_its_spinners(capsys):
    before = _children()
    assert idle_penalty.main(["--calls", "3", "--gap-ms", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| tokenize", "| run_batch",
                                                                   "| mean pool"))]
    assert len(rows) == 5, out
    assert "| mean pool 22 texts, PyTorch reference |" in out and "| mean pool 22 texts, NumPy |" in out
    for row in rows:
        figures = [float(f.replace(",", "")) for f in re.findall(r"([\d,.]+) us", row)]
        ratios = [float(r) for r in re.findall(r"\(([\d.]+)x\)", row)]
        assert len(figures) == 8 and len(ratios) == 3, row
        assert all(math.isfinite(v) and v > 0 for v in figures + ratios), row
    assert "command: python bench/idle_penalty.py --calls 3 --gap-ms 1" in out
    assert _children() == before  # the spinners were stopped and reaped


def _children() -> set[int]:
    """This process's live children (a reaped spinner is gone from /proc)."""
    return {p.pid for p in processes() if p.ppid == os.getpid()}
