"""Reply framing: one-message replies under max_payload, streamed frames split by token rows."""

import msgpack
import numpy as np
import pytest

from poolwire.actors.framing import (ROWS_FROM, ReplyStyle, done_frame, error_frame, header_bytes,
                                    item_frames, one_reply, rows_from, wire_item)
from poolwire.schemas.codec import Float32Rows, WireFormat, decode
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.replies import DoneFrame, ErrorFrame, OneReply, StreamItemFrame

FLOAT = ReplyStyle(WireFormat.MSGPACK, binary=False, dtype="float32")


def test_header_bytes_matches_the_nats_header_block():
    block = b"NATS/1.0\r\nPooling-Deprecation: embed\r\n\r\n"
    assert header_bytes({"Pooling-Deprecation": "embed"}) == len(block)
    assert header_bytes(None) == 0


def test_one_reply_validates_against_the_schema():
    items = [wire_item(i, np.ones(4, np.float32) * i, FLOAT) for i in range(3)]
    body = one_reply("r1", "m", "embed", items, 12, FLOAT, 1 << 20, warnings=["w"])
    frame, _ = decode(body)
    reply = OneReply.model_validate(frame)
    assert reply.usage.total_tokens == 12 and reply.data[2].data == [2.0] * 4


@pytest.mark.parametrize("shape", [(3,), (ROWS_FROM - 1,), (ROWS_FROM,), (384,), (2, 100), (7, 2)],
                         ids=str)
def test_float32_items_are_the_bytes_of_their_values_packed_as_32_bit_floats(shape):
    # Small items go as Python floats, large ones from the array's bytes (codec.Float32Rows):
    # both must give what packb gives for the values themselves.
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    body = one_reply("r1", "m", "embed", [wire_item(0, values, FLOAT)], 5, FLOAT, 1 << 20)
    frame = {"request_id": "r1", "model": "m", "task": "embed",
             "usage": {"prompt_tokens": 5, "total_tokens": 5}, "data": [{"index": 0,
                                                                     "data": values.tolist()}]}
    assert msgpack.unpackb(body) == msgpack.unpackb(
        msgpack.packb(frame, use_single_float=True, use_bin_type=True))
    assert body.count(b"\xca") >= values.size  # every value a MessagePack float32


@pytest.mark.parametrize("items, width, from_bytes", [
    (1, 100, False), (2, 100, False), (4, 100, True), (4, 64, False), (32, 48, True),
    (32, 32, False), (64, 48, True), (16, 56, True), (16, 48, False), (3, ROWS_FROM, True)])
def test_a_reply_of_many_items_writes_shorter_vectors_from_their_bytes(items, width, from_bytes):
    # The rows' fixed cost is shared by a reply's items (rows_from): which way each item goes,
    # and the same values either way.
    rng = np.random.default_rng(items * 1000 + width)
    vectors = [rng.standard_normal(width).astype(np.float32) for _ in range(items)]
    wire = [wire_item(i, v, FLOAT, rows_from=rows_from(items)) for i, v in enumerate(vectors)]
    assert all(isinstance(w["data"], Float32Rows) == from_bytes for w in wire)
    body = one_reply("r", "m", "embed", wire, 5, FLOAT, 1 << 20)
    expected = [{"index": i, "data": v.tolist()} for i, v in enumerate(vectors)]
    assert msgpack.unpackb(body)["data"] == msgpack.unpackb(
        msgpack.packb(expected, use_single_float=True))


def test_one_reply_over_max_payload_is_payload_too_large_naming_stream_and_binary():
    items = [wire_item(0, np.zeros(4096, np.float32), FLOAT)]
    with pytest.raises(PoolingError) as info:
        one_reply("r", "m", "embed", items, 1, FLOAT, max_payload=8192)
    assert info.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert "stream" in info.value.message and "binary" in info.value.message


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("binary", [False, True])
def test_token_rows_split_into_frames_under_the_limit_with_offsets(fmt, binary):
    style = ReplyStyle(fmt, binary, "float16")
    rows = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    headers = {"Pooling-Deprecation": "embed"}
    limit = 16 * 1024
    frames = item_frames("req", 3, rows, style, token_level=True, max_payload=limit, headers=headers)
    assert len(frames) > 1
    got, next_offset = [], 0
    for body in frames:
        assert len(body) + header_bytes(headers) <= limit
        frame, _ = decode(body)
        StreamItemFrame.model_validate(frame)
        assert frame["index"] == 3 and frame["offset"] == next_offset
        if binary:
            raw = frame["bytes"] if fmt is WireFormat.MSGPACK else __import__("base64").b64decode(frame["bytes"])
            part = np.frombuffer(raw, "<f2").reshape(frame["shape"])
        else:
            part = np.asarray(frame["data"])
        next_offset += part.shape[0]
        got.append(part)
    assert next_offset == 300
    atol = 1e-2 if binary else 1e-6
    np.testing.assert_allclose(np.concatenate(got).astype(np.float32), rows, atol=atol, rtol=1e-3)


