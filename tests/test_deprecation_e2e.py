"""Deprecation of multi-task serving (vLLM PR #37956) on a real nats-server: events, warnings,
headers, one log line, reject mode, and the JetStream stream that keeps the events."""

import asyncio
import logging
import os
import subprocess
import sys

import msgpack
import pytest
from nats.js.api import StreamConfig

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.actors.events import events_stream_name
from poolwire.schemas.events import DeprecationEvent

pytestmark = pytest.mark.timeout(180)


async def test_20_deprecated_requests_give_20_events_warnings_headers_and_one_log_line(
        minilm, start_worker, nc, prefix, caplog):
    events = []
    got_all = asyncio.Event()

    async def on_event(msg):
        events.append(msgpack.unpackb(msg.data, raw=False))
        if len(events) == 20:
            got_all.set()

    await nc.subscribe(f"{prefix}.events.deprecation", cb=on_event)
    caplog.set_level(logging.WARNING, logger="actors.validator")
    async with start_worker(minilm, task="embed") as worker:
        replies = await asyncio.gather(*(nc.request(
            f"{prefix}.token_embed", msgpack.packb({"input": f"text {i}", "request_id": f"r{i}"}),
            timeout=30) for i in range(20)))
        await asyncio.wait_for(got_all.wait(), 10)
    for i, msg in enumerate(replies):
        frame = msgpack.unpackb(msg.data, raw=False)
        assert frame["request_id"] == f"r{i}" and frame["task"] == "token_embed"
        assert len(frame["warnings"]) == 1 and "deprecated" in frame["warnings"][0]
        assert msg.headers["Pooling-Deprecation"] == "embed"
    assert sorted(e["request_id"] for e in events) == sorted(f"r{i}" for i in range(20))
    for event in events:
        DeprecationEvent.model_validate(event)  # every field of PROTOCOL.md, nothing else
        assert event["event"] == "pooling.multitask.deprecated"
        assert event["requested_task"] == "token_embed" and event["configured_task"] == "embed"
        assert event["supported_tasks"] == ["embed", "token_embed", "score"]
        assert event["model"] == "all-MiniLM-L6-v2" and event["worker"] == worker.worker_id
        assert "--task token_embed" in event["hint"] and event["time"].endswith("Z")
    lines = [r for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(lines) == 1


async def test_streamed_frames_of_a_deprecated_request_all_carry_the_header(minilm, start_worker, nc, prefix):
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    async with start_worker(minilm, task="embed"):
        await nc.publish(f"{prefix}.token_embed", msgpack.packb({"input": ["a", "b"], "stream": True}),
                         reply=inbox)
        frames = []
        while not frames or "done" not in msgpack.unpackb(frames[-1].data):
            frames.append(await sub.next_msg(timeout=30))
    assert len(frames) == 3
    assert all(f.headers["Pooling-Deprecation"] == "embed" for f in frames)
    assert "warnings" in msgpack.unpackb(frames[-1].data)


async def test_an_invalid_request_on_a_deprecated_task_carries_the_header_too(minilm, start_worker,
                                                                              nc, prefix):
    """Every frame of a deprecated-task request carries the header (PROTOCOL.md), its error
    frame included, whichever check refused it; a refused request publishes no event."""
    events = []

    async def on_event(msg):
        events.append(msg)

    await nc.subscribe(f"{prefix}.events.deprecation", cb=on_event)
    async with start_worker(minilm, task="embed"):
        for body in ({"input": "a", "bogus": 1}, {"input": "a", "dimensions": 999},
                     {"input": "word " * 300}):
            msg = await nc.request(f"{prefix}.token_embed", msgpack.packb(body), timeout=30)
            assert "error" in msgpack.unpackb(msg.data), body
            assert msg.headers["Pooling-Deprecation"] == "embed", body
        refused = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "a", "bogus": 1}),
                                   timeout=30)
        assert "Pooling-Deprecation" not in (refused.headers or {})
        await nc.flush()
    assert events == []


