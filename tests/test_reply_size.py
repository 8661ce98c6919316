"""The reply-size estimate on its own: an upper bound on the real one-message reply (built by
framing.one_reply from real-looking values), close to it, and the error it gives."""

import numpy as np
import pytest

from poolwire.actors.framing import ReplyStyle, one_reply, wire_item
from poolwire.actors.reply_size import (ReplyEstimate, estimate_reply, item_shapes, request_items,
                                        too_large)
from poolwire.schemas.codec import WireFormat
from poolwire.schemas.errors import ErrorCode
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task

MAX_PAYLOAD = 1024 * 1024


def real_reply_bytes(shapes, style: ReplyStyle, rng, labels=None, warnings=None) -> int:
    # Values as a model gives them: normalised vectors, logits, tiny and negative numbers.
    scale = np.array([1e-3, 0.05, 1.0, 30.0], dtype=np.float32)
    sizes = [int(np.prod(s)) for s in shapes]
    flat = rng.standard_normal(sum(sizes)).astype(np.float32)
    flat *= scale[np.arange(flat.size) % 4]
    items, start = [], 0
    for i, (shape, size) in enumerate(zip(shapes, sizes)):
        items.append(wire_item(i, flat[start:start + size].reshape(shape), style))
        start += size
    body = one_reply("r" * 32, "all-MiniLM-L6-v2", "embed", items, 123456, style, 2**40,
                     None, warnings, labels)
    return len(body)


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("binary, dtype", [(False, "float32"), (True, "float32"), (True, "float16"),
                                           (True, "bfloat16")])
@pytest.mark.parametrize("task, n, width, tokens", [
    (Task.EMBED, 1, 384, None), (Task.EMBED, 17, 384, None), (Task.EMBED, 300, 64, None),
    (Task.CLASSIFY, 40, 3, None), (Task.SCORE, 3000, 1, None),
    (Task.TOKEN_EMBED, 3, 384, [5, 256, 17]), (Task.TOKEN_CLASSIFY, 20, 5, list(range(1, 21))),
])
def test_the_estimate_bounds_the_real_reply_closely(fmt, binary, dtype, task, n, width, tokens):
    rng = np.random.default_rng(n)
    shapes = item_shapes(task, n, width, tokens)
    style = ReplyStyle(fmt, binary, dtype)
    labels = ["LABEL_0", "LABEL_1", "LABEL_2"] if task is Task.CLASSIFY else None
    warnings = ["serving task 'token_embed' ... is deprecated"] if tokens else None
    real = real_reply_bytes(shapes, style, rng, labels, warnings)
    estimate = estimate_reply(shapes, fmt=fmt, binary=binary, dtype=dtype, request_id="r" * 32,
                              model="all-MiniLM-L6-v2", task="embed", max_payload=MAX_PAYLOAD,
                              labels=labels, warnings=warnings)
    assert estimate.bytes >= real
    # Exact but for the usage counts in MessagePack and binary; JSON floats are 17 to 23
    # characters each, so the bound is within 40% there.
    slack = 1.4 if fmt is WireFormat.JSON and not binary else 1.01
    assert estimate.bytes <= real * slack + 64


def test_more_items_than_a_16_bit_msgpack_array_header_holds():
    shapes = item_shapes(Task.SCORE, 70_000, 1)
    style = ReplyStyle(WireFormat.MSGPACK, False, "float32")
    real = real_reply_bytes(shapes, style, np.random.default_rng(0))
    estimate = estimate_reply(shapes, fmt=WireFormat.MSGPACK, binary=False, dtype="float32",
                              request_id="r" * 32, model="all-MiniLM-L6-v2", task="embed",
                              max_payload=MAX_PAYLOAD)
    assert real <= estimate.bytes <= real + 64


def test_ten_thousand_minilm_vectors_are_far_over_the_limit_in_every_encoding():
    shapes = item_shapes(Task.EMBED, 10_000, 384)
    for fmt in WireFormat:
        for binary in (False, True):
            est = estimate_reply(shapes, fmt=fmt, binary=binary, dtype="float32", request_id="r",
                                 model="m", task="embed", max_payload=MAX_PAYLOAD)
            assert not est.fits and est.bytes > 15_000_000


