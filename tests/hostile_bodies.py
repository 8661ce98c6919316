"""A seeded generator of hostile request bodies, one class at a time, for the unit tests of each
class and the fuzz test against a real worker. Every body it makes is invalid on every task
subject (each names a wrong value, or cannot be decoded), so every answer must be an error.

A seeded `random.Random` rather than hypothesis: the fuzz test needs 10,000 bodies in a fixed
order on a budget, not shrinking, and the same bodies on every run."""

import json
import math
import random
from collections.abc import Callable, Iterator

import msgpack

TASK_SUBJECTS = ("embed", "classify", "score", "token_embed", "token_classify")
UNKNOWN_SUBJECTS = ("summarize", "EMBED", "embeddings", "x" * 200)

MAX_PAYLOAD = 1024 * 1024  # nats-server's default; the fuzz test's server keeps it


def mp(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def js(obj) -> bytes:
    return json.dumps(obj).encode()


def _valid_base(rng: random.Random) -> dict:
    """A plausible start that some bodies then break (never sent as it is)."""
    body = {"input": rng.choice(["hello", ["a", "b"], [101, 7592, 102]])}
    if rng.random() < 0.5:
        body["request_id"] = f"r{rng.randrange(10**6)}"
    return body


def random_bytes(rng: random.Random) -> bytes:
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
    # A random body that happens to decode must still be invalid: a map missing `input` is,
    # and the odd one that happens to start like JSON or a map is made unparsable at its end.
    return body + rng.choice([b"\xc1", b"{", b"\xff"])


def truncated(rng: random.Random) -> bytes:
    full = rng.choice([mp, js])({**_valid_base(rng), "normalize": True, "priority": 3})
    return full[:rng.randrange(1, len(full))]


_WRONG_VALUES = {
    "input": [5, 3.5, True, {"a": 1}, [1.5], [[1, "x"]], ["ok", 3], [None], [[]], [], ""],
    "dimensions": ["8", 8.0, True, 0, -3, [8]],
    "normalize": [1, "yes", 1.0, [True]],
    "stream": ["true", 1, 0.0],
    "priority": [1.5, "1", True, [1]],
    "truncate_prompt_tokens": [0, -2, 1.0, "5", 10**6],
    "truncation_side": ["middle", 3, "", None, ["left"]],
    "encoding_format": ["text", "base64", 1, "FLOAT"],
    "embed_dtype": ["int8", "float64", 16, "fp16"],
    "deadline_ms": [0, -5, 1.5, "10"],
    "request_id": [42, 4.2, ["r"], {"id": 1}, True],
    "text_1": [5, [1, 2], {"t": "x"}],
    "use_activation": ["no", 2],
    "prompt_name": [5, ["query"], "no such prompt"],
    "prompt": [5, {"p": 1}, ["a"]],
    "return_tokens": ["yes", 1],
    "aggregation": ["all", 3, "SIMPLE"],
}


def wrong_types(rng: random.Random) -> bytes:
    body = _valid_base(rng)
    key = rng.choice(sorted(_WRONG_VALUES))
    value = rng.choice(_WRONG_VALUES[key])
    if value is None:  # null counts as absent: make the body invalid another way
        body = {"text_1": "x"} | body
    else:
        body[key] = value
    if key == "request_id" or value is None or key in ("text_1", "use_activation"):
        body["dimensions"] = "8"  # these alone would be valid on some task
    return rng.choice([mp, js])(body)


_SURROGATES = ["\ud800", "\udfff", "\udbff", "\udc00"]


def lone_surrogates(rng: random.Random) -> bytes:
    s = rng.choice(_SURROGATES)
    text = rng.choice([s, "hello " + s, s + "world", "ok" * rng.randrange(1, 50) + s])
    where = rng.randrange(5)
    body = _valid_base(rng)
    if where == 0:
        body["input"] = text
    elif where == 1:
        body["input"] = ["fine", text]
    elif where == 2:
        body[text] = 1
    elif where == 3:
        body["request_id"] = text
        body["dimensions"] = "8"
    else:
        body = {"text_1": text, "text_2": ["a", "b"]}
    if rng.random() < 0.2:
        # The surrogate encoded as raw UTF-8-like bytes (what a careless encoder writes), which
        # no strict UTF-8 decoder accepts, in either encoding.
        raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return raw if rng.random() < 0.5 else msgpack.packb(
            {k: v for k, v in body.items()}, use_bin_type=True, unicode_errors="surrogatepass")
    return json.dumps(body).encode()  # ensure_ascii writes them as \ud800 escapes


def deep_nesting(rng: random.Random) -> bytes:
    """Lists or maps nested past the bound, up to far past Python's recursion limit. Built as
    bytes by hand: msgpack.packb and json.dumps refuse to go this deep themselves."""
    depth = rng.choice([17, 40, 200, 990, 1200, 1500, 5000, rng.randrange(17, 3000)])
    key = rng.choice(["input", "text_1", "extra", "request_id"])
    kind = rng.randrange(4)
    if kind == 0:
        return b"\x81" + mp(key) + b"\x91" * depth + b"\x01"
    if kind == 1:
        return b"\x81" + mp(key) + (b"\x81" + mp("k")) * depth + b"\x01"
    if kind == 2:
        return f'{{"{key}": {"[" * depth}1{"]" * depth}}}'.encode()
    opening = '{"k": ' * depth
    return f'{{"{key}": {opening}1{"}" * depth}}}'.encode()


def huge_strings(rng: random.Random) -> bytes:
    size = rng.choice([1000, 10_000, 100_000, 500_000, MAX_PAYLOAD - 200])
    text = "y" * size
    where = rng.randrange(5)
    body = _valid_base(rng)
    if where == 4:
        body["prompt_name"] = text  # a name no model folder defines, quoted back as a preview
    elif where == 0:
        body["truncation_side"] = text
    elif where == 1:
        body["embed_dtype"] = text
    elif where == 2:
        body["bogus"] = text
    else:  # a big text is fine by itself: a wrong field makes the request invalid untokenized
        body["input"] = [text[: size // 2]]
        body["dimensions"] = "8"
    return rng.choice([mp, js])(body)


def huge_keys(rng: random.Random) -> bytes:
    size = rng.choice([100, 5000, 100_000, 700_000, MAX_PAYLOAD - 200])
    body = {**_valid_base(rng), "k" * size: rng.choice([1, "v", None, [1, 2]])}
    if body["k" * size] is None:
        body["k" * size] = 0
    return rng.choice([mp, js])(body)


def nan_and_huge_numbers(rng: random.Random) -> bytes:
    key = rng.choice(["dimensions", "priority", "deadline_ms", "truncate_prompt_tokens", "input",
                      "normalize"])
    body = _valid_base(rng)
    if rng.random() < 0.5:
        value = rng.choice([math.nan, math.inf, -math.inf, 1e308, -1e308, 2**64 - 1, -2**63,
                            2**63])
        body[key] = [value] if key == "input" else value
        return mp(body)
    literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * 4000,
                          "-" + "9" * 3000, "1" + "0" * 5000, "2147483648", "1.0e2"])
    if key == "input":
        literal = f"[{literal}]"
    rest = json.dumps(body)[1:-1]
    return f'{{{rest}, "{key}": {literal}}}'.encode()


def huge_request_ids(rng: random.Random) -> bytes:
    """request_ids too long to echo, some sized so the body just fits max_payload (the error
    frame that echoed it would not fit with its headers)."""
    size = rng.choice([257, 1000, 50_000, MAX_PAYLOAD - 300, MAX_PAYLOAD - 60])
    body = {"input": "x", "dimensions": "8", "request_id": "i" * size}
    packed = rng.choice([mp, js])(body)
    return packed if len(packed) <= MAX_PAYLOAD else mp({**body, "request_id": "i" * (size - 100)})


CLASSES: dict[str, Callable[[random.Random], bytes]] = {
    "random bytes": random_bytes,
    "truncated": truncated,
    "wrong types": wrong_types,
    "lone surrogates": lone_surrogates,
    "deep nesting": deep_nesting,
    "huge strings": huge_strings,
    "huge keys": huge_keys,
    "NaN and huge numbers": nan_and_huge_numbers,
    "huge request_ids": huge_request_ids,
}

# Share of the fuzz bodies per class: the big ones are fewer, so the run stays short.
WEIGHTS = {"random bytes": 20, "truncated": 15, "wrong types": 20, "lone surrogates": 12,
           "deep nesting": 8, "huge strings": 3, "huge keys": 3, "NaN and huge numbers": 16,
           "huge request_ids": 3}


def generate(count: int, seed: int = 9) -> Iterator[tuple[str, str, bytes]]:
    """(class name, task subject name, body), deterministic for a seed."""
    rng = random.Random(seed)
    names = list(WEIGHTS)
    weights = [WEIGHTS[n] for n in names]
    subjects = TASK_SUBJECTS + UNKNOWN_SUBJECTS
    for i in range(count):
        name = rng.choices(names, weights)[0]
        # Every task subject in turn, unknown names one time in ten.
        subject = subjects[i % len(TASK_SUBJECTS)] if i % 10 else rng.choice(UNKNOWN_SUBJECTS)
        yield name, subject, CLASSES[name](rng)
