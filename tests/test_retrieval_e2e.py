"""Retrieval through a real nats-server (PROTOCOL 1.2), each against its reference run directly
here: the rerank form of score on a cross-encoder (`CrossEncoder.rank`) and a bi-encoder
(Sentence-Transformers cosines, ranked), late interaction in a token_embed deployment (MaxSim
from transformers' hidden states), sparse models (`SparseEncoder.encode`, its
`max_active_dims` and `similarity`), bad input, discovery metadata and the CLI."""

import asyncio
import json
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.models.model import bundled_model_dir
from tests.helpers import close

pytestmark = pytest.mark.timeout(300)

QUERY = "how do rivers reach the sea?"
DOCS = ["Rivers flow downhill until they meet the ocean.",
        "The committee questions a careful experiment after a long debate.",
        "A river carries water and sediment to the sea through its delta.",
        "Every station was crowded before dawn.",
        "Mountains are cold.",
        "Streams join into rivers, and rivers empty into seas or lakes."]
TEXTS = ["A short one.", "Rivers flow into the sea through wide deltas.",
         "The station was crowded before dawn, with great care and no word."]


def ranked(reply) -> list[tuple[int, float]]:
    return [(d["index"], d["data"]) for d in reply["data"]]


def token_count(tokenizer, *texts) -> int:
    return len(tokenizer(*texts)["input_ids"])


async def test_cross_encoder_rerank_equals_cross_encoder_rank(small_models, small_model_dirs,
                                                              start_worker, nc, prefix):
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(small_model_dirs["seq1"]), device="cpu")
    want_all = reference.rank(QUERY, DOCS)
    want_top = reference.rank(QUERY, DOCS, top_k=3, return_documents=True)
    model = small_models["seq1"]
    async with start_worker(model) as worker:
        client = PoolingClient(nc, prefix=prefix)
        every = await client.rerank(QUERY, DOCS)
        top = await client.rerank(QUERY, DOCS, top_n=3, return_documents=True)
        more = await client.rerank(QUERY, DOCS, top_n=50)
        pairs = await client.score(QUERY, DOCS)
        frames = [f async for f in client.stream("score", {"query": QUERY, "documents": DOCS,
                                                            "top_n": 2, "return_documents": True})]
        described = worker.describe()
    assert [i for i, _ in ranked(every)] == [w["corpus_id"] for w in want_all]
    close([s for _, s in ranked(every)], [w["score"] for w in want_all])
    assert [i for i, _ in ranked(top)] == [w["corpus_id"] for w in want_top]
    close([s for _, s in ranked(top)], [w["score"] for w in want_top])
    assert [d["document"] for d in top["data"]] == [w["text"] for w in want_top]
    assert "document" not in every["data"][0] and ranked(more) == ranked(every)
    # The rerank form's scores are the pair form's, ranked.
    by_index = {d["index"]: d["data"] for d in pairs["data"]}
    assert all(by_index[i] == s for i, s in ranked(every))
    # A cross-encoder reads every (query, document) pair: usage counts each pair, as score does.
    pair_tokens = sum(token_count(model.tokenizer, QUERY, d) for d in DOCS)
    assert every["usage"]["prompt_tokens"] == pair_tokens == pairs["usage"]["prompt_tokens"]
    assert top["usage"]["prompt_tokens"] == pair_tokens  # all were scored, only 3 are sent
    # Streamed: the top_n item frames in rank order, each with its document, then done.
    assert [f.get("done", False) for f in frames] == [False, False, True]
    assert [(f["index"], f["document"]) for f in frames[:2]] == \
        [(w["corpus_id"], w["text"]) for w in want_top[:2]]
    assert set(frames[0]) == {"request_id", "index", "data", "document"}
    assert frames[2]["usage"]["prompt_tokens"] == pair_tokens
    assert described["score_method"] == "cross-encoder" and "embedding_kind" not in described


