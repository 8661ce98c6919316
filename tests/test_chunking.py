"""Chunked processing's pure parts on hand-made ids and vectors (models/chunking.py)."""

import numpy as np
import pytest

from poolwire.models.chunking import Chunks, chunk_sequences, cut, weighted_mean
from poolwire.models.tokenizing import TokenSeq

CLS, SEP = 101, 102


def test_chunks_are_exactly_the_maximum_length_in_order_special_tokens_included():
    ids = [CLS, *range(1000, 1010), SEP]  # 12 ids
    assert cut(ids, 5) == [[CLS, 1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007, 1008],
                           [1009, SEP]]
    assert cut(ids, 4) == [ids[0:4], ids[4:8], ids[8:12]]  # an exact multiple: no empty chunk
    assert sum(cut(ids, 5), []) == ids


def test_an_input_within_the_maximum_is_one_chunk():
    assert cut([CLS, 7, SEP], 3) == [[CLS, 7, SEP]]
    assert cut([CLS, 7, SEP], 512) == [[CLS, 7, SEP]]
    assert cut([5], 1) == [[5]]
    with pytest.raises(ValueError, match="max_length must be at least 1, got 0"):
        cut([1, 2], 0)


def test_weighted_mean_weights_by_token_counts():
    a, b = np.array([1.0, 0.0], np.float32), np.array([0.0, 4.0], np.float32)
    out = weighted_mean([a, b], [3, 1])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.75, 1.0])
    np.testing.assert_array_equal(weighted_mean([a], [7]), a)  # one chunk: its own vector
    with pytest.raises(ValueError, match="2 vectors and 1 token counts"):
        weighted_mean([a, b], [1])


def test_chunk_sequences_keeps_each_inputs_chunks_together():
    seqs = [TokenSeq([CLS, 1, 2, 3, 4, 5, SEP]), TokenSeq([CLS, 9, SEP]), TokenSeq(list(range(8)))]
    chunks, groups = chunk_sequences(seqs, 3)
    assert [c.ids for c in chunks] == [[CLS, 1, 2], [3, 4, 5], [SEP], [CLS, 9, SEP],
                                       [0, 1, 2], [3, 4, 5], [6, 7]]
    assert groups == [[0, 1, 2], [3], [4, 5, 6]]
    outputs = {i: np.full(2, float(i), np.float32) for i in range(len(chunks))}
    combined = Chunks(groups, finish=None).combine(outputs, [len(c) for c in chunks])
    np.testing.assert_allclose(combined[0], [(0 * 3 + 1 * 3 + 2 * 1) / 7] * 2, rtol=1e-6)
    np.testing.assert_array_equal(combined[1], [3.0, 3.0])
    np.testing.assert_allclose(combined[2], [(4 * 3 + 5 * 3 + 6 * 2) / 8] * 2, rtol=1e-6)


def test_a_chunked_plan_holds_every_chunk_as_a_sequence(minilm):
    """What the engine queues and admits: every chunk, each at most the maximum length, and
    `usage` their sum; the item's Dense, dimensions and normalisation wait for the combination."""
    from poolwire.models.task_heads import plan_task
    from poolwire.models.tokenizing import Tokenizing
    from poolwire.schemas.errors import PoolingError
    from poolwire.schemas.requests import PoolingRequest
    from poolwire.schemas.tasks import Task

    ids = [CLS, *[1996] * 1998, SEP]  # 2,000 token ids as given
    tokenizing = Tokenizing(minilm.tokenizer, minilm.max_length)
    request = PoolingRequest(input=[ids, [CLS, 1996, SEP]], dimensions=64)
    plan = plan_task(Task.EMBED, request, minilm, tokenizing, max_embed_len=2048)
    assert [len(s) for s in plan.sequences] == [256] * 7 + [208, 3]
    assert plan.chunks.groups == [list(range(8)), [8]]
    assert (plan.n_items, plan.prompt_tokens) == (2, 2003)
    assert not plan.spec.project and not plan.spec.normalize and plan.spec.dimensions is None
    assert plan.chunks.finish.normalize and plan.chunks.finish.dimensions == 64
    # Within the maximum, or without chunked processing, the plan is the usual one.
    short = plan_task(Task.EMBED, PoolingRequest(input="short"), minilm, tokenizing,
                      max_embed_len=2048)
    assert short.chunks is None and short.spec.project
    with pytest.raises(PoolingError, match="over the model's maximum of 256"):
        plan_task(Task.EMBED, request, minilm, tokenizing)
    with pytest.raises(PoolingError, match="chunked processing limit"):
        plan_task(Task.EMBED, request, minilm, tokenizing, max_embed_len=1999)
