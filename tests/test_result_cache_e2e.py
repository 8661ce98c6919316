"""The shared result cache (`--cache-bucket`) against real nats-servers: hits served without a
forward pass and with the computed numbers, per-item hits and misses, keys that change with
options and the model, two workers sharing a bucket, and a bucket deleted or JetStream gone
mid-run without a single error reply."""

import asyncio
import contextlib
import dataclasses
import logging

import msgpack
import nats
import numpy as np
import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.actors.worker import Worker
from poolwire.models.model import bundled_model_dir
from poolwire.settings import WorkerSettings
from tests.helpers import poll_until, wait_until_answering

pytestmark = [pytest.mark.timeout(120)]


def data_of(worker) -> dict:
    return worker.discovery.response("STATS")["endpoints"][0]["data"]


async def ask(nc, prefix: str, body: dict, task: str = "embed") -> dict:
    msg = await nc.request(f"{prefix}.{task}", msgpack.packb(body), timeout=30)
    return msgpack.unpackb(msg.data)


def without_id(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k != "request_id"}


@pytest.fixture
def bucket(prefix):
    return "cache_" + prefix.replace(".", "_")


async def test_a_repeated_request_is_served_from_the_cache_without_a_forward_pass(
        minilm, start_worker, nc, prefix, bucket):
    texts = [f"text number {i}" for i in range(32)]
    async with start_worker(minilm, cache_bucket=bucket) as worker:
        first = await ask(nc, prefix, {"input": texts[:30], "request_id": "a"})
        before = data_of(worker)
        assert before["cache"]["misses"] == 30 and before["cache"]["hits"] == 0
        await poll_until(lambda: _written(worker, 30))  # stores go out in the background

        again = await ask(nc, prefix, {"input": texts[:30], "request_id": "b"})
        after = data_of(worker)
        assert without_id(again) == without_id(first)  # same numbers, same usage, same reply
        assert after["batches"] == before["batches"] and after["sequences"] == before["sequences"]
        assert after["cache"]["hits"] == 30

        # 32 texts, 30 of them cached: 2 are computed, and the reply is the computed one's.
        mixed = await ask(nc, prefix, {"input": texts, "request_id": "c"})
        late = data_of(worker)
        assert late["sequences"] == after["sequences"] + 2
        assert late["cache"]["hits"] == 60 and late["cache"]["misses"] == 32
        computed = await ask(nc, prefix, {"input": texts, "cache": False, "request_id": "d"})
        # The same reply but for float rounding: a batch of 32 and batches of 30 and 2 pad
        # differently, and a computed reply differs from another computed one as much.
        assert {k: v for k, v in without_id(mixed).items() if k != "data"} == \
            {k: v for k, v in without_id(computed).items() if k != "data"}
        assert rows_close(mixed, computed)
        assert data_of(worker)["sequences"] == late["sequences"] + 32  # cache: false computes all

        # A stream and binary encoding from cached items: the same frames as computed ones.
        binary = {"input": texts[:3], "encoding_format": "binary", "stream": True}
        cached_frames = await stream_frames(nc, prefix, binary)
        computed_frames = await stream_frames(nc, prefix, {**binary, "cache": False})
        assert len(cached_frames) == len(computed_frames) == 4
        assert cached_frames[-1] == computed_frames[-1]  # the done frame: usage, model
        by_index = {f["index"]: f for f in computed_frames[:-1]}
        for frame in cached_frames[:-1]:
            want = by_index[frame["index"]]
            assert frame.keys() == want.keys() and frame["shape"] == want["shape"]
            close = np.frombuffer(frame["bytes"], np.float32) - np.frombuffer(want["bytes"], np.float32)
            assert np.abs(close).max() < 1e-5

        # Other options are other keys: nothing hits.
        seqs = data_of(worker)["sequences"]
        await ask(nc, prefix, {"input": texts[:4], "dimensions": 64})
        await ask(nc, prefix, {"input": texts[:4], "prompt": "query: "})
        assert data_of(worker)["sequences"] == seqs + 8
        metrics = worker.metrics.registry.get_sample_value
        assert metrics("poolwire_cache_hits_total") == data_of(worker)["cache"]["hits"]
        assert metrics("poolwire_cache_bytes_written_total") > 0


async def test_a_slow_lookup_holds_up_only_its_own_request(minilm, start_worker, nc, prefix, bucket):
    """The bucket is a round trip away, and a busy server makes it slow: a request whose lookup
    has not come back must not hold up the requests behind it. Here the lookup of the request
    "slow" waits until the test lets it go; a request sent after it is answered meanwhile."""
    async with start_worker(minilm, cache_bucket=bucket) as worker:
        held, gate = asyncio.Event(), asyncio.Event()
        lookup = worker.cache.lookup

        async def gated_lookup(task, request):
            if request.request_id == "slow":
                held.set()
                await gate.wait()
            return await lookup(task, request)

        worker.cache.lookup = gated_lookup
        slow = asyncio.create_task(ask(nc, prefix, {"input": ["slow one", "slow two"],
                                                    "request_id": "slow"}))
        await asyncio.wait_for(held.wait(), 30)
        fast = await ask(nc, prefix, {"input": ["fast"], "request_id": "fast"})
        assert fast["request_id"] == "fast" and not slow.done()
        gate.set()
        slow_reply = await slow
        assert slow_reply["request_id"] == "slow" and len(slow_reply["data"]) == 2
        assert data_of(worker)["cache"]["misses"] == 3


