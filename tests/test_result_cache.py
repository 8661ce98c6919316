"""actors/result_cache.py's pure parts alone: the key (what changes it, what does not), the
model fingerprint, the stored value's round trip, and how a lookup splits a request."""

import numpy as np
import pytest

from poolwire.actors.result_cache import (NOT_IN_KEY, Identity, Lookup, cacheable, decode_value,
                                          encode_value, fingerprint, items_of, key_of, options_of,
                                          split_request)
from poolwire.schemas.requests import PoolingRequest, parse_request
from poolwire.schemas.tasks import Task

IDENTITY = Identity("files:abc", "torch", "exact", "float32", "cpu")


def key(body: dict, task: Task = Task.EMBED, identity: Identity = IDENTITY, item="hello"):
    return key_of(identity.digest(), task, options_of(parse_request(task, body)), item)


def test_fields_that_change_numbers_change_the_key():
    base = key({"input": "hello"})
    assert key({"input": "hello"}) == base  # pure: the same request, the same key
    for changed in ({"dimensions": 8}, {"normalize": False}, {"use_activation": False},
                    {"prompt": "query: "}, {"prompt_name": "query"},
                    {"truncate_prompt_tokens": 16}, {"truncation_side": "left"}):
        assert key({"input": "hello", **changed}) != base, changed
    assert key({"input": "hello"}, item="hello!") != base
    assert key({"input": "hello"}, task=Task.CLASSIFY) != base
    # Text and the same characters' token ids are different inputs.
    assert key({"input": "hello"}, item=[101, 102]) != key({"input": "hello"}, item="[101, 102]")


@pytest.mark.parametrize("identity", [
    Identity("files:abd", "torch", "exact", "float32", "cpu"),      # another model revision
    Identity("files:abc", "openvino", "exact", "float32", "cpu"),   # another backend
    Identity("files:abc", "torch", "fast", "float32", "cpu"),       # another precision
    Identity("files:abc", "torch", "exact", "float16", "cpu"),      # another dtype
    Identity("files:abc", "torch", "exact", "float32", "cuda"),     # another device type
])
def test_a_changed_model_or_way_of_computing_never_hits(identity):
    assert key({"input": "hello"}, identity=identity) != key({"input": "hello"})


def test_fields_that_leave_numbers_alone_do_not_change_the_key():
    base = key({"input": "hello"})
    for same in ({"request_id": "r9"}, {"stream": True}, {"deadline_ms": 50}, {"priority": 3},
                 {"encoding_format": "binary"}, {"embed_dtype": "float16"}, {"cache": True}):
        assert key({"input": "hello", **same}) == base, same
    # Every field of the protocol is in the key unless named here: a new field is keyed.
    assert NOT_IN_KEY < set(PoolingRequest.model_fields)


def test_fingerprint_follows_the_files_not_the_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / "sub").mkdir(parents=True)
        (folder / "config.json").write_text('{"x": 1}')
        (folder / "sub" / "weights.bin").write_bytes(b"\x00\x01" * 100)
    (a / ".cache").mkdir()
    (a / ".cache" / "lock").write_text("not the model")
    assert fingerprint(a) == fingerprint(b)
    (b / "sub" / "weights.bin").write_bytes(b"\x00\x02" * 100)
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a, "0123abcd") == "revision:0123abcd"


def test_a_stored_value_comes_back_bit_for_bit():
    value = np.random.default_rng(0).standard_normal((384,)).astype(np.float32)
    back, tokens = decode_value(encode_value(value[::1], 7))
    assert tokens == 7 and back.dtype == value.dtype and back.tobytes() == value.tobytes()
    rows = np.arange(12, dtype=np.float16).reshape(3, 4)
    assert decode_value(encode_value(rows, 1))[0].tobytes() == rows.tobytes()


def test_a_lookup_keeps_only_the_misses_to_compute():
    request = parse_request(Task.EMBED, {"input": ["a", "b", "c", "d"], "dimensions": 4})
    items, batch = items_of(request)
    assert items == ["a", "b", "c", "d"] and batch
    rest = split_request(request, [1, 3], batch)
    assert rest.input == ["b", "d"] and rest.dimensions == 4
    hit = (np.zeros(4, np.float32), 5)
    lookup = Lookup(["k0", "k1", "k2", "k3"], {0: hit, 2: hit}, [1, 3], rest)
    assert lookup.item_tokens([6, 7]) == [5, 6, 5, 7]
    assert items_of(parse_request(Task.EMBED, {"input": [1, 2, 3]})) == ([[1, 2, 3]], False)
    assert items_of(parse_request(Task.EMBED, {"input": "one"})) == (["one"], False)


def test_what_is_cached():
    assert cacheable(Task.EMBED, parse_request(Task.EMBED, {"input": "x"}))
    assert cacheable(Task.CLASSIFY, parse_request(Task.CLASSIFY, {"input": "x"}))
    assert not cacheable(Task.EMBED, parse_request(Task.EMBED, {"input": "x", "cache": False}))
    assert not cacheable(Task.TOKEN_EMBED, parse_request(Task.TOKEN_EMBED, {"input": "x"}))
    assert not cacheable(Task.SCORE, parse_request(Task.SCORE, {"text_1": "a", "text_2": "b"}))