def test_token_item_that_fits_is_one_frame_with_offset_zero():
    frames = item_frames("r", 0, np.ones((3, 4), np.float32), FLOAT, True, 1 << 20)
    assert [msgpack.unpackb(f)["offset"] for f in frames] == [0]


def test_a_vector_item_never_carries_offset_and_must_fit():
    (body,) = item_frames("r", 1, np.ones(4, np.float32), FLOAT, False, 1 << 20)
    assert "offset" not in msgpack.unpackb(body)
    with pytest.raises(PoolingError):
        item_frames("r", 1, np.ones(4096, np.float32), FLOAT, False, 4096)


def test_bfloat16_binary_rounds_like_torch():
    import torch

    values = np.array([1.0, 1.00390625, 3.14159, -2.5e-3, 65504.0], np.float32)
    item = wire_item(0, values, ReplyStyle(WireFormat.MSGPACK, True, "bfloat16"))
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert item["bytes"] == expected and item["shape"] == [5] and item["dtype"] == "bfloat16"


def test_done_and_error_frames_follow_the_schema():
    DoneFrame.model_validate(decode(done_frame("r", "m", "embed", 5, FLOAT))[0])
    body, headers = error_frame("r", PoolingError(ErrorCode.OVERLOADED, "full\nnow", retry_after_ms=5),
                                WireFormat.JSON)
    frame = ErrorFrame.model_validate(decode(body)[0])
    assert frame.error.code == "overloaded" and frame.error.retry_after_ms == 5
    assert headers == {"Nats-Service-Error": "full now", "Nats-Service-Error-Code": "503"}


def test_an_error_frame_with_a_doc_id_keeps_it_and_still_fits():
    """A pipeline result's doc_id rides along as it is while the message is cut to fit."""
    headers = {"Pooling-Source-Stream": "DOCS", "Pooling-Source-Seq": "7", "Nats-Msg-Id": "DOCS:7"}
    error = PoolingError(ErrorCode.INVALID_REQUEST, "no field 'text' in " + "k" * 5000)
    for fmt in WireFormat:
        body, service = error_frame("DOCS:7", error, fmt, 1024, headers, fields={"doc_id": "d-7"})
        frame = decode(body)[0]
        assert frame["doc_id"] == "d-7" and frame["request_id"] == "DOCS:7"
        assert "(shortened from" in frame["error"]["message"]
        assert len(body) + header_bytes({**headers, **service}) <= 1024


def test_token_frames_carry_the_tokens_and_offsets_of_their_own_rows():
    """return_tokens on a streamed token-level item split over frames: each frame has its
    rows' tokens and offsets, and its share of the entities (here one, in the first frame)."""
    rows = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    extras = {"tokens": [f"t{i}" for i in range(40)],
              "offsets": [None] + [[i, i + 1] for i in range(39)],
              "entities": [{"entity_group": "PER", "score": 0.5, "word": "t1", "start": 0, "end": 1}]}
    bodies = item_frames("r1", 0, rows, FLOAT, True, 600, None, extras)
    frames = [StreamItemFrame.model_validate(decode(b)[0]) for b in bodies]
    assert len(frames) > 2 and all(len(b) <= 600 for b in bodies)
    assert sum((f.tokens for f in frames), []) == extras["tokens"]
    assert sum((f.offsets for f in frames), []) == extras["offsets"]
    for f in frames:
        assert len(f.tokens) == len(f.data) and f.tokens[0] == f"t{f.offset}"
    assert [e.word for e in frames[0].entities] == ["t1"]
    assert all(f.entities is None for f in frames[1:])


def test_entities_too_many_for_one_frame_are_spread_over_the_item_s_frames():
    """An item whose entities alone exceed max_payload streams, each frame with its rows'
    share of them, in order (an audit found the whole list put on the first frame, and the
    request refused as payload_too_large with a remedy that did not apply)."""
    rows = np.zeros((134, 5), dtype=np.float32)
    extras = {"entities": [{"entity_group": "PER", "score": 0.99, "word": f"Hunnewell {i}",
                            "start": 10 * i, "end": 10 * i + 9} for i in range(85)]}
    for fmt in WireFormat:
        style = ReplyStyle(fmt, False, "float32")
        bodies = item_frames("r1", 0, rows, style, True, 4096, None, extras)
        frames = [StreamItemFrame.model_validate(decode(b)[0]) for b in bodies]
        assert len(frames) > 1 and all(len(b) <= 4096 for b in bodies)
        joined = [(e.word, e.start, e.end) for f in frames for e in f.entities or []]
        assert joined == [(e["word"], e["start"], e["end"]) for e in extras["entities"]]
        assert sum(len(f.data) for f in frames) == 134 and frames[0].entities
