"""A pipeline of 1,000 documents, some longer than the model, through two chunked-processing
workers (subprocesses), one SIGKILLed part-way: every document has exactly one stored result,
and a long one is embedded whole (its chunks' tokens all counted), not cut."""

import asyncio
import json

import msgpack
import nats
import pytest
from nats.js.api import StreamConfig

from tests.helpers import poll_until
from tests.procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

LONG_EVERY = 50  # 20 long documents of 700 tokens (3 chunks each); the rest a sentence


def text_of(i: int) -> str:
    if i % LONG_EVERY == 0:
        return " ".join(["the"] * 698)  # 698 words + [CLS] + [SEP] = 700 tokens
    return f"pipeline document {i} about rivers and stations"


@pytest.mark.timeout(300)
async def test_a_pipeline_with_long_documents_loses_none_when_a_worker_is_killed(nats_server, prefix, tmp_path):
    docs = 1000
    root = prefix.replace(".", "_")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=f"{root}_DOCS", subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    results: dict[int, dict] = {}
    all_seen, part_seen = asyncio.Event(), asyncio.Event()

    async def on_result(msg) -> None:
        body = msgpack.unpackb(msg.data)
        results[body["doc_id"]] = body  # a redelivered document's result overwrites its twin
        if len(results) >= docs * 3 // 10:
            part_seen.set()
        if len(results) == docs:
            all_seen.set()

    await nc.subscribe(f"{root}.out.>", cb=on_result)
    options = ("--pipeline-stream", f"{root}_DOCS", "--pipeline-input", f"{root}.in",
               "--pipeline-output", f"{root}.out", "--pipeline-id-field", "id",
               "--chunked-processing", "--durable-ack-wait-s", "1")
    first, second = (WorkerProcess(nats_server.url, prefix, *options, log_dir=tmp_path)
                     for _ in range(2))
    try:
        await asyncio.gather(first.start(), second.start())
        for i in range(docs):
            await js.publish(f"{root}.in.{i}", msgpack.packb({"text": text_of(i), "id": i}))
        await asyncio.wait_for(part_seen.wait(), 150)
        first.kill()
        answered_before_kill = len(results)
        await asyncio.wait_for(all_seen.wait(), 200)
        # A subscriber sees a result on core NATS before its stream has stored it (the store is
        # acknowledged to the publisher only), so the count read the moment the last result
        # arrived could be one short (CI saw 999 of 1000): look until it is all there.
        async def count() -> int:
            return (await js.stream_info(f"{root}_OUT")).state.messages

        async def all_stored() -> bool:
            return await count() >= docs

        try:
            await poll_until(all_stored, timeout=10)
        except AssertionError:
            pass  # the count is asserted below, with what it is
        stored = await count()
        print(json.dumps({"test": "chunked_pipeline_kill", "docs": docs,
                          "answered_before_kill": answered_before_kill, "results": len(results),
                          "stored": stored}))
        assert sorted(results) == list(range(docs))
        assert stored == docs  # one result each: redeliveries are de-duplicated by Nats-Msg-Id
        assert not [b for b in results.values() if "error" in b]
        assert {len(b["data"]) for b in results.values()} == {1}
        assert {len(b["data"][0]["data"]) for b in results.values()} == {384}
        long_usage = {results[i]["usage"]["prompt_tokens"] for i in range(0, docs, LONG_EVERY)}
        assert long_usage == {700}
    finally:
        await nc.close()
        await asyncio.gather(first.close(), second.close())
