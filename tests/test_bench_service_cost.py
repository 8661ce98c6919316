"""bench/service_cost.py: its pure parts (which thread is which, the CPU split, the table) and
one tiny run end to end, every request answered on both sides. Never asserts on speed."""

import json
import math

import pytest

from bench import service_cost as sc
from tests.helpers import usage_error

PID = 100


def test_threads_are_grouped_by_role():
    assert sc.thread_group(PID, PID, "python") == "event loop"
    assert sc.thread_group(PID, 101, "poolwire-forwar") == "forward"  # comm: 15 characters
    assert sc.thread_group(PID, 102, "python") == "backend threads"
    assert sc.thread_group(PID, 103, "poolwire-tokeni") == "tokenize"


def test_cpu_split_counts_only_what_each_thread_spent_meanwhile():
    before = {PID: ("python", 1.0), 101: ("poolwire-forwar", 2.0), 102: ("ov_thread", 0.5),
              104: ("poolwire-tokeni", 0.25)}
    after = {PID: ("python", 1.5), 101: ("poolwire-forwar", 2.25), 102: ("ov_thread", 0.5),
             103: ("tbb_worker", 0.125), 104: ("poolwire-tokeni", 0.375)}  # 103: started meanwhile
    groups, names = sc.cpu_by_group(PID, before, after)
    assert groups == {"event loop": 0.5, "tokenize": 0.125, "forward": 0.25,
                      "backend threads": 0.125}
    assert names == ["tbb_worker"]  # 102 spent nothing


def test_table_shows_ratios_each_way_and_cpu_per_text():
    def side(texts, wall, lat, cpu, batches=0, sequences=0, pass_s=0.0, gc_s=0.0):
        return sc.Side(texts=texts, wall_s=wall, latencies_ms=lat, cpu_s=cpu, batches=batches,
                       sequences=sequences, pass_s=pass_s, gc_s=gc_s)

    rows = [sc.ShapeResult(sc.SHAPES[0], side(1000, 1.0, [1.0], {"process": 0.01}),
                           side(1000, 2.0, [2.0], {"event loop": 0.2, "tokenize": 0.05,
                                                   "forward": 0.1, "backend threads": 0.0},
                                batches=80, sequences=1000, pass_s=0.2, gc_s=0.015),
                           [], 1.5, 0.25),
            sc.ShapeResult(sc.SHAPES[2], side(10, 1.0, [0.2, 0.25, 0.3], {"process": 0.001}),
                           side(10, 1.0, [0.5, 0.6, 0.7], {"event loop": 0.01}), [], 1.5, 0.25)]
    text = sc.markdown(rows, "2 CPU cores (test)", "cmd", processes=2)
    assert "| 1 text a request, 64 in flight | 1,000 texts/s | 500 texts/s | 0.50x | 1.50 | 0.25 |" in text
    assert "| one request at a time, median round trip | 0.25 ms | 0.60 ms | 2.40x |" in text
    assert "poolwire, near-zero model, 2 processes" in text
    # 0.35 s of the worker's CPU over 1,000 texts: 0.35 ms a text; the responder 0.01 ms.
    # 15 ms of garbage collection over 1,000 texts: 0.015 ms a text.
    # 1,000 sequences in 80 forward passes: 12.5 a pass; 0.2 s over them: 2.50 ms a pass.
    assert ("| 1 text a request, 64 in flight | 0.200 | 0.050 | 0.100 | 0.000 | 0.350 | 0.010 "
            "| 0.015 | 12.5 | 2.50 |" in text)
    # No passes: neither their size nor their time (and nowhere else a nan).
    assert text.count("nan") == 2 and "| 1.000 | 0.100 | 0.000 | nan | nan |" in text
    assert "CPU: 2 CPU cores (test)" in text and "command: cmd" in text


