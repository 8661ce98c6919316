"""bench/trace_cache.py on a tiny workload: every row and ratio is there and every request was
answered. Its shape only, never its speed."""

import json

import pytest

from bench import trace_cache
from tests.helpers import usage_error


@pytest.mark.timeout(300)
def test_a_tiny_run_reports_every_row_and_both_ratios(tmp_path, capsys):
    out = tmp_path / "trace_cache.json"
    assert trace_cache.main(["--texts", "16", "--concurrency", "4", "--per-request", "4",
                             "--rounds", "2", "--span-reps", "50", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert list(rows) == ["trace-off", "trace-on", "cache-computed", "cache-hits"]
    for key in ("trace-off", "trace-on"):
        assert rows[key]["requests"] == 16 and len(rows[key]["rounds"]) == 2
    assert rows["cache-computed"]["requests"] == rows["cache-hits"]["requests"] == 4
    assert all(r["errors"] == 0 and r["throughput"] > 0 for r in rows.values())
    assert rows["trace-on"]["exports"] >= 1  # spans really went out
    # Every warm item was a hit: nothing was computed on the second pass.
    assert rows["cache-hits"]["computed_sequences"] == 0
    assert rows["cache-hits"]["cache"]["hits"] == 16
    assert set(report["ratios"]) == {"trace_on_vs_off", "cached_vs_computed",
                                     "span_cpu_vs_request_cpu"}
    assert report["span_cpu_us_per_request"] > 0
    assert all(v > 0 for v in report["ratios"].values())
    assert "tracing on / off" in capsys.readouterr().out


def test_sizes_below_one_are_refused(capsys):
    assert ("argument --texts: must be at least 1, got 0"
            in usage_error(trace_cache.main, ["--texts", "0"], capsys))