async def test_reject_policy_refuses_with_task_not_configured(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, task="embed", multitask="reject"):
        client = PoolingClient(nc, prefix=prefix)
        for _ in range(20):
            with pytest.raises(PoolingServiceError) as info:
                await client.token_embed("text")
            assert info.value.code == "task_not_configured"
            assert info.value.error["configured_task"] == "embed"
            assert info.value.error["supported_tasks"] == ["embed", "token_embed", "score"]
        # score is computed with the configured task (cosine of embed vectors): served.
        assert "warnings" not in await client.score("a", "b")


async def test_an_unsupported_task_lists_every_supported_task(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, task="embed"):
        with pytest.raises(PoolingServiceError) as info:
            await PoolingClient(nc, prefix=prefix).classify("text")
    assert info.value.code == "unsupported_task"
    assert set(info.value.error["supported_tasks"]) == {"embed", "score", "token_embed"}


async def test_the_events_stream_keeps_events_published_while_nobody_listened(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, task="embed"):
        client = PoolingClient(nc, prefix=prefix)
        for i in range(5):
            await client.token_embed("text", request_id=f"kept{i}")
    js = nc.jetstream()
    name = events_stream_name(prefix)
    assert name == "POOLWIRE_EVENTS_" + prefix.upper().replace(".", "_")
    sub = await js.subscribe(f"{prefix}.events.deprecation", stream=name, ordered_consumer=True)
    got = [msgpack.unpackb((await sub.next_msg(timeout=5)).data)["request_id"] for _ in range(5)]
    assert got == [f"kept{i}" for i in range(5)]


async def test_a_stream_an_operator_made_is_reused_not_duplicated(minilm, start_worker, nc, prefix):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=f"OPS_AUDIT_{os.getpid()}_{prefix.replace('.', '_')}",
                                     subjects=[f"{prefix}.events.>"], max_msgs=1000))
    async with start_worker(minilm, task="embed"):
        await PoolingClient(nc, prefix=prefix).token_embed("text")
    names = await js.streams_info()
    ours = [s.config.name for s in names if s.config.name == events_stream_name(prefix)]
    assert ours == []
    info = await js.stream_info(f"OPS_AUDIT_{os.getpid()}_{prefix.replace('.', '_')}")
    assert info.state.messages == 1


async def test_poolwire_events_prints_each_event_as_a_json_line(minilm, start_worker, nats_server, nc, prefix):
    import json

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", "events", "--nats-url", nats_server.url,
        "--prefix", prefix, "--count", "2", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        async with start_worker(minilm, task="embed"):
            client = PoolingClient(nc, prefix=prefix)
            lines = []
            # The CLI subscribes a moment after it starts: send until it has printed two events.
            while len(lines) < 2:
                await client.token_embed("text")
                try:
                    lines.append(await asyncio.wait_for(proc.stdout.readline(), 0.5))
                except asyncio.TimeoutError:
                    continue
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    for line in lines:
        event = json.loads(line)
        assert event["event"] == "pooling.multitask.deprecated" and event["requested_task"] == "token_embed"


async def test_a_deprecated_score_hints_at_the_task_it_is_computed_with(small_models, start_worker,
                                                                      nc, prefix):
    # On a cross-encoder's token_classify deployment, score (the classify head on the pair) is
    # deprecated; `--task score` is refused at start, so the hint names classify. (Since
    # PROTOCOL 1.2 a token_embed deployment scores by late interaction, not deprecated.)
    events = await nc.subscribe(f"{prefix}.events.deprecation")
    async with start_worker(small_models["seq1"], task="token_classify"):
        reply = await PoolingClient(nc, prefix=prefix).score("a cat", "a dog")
        assert reply["warnings"]
        event = msgpack.unpackb((await events.next_msg(timeout=10)).data)
    assert event["requested_task"] == "score" and event["configured_task"] == "token_classify"
    assert "--task classify" in event["hint"] and "--task score" not in event["hint"]
