"""Embeddings through a real nats-server equal Sentence-Transformers' in-process encode."""

import asyncio

import numpy as np
import pytest

from poolwire.client import PoolingClient
from bench.workload import mixed_texts

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def st_model(minilm):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm.path), device="cpu")


def vectors(reply) -> np.ndarray:
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    return np.array([d["data"] for d in reply["data"]], dtype=np.float32)


async def test_single_text_and_64_mixed_texts_equal_sentence_transformers(minilm, st_model, start_worker, nc, prefix):
    texts = mixed_texts(64, seed=1)
    async with start_worker(minilm):
        client = PoolingClient(nc, prefix=prefix)
        one = await client.embed("The quick brown fox jumps over the lazy dog.")
        many = await client.embed(texts)
    expected_one = st_model.encode(["The quick brown fox jumps over the lazy dog."], normalize_embeddings=True)
    expected = st_model.encode(texts, normalize_embeddings=True, batch_size=32)
    assert one["model"] == "all-MiniLM-L6-v2" and one["task"] == "embed"
    assert np.abs(vectors(one) - expected_one).max() <= 1e-5
    assert np.abs(vectors(many) - expected).max() <= 1e-5
    tokens = sum(len(minilm.tokenizer(t)["input_ids"]) for t in texts)
    assert many["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def test_token_id_inputs_are_used_as_given(minilm, st_model, start_worker, nc, prefix):
    texts = ["Token ids go straight to the model.", "A second one, a little bit longer than the first."]
    ids = [minilm.tokenizer(t)["input_ids"] for t in texts]
    async with start_worker(minilm):
        client = PoolingClient(nc, prefix=prefix)
        batch = await client.embed(ids)
        single = await client.embed(ids[0])
    expected = st_model.encode(texts, normalize_embeddings=True)
    assert np.abs(vectors(batch) - expected).max() <= 1e-5
    assert np.abs(vectors(single)[0] - expected[0]).max() <= 1e-5


async def test_500_concurrent_requests_from_50_clients_each_get_their_own_reply(minilm, start_worker, nats_server, prefix):
    import nats

    texts = mixed_texts(500, seed=2, short_share=0.9)

    async def one_client(c: int) -> list[tuple[str, str]]:
        conn = await nats.connect(nats_server.url)
        try:
            client = PoolingClient(conn, prefix=prefix, timeout=120)
            async def one(i: int):
                rid = f"client{c}-req{i}"
                reply = await client.embed(texts[c * 10 + i], request_id=rid)
                assert len(reply["data"]) == 1 and len(reply["data"][0]["data"]) == 384
                return rid, reply["request_id"]
            return await asyncio.gather(*(one(i) for i in range(10)))
        finally:
            await conn.close()

    async with start_worker(minilm):
        results = await asyncio.gather(*(one_client(c) for c in range(50)))
    pairs = [p for r in results for p in r]
    assert len(pairs) == 500
    assert all(sent == got for sent, got in pairs)
    assert len({got for _, got in pairs}) == 500
