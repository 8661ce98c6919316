"""bench/offline.py on a tiny workload: both rows measured, the ratio printed, the vectors the
same. Never a speed assertion."""

import json
import math

import pytest

from bench import offline

pytestmark = pytest.mark.timeout(300)


def test_a_tiny_run_reports_both_rows_and_their_ratio(tmp_path, capsys):
    out = tmp_path / "offline.json"
    assert offline.main(["--texts", "12", "--rounds", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [r["key"] for r in result["rows"]] == ["inprocess", "offline"]
    for row in result["rows"]:
        assert row["texts"] == 12 and len(row["rounds_s"]) == 2
        assert math.isfinite(row["texts_per_s"]) and row["texts_per_s"] > 0
    assert result["shape"] == [12, 384]
    assert result["min_cos"] > 0.99999  # the same vectors, or the ratio compares nothing
    assert f"offline / in-process: {result['ratio']:.2f}x" in printed
    assert printed.count("\n| ") == 3  # header rule and two rows after the header
