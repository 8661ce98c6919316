"""Every bad input gets PROTOCOL.md's error frame with the NATS service headers, in the
request's own encoding, and the worker keeps serving."""

import json

import msgpack
import pytest

from poolwire.schemas.codec import decode
from poolwire.schemas.replies import ErrorFrame

pytestmark = pytest.mark.timeout(120)

LONG_TEXT = "word " * 400  # well past MiniLM's 256 tokens


async def ask(nc, subject, body: bytes):
    msg = await nc.request(subject, body, timeout=30)
    frame, fmt = decode(msg.data)
    return frame, fmt, msg.headers or {}


def mp(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


CASES = [
    # (name, task, body, code, status, extra checks)
    ("undecodable bytes", "embed", b"\xc1\xff\x00garbage", "invalid_request", "400", {}),
    ("truncated msgpack", "embed", mp({"input": "hello"})[:-2], "invalid_request", "400", {}),
    ("json not a map", "embed", b'["hello"]', "invalid_request", "400", {}),
    ("msgpack not a map", "embed", mp(["hello"]), "invalid_request", "400", {}),
    ("json syntax", "embed", b'{"input": "hello"', "invalid_request", "400", {}),
    ("wrong type", "embed", mp({"input": "x", "dimensions": "8"}), "invalid_request", "400", {"field": "dimensions"}),
    ("float for int", "embed", mp({"input": "x", "dimensions": 8.0}), "invalid_request", "400", {"field": "dimensions"}),
    ("unknown key", "embed", mp({"input": "x", "normalise": True}), "invalid_request", "400", {"field": "normalise"}),
    ("empty input", "embed", mp({"input": []}), "invalid_request", "400", {"field": "input"}),
    ("empty text", "embed", b'{"input": ""}', "invalid_request", "400", {"field": "input"}),
    ("dimensions too big", "embed", mp({"input": "x", "dimensions": 385}), "invalid_request", "400", {"field": "dimensions"}),
    ("truncate zero", "embed", mp({"input": "x", "truncate_prompt_tokens": 0}), "invalid_request", "400", {"field": "truncate_prompt_tokens"}),
    ("truncate past max", "embed", mp({"input": "x", "truncate_prompt_tokens": 257}), "invalid_request", "400", {"field": "truncate_prompt_tokens"}),
    ("truncate below the special tokens", "embed", mp({"input": "word " * 300, "truncate_prompt_tokens": 1}), "invalid_request", "400", {"field": "truncate_prompt_tokens"}),
    ("truncate a pair below its special tokens", "score", mp({"text_1": "q", "text_2": "d " * 300, "truncate_prompt_tokens": 1}), "invalid_request", "400", {"field": "truncate_prompt_tokens"}),
    ("too long", "embed", mp({"input": ["short", LONG_TEXT]}), "input_too_long", "413", {"max_tokens": 256, "index": 1}),
    ("too long ids", "embed", mp({"input": list(range(1000, 1300))}), "input_too_long", "413", {"max_tokens": 256, "index": 0}),
    ("unknown task", "summarize", mp({"input": "x"}), "unsupported_task", "400",
     {"supported_tasks": ["embed", "token_embed", "score"]}),
    ("unsupported task", "classify", mp({"input": "x"}), "unsupported_task", "400",
     {"supported_tasks": ["embed", "token_embed", "score"]}),
]


async def test_every_bad_input_gets_its_error_and_the_worker_stays_up(minilm, start_worker, nc, prefix):
    async with start_worker(minilm):
        for name, task, body, code, status, extra in CASES:
            frame, fmt, headers = await ask(nc, f"{prefix}.{task}", body)
            ErrorFrame.model_validate(frame)
            err = frame["error"]
            assert err["code"] == code, (name, frame)
            for key, value in extra.items():
                assert err[key] == value, (name, key, err)
            assert headers.get("Nats-Service-Error-Code") == status, name
            assert headers.get("Nats-Service-Error"), name
            assert frame["request_id"], name
            # JSON in, JSON out; anything else gets MessagePack.
            assert fmt.value == ("json" if body.lstrip()[:1] == b"{" else "msgpack"), name
        frame, _, headers = await ask(nc, f"{prefix}.embed", b'{"input": "still up", "request_id": "after"}')
    assert frame["request_id"] == "after" and len(frame["data"][0]["data"]) == 384
    assert "Nats-Service-Error" not in headers


async def test_errors_echo_a_usable_request_id_and_generate_one_otherwise(minilm, start_worker, nc, prefix):
    async with start_worker(minilm):
        frame, _, _ = await ask(nc, f"{prefix}.embed", mp({"input": [], "request_id": "mine"}))
        assert frame["request_id"] == "mine"
        frame, _, _ = await ask(nc, f"{prefix}.embed", mp({"input": [], "request_id": 42}))
        assert frame["request_id"] and frame["request_id"] != 42
        frame, _, _ = await ask(nc, f"{prefix}.embed", b"\x00")
        assert isinstance(frame["request_id"], str) and len(frame["request_id"]) == 32


async def test_the_task_error_comes_before_field_errors(minilm, start_worker, nc, prefix):
    async with start_worker(minilm):
        frame, _, _ = await ask(nc, f"{prefix}.classify", mp({"input": 5, "bogus": 1}))
    assert frame["error"]["code"] == "unsupported_task"


async def test_truncation_makes_a_long_input_fit(minilm, start_worker, nc, prefix):
    async with start_worker(minilm):
        frame, _, _ = await ask(nc, f"{prefix}.embed", json.dumps(
            {"input": LONG_TEXT, "truncate_prompt_tokens": -1}).encode())
        assert frame["usage"]["prompt_tokens"] == 256
        frame, _, _ = await ask(nc, f"{prefix}.embed", mp(
            {"input": LONG_TEXT, "truncate_prompt_tokens": 10, "truncation_side": "left"}))
        assert frame["usage"]["prompt_tokens"] == 10