async def test_bi_encoder_rerank_equals_ranked_cosines_and_encodes_the_query_once(
        minilm, start_worker, nc, prefix):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    q = reference.encode([QUERY], convert_to_tensor=True, normalize_embeddings=True)
    d = reference.encode(DOCS, convert_to_tensor=True, normalize_embeddings=True)
    cosines = (q @ d.T)[0].numpy()
    want = sorted(range(len(DOCS)), key=lambda i: (-cosines[i], i))
    async with start_worker(minilm) as worker:
        client = PoolingClient(nc, prefix=prefix)
        before = worker.stats.sequences
        reply = await client.rerank(QUERY, DOCS, top_n=4, return_documents=True)
        sequences = worker.stats.sequences - before
        described = worker.describe()
        long = "word " * 300  # over MiniLM's 256 tokens
        with pytest.raises(PoolingServiceError) as doc_error:
            await client.rerank(QUERY, DOCS[:2] + [long])
        with pytest.raises(PoolingServiceError) as query_error:
            await client.rerank(long, DOCS[:2])
        cut = await client.rerank(long, DOCS[:2], truncate_prompt_tokens=-1)
    # A document's input_too_long names its place in `documents`; the query's says so.
    assert doc_error.value.error["code"] == "input_too_long" and doc_error.value.error["index"] == 2
    assert query_error.value.error["message"].startswith("query: ")
    assert query_error.value.error["field"] == "query" and len(cut["data"]) == 2
    assert [i for i, _ in ranked(reply)] == want[:4]
    close([s for _, s in ranked(reply)], cosines[want[:4]])
    assert [x["document"] for x in reply["data"]] == [DOCS[i] for i in want[:4]]
    # The query once plus every document, in usage and in what the model ran.
    tok = minilm.tokenizer
    assert reply["usage"]["prompt_tokens"] == token_count(tok, QUERY) + sum(
        token_count(tok, x) for x in DOCS)
    assert sequences == 1 + len(DOCS)
    assert described["score_method"] == "cosine" and described["embedding_kind"] == "dense"


