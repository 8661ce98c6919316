"""Smoke test of the throughput benchmark's harness (bench/throughput.py) on a tiny workload:
every request answered, the report has its rows and columns, and every number is finite. It
never asserts on speed: benchmarks print numbers, tests check that they were measured."""

import argparse
import json
import math

import pytest

from bench import throughput as benchmark
import numpy as np

from bench.arguments import count
from bench.precision_modes import accuracy_cells, classify_accuracy, embed_accuracy, parse_modes
from bench.setups import Setup, parse_configs
from bench.table import Report, Row, percentile
from poolwire.models.precision import cpu_has_bf16

COLUMNS = ("| setup | mode | texts/s | tokens/s | p50 ms | p99 ms | peak RSS MiB | vs in-process "
           "| min cos vs fp32 | mean cos vs fp32 | max abs diff vs fp32 |")


def test_parse_configs_names_every_setup():
    assert parse_configs("inprocess, c1,c64,4x32,CLS16") == [
        "inprocess", Setup("c1", 1, 1, 1), Setup("c64", 1, 64, 1), Setup("4x32", 4, 1, 32),
        Setup("cls16", 1, 16, 1, "classify")]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown setup 'fast'"):
        parse_configs("c1,fast")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        parse_configs("c0")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        parse_configs("cls0")


def test_counts_are_whole_numbers_of_at_least_one():
    assert count("1") == 1 and count("64") == 64
    for raw, message in (("0", "must be at least 1, got 0"), ("-3", "must be at least 1, got -3"),
                         ("2.5", "not a whole number: '2.5'"), ("", "not a whole number: ''")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            count(raw)
    with pytest.raises(SystemExit):  # what the benchmarks' parsers make of it
        benchmark.build_parser().parse_args(["--texts", "0"])


def test_percentile_interpolates_like_numpy():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))


