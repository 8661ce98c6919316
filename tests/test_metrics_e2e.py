"""Prometheus metrics: scraped over HTTP after known traffic, every counter has moved by exactly
what that traffic should add."""

import asyncio
import urllib.request

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(90)


async def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from /metrics."""
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()

    samples = {}
    for family in text_string_to_metric_families(await asyncio.to_thread(get)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def moved(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_counters_move_by_what_the_traffic_adds(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, metrics_port=0, metrics_host="127.0.0.1") as worker:
        before = await scrape(worker.metrics_port)
        texts = [["a short text"], ["two texts", "in one request"], ["three", "short", "texts"]]
        for batch in texts:  # one at a time: each request is its own micro-batch
            reply = await nc.request(f"{prefix}.embed", msgpack.packb({"input": batch}), timeout=30)
            assert "error" not in msgpack.unpackb(reply.data)
        reply = await nc.request(f"{prefix}.token_embed", msgpack.packb({"input": "deprecated"}),
                                 timeout=30)
        assert msgpack.unpackb(reply.data)["warnings"]
        for subject, body in ((f"{prefix}.embed", b"\xc1"),                       # undecodable
                              (f"{prefix}.classify", msgpack.packb({"input": "x"})),  # unsupported
                              (f"{prefix}.nope", msgpack.packb({"input": "x"}))):     # unknown task
            reply = await nc.request(subject, body, timeout=30)
            assert "error" in msgpack.unpackb(reply.data)
        after = await scrape(worker.metrics_port)

    assert moved(before, after, "poolwire_requests_total", task="embed") == 4
    assert moved(before, after, "poolwire_requests_total", task="token_embed") == 1
    assert moved(before, after, "poolwire_requests_total", task="classify") == 1
    assert moved(before, after, "poolwire_requests_total", task="unknown") == 1
    assert moved(before, after, "poolwire_errors_total", code="invalid_request") == 1
    assert moved(before, after, "poolwire_errors_total", code="unsupported_task") == 2
    assert moved(before, after, "poolwire_deprecation_events_total", requested_task="token_embed") == 1
    assert moved(before, after, "poolwire_request_seconds_count", task="embed") == 3
    assert moved(before, after, "poolwire_request_seconds_count", task="token_embed") == 1
    assert moved(before, after, "poolwire_request_seconds_sum", task="embed") > 0
    # Four requests, computed one after another: four forward passes of 1 + 2 + 3 + 1 sequences.
    assert moved(before, after, "poolwire_batch_size_count") == 4
    assert moved(before, after, "poolwire_batch_size_sum") == 7
    assert moved(before, after, "poolwire_batch_padded_tokens_count") == 4
    def padded(batch: list[str]) -> int:  # batch x longest, special tokens included
        return len(batch) * max(len(minilm.tokenizer(t)["input_ids"]) for t in batch)

    want = sum(padded(b) for b in texts) + padded(["deprecated"])
    assert moved(before, after, "poolwire_batch_padded_tokens_sum") == want
    assert moved(before, after, "poolwire_stage_seconds_total", stage="forward") > 0
    assert after[("poolwire_queued_items", ())] == 0 and after[("poolwire_queued_tokens", ())] == 0
    info = next(dict(labels) for (name, labels) in after if name == "poolwire_worker_info")
    assert info["model"] == "all-MiniLM-L6-v2" and info["configured_task"] == "embed"
    assert info["dtype"] == "float32" and info["device"] == "cpu"


async def test_metrics_are_off_unless_a_port_is_given(minilm, start_worker):
    async with start_worker(minilm) as worker:
        assert worker.metrics_port is None