async def stream_frames(nc, prefix: str, body: dict) -> list:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(f"{prefix}.embed", msgpack.packb(body), reply=inbox)
        frames = []
        while True:
            frame = msgpack.unpackb((await sub.next_msg(timeout=30)).data)
            frame.pop("request_id")
            frames.append(frame)
            if frame.get("done"):
                return frames
    finally:
        await sub.unsubscribe()


async def _written(worker, items: int) -> bool:
    return worker.cache.bytes_written > 0 and not worker.cache._stores and \
        data_of(worker)["cache"]["bytes_written"] >= items * 384 * 4


@contextlib.asynccontextmanager
async def another_worker(model, url: str, prefix: str, **settings):
    worker = Worker(WorkerSettings(prefix=prefix, **settings), model)
    await worker.start(url)
    try:
        await wait_until_answering(url, prefix)
        yield worker
    finally:
        await worker.stop()


async def test_two_workers_share_hits_and_another_model_revision_misses(
        minilm, start_worker, nats_server, nc, prefix, bucket, tmp_path):
    texts = ["shared one", "shared two", "shared three"]
    # The same weights in another folder with one more file: another revision of the model.
    other = tmp_path / "minilm-v2"
    other.mkdir()
    for f in bundled_model_dir().iterdir():
        if f.is_file():
            (other / f.name).symlink_to(f)
    (other / "NOTES.md").write_text("a new revision\n")
    revised = dataclasses.replace(minilm, path=other)
    async with start_worker(minilm, cache_bucket=bucket) as first, \
            another_worker(minilm, nats_server.url, prefix + "b", cache_bucket=bucket) as second, \
            another_worker(revised, nats_server.url, prefix + "c", cache_bucket=bucket) as third:
        computed = await ask(nc, prefix, {"input": texts})
        await poll_until(lambda: _written(first, 3))
        shared = await ask(nc, prefix + "b", {"input": texts})
        assert data_of(second)["cache"]["hits"] == 3 and data_of(second)["batches"] == 0
        assert shared["data"] == computed["data"]
        await ask(nc, prefix + "c", {"input": texts})
        assert data_of(third)["cache"]["hits"] == 0 and data_of(third)["sequences"] == 3


async def test_a_deleted_bucket_and_jetstream_gone_never_fail_a_request(minilm, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="poolwire.actors.result_cache")
    prefix, bucket = "cachefail.pooling", "cache_fail"
    texts = [f"doc {i}" for i in range(8)]
    server = NatsServer(store_dir=tmp_path / "js")
    server.start()
    port = int(server.url.rsplit(":", 1)[1])
    replacement = None
    try:
        async with another_worker(minilm, server.url, prefix, cache_bucket=bucket,
                                  nats_reconnect_wait_s=0.1) as worker:
            nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
            try:
                want = await ask(nc, prefix, {"input": texts})
                await poll_until(lambda: _written(worker, 8))
                await nc.jetstream().delete_key_value(bucket)
                for _ in range(3):
                    reply = await ask(nc, prefix, {"input": texts})
                    assert "error" not in reply and rows_close(reply, want)
                # JetStream gone: the same port, a server without it.
                server.stop()
                replacement = NatsServer(store_dir=tmp_path / "plain", port=port, jetstream=False)
                replacement.start()
                await wait_until_answering(replacement.url, prefix, timeout=30)
                for i in range(4):
                    reply = await ask(nc, prefix, {"input": texts + [f"new {i}"]})
                    assert "error" not in reply and rows_close(reply, want, len(texts))
                counters = data_of(worker)["cache"]
                assert counters["errors"] >= 1
                assert data_of(worker)["batches"] >= 4  # computed as if there were no cache
            finally:
                await nc.close()
    finally:
        server.stop()
        if replacement is not None:
            replacement.stop()
    warnings = [r for r in caplog.records if "computing without the cache" in r.getMessage()]
    assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]  # once per outage


def rows_close(reply: dict, want: dict, n: int | None = None) -> bool:
    got = [np.asarray(d["data"], np.float32) for d in reply["data"]][:n]
    ref = [np.asarray(d["data"], np.float32) for d in want["data"]][:n]
    return len(got) == len(ref) and all(np.abs(a - b).max() < 1e-5 for a, b in zip(got, ref))