@pytest.mark.timeout(420)
def test_small_run_answers_every_request_and_reports_every_row(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    rc = benchmark.main(["--texts", "40", "--configs", "inprocess,c1,cls8", "--latency-reps", "10",
                         "--settle-s", "0", "--modes", "fast", "--json", str(out_json)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout

    report = json.loads(out_json.read_text())
    rows = {r["key"]: r for r in report["rows"]}
    # One worker per task (the fast mode's) keeps this test's cost near where it was before
    # --modes and classify.
    assert list(rows) == ["inprocess", "inprocess-1", "inprocess-classify", "c1-fast", "cls8-fast"]
    for key in ("c1-fast", "cls8-fast"):
        assert rows[key]["requests"] == 40 and rows[key]["errors"] == 0, rows[key]["notes"]
        assert rows[key]["texts"] == 40 and not rows[key]["notes"]  # token counts agree too
    assert rows["inprocess"]["texts"] == rows["inprocess-classify"]["texts"] == 40
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
    assert rows["c1-fast"]["mode"] == rows["cls8-fast"]["mode"] == served
    # Every text's logits compared with the in-process float32 ones. Float32 differs only by
    # rounding (other batch shapes: not 0, as a self-comparison would be); bfloat16 autocast
    # measured 0.028 on these logits of a few units (bench/precision_accuracy.py, 100 texts).
    diff = rows["cls8-fast"]["accuracy"]["max_abs_diff"]
    assert 0 < diff < (0.1 if served == "fast" else 1e-4), diff
    assert rows["cls8-fast"]["task"] == "classify"

    lines = stdout.splitlines()
    header = lines.index(COLUMNS)
    table = lines[header + 2: header + 2 + len(rows)]
    assert len(table) == 5 and all(line.count("|") == 12 for line in table)
    assert table[0].startswith("| in-process encode, batch size 32 |")
    assert table[0].endswith("| 1.00x | reference | reference | n/a |")
    assert table[2].startswith("| in-process transformers classify, batch size 32 |")
    assert table[2].endswith("| 1.00x | n/a | n/a | reference |")
    assert table[4].startswith("| poolwire classify, concurrency 8, 1 text/request, fast |")
    assert table[4].endswith(f"| n/a | n/a | {diff:.3g} |")
    assert any(line.startswith("command: ") and "--texts 40" in line for line in lines)
    assert any(line.startswith("latency, one short text: poolwire at concurrency 1 (fast")
               for line in lines)
    assert report["latency_comparison"] and report["throughput_comparison"]
    assert "throughput vs in-process transformers classify, batch size 32: cls8-fast " \
        in report["throughput_comparison"]


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


def test_classify_accuracy_is_the_largest_logit_difference():
    ref = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    got = ref + np.array([[0.0, 0.25, 0.0], [-0.5, 0.0, 0.125]])
    assert classify_accuracy(ref, got) == {"max_abs_diff": 0.5}
    assert classify_accuracy(ref, ref) == {"max_abs_diff": 0.0}
    with pytest.raises(ValueError, match=r"\(2, 2\) logits to compare with \(2, 3\)"):
        classify_accuracy(ref, got[:, :2])


def test_each_row_fills_its_own_tasks_accuracy_columns_and_ratio():
    assert accuracy_cells("embed", {"min_cosine": 0.5, "mean_cosine": 0.75}) == [
        "0.500000", "0.750000", "n/a"]
    assert accuracy_cells("classify", {"max_abs_diff": 0.00123456}) == ["n/a", "n/a", "0.00123"]
    assert accuracy_cells("classify", {}, reference=True) == ["n/a", "n/a", "reference"]
    assert accuracy_cells("classify", {}) == ["n/a", "n/a", "n/a"]  # no inprocess run

    def row(key, task, texts_per_s):
        return Row(key, key, 10, 100, 10 / texts_per_s, [1.0], None, task=task)

    report = Report("cmd", 10, 0, [row("inprocess", "embed", 10.0), row("c4", "embed", 20.0),
                                   row("inprocess-classify", "classify", 4.0),
                                   row("cls4", "classify", 6.0)], "machine")
    lines = report.markdown().splitlines()
    assert lines[0] == "CPU: machine"  # the CPU's model and flags head the table
    table = lines[4:8]
    assert [line.split(" | ")[7] for line in table] == ["1.00x", "2.00x", "1.00x", "1.50x"]
    assert report.throughput_comparison() == ("throughput vs inprocess: c4 2.00x\n"
                                              "throughput vs inprocess-classify: cls4 1.50x")


def test_the_headline_is_poolwire_against_the_fastest_peer_of_its_precision():
    def row(key, texts_per_s, mode="float32", peer_of=""):
        r = Row(key, key, 10, 100, 10 / texts_per_s, [1.0], None, peer_of=peer_of)
        r.mode = mode
        return r

    report = Report("cmd", 10, 0, [row("inprocess", 10.0, peer_of="exact"),
                                   row("inprocess-st-openvino-f32", 25.0, peer_of="exact"),
                                   row("inprocess-st-onnx", 20.0, peer_of="exact"),
                                   row("inprocess-st-openvino", 40.0, "default", "fast"),
                                   row("c64", 24.0, "exact"), row("c64-fast", 30.0, "fast"),
                                   row("c1-fast", 5.0, "fast -> exact")], "machine")
    assert report.headline().splitlines() == [
        "headline: c64 (exact) 24.0 texts/s = 0.96x the fastest in-process peer of exact "
        "precision, inprocess-st-openvino-f32 (25.0)",
        "headline: c64-fast (fast) 30.0 texts/s = 0.75x the fastest in-process peer of fast "
        "precision, inprocess-st-openvino (40.0)",
        "headline: c1-fast (fast -> exact) 5.0 texts/s = 0.20x the fastest in-process peer of "
        "exact precision, inprocess-st-openvino-f32 (25.0)"]


def test_peers_is_a_setup():
    assert parse_configs("peers,c64")[0] == "peers"
