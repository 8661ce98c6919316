"""The codec on its own: round trips, both encodings, and hostile bytes."""

import base64
import json

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from poolwire.schemas.codec import WireFormat, decode, encode, sniff_format
from poolwire.schemas.errors import ErrorCode, PoolingError


def test_msgpack_round_trip_packs_floats_as_float32():
    body = encode({"request_id": "r", "data": [0.1, 2.5]}, WireFormat.MSGPACK)
    # 0xca is MessagePack's float 32 marker; 0xcb (float 64) must not appear.
    assert body.count(b"\xca") == 2 and b"\xcb" not in body
    value, fmt = decode(body)
    assert fmt is WireFormat.MSGPACK
    assert value["data"] == pytest.approx([np.float32(0.1), 2.5])


def test_json_body_is_sniffed_after_white_space_and_replies_in_json():
    value, fmt = decode(b'  \n {"input": "hello"}')
    assert (value, fmt) == ({"input": "hello"}, WireFormat.JSON)
    out = encode({"bytes": b"\x00\x01"}, WireFormat.JSON)
    assert json.loads(out) == {"bytes": base64.b64encode(b"\x00\x01").decode()}


def test_sniff_format_only_looks_at_the_first_non_blank_byte():
    assert sniff_format(b"\t{") is WireFormat.JSON
    assert sniff_format(msgpack.packb({"{": 1})) is WireFormat.MSGPACK


@pytest.mark.parametrize("body, expected", [
    (b"", "empty body"),
    (b"   ", "empty body"),
    (b"\xc1", "undecodable msgpack"),
    (b"{not json", "undecodable json"),
    (msgpack.packb([1, 2]), "must be a map, got a list"),
    (b'{"a": 1} trailing', "undecodable json"),
    (msgpack.packb({"a": 1}) + b"\x00", "undecodable msgpack"),
    (msgpack.packb({1: "int key"}), "undecodable msgpack"),
    (b"\x81\xa1a\xc4\x02\xff", "undecodable msgpack"),  # truncated bin value
    (b"\xa3\xff\xfe\xfd", "undecodable msgpack"),       # a str that is not UTF-8
])
def test_undecodable_bodies_are_invalid_request(body, expected):
    with pytest.raises(PoolingError) as info:
        decode(body)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert expected in info.value.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_hostile_bytes_decode_to_a_map_or_a_clear_error(body):
    try:
        value, _ = decode(body)
    except PoolingError as err:
        assert err.code is ErrorCode.INVALID_REQUEST and err.message
    else:
        assert isinstance(value, dict)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**31, 2**31) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), st.sampled_from(list(WireFormat)))
def test_round_trip_of_maps_in_both_encodings(frame, fmt):
    assert decode(encode(frame, fmt)) == (frame, fmt)


@pytest.mark.parametrize("shape", [(0,), (1,), (15,), (16,), (384,), (70000,), (3, 4), (20, 17)])
def test_float32_rows_encode_as_the_floats_would(shape):
    """Float32Rows: the same bytes as the values packed one by one as 32-bit floats, and the
    same JSON as the list of them."""
    import json

    import msgpack
    import numpy as np

    from poolwire.schemas.codec import Float32Rows

    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if a.size:
        a.flat[0] = np.inf
    frame = {"request_id": "r", "data": [{"index": i, "data": Float32Rows(a)} for i in range(2)]}
    plain = {"request_id": "r", "data": [{"index": i, "data": a.tolist()} for i in range(2)]}
    assert encode(frame, WireFormat.MSGPACK) == msgpack.packb(plain, use_single_float=True,
                                                              use_bin_type=True)
    assert encode(frame, WireFormat.JSON) == json.dumps(plain, separators=(",", ":")).encode()


@pytest.mark.parametrize("shapes", [[(384,)] * 32, [(16,)] * 3 + [(17,)], [(8,), (2, 8), (8,)],
                                    [(0,), (0,)], [(70000,)] * 2])
def test_a_frame_of_many_float32_rows_encodes_as_the_floats_would(shapes):
    """A reply's rows are converted together where they are vectors of one length, one by one
    otherwise: either way each lands in its own place, in the bytes the floats give."""
    import msgpack
    import numpy as np

    from poolwire.schemas.codec import Float32Rows

    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    frame = {"data": [{"index": i, "data": Float32Rows(a)} for i, a in enumerate(arrays)],
             "usage": {"prompt_tokens": 3}}
    plain = {"data": [{"index": i, "data": a.tolist()} for i, a in enumerate(arrays)],
             "usage": {"prompt_tokens": 3}}
    assert encode(frame, WireFormat.MSGPACK) == msgpack.packb(plain, use_single_float=True,
                                                              use_bin_type=True)


def test_float32_rows_beside_bytes_that_hold_the_marker_still_encode_exactly():
    import msgpack
    import numpy as np

    from poolwire.schemas import codec

    a = np.ones(4, np.float32)
    hostile = codec._PACKED_MARK + bytes(4)  # what the first array's marker looks like
    frame = {"bytes": hostile, "data": codec.Float32Rows(a)}
    assert encode(frame, WireFormat.MSGPACK) == msgpack.packb(
        {"bytes": hostile, "data": a.tolist()}, use_single_float=True, use_bin_type=True)
