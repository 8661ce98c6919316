"""Size before compute, end to end: a one-message reply that cannot fit is refused before any
forward pass with the numbers, and the Python client and the CLI return the whole answer to a
big input anyway (splitting the request, streaming the reply)."""

import asyncio
import json
import os
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.client import PoolingClient

pytestmark = pytest.mark.timeout(180)


async def ask(nc, subject, body: dict):
    msg = await nc.request(subject, msgpack.packb(body), timeout=60)
    return msgpack.unpackb(msg.data)


async def test_a_reply_too_big_for_one_message_is_refused_before_any_compute(
        minilm, start_worker, nc, prefix):
    async with start_worker(minilm) as worker:
        computed = worker.stats.sequences
        started = time.monotonic()
        frame = await ask(nc, f"{prefix}.embed", {"input": [f"text number {i}" for i in range(10_000)]})
        refused_in = time.monotonic() - started
        err = frame["error"]
        assert err["code"] == "payload_too_large"
        assert err["items"] == 10_000 and err["max_payload"] == nc.max_payload
        assert err["estimated_bytes"] > 10_000 * 384 * 5  # 5 bytes per MessagePack float32
        assert '"stream": true' in err["message"] and "10000 items" in err["message"]
        # Token-level: judged from the token counts, still before the forward pass.
        long_texts = ["word " * 250] * 4  # 4 x 252 tokens x 384 floats: about 1.9 MB
        frame = await ask(nc, f"{prefix}.token_embed", {"input": long_texts})
        assert frame["error"]["code"] == "payload_too_large" and frame["error"]["items"] == 4
        assert worker.stats.sequences == computed  # nothing reached the model
        # One of those texts with 8 dimensions fits, and is served as one message.
        frame = await ask(nc, f"{prefix}.token_embed", {"input": long_texts[:1], "dimensions": 8})
        assert len(frame["data"][0]["data"]) == 252
    print(f"10,000-text embed refused in {refused_in:.3f} s")


@pytest.fixture(scope="module")
def small_payload_server():
    """A nats-server whose max_payload (3 KiB: one MiniLM vector and a little more) a few
    hundred short texts exceed both ways, so the model computes little."""
    with NatsServer(max_payload=3 * 1024) as server:
        yield server


TEXTS = [f"item {i} of the batch" for i in range(320)]


async def test_the_client_returns_the_whole_answer_to_a_big_input(
        minilm, start_worker, small_payload_server):
    url = small_payload_server.url
    async with start_worker(minilm, url=url) as worker, PoolingClient(url, prefix=worker.settings.prefix) as client:
        assert len(msgpack.packb({"input": TEXTS})) > client.nc.max_payload  # the request is split
        reply = await client.embed(TEXTS)
        first = await client.embed(TEXTS[0])
        last = await client.embed([TEXTS[-1]])
    assert [item["index"] for item in reply["data"]] == list(range(len(TEXTS)))
    assert reply["model"] == "all-MiniLM-L6-v2" and reply["task"] == "embed"
    assert reply["usage"]["prompt_tokens"] > 320 * 6
    np.testing.assert_allclose(reply["data"][0]["data"], first["data"][0]["data"], atol=1e-5)
    np.testing.assert_allclose(reply["data"][-1]["data"], last["data"][0]["data"], atol=1e-5)


@pytest.mark.slow
async def test_the_cli_prints_the_whole_answer_to_a_big_input(minilm, start_worker, small_payload_server):
    url = small_payload_server.url
    async with start_worker(minilm, url=url) as worker:
        env = {**os.environ, "NATS_URL": url, "POOLWIRE_PREFIX": worker.settings.prefix}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "embed", *TEXTS,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(), 150)
    assert proc.returncode == 0, err.decode()[-2000:]
    reply = json.loads(out)
    assert len(reply["data"]) == 320 and all(len(item["data"]) == 384 for item in reply["data"])
