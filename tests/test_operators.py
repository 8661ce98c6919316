"""The operator's commands: `poolwire stats` and `poolwire events` against real workers and a
real JetStream events stream, and their pure pieces (time parsing, the table, the hint)."""

import asyncio
import json
import shlex
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import msgpack
import pytest

from poolwire.operators import STATS_COLUMNS, format_table, parse_since, stats_rows, try_hint

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, want", [
    ("90s", NOW - timedelta(seconds=90)), ("10m", NOW - timedelta(minutes=10)),
    ("2h", NOW - timedelta(hours=2)), ("1.5d", NOW - timedelta(hours=36)),
    ("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, tzinfo=timezone.utc)),
    ("2026-11-30T10:00:00+01:00", datetime(2026, 11, 30, 9, tzinfo=timezone.utc)),
    ("2026-11-30T10:00:00", datetime(2026, 11, 30, 10, tzinfo=timezone.utc)),  # naive: UTC
])
def test_since_takes_an_rfc3339_time_or_an_age(text, want):
    assert parse_since(text, NOW) == want


@pytest.mark.parametrize("text", ["yesterday", "10 minutes", "-5m", ""])
def test_a_since_that_is_neither_says_what_would_do(text):
    with pytest.raises(ValueError, match="RFC 3339 time .* or an age"):
        parse_since(text, NOW)


@pytest.mark.parametrize("task", ["embed", "classify", "token_embed", "token_classify"])
def test_the_start_up_hint_names_a_request_the_served_task_accepts(task):
    hint = try_hint(task, "pooling.minilm", "nats://127.0.0.1:4333")
    raw = hint.split("   or   ")[-1]
    words = shlex.split(raw)
    assert words[:5] == ["nats", "--server", "nats://127.0.0.1:4333", "req", f"pooling.minilm.{task}"]
    assert set(json.loads(words[5])) == {"input"}
    if task in ("embed", "classify"):  # the CLI has a command for these
        assert shlex.split(hint)[:6] == ["poolwire", task, "--nats-url", "nats://127.0.0.1:4333",
                                         "--prefix", "pooling.minilm"]


def test_stats_rows_keep_one_prefix_and_read_as_a_table():
    def answer(worker, prefix, requests, last_error=""):
        return {"id": worker, "metadata": {"worker": worker, "prefix": prefix, "model": "m",
                                           "configured_task": "embed"},
                "endpoints": [{"num_requests": requests, "num_errors": 1, "last_error": last_error,
                               "data": {"batches": 4, "mean_batch_size": 2.5,
                                        "padding_waste": 0.06, "seconds": {"forward": 1.25}}}]}

    answers = [answer("w2", "a", 9, "overloaded: full"), answer("w1", "a", 3), answer("w3", "b", 1)]
    rows = stats_rows(answers, "a")
    assert rows == [("w1", "m", "embed", "3", "1", "4", "2.5", "6%", "1.2", "-", "-"),
                    ("w2", "m", "embed", "9", "1", "4", "2.5", "6%", "1.2", "-", "overloaded: full")]
    assert len(stats_rows(answers)) == 3
    lines = format_table(STATS_COLUMNS, rows).splitlines()
    assert lines[0].split()[:3] == ["worker", "model", "task"] and len(lines) == 3
    assert lines[2].index("overloaded") == lines[0].index("last error")  # columns line up
    # A worker with a result cache shows its hit rate.
    cached = answer("w4", "c", 5)
    cached["endpoints"][0]["data"]["cache"] = {"hits": 30, "misses": 10}
    assert stats_rows([cached])[0][STATS_COLUMNS.index("cache hits")] == "75%"


async def run_cli(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "poolwire", *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.timeout(120)
async def test_stats_prints_every_worker_of_a_prefix(minilm, start_worker, nats_server, nc, prefix):
    async with start_worker(minilm) as first, start_worker(minilm) as second:
        for i in range(4):
            await nc.request(f"{prefix}.embed", msgpack.packb({"input": f"text {i}"}), timeout=30)
        code, out, err = await run_cli("stats", "--nats-url", nats_server.url, "--prefix", prefix)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("worker") and len(lines) == 3
        assert {line.split()[0] for line in lines[1:]} == {first.worker_id, second.worker_id}
        code, out, _ = await run_cli("stats", "--nats-url", nats_server.url, "--prefix", prefix, "--json")
        assert code == 0 and len([a for a in json.loads(out)
                                  if a["metadata"]["prefix"] == prefix]) == 2
    code, _, err = await run_cli("stats", "--nats-url", nats_server.url, "--prefix", prefix)
    assert code == 1 and "no worker answered" in err


@pytest.mark.timeout(120)
async def test_events_replays_stored_events_then_stops_when_idle(minilm, start_worker, nats_server,
                                                                 nc, prefix):
    async with start_worker(minilm):
        for i in range(3):  # token_embed on an embed worker: deprecated, an event each
            await nc.request(f"{prefix}.token_embed",
                             msgpack.packb({"input": "x", "request_id": f"r{i}"}), timeout=30)
    common = ("--nats-url", nats_server.url, "--prefix", prefix, "--timeout", "1")
    code, out, err = await run_cli("events", "--all", *common)
    assert code == 0, err
    assert [json.loads(line)["request_id"] for line in out.splitlines()] == ["r0", "r1", "r2"]
    code, out, _ = await run_cli("events", "--since", "10m", *common)
    assert code == 0 and len(out.splitlines()) == 3
    code, out, _ = await run_cli("events", "--since", "2000-01-01T00:00:00Z", "--count", "2", *common)
    assert code == 0 and len(out.splitlines()) == 2
    # Without --all / --since only new events are shown: none come, and --timeout ends it.
    code, out, _ = await run_cli("events", *common)
    assert code == 0 and out == ""
