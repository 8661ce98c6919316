"""Each class of hostile body on its own, through the worker's validation path without NATS
(decode, then the fields against the task and the model): invalid_request naming the field,
never another exception, and an error frame that fits max_payload with its headers."""

import json
import random

import msgpack
import pytest

from poolwire.actors.framing import error_frame, header_bytes
from poolwire.actors.validator import ModelLimits, check_against_model
from poolwire.schemas.codec import WireFormat, decode, sniff_format
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.replies import ErrorFrame
from poolwire.schemas.requests import parse_request, request_id_of
from poolwire.schemas.sanity import MAX_DEPTH, preview
from poolwire.schemas.tasks import Task
from tests import hostile_bodies as hb

LIMITS = ModelLimits("all-MiniLM-L6-v2", max_length=256, embedding_size=384)
MAX_PAYLOAD = hb.MAX_PAYLOAD
DEPRECATION = {"Pooling-Deprecation": "embed"}  # the longest headers a reply carries


def judge(task: Task, body: bytes) -> PoolingError:
    """The error the worker's validation gives `body` on `task` (fails the test if none)."""
    try:
        value, _ = decode(body)
        request = parse_request(task, value)
        check_against_model(task, request, LIMITS)
    except PoolingError as err:
        return err
    raise AssertionError(f"accepted: {body[:120]!r}")


def assert_frame_fits(err: PoolingError, body: bytes) -> dict:
    """The frame the worker would send: it fits max_payload with every header and decodes."""
    try:
        request_id = request_id_of(decode(body)[0]) or "generated0123456789abcdef01234567"
    except PoolingError:
        request_id = "generated0123456789abcdef01234567"
    fmt = sniff_format(body)
    frame_body, service = error_frame(request_id, err, fmt, MAX_PAYLOAD, DEPRECATION)
    assert len(frame_body) + header_bytes({**DEPRECATION, **service}) <= MAX_PAYLOAD
    frame, _ = decode(frame_body)
    ErrorFrame.model_validate(frame)
    assert len(frame["error"]["message"]) < 1000 and len(service["Nats-Service-Error"]) < 400
    return frame


@pytest.mark.parametrize("name", sorted(hb.CLASSES))
def test_every_body_of_each_class_is_invalid_request_with_a_frame_that_fits(name):
    rng = random.Random(name)
    for _ in range(60):
        body = hb.CLASSES[name](rng)
        for task in (Task.EMBED, Task.TOKEN_EMBED, Task.SCORE):
            err = judge(task, body)
            assert err.code is ErrorCode.INVALID_REQUEST, (name, task, err)
            assert_frame_fits(err, body)


@pytest.mark.parametrize("body, field", [
    (b'{"input": "\\ud800"}', "input"),
    (b'{"input": ["fine", "cut \\udbff"]}', "input"),
    (b'{"text_1": "\\udc00", "text_2": "b"}', "text_1"),
    (b'{"input": "x", "request_id": "r\\ud800"}', "request_id"),
    (b'{"input": "x", "\\ud800": 1}', None),
])
def test_a_lone_surrogate_is_invalid_request_where_it_is(body, field):
    err = judge(Task.EMBED, body)
    assert err.code is ErrorCode.INVALID_REQUEST and "not valid Unicode" in err.message
    assert err.extra.get("field") == field
    frame = assert_frame_fits(err, body)
    # The answer quotes the surrogate as an escape, so it encodes in MessagePack too.
    error_frame("r", err, WireFormat.MSGPACK, MAX_PAYLOAD)
    assert "\\ud" in frame["error"]["message"]


@pytest.mark.parametrize("body", [
    '{"input": "\ud800"}'.encode("utf-8", "surrogatepass"),
    msgpack.packb({"input": "\ud800"}, unicode_errors="surrogatepass"),
])
def test_a_surrogate_as_raw_bytes_is_invalid_in_either_encoding(body):
    # msgpack's strict UTF-8 refuses the bytes; json.loads decodes bytes with surrogatepass,
    # so the body check catches the surrogate it lets through.
    err = judge(Task.EMBED, body)
    assert err.code is ErrorCode.INVALID_REQUEST
    assert "undecodable msgpack" in err.message or "not valid Unicode" in err.message
    assert_frame_fits(err, body)


@pytest.mark.parametrize("depth", [MAX_DEPTH, 990, 1500, 100_000])
@pytest.mark.parametrize("encoding", ["msgpack list", "msgpack map", "json list", "json map"])
def test_nesting_past_the_bound_is_invalid_request_not_a_recursion_error(depth, encoding):
    if encoding == "msgpack list":
        body = b"\x81" + hb.mp("input") + b"\x91" * depth + b"\x01"
    elif encoding == "msgpack map":
        body = b"\x81" + hb.mp("input") + (b"\x81" + hb.mp("k")) * depth + b"\x01"
    elif encoding == "json list":
        body = b'{"input": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    else:
        body = b'{"input": ' + b'{"k": ' * depth + b"1" + b"}" * depth + b"}"
    err = judge(Task.EMBED, body)
    assert err.code is ErrorCode.INVALID_REQUEST
    assert "nests deeper" in err.message or "undecodable" in err.message
    assert_frame_fits(err, body)