def colbert_reference(folder, texts: list[str]) -> list[np.ndarray]:
    """Token rows as PyLate computes them, from transformers directly: hidden states of every
    token (special tokens included), the bias-free Dense projection, L2-normalised."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
    out = []
    for text in texts:
        with torch.inference_mode():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        out.append(torch.nn.functional.normalize(hidden @ weight.T, dim=-1).numpy())
    return out


def maxsim_reference(q: np.ndarray, d: np.ndarray) -> float:
    return float(sum(max(float(np.dot(row, other)) for other in d) for row in q))


async def test_late_interaction_in_a_token_embed_deployment_is_maxsim(zoo, zoo_dirs, start_worker,
                                                                      nc, prefix):
    folder = zoo_dirs["colbert"]
    rows = colbert_reference(folder, [QUERY] + DOCS)
    want = [maxsim_reference(rows[0], r) for r in rows[1:]]
    order = sorted(range(len(DOCS)), key=lambda i: (-want[i], i))
    async with start_worker(zoo("colbert"), task="token_embed") as worker:
        client = PoolingClient(nc, prefix=prefix)
        tokens = await client.token_embed(DOCS[0])
        pairs = await client.score(QUERY, DOCS)
        reranked = await client.rerank(QUERY, DOCS, top_n=3)
        info = await nc.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
    close(tokens["data"][0]["data"], rows[1])          # Dense on every row, normalised by default
    close([x["data"] for x in pairs["data"]], want, atol=1e-4)  # sums of up to 20 dot products
    assert "warnings" not in pairs and "warnings" not in reranked  # not deprecated here
    assert [i for i, _ in ranked(reranked)] == order[:3]
    close([s for _, s in ranked(reranked)], [want[i] for i in order[:3]], atol=1e-4)
    assert reranked["usage"]["prompt_tokens"] == sum(len(r) for r in rows)
    meta = json.loads(info.data)["metadata"]
    assert meta["score_method"] == "maxsim" and meta["embedding_kind"] == "dense"
    assert meta["configured_task"] == "token_embed"


def sparse_reference(folder):
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(folder), device="cpu")


def check_sparse(item: dict, want: torch.Tensor) -> None:
    """indices exactly, values to 1e-5, against one row of SparseEncoder.encode."""
    dense = want.to_dense() if want.is_sparse else want
    indices = torch.nonzero(dense).flatten().tolist()
    assert item["indices"] == indices
    close(item["values"], dense[indices].numpy())


@pytest.mark.parametrize("name", ["splade_max", "splade_sum"])
async def test_sparse_embed_equals_sparse_encoder(zoo, zoo_dirs, start_worker, nc, prefix, name):
    reference = sparse_reference(zoo_dirs[name])
    want = reference.encode(TEXTS).to_dense()
    want_top = reference.encode(TEXTS, max_active_dims=8).to_dense()
    want_scores = reference.similarity(reference.encode(TEXTS[:1]), reference.encode(TEXTS))[0]
    async with start_worker(zoo(name), durable=True, durable_ack_wait_s=1.0) as worker:
        client = PoolingClient(nc, prefix=prefix)
        full = await client.embed(TEXTS)
        top = await client.embed(TEXTS, max_active_dims=8)
        binary = await client.embed(TEXTS[1], max_active_dims=8, encoding_format="binary")
        streamed = [f async for f in client.stream("embed", {"input": TEXTS, "max_active_dims": 8})]
        job = await client.submit("embed", {"input": TEXTS[1:], "max_active_dims": 8})
        scores = await client.score(TEXTS[0], TEXTS)
        reranked = await client.rerank(TEXTS[0], TEXTS, top_n=2)
        described = worker.describe()
    for item, row in zip(full["data"], want):
        check_sparse(item["data"], row)
    for item, row in zip(top["data"], want_top):
        assert len(item["data"]["indices"]) == 8
        check_sparse(item["data"], row)
    b = binary["data"][0]
    assert b["shape"] == [30522] and b["dtype"] == "float32"
    check_sparse({"indices": np.frombuffer(b["indices"], "<u4").tolist(),
                  "values": np.frombuffer(b["bytes"], "<f4")}, want_top[1])
    items = {f["index"]: f["data"] for f in streamed if "index" in f}
    assert streamed[-1]["done"] and sorted(items) == [0, 1, 2]
    for i, row in enumerate(want_top):
        check_sparse(items[i], row)
    for item, row in zip(job["data"], want_top[1:]):
        check_sparse(item["data"], row)
    # Dot products of sums of ~30k weights of magnitude ~1: compared relative to their size.
    close(np.array([x["data"] for x in scores["data"]]) / float(want_scores.max()),
          want_scores.numpy() / float(want_scores.max()))
    order = sorted(range(len(TEXTS)), key=lambda i: (-float(want_scores[i]), i))
    assert [i for i, _ in ranked(reranked)] == order[:2]
    tok = zoo(name).tokenizer
    assert reranked["usage"]["prompt_tokens"] == token_count(tok, TEXTS[0]) + sum(
        token_count(tok, t) for t in TEXTS)
    assert described["embedding_kind"] == "sparse" and described["score_method"] == "dot"
    assert described["supported_tasks"] == "embed,score"


BAD = [
    ("minilm", "score", {"query": "q", "text_1": "a", "documents": ["d"]}, "text_1"),
    ("minilm", "score", {"query": "q", "documents": []}, "documents"),
    ("minilm", "score", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ("minilm", "score", {"text_1": "a", "text_2": "b", "top_n": 2}, "top_n"),
    ("minilm", "embed", {"input": "a", "max_active_dims": 4}, "max_active_dims"),
    ("splade_max", "embed", {"input": "a", "dimensions": 8}, "dimensions"),
]


@pytest.mark.parametrize("name, task, body, field", BAD, ids=[c[3] + "-" + c[0] for c in BAD])
async def test_bad_retrieval_input_is_invalid_request_naming_the_field(
        minilm, zoo, start_worker, nc, prefix, name, task, body, field):
    model = minilm if name == "minilm" else zoo(name)
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        with pytest.raises(PoolingServiceError) as info:
            await client.request(task, body)
        assert info.value.error["code"] == "invalid_request"
        assert info.value.error["field"] == field, info.value.error["message"]
        # The worker stays up and serves the next request.
        assert (await client.embed("still here"))["data"]


async def test_cli_rerank_prints_the_ranked_reply(minilm, start_worker, nats_server, nc, prefix):
    async with start_worker(minilm):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "rerank", QUERY, *DOCS[:3], "--top-n", "2",
            "--return-documents", "--nats-url", nats_server.url, "--prefix", prefix,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        direct = await PoolingClient(nc, prefix=prefix).rerank(QUERY, DOCS[:3], top_n=2)
    assert proc.returncode == 0, err.decode()
    reply = json.loads(out)
    assert [d["index"] for d in reply["data"]] == [d["index"] for d in direct["data"]]
    assert [d["document"] for d in reply["data"]] == [DOCS[d["index"]] for d in direct["data"]]


def test_binary_sparse_item_is_msgpack_bytes():
    from poolwire.actors.framing import ReplyStyle, wire_item
    from poolwire.models.sparse_vector import SparseVector
    from poolwire.schemas.codec import WireFormat

    v = SparseVector(np.array([2, 7], np.int64), np.array([0.5, 1.5], np.float32), 10)
    item = wire_item(3, v, ReplyStyle(WireFormat.MSGPACK, True, "float16"))
    assert item == {"index": 3, "dtype": "float16", "shape": [10],
                    "indices": np.array([2, 7], "<u4").tobytes(),
                    "bytes": np.array([0.5, 1.5], "<f2").tobytes()}
    assert msgpack.unpackb(msgpack.packb(item))["indices"] == item["indices"]
    assert wire_item(0, v, ReplyStyle(WireFormat.JSON, False, "float32"))["data"] == \
        {"indices": [2, 7], "values": [0.5, 1.5]}


async def test_a_pipeline_result_holds_the_sparse_item_as_is(zoo, zoo_dirs, start_worker, nc,
                                                            prefix):
    from nats.js.api import StreamConfig

    want = sparse_reference(zoo_dirs["splade_max"]).encode(TEXTS[1:2]).to_dense()[0]
    root = prefix.replace(".", "_")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=f"{root}_DOCS", subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    results = await nc.subscribe(f"{root}.out.>")
    try:
        async with start_worker(zoo("splade_max"), pipeline_stream=f"{root}_DOCS",
                                pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                pipeline_id_field="id", durable_ack_wait_s=1.0):
            await js.publish(f"{root}.in.7", msgpack.packb({"id": "doc-7", "text": TEXTS[1]}))
            msg = await results.next_msg(timeout=30)
    finally:
        for stream in (f"{root}_DOCS", f"{root}_OUT"):
            await js.delete_stream(stream)
    result = msgpack.unpackb(msg.data)
    assert msg.subject == f"{root}.out.7" and result["doc_id"] == "doc-7"
    check_sparse(result["data"][0]["data"], want)


async def test_a_rerank_too_big_for_one_message_comes_whole_and_ranked(minilm, start_worker):
    """Over max_payload with its documents, the reply is refused before compute and the client
    takes it as a stream: the same ranking, documents included."""
    import nats

    from poolwire.actors.nats_server import NatsServer

    docs = [f"{d} {i}" for i, d in enumerate(DOCS * 10)]
    # Room for the request (the documents once), not for the reply (the documents again, with
    # an index and a score each).
    request = msgpack.packb({"query": QUERY, "documents": docs, "return_documents": True,
                             "request_id": "x" * 32})
    with NatsServer(max_payload=len(request) + 512) as server:
        nc = await nats.connect(server.url)
        try:
            async with start_worker(minilm, url=server.url) as worker:
                client = PoolingClient(nc, prefix=worker.settings.prefix)
                before = worker.stats.sequences
                whole = await client.rerank(QUERY, docs, return_documents=True)
                computed = worker.stats.sequences - before
                bare = await client.rerank(QUERY, docs)
        finally:
            await nc.close()
    assert [d["index"] for d in whole["data"]] == [d["index"] for d in bare["data"]]
    assert [d["document"] for d in whole["data"]] == [docs[d["index"]] for d in bare["data"]]
    assert [d["data"] for d in whole["data"]] == [d["data"] for d in bare["data"]]
    assert computed == 1 + len(docs)  # refused from the estimate, computed once as a stream
