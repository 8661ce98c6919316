"""Discovery: each worker answers $SRV.PING / INFO / STATS as a micro service named poolwire,
and STATS shows where its time goes."""

import json

import msgpack
import pytest

from poolwire.operators import collect_answers

pytestmark = pytest.mark.timeout(60)


async def test_ping_info_and_stats_of_two_workers(minilm, start_worker, nc, prefix):
    async with start_worker(minilm) as first, start_worker(minilm, multitask="reject") as second:
        for i in range(6):
            await nc.request(f"{prefix}.embed", msgpack.packb({"input": f"text {i}"}), timeout=30)
        await nc.request(f"{prefix}.embed", b"\x00", timeout=30)
        pings = [a for a in await collect_answers(nc, "$SRV.PING.poolwire")
                 if a["id"] in (first.discovery.id, second.discovery.id)]
        info = await nc.request(f"$SRV.INFO.poolwire.{first.discovery.id}", b"", timeout=5)
        stats = [json.loads((await nc.request(f"$SRV.STATS.poolwire.{w.discovery.id}", b"", timeout=5)).data)
                 for w in (first, second)]
    assert len(pings) == 2 and {p["type"] for p in pings} == {"io.nats.micro.v1.ping_response"}
    meta = {p["id"]: p["metadata"] for p in pings}
    assert meta[first.discovery.id]["multitask"] == "warn" and meta[second.discovery.id]["multitask"] == "reject"
    assert meta[first.discovery.id]["model"] == "all-MiniLM-L6-v2"
    assert meta[first.discovery.id]["configured_task"] == "embed"
    assert meta[first.discovery.id]["supported_tasks"] == "embed,token_embed,score"
    assert {k: meta[first.discovery.id][k] for k in
            ("prefix", "queue", "embedding_size", "max_length", "dtype", "device")} == {
        "prefix": prefix, "queue": "poolwire", "embedding_size": "384", "max_length": "256",
        "dtype": "float32", "device": "cpu"}
    info = json.loads(info.data)
    assert info["endpoints"][0]["subject"] == f"{prefix}.*" and info["endpoints"][0]["queue_group"] == "poolwire"
    # The queue group shares the 7 requests (plus the fixtures' readiness probes) between both.
    assert sum(s["endpoints"][0]["num_requests"] for s in stats) >= 7
    assert sum(s["endpoints"][0]["num_errors"] for s in stats) >= 1
    # The worker that answered the non-map body says what its last error was.
    assert any(s["endpoints"][0]["last_error"] == "invalid_request: the body must be a map, got a int"
               for s in stats)
    data = [s["endpoints"][0]["data"] for s in stats]
    assert sum(d["sequences"] for d in data) == 6
    for d in data:
        assert set(d["seconds"]) == {"decode", "validate", "tokenize", "plan", "forward", "pool",
                                     "encode", "publish"}
    assert any(d["seconds"]["forward"] > 0 for d in data)
    # The garbage collector's passes since each worker started, by generation (actors/stats.py).
    for d in data:
        assert len(d["gc"]["collections"]) == len(d["gc"]["seconds"]) == 3
        assert all(s >= 0 for s in d["gc"]["seconds"])