def test_nesting_within_the_bound_reaches_the_field_checks():
    # Depth 4 is one more than any field has: the field check names it, not the body check.
    err = judge(Task.EMBED, hb.mp({"input": [[[1]]]}))
    assert err.extra["field"] == "input" and "nests deeper" not in err.message


@pytest.mark.parametrize("fmt", [hb.mp, hb.js])
def test_a_700_kb_unknown_key_is_quoted_as_a_short_preview(fmt):
    key = "k" * 700_000
    err = judge(Task.EMBED, fmt({"input": "x", key: 1}))
    assert err.code is ErrorCode.INVALID_REQUEST and "unknown key" in err.message
    assert len(err.message) < 400 and "700000 chars" in err.message
    assert len(err.extra["field"]) < 100
    assert_frame_fits(err, fmt({"input": "x", key: 1}))


@pytest.mark.parametrize("where", ["truncation_side", "embed_dtype", "encoding_format"])
def test_a_huge_string_value_is_quoted_as_a_short_preview(where):
    body = hb.mp({"input": "x", where: "y" * 900_000})
    err = judge(Task.EMBED, body)
    assert err.extra["field"] == where and len(err.message) < 400
    assert_frame_fits(err, body)


@pytest.mark.parametrize("size", [257, 5000, MAX_PAYLOAD - 300])
def test_a_request_id_too_long_to_echo_is_unusable_and_invalid(size):
    body = hb.mp({"input": "x", "request_id": "i" * size})
    assert request_id_of(decode(body)[0]) is None  # errors to it carry a generated id
    err = judge(Task.EMBED, body)
    assert err.extra["field"] == "request_id" and "at most 256" in err.message
    assert assert_frame_fits(err, body)["request_id"].startswith("generated")


@pytest.mark.parametrize("key, literal", [
    ("dimensions", "NaN"), ("priority", "Infinity"), ("deadline_ms", "-Infinity"),
    ("dimensions", "1e999"), ("priority", "1" + "0" * 4000), ("deadline_ms", "1" + "0" * 400),
    ("truncate_prompt_tokens", "2147483648"), ("input", "[NaN]"), ("input", "[2147483648]"),
    ("priority", "-2147483649"), ("normalize", "NaN"),
])
def test_nan_and_huge_json_numbers_are_invalid_request_naming_the_field(key, literal):
    body = f'{{"input": "x", "{key}": {literal}}}'.encode()
    err = judge(Task.EMBED, body)
    assert err.code is ErrorCode.INVALID_REQUEST and err.extra["field"] == key
    assert len(err.message) < 400
    assert_frame_fits(err, body)


def test_a_json_int_past_python_s_digit_limit_is_undecodable():
    err = judge(Task.EMBED, b'{"input": "x", "priority": 1' + b"0" * 5000 + b"}")
    assert "undecodable json" in err.message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**64 - 1, -2**63])
def test_nan_and_huge_msgpack_numbers_are_invalid_request(value):
    for key in ("dimensions", "priority", "deadline_ms", "truncate_prompt_tokens"):
        err = judge(Task.EMBED, hb.mp({"input": "x", key: value}))
        assert err.extra["field"] == key, (key, value, err)


def test_random_and_truncated_bytes_are_undecodable():
    rng = random.Random(3)
    full = msgpack.packb({"input": ["a", "b"], "normalize": True})
    for cut in range(1, len(full)):
        assert "undecodable msgpack" in judge(Task.EMBED, full[:cut]).message
    text = json.dumps({"input": ["a", "b"]}).encode()
    for cut in range(1, len(text)):
        assert "undecodable json" in judge(Task.EMBED, text[:cut]).message
    for _ in range(200):
        assert judge(Task.EMBED, hb.random_bytes(rng)).code is ErrorCode.INVALID_REQUEST


def test_preview_is_short_for_any_value():
    hostile = ["x" * 10**6, b"\xff" * 10**6, "\ud800" * 1000, list(range(10**5)),
               {"k" * 1000: [[[[["deep"]]]]]}, 10**4000]
    for value in hostile:
        shown = preview(value)
        assert len(shown) <= 100 and "\n" not in shown
        shown.encode("utf-8")  # never a lone surrogate


def test_an_error_frame_always_fits_even_with_a_giant_request_id_and_message():
    err = PoolingError(ErrorCode.INVALID_REQUEST, "m" * 2_000_000, field="f" * 500_000)
    for fmt in WireFormat:
        for max_payload in (1024, 64 * 1024, MAX_PAYLOAD):
            body, service = error_frame("r" * (max_payload - 20), err, fmt, max_payload, DEPRECATION)
            assert len(body) + header_bytes({**DEPRECATION, **service}) <= max_payload
            frame, _ = decode(body)
            assert frame["error"]["code"] == "invalid_request" and len(frame["request_id"]) == 32


def test_an_error_frame_that_fits_is_left_whole():
    err = PoolingError(ErrorCode.INPUT_TOO_LONG, "input 1 has 400 tokens", max_tokens=256, index=1)
    body, service = error_frame("mine", err, WireFormat.JSON, MAX_PAYLOAD)
    assert json.loads(body) == {"request_id": "mine", "error": {
        "code": "input_too_long", "message": "input 1 has 400 tokens", "max_tokens": 256, "index": 1}}
    assert service == {"Nats-Service-Error": "input 1 has 400 tokens", "Nats-Service-Error-Code": "413"}