@pytest.mark.parametrize("args, message", [
    (["--shapes", "1x64,9x9"], "--shapes 9x9: unknown"),
    (["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
    (["--processes", "x"], "argument --processes: not a whole number: 'x'"),
    (["--scale", "0"], "--scale must be above 0"),
    (["--floor", "--worker-args=--backend torch"], "the floor worker (--floor) takes none"),
])
def test_bad_arguments_name_the_value(args, message, capsys):
    assert message in usage_error(sc.main, args, capsys)


@pytest.mark.timeout(300)
def test_a_tiny_run_answers_every_request_on_both_sides(tmp_path, capsys):
    out = tmp_path / "cost.json"
    # torch: no OpenVINO conversion at start, the test's largest cost.
    rc = sc.main(["--scale", "0.02", "--rounds", "1", "--shapes", "32x8,1x1",
                  "--worker-args=--backend torch", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    results = json.loads(out.read_text())
    assert [r["shape"]["key"] for r in results] == ["32x8", "1x1"]
    for r in results:
        for side in ("bare", "poolwire"):
            assert r[side]["errors"] == 0 and r[side]["texts"] > 0
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        # The split is read from /proc in clock ticks (10 ms): one shape of a tiny run can stay
        # under a tick on a thread (CI read 0.0 for the event loop once), the run as a whole not.
        assert "event loop" in r["poolwire"]["cpu_s"] and min(r["poolwire"]["cpu_s"].values()) >= 0
        # Every text went through a forward pass of the worker, counted from its $SRV.STATS.
        assert r["poolwire"]["sequences"] == r["poolwire"]["texts"]
        assert 1 <= r["poolwire"]["batches"] <= r["poolwire"]["sequences"]
        assert r["poolwire"]["pass_s"] > 0  # from the workers' forward and pool stages
        assert r["poolwire"]["gc_s"] >= 0  # the workers' collector time, from the same reply
    assert sum(sum(r["poolwire"]["cpu_s"].values()) for r in results) > 0
    assert text.count("texts/s") >= 2 and "median round trip" in text


@pytest.mark.timeout(300)
def test_the_floor_worker_answers_every_request_in_place_of_poolwire(tmp_path, capsys):
    out = tmp_path / "floor.json"
    rc = sc.main(["--floor", "--scale", "0.02", "--rounds", "1", "--shapes", "1x64,32x8",
                  "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "| the floor worker, near-zero model |" in text
    for r in json.loads(out.read_text()):
        side = r["poolwire"]  # the measured side's key, whichever program served it
        assert side["errors"] == 0 and side["texts"] > 0
        assert side["sequences"] == side["texts"]  # counted from its $SRV.STATS answer
        assert 1 <= side["batches"] <= side["sequences"]


@pytest.mark.parametrize("body, message", [
    ([1, 2], "a MessagePack map with `input`"),
    ({"inputs": "x"}, "a MessagePack map with `input`"),
    ({"input": []}, "a non-empty list of strings"),
    ({"input": ["a", 3]}, "a non-empty list of strings"),
    ({"input": b"bytes"}, "a non-empty list of strings"),
])
def test_the_floor_worker_names_what_is_wrong_with_a_request(body, message):
    from bench.floor_worker import texts_of

    with pytest.raises(ValueError, match=message):
        texts_of(body)
    assert texts_of({"input": "one"}) == ["one"]
    assert texts_of({"input": ["a", "b"]}) == ["a", "b"]


@pytest.mark.timeout(300)
async def test_the_floor_worker_answers_malformed_bytes_and_serves_on(nats_server, tmp_path):
    from pathlib import Path

    import msgpack
    import nats

    from bench.nats_load import PREFIX
    from bench.worker import WorkerProcess

    model = sc.build_near_zero_model(tmp_path / "near-zero")
    worker = WorkerProcess(nats_server.url, str(model), ["--state-dir", str(tmp_path / "state")],
                           tmp_path / "floor.log",
                           program=[str(Path(sc.__file__).resolve().parent / "floor_worker.py")])
    nc = None
    try:
        worker.start()  # as service_cost.py starts it: until its ready line is in the log
        nc = await nats.connect(nats_server.url)
        bad = msgpack.unpackb((await nc.request(f"{PREFIX}.embed", b"\xc1\xff", timeout=30)).data)
        assert bad["error"]["code"] == "invalid_request"
        empty = msgpack.unpackb((await nc.request(f"{PREFIX}.embed", msgpack.packb({"input": []}),
                                                  timeout=30)).data)
        assert "non-empty list of strings" in empty["error"]["message"]
        good = msgpack.unpackb((await nc.request(
            f"{PREFIX}.embed", msgpack.packb({"input": ["one", "two"], "request_id": "f-1"}),
            timeout=30)).data)
        assert good["request_id"] == "f-1" and [d["index"] for d in good["data"]] == [0, 1]
        assert len(good["data"][0]["embedding"]) == 32  # the near-zero model's width
    finally:
        if nc is not None:
            await nc.close()
        worker.stop()