def test_headers_count_against_the_limit():
    est = estimate_reply(item_shapes(Task.EMBED, 1, 8), fmt=WireFormat.MSGPACK, binary=False,
                         dtype="float32", request_id="r", model="m", task="embed",
                         max_payload=1000, header_bytes=40)
    assert est.limit == 960 and est.fits


def test_the_error_states_items_bytes_limit_and_the_remedies():
    err = too_large(ReplyEstimate(items=10_000, bytes=19_361_234, limit=1_048_550), 1_048_576,
                    ReplyEstimate(items=10_000, bytes=15_500_000, limit=1_048_550))
    assert err.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert err.extra == {"items": 10_000, "estimated_bytes": 19_361_234, "max_payload": 1_048_576}
    for figure in ("10000 items", "19361234 bytes", "1048576", '"stream": true', "nothing was computed"):
        assert figure in err.message
    assert "binary" not in err.message  # binary would not fit either: not offered
    fits_in_binary = too_large(ReplyEstimate(200, 1_100_000, 1_048_550), 1_048_576,
                               ReplyEstimate(200, 320_000, 1_048_550))
    assert '"encoding_format": "binary" (about 320000 bytes)' in fits_in_binary.message


@pytest.mark.parametrize("task, fields, items", [
    (Task.EMBED, {"input": "one"}, 1),
    (Task.EMBED, {"input": ["a", "b", "c"]}, 3),
    (Task.EMBED, {"input": [101, 102]}, 1),
    (Task.EMBED, {"input": [[101], [102, 7], [3]]}, 3),
    (Task.SCORE, {"text_1": "q", "text_2": ["a", "b"]}, 2),
    (Task.SCORE, {"text_1": ["a", "b", "c"], "text_2": "q"}, 3),
    (Task.SCORE, {"text_1": ["a", "b"], "text_2": ["c", "d"]}, 2),
    (Task.SCORE, {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 0),  # refused by the planner
])
def test_items_are_counted_from_the_request_alone(task, fields, items):
    assert request_items(task, PoolingRequest(**fields)) == items


def test_shapes_per_task():
    assert item_shapes(Task.EMBED, 2, 384) == [(384,), (384,)]
    assert item_shapes(Task.SCORE, 2, 1) == [(), ()]
    assert item_shapes(Task.TOKEN_EMBED, 2, 384, [7, 3]) == [(7, 384), (3, 384)]


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("binary", [False, True])
def test_bge_m3_maps_are_bounded_from_their_token_counts(fmt, binary):
    """PROTOCOL 1.3: an item that maps dense, sparse and multi_vector, sized before the forward
    pass from its token count (at most one lexical weight per token)."""
    from types import SimpleNamespace

    from poolwire.actors.reply_size import OUTPUTS_MAP_BYTES, outputs_shapes
    from poolwire.models.sparse_vector import SparseVector

    rng = np.random.default_rng(3)
    tokens = [4, 40, 200]
    request = PoolingRequest(input=["x"] * 3, outputs=["dense", "sparse", "multi_vector"])
    model = SimpleNamespace(embedding_size=64, m3=None)
    style = ReplyStyle(fmt, binary, "float32")
    items = []
    for i, t in enumerate(tokens):
        ids = np.sort(rng.choice(250_000, size=t, replace=False)).astype(np.int64)
        value = {"dense": rng.standard_normal(64).astype(np.float32),
                 "sparse": SparseVector(ids, rng.random(t).astype(np.float32) + 0.01, 250_002),
                 "multi_vector": rng.standard_normal((t - 1, 64)).astype(np.float32)}
        items.append(wire_item(i, value, style))
    real = len(one_reply("r" * 32, "bge-m3", "embed", items, 123456, style, 2**40))
    shapes = [s for group in outputs_shapes(request, model, tokens) for s in group]
    estimate = estimate_reply(shapes, fmt=fmt, binary=binary, dtype="float32",
                              request_id="r" * 32, model="bge-m3", task="embed",
                              max_payload=MAX_PAYLOAD)
    assert estimate.bytes + OUTPUTS_MAP_BYTES * len(tokens) >= real


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("binary, dtype", [(False, "float32"), (True, "float16")])
@pytest.mark.parametrize("task, n, width", [
    (Task.EMBED, 1, 384), (Task.EMBED, 17, 1024), (Task.CLASSIFY, 40, 3), (Task.SCORE, 300, 1)])
def test_the_coarse_bound_only_passes_what_the_exact_estimate_passes(fmt, binary, dtype, task, n,
                                                                      width):
    """check_reply_fits skips the exact estimate where a coarse bound already fits (the hot
    path); at every room around the reply's real size, the bound may pass only where the
    estimate passes, and it passes the common case of a reply far below the room."""
    from types import SimpleNamespace

    from poolwire.actors.reply_size import _clearly_fits

    labels = ["LABEL_0", "LABEL_1", "négatif"] if task is Task.CLASSIFY else None
    warnings = ("serving task 'classify' from a deployment configured for 'embed' is deprecated",)
    job = SimpleNamespace(request_id="é" * 40, task=task, warnings=warnings)
    model = SimpleNamespace(name="all-MiniLM-L6-v2", labels=labels or [], sparse=None)
    shapes = item_shapes(task, n, width)
    exact = estimate_reply(shapes, fmt=fmt, binary=binary, dtype=dtype, request_id=job.request_id,
                           model=model.name, task=task.value, max_payload=MAX_PAYLOAD,
                           labels=labels, warnings=list(warnings)).bytes
    for room in range(exact // 2, 40 * exact, max(exact // 50, 1)):
        if _clearly_fits(n, width, job, model, room):
            assert exact <= room
    assert _clearly_fits(n, width, job, model, 40 * exact)


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_tokens_offsets_and_entities_are_counted_before_the_forward_pass(small_models, fmt):
    """A token_classify reply with return_tokens and entities is judged once tokenized, before
    any model time: an audit found only its rows counted, so such a request was computed and
    then refused. The bound holds the real reply (entities from rows where every real token
    starts an entity: the most a text can have)."""
    from poolwire.actors.messages import Job
    from poolwire.actors.reply_size import check_reply_fits
    from poolwire.models.task_heads import plan_task
    from poolwire.models.tokenizing import Tokenizing
    from poolwire.schemas.errors import PoolingError
    from poolwire.schemas.requests import parse_request

    model = small_models["tok5"]
    text = " ".join(["Hunnewell visited Washington yesterday with Ganymede."] * 12)
    request = parse_request(Task.TOKEN_CLASSIFY, {"input": text, "return_tokens": True,
                                                  "aggregation": "simple"})
    plan = plan_task(Task.TOKEN_CLASSIFY, request, model,
                     Tokenizing(model.tokenizer, model.max_length))
    rows = np.full((len(plan.sequences[0]), model.num_labels), -5.0, dtype=np.float32)
    rows[np.arange(len(rows)), np.arange(len(rows)) % model.num_labels] = 5.0
    style = ReplyStyle(fmt, False, "float32")
    extras = plan.extras(0, rows)
    assert len(extras["entities"]) > 20 and extras["tokens"]
    real = len(one_reply("r" * 32, model.name, "token_classify",
                         [wire_item(0, rows, style, extras=extras)], plan.prompt_tokens, style,
                         2**40, labels=model.labels))
    job = Job(request=request, task=Task.TOKEN_CLASSIFY, reply="r", fmt=fmt,
              request_id="r" * 32, received_at=0.0)
    with pytest.raises(PoolingError) as refused:
        check_reply_fits(job, plan, model, real - 1)
    assert refused.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert real <= refused.value.extra["estimated_bytes"] <= 3 * real
    check_reply_fits(job, plan, model, 3 * real)  # admitted: well within the limit
