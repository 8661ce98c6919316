"""Streamed replies against a nats-server with a small max_payload: token rows split into
offset frames, every frame (headers included) under the limit, one final frame; and the
one-message reply that would not fit is refused with payload_too_large."""

import msgpack
import nats
import numpy as np
import pytest

from poolwire.actors.framing import header_bytes
from poolwire.actors.nats_server import NatsServer

pytestmark = pytest.mark.timeout(180)

MAX_PAYLOAD = 64 * 1024


@pytest.fixture(scope="module")
def small_payload_server():
    with NatsServer(max_payload=MAX_PAYLOAD) as server:
        yield server


def frame_size(msg) -> int:
    return len(msg.data) + header_bytes(dict(msg.headers) if msg.headers else None)


async def collect(nc, subject, body, timeout=60):
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, msgpack.packb(body), reply=inbox)
    frames = []
    while True:
        msg = await sub.next_msg(timeout=timeout)
        frames.append(msg)
        frame = msgpack.unpackb(msg.data)
        if frame.get("done") or "error" in frame:
            break
    await sub.unsubscribe()
    return frames


@pytest.mark.parametrize("configured", ["embed", "token_embed"])  # deprecated frames carry a header
async def test_token_embed_at_max_length_streams_complete_under_the_limit(
        minilm, start_worker, small_payload_server, prefix, configured):
    task = "token_embed"
    long_text = "word " * 400
    nc = await nats.connect(small_payload_server.url)
    try:
        assert nc.max_payload == MAX_PAYLOAD
        async with start_worker(minilm, url=small_payload_server.url, task=configured):
            frames = await collect(nc, f"{prefix}.{task}", {
                "input": [long_text, "short", long_text, long_text], "truncate_prompt_tokens": -1,
                "stream": True, "request_id": "s1"})
            one = await nc.request(f"{prefix}.{task}", msgpack.packb(
                {"input": [long_text], "truncate_prompt_tokens": -1}), timeout=60)
            reference = await nc.request(f"{prefix}.token_embed", msgpack.packb(
                {"input": "short", "encoding_format": "binary"}), timeout=60)
    finally:
        await nc.close()
    assert all(frame_size(m) <= MAX_PAYLOAD for m in frames)
    decoded = [msgpack.unpackb(m.data) for m in frames]
    assert [("done" in f) for f in decoded].count(True) == 1 and decoded[-1]["done"]
    assert decoded[-1]["usage"]["prompt_tokens"] == 3 * 256 + 3
    rows: dict[int, list] = {0: [], 1: [], 2: [], 3: []}
    for f in decoded[:-1]:
        assert set(f) == {"request_id", "index", "offset", "data"} and f["request_id"] == "s1"
        assert f["offset"] == len(rows[f["index"]])  # in order per item, no gap
        rows[f["index"]].extend(f["data"])
    assert [len(r) for r in rows.values()] == [256, 3, 256, 256]
    assert len(decoded) > 5  # 256 x 384 floats do not fit in 64 KB: items were split
    # The one-message reply of the same item cannot fit: a clear error, not a reset connection.
    err = msgpack.unpackb(one.data)["error"]
    assert err["code"] == "payload_too_large" and "stream" in err["message"]
    # Binary fp32 of the short item (which fits in one message) equals what was streamed.
    ref = msgpack.unpackb(reference.data)["data"][0]
    short = np.frombuffer(ref["bytes"], "<f4").reshape(ref["shape"])
    np.testing.assert_allclose(np.asarray(rows[1], np.float32), short, atol=1e-5)
    if configured == "embed":
        assert all(m.headers["Pooling-Deprecation"] == "embed" for m in frames)
