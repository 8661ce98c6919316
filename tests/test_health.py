"""`poolwire health`'s judgement of the worker's heartbeat file, and the command itself."""

import time

from poolwire.actors.health import judge, read_heartbeat, write_heartbeat
from poolwire.cli import main


def record(**kw):
    return {"worker": "w1", "healthy": True, "reason": "ok: probe answered 0.2 s ago",
            "updated": 100.0, "stale_after_s": 6.0, **kw}


def test_a_fresh_healthy_heartbeat_is_healthy(tmp_path):
    ok, line = judge(record(), 103.0, tmp_path / "h.json")
    assert ok and line == "worker w1: ok: probe answered 0.2 s ago"


def test_unhealthy_old_stopped_and_missing_heartbeats_say_why(tmp_path):
    path = tmp_path / "h.json"
    ok, line = judge(record(healthy=False, reason="deaf: no probe for 3.0 s"), 101.0, path)
    assert not ok and "deaf" in line
    ok, line = judge(record(), 107.5, path)
    assert not ok and "7.5 s old" in line and "stuck or gone" in line
    ok, line = judge(record(stopped=True), 100.5, path)
    assert not ok and "stopped" in line
    for broken in (None, {}, {"updated": "yesterday"}, []):
        ok, line = judge(broken, 100.0, path)
        assert not ok and str(path) in line and "--state-dir" in line


def test_the_command_reads_the_file_a_worker_writes(tmp_path, capsys):
    assert main(["health", "--state-dir", str(tmp_path)]) == 1
    assert "no worker heartbeat" in capsys.readouterr().out
    write_heartbeat(tmp_path / "health.json", record(updated=time.time()))
    assert read_heartbeat(tmp_path / "health.json")["worker"] == "w1"
    assert main(["health", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "ok" in out
    (tmp_path / "other.json").write_text("{not json")
    assert main(["health", "--health-file", str(tmp_path / "other.json")]) == 1
