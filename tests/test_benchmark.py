"""Smoke test of the throughput benchmark's harness (actors/benchmark.py) on a tiny workload:
every request answered, the report has its rows and columns, and every number is finite. It
never asserts on speed: benchmarks print numbers, tests check that they were measured."""

import argparse
import json
import math

import pytest

from bench import throughput as benchmark
import numpy as np

from bench.precision_modes import embed_accuracy, parse_modes
from bench.throughput import Setup, parse_configs, percentile
from poolwire.actors.precision import cpu_has_bf16

COLUMNS = ("| setup | mode | texts/s | tokens/s | p50 ms | p99 ms | peak RSS MiB | vs in-process "
           "| min cos vs fp32 | mean cos vs fp32 |")


def test_parse_configs_names_every_setup():
    assert parse_configs("inprocess, c1,c64,4x32") == [
        "inprocess", Setup("c1", 1, 1, 1), Setup("c64", 1, 64, 1), Setup("4x32", 4, 1, 32)]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown setup 'fast'"):
        parse_configs("c1,fast")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        parse_configs("c0")


def test_percentile_interpolates_like_numpy():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))


@pytest.mark.timeout(360)
def test_small_run_answers_every_request_and_reports_every_row(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    rc = benchmark.main(["--texts", "40", "--configs", "inprocess,c1", "--latency-reps", "10",
                         "--settle-s", "0", "--modes", "fast", "--json", str(out_json)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout

    report = json.loads(out_json.read_text())
    rows = {r["key"]: r for r in report["rows"]}
    # One worker (the fast mode's) keeps this test's cost where it was before --modes.
    assert list(rows) == ["inprocess", "inprocess-1", "c1-fast"]
    fast = rows["c1-fast"]
    assert fast["requests"] == 40 and fast["errors"] == 0, fast["notes"]
    assert fast["texts"] == 40 and not fast["notes"]  # token counts agree too
    assert rows["inprocess"]["texts"] == 40
    assert rows["inprocess-1"]["requests"] == 10
    for row in rows.values():
        for name in ("texts_per_s", "tokens_per_s", "p50_ms", "p99_ms", "peak_rss_mib", "wall_s"):
            assert math.isfinite(row[name]) and row[name] > 0, (row["key"], name, row[name])
        assert row["p99_ms"] >= row["p50_ms"]
    assert math.isfinite(rows["c1-fast"]["short_p50_ms"])
    # Every text's embedding compared with the in-process float32 one.
    assert rows["c1-fast"]["accuracy"]["min_cosine"] >= 0.9999
    # What the worker served, from its discovery metadata: float32 on a CPU without bfloat16.
    served = "fast" if cpu_has_bf16() else "fast -> exact"
    assert rows["c1-fast"]["mode"] == served

    lines = stdout.splitlines()
    header = lines.index(COLUMNS)
    table = lines[header + 2: header + 2 + len(rows)]
    assert len(table) == 3 and all(line.count("|") == 11 for line in table)
    assert table[0].startswith("| in-process encode, batch size 32 |")
    assert table[0].endswith("| 1.00x | reference | reference |")
    assert any(line.startswith("command: ") and "--texts 40" in line for line in lines)
    assert any(line.startswith("latency, one short text: poolwire at concurrency 1 (fast")
               for line in lines)
    assert report["latency_comparison"] and report["throughput_comparison"]


def test_modes_are_parsed_and_accuracy_is_cosine_to_the_reference():
    assert parse_modes("exact, fast,bfloat16,fast") == ["exact", "fast", "bfloat16"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown mode 'int8'"):
        parse_modes("exact,int8")
    ref = np.array([[1.0, 0.0], [0.0, 2.0]])
    got = np.array([[1.0, 0.0], [1.0, 1.0]])   # cosines 1 and 1/sqrt(2)
    acc = embed_accuracy(ref, got)
    assert acc["min_cosine"] == pytest.approx(2 ** -0.5)
    assert acc["mean_cosine"] == pytest.approx((1 + 2 ** -0.5) / 2)
    with pytest.raises(ValueError, match=r"\(1, 2\) embeddings to compare with \(2, 2\)"):
        embed_accuracy(ref, got[:1])
