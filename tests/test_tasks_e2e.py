"""Every task of every model kind through a real nats-server equals what transformers gives
for the same input computed directly here: softmax/sigmoid of the logits, per-token rows of
real tokens only, cosine for a bi-encoder's score (issue 3), to 1e-5."""

import base64

import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.actors.worker import Worker, task_policy_for
from poolwire.settings import WorkerSettings
from poolwire.actors.task_policy import TaskConfigError
from tests.helpers import close, rows

pytestmark = pytest.mark.timeout(300)

TEXTS = ["A short one.", "The committee questions a careful experiment after a long debate.",
         "Every river follows the crowded station before dawn, with great care and no word."]


def encode(model, texts, pair=None):
    return model.tokenizer(texts, pair, padding=True, return_tensors="pt")


def activation(logits: torch.Tensor, kind: str) -> np.ndarray:
    return (torch.sigmoid(logits) if kind == "sigmoid" else torch.softmax(logits, -1)).numpy()


def real_rows(per_token: torch.Tensor, mask: torch.Tensor) -> list[np.ndarray]:
    return [per_token[i, : int(mask[i].sum())].numpy() for i in range(per_token.shape[0])]


def test_the_default_task_of_each_model_kind(minilm, small_models):
    got = {name: task_policy_for(m, WorkerSettings()).configured.value
           for name, m in {"minilm": minilm, **small_models}.items()}
    assert got == {"minilm": "embed", "seq3": "classify", "seq1": "classify",
                   "multi": "classify", "tok5": "token_classify"}


@pytest.mark.parametrize("name, task, supported", [
    ("tok5", "embed", "supports: token_classify"),
    # score is never a configured task (vLLM PR #37537), even on a cross-encoder.
    ("seq3", "score", "configured for: classify, token_classify"),
    ("seq1", "score", "configured for: classify, token_classify"),
    ("seq1", "embed", "supports: classify, token_classify, score"),
])
def test_a_task_the_model_cannot_do_fails_start_up(small_models, name, task, supported):
    with pytest.raises(TaskConfigError, match=f"{supported}$"):
        Worker(WorkerSettings(task=task), small_models[name])


async def test_minilm_token_embed_and_bi_encoder_score(minilm, start_worker, nc, prefix):
    enc = encode(minilm, TEXTS)
    with torch.inference_mode():
        hidden = minilm.module(**enc).last_hidden_state
    expected_tokens = real_rows(hidden, enc["attention_mask"])
    async with start_worker(minilm):
        client = PoolingClient(nc, prefix=prefix)
        tokens = await client.token_embed(TEXTS, normalize=False)
        normalised = await client.token_embed(TEXTS)  # MiniLM's Normalize module: the default
        cut = await client.token_embed(TEXTS[1], dimensions=16, normalize=True)
        score = await client.score(TEXTS[0], TEXTS[1:])
        embed = await client.embed(TEXTS)
    for got, want in zip(rows(tokens), expected_tokens):
        close(got, want, atol=2e-5)  # unnormalised hidden states have magnitudes near 1..10
    for got, want in zip(rows(normalised), expected_tokens):
        close(got, torch.nn.functional.normalize(torch.from_numpy(want), dim=-1).numpy())
    want_cut = torch.nn.functional.normalize(torch.from_numpy(expected_tokens[1][:, :16]), dim=-1)
    close(rows(cut)[0], want_cut.numpy())
    vectors = rows(embed)
    close([d["data"] for d in score["data"]],
          [float(np.dot(vectors[0], vectors[1])), float(np.dot(vectors[0], vectors[2]))])
    # A pair counts the tokens of both texts.
    n = [len(minilm.tokenizer(t)["input_ids"]) for t in TEXTS]
    assert score["usage"]["prompt_tokens"] == (n[0] + n[1]) + (n[0] + n[2])


