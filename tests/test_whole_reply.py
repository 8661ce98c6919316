"""How the client puts a big answer back together (pure): splitting a request by its items,
joining a stream (with token rows split by offset), merging the replies to the parts."""

import base64

import msgpack
import numpy as np

from poolwire.whole_reply import assemble_stream, merge_replies, split_body


def packed(body) -> int:
    return len(msgpack.packb(body, use_bin_type=True))


def test_a_body_that_fits_is_not_split():
    body = {"input": ["a", "b"], "dimensions": 8}
    assert split_body("embed", body, 1000) == [(0, body)]


def test_a_big_input_is_split_in_order_into_parts_that_fit():
    texts = [f"text {i} " + "w" * (i % 50) for i in range(3000)]
    body = {"input": texts, "dimensions": 64, "request_id": "mine"}
    parts = split_body("embed", body, 16 * 1024)
    assert len(parts) > 3
    joined = []
    for start, part in parts:
        assert packed(part) <= 16 * 1024 and start == len(joined)
        assert part["dimensions"] == 64 and part["request_id"] == "mine"
        joined.extend(part["input"])
    assert joined == texts


def test_a_single_item_cannot_be_split():
    body = {"input": "x" * 100_000}
    assert split_body("embed", body, 1000) == [(0, body)]
    ids = {"input": list(range(50_000))}  # one list of token ids is one item
    assert split_body("embed", ids, 1000) == [(0, ids)]


def test_score_splits_the_side_with_many_texts_and_keeps_the_lone_one():
    body = {"text_1": "query", "text_2": [f"doc {i} " * 20 for i in range(400)]}
    parts = split_body("score", body, 8 * 1024)
    assert len(parts) > 1 and all(p["text_1"] == "query" for _, p in parts)
    assert sum(len(p["text_2"]) for _, p in parts) == 400
    zipped = {"text_1": [f"a{i} " * 30 for i in range(200)], "text_2": [f"b{i} " * 30 for i in range(200)]}
    for start, part in split_body("score", zipped, 8 * 1024):
        assert part["text_1"][0] == zipped["text_1"][start] and part["text_2"][0] == zipped["text_2"][start]
        assert len(part["text_1"]) == len(part["text_2"])


def test_a_stream_becomes_the_one_reply_shape_in_index_order():
    frames = [{"request_id": "r", "index": 1, "data": [0.5, 0.25]},
              {"request_id": "r", "index": 0, "data": [1.0, 0.0]},
              {"request_id": "r", "done": True, "model": "m", "task": "embed",
               "usage": {"prompt_tokens": 9, "total_tokens": 9}, "warnings": ["deprecated"]}]
    assert assemble_stream(frames, "r") == {
        "request_id": "r", "model": "m", "task": "embed",
        "data": [{"index": 0, "data": [1.0, 0.0]}, {"index": 1, "data": [0.5, 0.25]}],
        "usage": {"prompt_tokens": 9, "total_tokens": 9}, "warnings": ["deprecated"]}


def test_token_rows_split_by_offset_are_joined_in_row_order():
    rows = np.arange(12, dtype="<f4").reshape(6, 2)
    float_frames = [{"request_id": "r", "index": 0, "offset": 4, "data": rows[4:].tolist()},
                    {"request_id": "r", "index": 0, "offset": 0, "data": rows[:4].tolist()}]
    binary_frames = [
        {"request_id": "r", "index": 0, "offset": 3, "dtype": "float32", "shape": [3, 2],
         "bytes": base64.b64encode(rows[3:].tobytes()).decode()},  # JSON replies carry base64
        {"request_id": "r", "index": 0, "offset": 0, "dtype": "float32", "shape": [3, 2],
         "bytes": rows[:3].tobytes()}]
    done = {"request_id": "r", "done": True, "model": "m", "task": "token_embed",
            "usage": {"prompt_tokens": 6, "total_tokens": 6}}
    assert assemble_stream(float_frames + [done], "r")["data"] == [{"index": 0, "data": rows.tolist()}]
    item = assemble_stream(binary_frames + [done], "r")["data"][0]
    assert item["shape"] == [6, 2] and item["dtype"] == "float32"
    assert np.array_equal(np.frombuffer(item["bytes"], "<f4").reshape(6, 2), rows)


def test_replies_to_parts_merge_into_one():
    def reply(n, tokens, warnings=None):
        out = {"request_id": "x", "model": "m", "task": "classify", "labels": ["A", "B"],
               "data": [{"index": i, "data": [0.1, 0.9]} for i in range(n)],
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return out | ({"warnings": warnings} if warnings else {})

    merged = merge_replies([(0, reply(2, 10, ["w"])), (2, reply(3, 7, ["w"]))], "mine")
    assert [d["index"] for d in merged["data"]] == [0, 1, 2, 3, 4]
    assert merged["usage"] == {"prompt_tokens": 17, "total_tokens": 17}
    assert merged["warnings"] == ["w"] and merged["labels"] == ["A", "B"]
    assert merged["request_id"] == "mine"
