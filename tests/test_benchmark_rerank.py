"""Smoke test of bench/rerank.py on a tiny run: both rows measured, the table has its columns,
both sides ranked alike, every number finite. Never a speed assertion."""

import json
import math

import pytest

from bench import rerank


@pytest.mark.timeout(300)
def test_tiny_rerank_bench_reports_both_rows_and_the_ratio(tmp_path, capsys, small_model_dirs):
    out = tmp_path / "rerank.json"
    # The session's small cross-encoder keeps this fast; the default builds one from MiniLM.
    rc = rerank.main(["--documents", "6", "--reps", "2", "--warmup", "1",
                      "--model", str(small_model_dirs["seq1"]), "--json", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    lines = stdout.splitlines()
    assert lines[0] == "| " + " | ".join(rerank.COLUMNS) + " |"
    assert lines[2].startswith("| CrossEncoder.rank (in-process) | 6 |")
    assert lines[3].startswith("| poolwire rerank (NATS, one request) | 6 |")
    assert lines[2].endswith("| 1.00x |") and lines[3].endswith("x |")
    assert "ranked the documents alike" in stdout
    report = json.loads(out.read_text())
    assert [r["setup"] for r in report["rows"]] == ["CrossEncoder.rank (in-process)",
                                                    "poolwire rerank (NATS, one request)"]
    assert all(math.isfinite(v) and v > 0 for r in report["rows"]
               for k, v in r.items() if k not in ("setup", "documents"))
    assert report["same_order"] and report["max_score_diff"] < 1e-4


def test_bad_counts_are_refused():
    with pytest.raises(SystemExit):
        rerank.parse_args(["--documents", "0"])