@pytest.mark.parametrize("name", ["seq3", "multi"])
async def test_sequence_classifier_classify_and_token_classify(small_models, start_worker, nc, prefix, name):
    model = small_models[name]
    enc = encode(model, TEXTS)
    with torch.inference_mode():
        logits = model.module(**enc).logits
        per_token = model.module.classifier(model.module.bert(**enc).last_hidden_state)
    kind = "sigmoid" if name == "multi" else "softmax"
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.classify(TEXTS)
        raw = await client.classify(TEXTS, use_activation=False)
        tokens = await client.token_classify(TEXTS)
    close(rows(reply), activation(logits, kind))
    close(rows(raw), logits.numpy())
    assert reply["labels"] == model.labels
    expected = real_rows(torch.from_numpy(activation(per_token, kind)), enc["attention_mask"])
    for got, want in zip(rows(tokens), expected):
        close(got, want)


async def test_cross_encoder_classify_and_score(small_models, start_worker, nc, prefix):
    model = small_models["seq1"]
    first, second = ["what is a cat?"] * 2, ["a cat is a small animal.", "the train is late."]
    with torch.inference_mode():
        pair_logits = model.module(**encode(model, first, second)).logits[:, 0]
        single = model.module(**encode(model, TEXTS)).logits
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        one_to_n = await client.score(first[0], second)
        zipped = await client.score(first, second)
        n_to_one = await client.score(second, "what is a cat?")
        raw = await client.score(first[0], second, use_activation=False)
        classified = await client.classify(TEXTS)
        with pytest.raises(PoolingServiceError) as info:
            await client.score(["a", "b"], ["c", "d", "e"])
    expected = torch.sigmoid(pair_logits).numpy()
    close([d["data"] for d in one_to_n["data"]], expected)
    close([d["data"] for d in zipped["data"]], expected)
    close([d["data"] for d in raw["data"]], pair_logits.numpy())
    with torch.inference_mode():
        swapped = model.module(**encode(model, second, ["what is a cat?"] * 2)).logits[:, 0]
    close([d["data"] for d in n_to_one["data"]], torch.sigmoid(swapped).numpy())
    close(rows(classified), torch.sigmoid(single).numpy())
    assert info.value.code == "invalid_request" and info.value.error["field"] == "text_2"
    assert "2 texts" in info.value.error["message"] and "3" in info.value.error["message"]


async def test_token_classifier_rows_of_real_tokens_only(small_models, start_worker, nc, prefix):
    model = small_models["tok5"]
    enc = encode(model, TEXTS)
    with torch.inference_mode():
        logits = model.module(**enc).logits
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.token_classify(TEXTS)
        with pytest.raises(PoolingServiceError) as info:
            await client.classify(TEXTS)
    expected = real_rows(torch.softmax(logits, -1), enc["attention_mask"])
    for got, want in zip(rows(reply), expected):
        close(got, want)
    assert reply["labels"] == model.labels
    assert info.value.code == "unsupported_task"
    assert info.value.error["supported_tasks"] == ["token_classify"]


@pytest.mark.parametrize("dtype, np_dtype, atol", [("float32", "<f4", 0), ("float16", "<f2", 1e-3),
                                                    ("bfloat16", None, 8e-3)])
async def test_binary_encoding_in_every_dtype_msgpack_and_json(minilm, start_worker, nc, prefix,
                                                               dtype, np_dtype, atol):
    import json

    async with start_worker(minilm):
        client = PoolingClient(nc, prefix=prefix)
        floats = await client.embed(TEXTS[:2])
        binary = await client.embed(TEXTS[:2], encoding_format="binary", embed_dtype=dtype)
        msg = await nc.request(f"{prefix}.embed", json.dumps(
            {"input": TEXTS[:2], "encoding_format": "binary", "embed_dtype": dtype}).encode(), timeout=30)
    as_json = json.loads(msg.data)

    def decode(item, raw):
        assert item["dtype"] == dtype and item["shape"] == [384]
        if np_dtype:
            return np.frombuffer(raw, np_dtype).astype(np.float32)
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)

    want = rows(floats)
    for i in range(2):
        close(decode(binary["data"][i], binary["data"][i]["bytes"]), want[i], atol=atol or 1e-7)
        j = as_json["data"][i]
        close(decode(j, base64.b64decode(j["bytes"])), want[i], atol=atol or 1e-7)
