"""Chunked processing through a real nats-server (PROTOCOL.md "Longer than the model"): a
worker started with chunked processing embeds a document longer than the model as the
token-weighted mean of its chunks' pooled vectors, computed here from transformers directly."""

import random

import msgpack
import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient, PoolingServiceError
from tests.helpers import rows

pytestmark = pytest.mark.timeout(300)

WORDS = ("river station market history language quiet morning careful engine winter "
         "garden silver planet council theory harbour machine forest letter window").split()


def document(tokenizer, n_tokens: int, seed: int = 0) -> str:
    """A text of exactly n_tokens tokens, [CLS] and [SEP] included (WordPiece splits on white
    space first, so a text's count is 2 plus its words' counts)."""
    rng = random.Random(seed)
    cost = {w: len(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in WORDS}
    words, count = [], 2
    while count < n_tokens - 8:
        words.append(rng.choice(WORDS))
        count += cost[words[-1]]
    words += ["the"] * (n_tokens - count)  # one token each
    text = " ".join(words)
    assert len(tokenizer(text)["input_ids"]) == n_tokens
    return text


def reference(model_dir, text: str, max_length: int, dense=None, normalize=True) -> np.ndarray:
    """Cut the ids as the protocol says, run each chunk alone, mean-pool it, weight by token
    counts, then Dense and normalise: transformers only, none of poolwire's code."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModel.from_pretrained(model_dir).eval()
    ids = tok(text)["input_ids"]
    vectors, counts = [], []
    with torch.inference_mode():
        for start in range(0, len(ids), max_length):
            chunk = torch.tensor([ids[start:start + max_length]])
            hidden = base(input_ids=chunk, attention_mask=torch.ones_like(chunk)).last_hidden_state
            vectors.append(hidden[0].double().mean(0))
            counts.append(chunk.shape[1])
        weights = torch.tensor(counts, dtype=torch.float64)
        item = (torch.stack(vectors) * weights[:, None]).sum(0) / weights.sum()
        if dense is not None:
            item = dense({"sentence_embedding": item.float()[None]})["sentence_embedding"][0].double()
        if normalize:
            item = torch.nn.functional.normalize(item, dim=0)
    return item.float().numpy()


async def test_a_2000_token_document_is_the_weighted_mean_of_its_chunks(minilm, start_worker, nc, prefix):
    assert minilm.max_length == 256
    long_doc = document(minilm.tokenizer, 2000)
    short = "A short sentence well within the maximum."
    async with start_worker(minilm, chunked_processing=True):
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.embed([long_doc, short])
        alone = await client.embed(short)
        frames = [f async for f in client.stream("embed", {"input": [short, long_doc]})]
    want = reference(minilm.path, long_doc, 256)
    got = rows(reply)
    assert np.abs(got[0] - want).max() <= 1e-5
    # Every token counts: the document's 2,000 (8 chunks) and the short one's.
    n_short = len(minilm.tokenizer(short)["input_ids"])
    assert reply["usage"]["prompt_tokens"] == 2000 + n_short
    # A short input is one chunk, its vector as without chunking.
    assert np.abs(got[1] - rows(alone)[0]).max() <= 1e-6
    # A stream still sees one item per input.
    items = [f for f in frames if "index" in f]
    assert sorted(i["index"] for i in items) == [0, 1] and frames[-1]["done"]
    assert frames[-1]["usage"]["prompt_tokens"] == 2000 + n_short
    by_index = {i["index"]: np.asarray(i["data"], np.float32) for i in items}
    assert np.abs(by_index[1] - want).max() <= 1e-5


async def test_within_the_maximum_nothing_changes_and_beyond_max_embed_len_is_input_too_long(
        minilm, start_worker, nc, prefix):
    texts = ["one", "a sentence of several more words than the first"]
    async with start_worker(minilm) as plain_worker:
        plain = rows(await PoolingClient(nc, prefix=prefix).embed(texts))
    del plain_worker
    async with start_worker(minilm, chunked_processing=True, max_embed_len=600):
        client = PoolingClient(nc, prefix=prefix)
        chunked = rows(await client.embed(texts))
        assert [np.array_equal(a, b) for a, b in zip(plain, chunked)] == [True, True]
        ok = await client.embed(document(minilm.tokenizer, 600))
        assert ok["usage"]["prompt_tokens"] == 600
        with pytest.raises(PoolingServiceError) as err:
            await client.embed(["fine", document(minilm.tokenizer, 601)])
        assert err.value.error["code"] == "input_too_long"
        assert (err.value.error["max_tokens"], err.value.error["index"]) == (600, 1)
        assert "max_embed_len" in err.value.error["message"]
        # truncate_prompt_tokens applies before chunking: -1 keeps the model's maximum.
        cut = await client.embed(document(minilm.tokenizer, 1000), truncate_prompt_tokens=-1)
        assert cut["usage"]["prompt_tokens"] == 256
        # Only embed is chunked: token_embed keeps the model's maximum.
        reply = await nc.request(f"{prefix}.token_embed",
                                 msgpack.packb({"input": document(minilm.tokenizer, 300)}), timeout=30)
        assert msgpack.unpackb(reply.data)["error"]["code"] == "input_too_long"


async def test_dense_and_dimensions_come_after_the_chunks_are_combined(zoo, zoo_dirs, start_worker, nc, prefix):
    from sentence_transformers import SentenceTransformer

    model = zoo("st_mean_dense")
    st = SentenceTransformer(str(zoo_dirs["st_mean_dense"]), device="cpu")
    text = document(model.tokenizer, 3 * model.max_length + 17, seed=3)
    async with start_worker(model, chunked_processing=True):
        client = PoolingClient(nc, prefix=prefix)
        full = rows(await client.embed(text))[0]
        cut = rows(await client.embed(text, dimensions=8))[0]
    want = reference(st[0].auto_model.name_or_path, text, model.max_length, dense=st[2])
    assert np.abs(full - want).max() <= 1e-5
    want8 = reference(st[0].auto_model.name_or_path, text, model.max_length, dense=st[2],
                      normalize=False)[:8]
    assert np.abs(cut - want8 / np.linalg.norm(want8)).max() <= 1e-5
