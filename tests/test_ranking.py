"""The pure parts of retrieval (PROTOCOL 1.2): ranking, MaxSim, sparse vectors and SPLADE
pooling against Sentence-Transformers' own module, the rerank fields' validation, and the task
policy's score_method / embedding_kind. No NATS, no model folder."""

import numpy as np
import pytest
import torch

from poolwire.actors.task_policy import embedding_kind, score_method, supported_tasks
from poolwire.models.ranking import maxsim, rank
from poolwire.models.sparse import SpladeConfig, splade_pool, sparse_items
from poolwire.models.sparse_vector import SparseVector
from poolwire.schemas.errors import PoolingError
from poolwire.schemas.requests import parse_request
from poolwire.schemas.tasks import Task


def test_rank_sorts_by_score_then_index_and_cuts_to_top_n():
    scores = [0.1, 0.9, 0.5, 0.9, -2.0]
    assert rank(scores) == [1, 3, 2, 0, 4]
    assert rank(scores, 2) == [1, 3]
    assert rank(scores, 50) == [1, 3, 2, 0, 4]
    assert rank([0.3], 1) == [0]


def test_maxsim_sums_each_query_rows_best_match():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    d = np.array([[0.8, 0.6], [0.0, -1.0]], dtype=np.float32)
    # Row by row: max(0.8, 0) + max(0.6, -1) + max(0.96, -0.8).
    assert maxsim(q, d) == pytest.approx(0.8 + 0.6 + 0.96)
    assert maxsim(d, q) == pytest.approx(0.96 + 0.0)  # not symmetric: the first text's rows


def test_sparse_vector_keeps_nonzero_ascending_and_the_k_largest():
    row = np.array([0.0, 3.0, 0.0, 1.0, 2.0, 0.5], dtype=np.float32)
    v = SparseVector.from_dense(row)
    assert v.indices.tolist() == [1, 3, 4, 5] and v.values.tolist() == [3.0, 1.0, 2.0, 0.5]
    top = SparseVector.from_dense(row, 2)
    assert top.indices.tolist() == [1, 4] and top.values.tolist() == [3.0, 2.0] and top.size == 6
    assert SparseVector.from_dense(row, 10).indices.tolist() == [1, 3, 4, 5]
    other = SparseVector.from_dense(np.array([1, 1, 0, 0, 4, 0], dtype=np.float32))
    assert v.dot(other) == pytest.approx(3.0 + 8.0)
    assert SparseVector.from_dense(np.zeros(4)).dot(v) == 0.0
    n = v.normalized()
    assert np.linalg.norm(n.values) == pytest.approx(1.0) and n.indices.tolist() == v.indices.tolist()


@pytest.mark.parametrize("pooling, activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_splade_pool_equals_sentence_transformers_splade_pooling(pooling, activation):
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50) * 3                 # [B, T, V], odd sizes
    lengths = torch.tensor([7, 1, 4])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    module = SpladePooling(pooling, activation).eval()
    with torch.inference_mode():
        want = module({"token_embeddings": logits.clone(), "attention_mask": mask})["sentence_embedding"]
    got = splade_pool(SpladeConfig(pooling, activation), logits, lengths)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    items = sparse_items(SpladeConfig(pooling, activation), logits, lengths, 3, False)
    assert all(len(i.indices) <= 3 and list(i.indices) == sorted(i.indices) for i in items)


@pytest.mark.parametrize("body, field", [
    ({"query": "q", "text_1": "a", "documents": ["d"]}, "text_1"),
    ({"query": "q", "text_2": "a", "documents": ["d"]}, "text_2"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["d", ""]}, "documents"),
    ({"query": "", "documents": ["d"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"documents": ["d"]}, "query"),
    ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["d"], "top_n": True}, "top_n"),
    ({"text_1": "a", "text_2": "b", "top_n": 2}, "top_n"),
    ({"text_1": "a", "text_2": "b", "return_documents": True}, "return_documents"),
    ({"query": "q", "documents": "d"}, "documents"),
    ({"query": ["q"], "documents": ["d"]}, "query"),
])
def test_bad_rerank_fields_name_the_field(body, field):
    with pytest.raises(PoolingError) as info:
        parse_request(Task.SCORE, body)
    assert info.value.extra.get("field") == field, info.value.message


def test_rerank_fields_only_on_score_and_max_active_dims_only_on_embed():
    request = parse_request(Task.SCORE, {"query": "q", "documents": ["a", "b"], "top_n": 1,
                                         "return_documents": True})
    assert request.top_n == 1 and request.documents == ["a", "b"]
    assert parse_request(Task.EMBED, {"input": "x", "max_active_dims": 4}).max_active_dims == 4
    for task, body, field in [(Task.EMBED, {"input": "x", "query": "q"}, "query"),
                              (Task.TOKEN_EMBED, {"input": "x", "max_active_dims": 3}, "max_active_dims"),
                              (Task.EMBED, {"input": "x", "max_active_dims": 0}, "max_active_dims")]:
        with pytest.raises(PoolingError) as info:
            parse_request(task, body)
        assert info.value.extra.get("field") == field


def test_score_method_and_embedding_kind_per_model_kind():
    E, TE, C = Task.EMBED, Task.TOKEN_EMBED, Task.CLASSIFY
    assert score_method("encoder", 0, E) == "cosine"
    assert score_method("encoder", 0, TE) == "maxsim"
    assert score_method("sparse", 0, E) == "dot"
    assert score_method("sequence_classification", 1, C) == "cross-encoder"
    assert score_method("sequence_classification", 3, C) is None
    assert score_method("token_classification", 0, Task.TOKEN_CLASSIFY) is None
    assert [embedding_kind(k) for k in ("encoder", "sparse", "sequence_classification")] == \
        ["dense", "sparse", None]
    assert supported_tasks("sparse") == [Task.EMBED, Task.SCORE]


def test_the_policy_and_the_planner_name_score_methods_alike():
    from poolwire.models.task_heads import ScoreMethod

    assert {score_method("encoder", 0, Task.EMBED), score_method("encoder", 0, Task.TOKEN_EMBED),
            score_method("sparse", 0, Task.EMBED),
            score_method("sequence_classification", 1, Task.CLASSIFY)} == {
        ScoreMethod.COSINE, ScoreMethod.MAXSIM, ScoreMethod.DOT, ScoreMethod.CROSS_ENCODER}


def test_a_streamed_rerank_is_assembled_in_rank_order_with_documents_and_sparse_indices():
    """The client's fallback when a one-message reply would be too large (payload_too_large):
    the stream's frames become the one reply, ranked items in the order they came."""
    from poolwire.whole_reply import assemble_stream

    frames = [{"request_id": "r", "index": 2, "data": 0.9, "document": "c"},
              {"request_id": "r", "index": 0, "data": 0.4, "document": "a"},
              {"request_id": "r", "done": True, "model": "m", "task": "score",
               "usage": {"prompt_tokens": 9, "total_tokens": 9}}]
    reply = assemble_stream(frames, "r", ranked=True)
    assert reply["data"] == [{"index": 2, "data": 0.9, "document": "c"},
                             {"index": 0, "data": 0.4, "document": "a"}]
    assert [d["index"] for d in assemble_stream(frames, "r")["data"]] == [0, 2]
    sparse = [{"request_id": "r", "index": 0, "dtype": "float32", "shape": [10],
               "indices": b"\x01\x00\x00\x00", "bytes": b"\x00\x00\x80\x3f"}, frames[-1]]
    assert assemble_stream(sparse, "r")["data"][0]["indices"] == b"\x01\x00\x00\x00"
