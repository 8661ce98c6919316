"""The offline API (`poolwire.PoolingModel`): for every zoo model and every task it supports,
what it returns equals what a worker answers over NATS, to 1e-6; the task policy's warning,
reject and unsupported paths; field errors as the protocol's codes; chunked processing."""

import warnings

import numpy as np
import pytest

import poolwire
from poolwire import (InputTooLongError, InvalidRequestError, PoolerConfig,
                      PoolingDeprecationWarning, PoolingModel, PoolingModelError,
                      TaskNotConfiguredError, UnsupportedTaskError)
from poolwire.client import PoolingClient
from poolwire.models.model import bundled_model_dir
from poolwire.offline_errors import ERROR_CLASSES
from poolwire.schemas.errors import ErrorCode
from tests.model_zoo import MATRYOSHKA
from tests.test_chunked_e2e import document, reference

pytestmark = pytest.mark.timeout(300)

TEXTS = ["Angela Merkel visited Paris.", "A short one.",
         "The committee questions a careful experiment after a long debate in Berlin."]
QUERY, DOCS = "where is the station", ["the station is north of the river", "a red car"]
ZOO = ["st_mean_dense", "st_mean_dense_old", "st_cls_prompts", "qwen3_st", "qwen3_plain",
       "qwen3_seq", "roberta3", "roberta1_ce", "xlmr3", "xlmr1_ce", "regression", "distil_seq",
       "distil_tok", "deberta_seq", "deberta_tok", "ner", "colbert", "splade_max", "splade_sum"]


@pytest.fixture(scope="module")
def minilm_offline():
    return PoolingModel(bundled_model_dir())


def body_for(task: str) -> dict:
    return {"text_1": QUERY, "text_2": DOCS} if task == "score" else {"input": TEXTS}


def call(model: PoolingModel, task: str, body: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoolingDeprecationWarning)
        if task == "score":
            return model.score(body["text_1"], body["text_2"])
        return model.encode(body["input"], pooling_task=task)


def wire_items(reply) -> list[np.ndarray]:
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    return [np.asarray(d["data"], dtype=np.float32) for d in reply["data"]]


def sparse_equal(result, reply) -> None:
    """A sparse model's embed: the same indices, values to 1e-6."""
    assert len(result.data) == len(reply["data"])
    for got, want in zip(result.data, reply["data"]):
        assert list(got["indices"]) == want["data"]["indices"]
        assert np.abs(got["values"] - np.asarray(want["data"]["values"], np.float32)).max() <= 1e-6


def test_the_zoo_list_is_the_whole_zoo(zoo_dirs):
    assert sorted(ZOO) == sorted(n for n in zoo_dirs)


@pytest.mark.parametrize("name", ["minilm", *ZOO])
async def test_offline_equals_a_worker_on_every_task(name, zoo, zoo_dirs, minilm, minilm_offline,
                                                      start_worker, nc, prefix):
    loaded = minilm if name == "minilm" else zoo(name)
    offline = minilm_offline if name == "minilm" else PoolingModel(zoo_dirs[name])
    assert offline.supported_tasks and offline.configured_task
    async with start_worker(loaded) as worker:
        assert [t.value for t in worker.policy.supported] == offline.supported_tasks
        assert worker.policy.configured.value == offline.configured_task
        client = PoolingClient(nc, prefix=prefix)
        for task in offline.supported_tasks:
            reply = await client.request(task, body_for(task))
            result = call(offline, task, body_for(task))
            assert result.usage == reply["usage"], task
            assert bool(result.warnings) == bool(reply.get("warnings")), task
            if isinstance(reply["data"][0]["data"], dict):
                sparse_equal(result, reply)
                continue
            want = wire_items(reply)
            if task in ("token_embed", "token_classify"):
                assert [r.shape for r in result.data] == [w.shape for w in want], task
                got = result.data
            else:
                got = list(np.asarray(result))
                assert result.data.dtype == np.float32
                assert result.data.shape == ((len(want),) if task == "score"
                                             else (len(want), len(want[0]))), task
            assert max(float(np.abs(g - w).max()) for g, w in zip(got, want)) <= 1e-6, task


@pytest.mark.parametrize("name", ["minilm", "roberta1_ce", "colbert", "splade_max"])
async def test_offline_rerank_equals_a_worker(name, zoo, zoo_dirs, minilm, minilm_offline,
                                              start_worker, nc, prefix):
    """The rerank form of score (PROTOCOL 1.2) offline: the worker's ranking, scores to 1e-6,
    on a bi-encoder, a cross-encoder, late interaction and a sparse model."""
    loaded = minilm if name == "minilm" else zoo(name)
    task = "token_embed" if name == "colbert" else None  # MaxSim is token_embed's score
    offline = (minilm_offline if name == "minilm" else
               PoolingModel(zoo_dirs[name], pooler_config=PoolerConfig(task=task)))
    docs = [*DOCS, "the station", "north of the river is the station"]
    async with start_worker(loaded, task=task) as worker:
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.request("score", {"query": QUERY, "documents": docs, "top_n": 3,
                                               "return_documents": True})
    result = offline.rerank(QUERY, docs, top_n=3, return_documents=True)
    assert result.indices == [d["index"] for d in reply["data"]]
    assert np.abs(np.asarray(result) - [d["data"] for d in reply["data"]]).max() <= 1e-6
    assert [e["document"] for e in result.extras] == [d["document"] for d in reply["data"]]
    assert result.usage == reply["usage"] and result.warnings == []


def test_a_non_configured_task_warns_naming_both_tasks_and_how_to_configure(minilm_offline):
    assert issubclass(PoolingDeprecationWarning, FutureWarning)
    with pytest.warns(PoolingDeprecationWarning) as caught:
        result = minilm_offline.encode(TEXTS, pooling_task="token_embed")
    text = str(caught[0].message)
    assert "deprecated" in text and "'token_embed'" in text and "'embed'" in text
    assert "PoolerConfig(task='token_embed')" in text
    assert caught[0].filename == __file__  # it points at the caller's line
    assert result.warnings == [text]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert minilm_offline.embed(TEXTS).warnings == []  # the configured task: no warning
        assert minilm_offline.score(QUERY, DOCS).warnings == []  # cosine of embed: not deprecated


def test_reject_raises_task_not_configured_and_unsupported_lists_every_task(zoo_dirs):
    strict = PoolingModel(zoo_dirs["roberta1_ce"],
                          pooler_config=PoolerConfig(task="classify", multitask="reject"))
    assert strict.supported_tasks == ["classify", "token_classify", "score"]
    with pytest.raises(TaskNotConfiguredError) as err:
        strict.encode(TEXTS, pooling_task="token_classify")
    e = err.value
    assert (e.code, e.configured_task, e.supported_tasks) == (
        "task_not_configured", "classify", ["classify", "token_classify", "score"])
    assert "PoolerConfig(task='token_classify')" in e.message
    assert isinstance(e, PoolingModelError)
    strict.score(QUERY, DOCS)  # a cross-encoder's score is computed with classify: served
    for task in ("embed", "token_embed", "no_such_task"):
        with pytest.raises(UnsupportedTaskError) as err:
            strict.encode(TEXTS, pooling_task=task)
        assert err.value.supported_tasks == ["classify", "token_classify", "score"]
        assert "classify, token_classify, score" in str(err.value)
    with pytest.raises(UnsupportedTaskError, match="embed, token_embed, score"):
        PoolingModel(bundled_model_dir(), pooler_config=PoolerConfig(task="embed")).classify(TEXTS)
    # A configured task the model cannot do fails at construction, as a worker's start does.
    with pytest.raises(UnsupportedTaskError, match=r"PoolerConfig\(task='classify'\).*supports: "
                                                   r"embed, token_embed, score") as err:
        PoolingModel(bundled_model_dir(), pooler_config=PoolerConfig(task="classify"))
    assert err.value.supported_tasks == ["embed", "token_embed", "score"]


def test_encode_without_pooling_task_is_a_clear_type_error(minilm_offline):
    with pytest.raises(TypeError, match=r"encode\(\) needs pooling_task=, one of embed, token_embed"):
        minilm_offline.encode(TEXTS)


def test_fields_are_checked_as_the_worker_checks_them(minilm_offline, zoo_dirs):
    for fields, name in (({"dimensions": 1000}, "dimensions"), ({"normalise": True}, "normalise"),
                         ({"prompt_name": "query"}, "prompt_name"), ({"stream": True}, "stream"),
                         ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                         ({"dimensions": 2.0}, "dimensions")):
        with pytest.raises(InvalidRequestError) as err:
            minilm_offline.embed(TEXTS, **fields)
        assert err.value.field == name and err.value.code == "invalid_request"
    with pytest.raises(InvalidRequestError, match="input is empty"):
        minilm_offline.embed([])
    with pytest.raises(InputTooLongError) as err:
        minilm_offline.embed(["ok", "word " * 300])
    assert (err.value.max_tokens, err.value.index) == (256, 1)
    out = minilm_offline.embed(TEXTS, dimensions=8, normalize=False)
    assert out.data.shape == (3, 8)
    prompted = PoolingModel(zoo_dirs["st_cls_prompts"])
    assert prompted.embed(TEXTS, dimensions=MATRYOSHKA[0], prompt_name="passage").data.shape == (3, 8)
    with pytest.raises(ValueError, match="backend 'onnx' is not one of auto, torch"):
        PoolingModel(bundled_model_dir(), backend="onnx")


def test_one_exception_class_per_protocol_error_code():
    assert set(ERROR_CLASSES) == {c.value for c in ErrorCode}
    for name in ("PoolingModel", "PoolerConfig", "PoolingDeprecationWarning",
                 "TaskNotConfiguredError", "UnsupportedTaskError"):
        assert name in poolwire.__all__ and getattr(poolwire, name)


def test_offline_chunked_processing_equals_the_reference(minilm):
    model = PoolingModel(bundled_model_dir(), pooler_config=PoolerConfig(task="embed", chunked_processing=True))
    text = document(minilm.tokenizer, 700)  # 3 chunks; the 2,000-token case: test_chunked_e2e
    out = model.embed([text, "short"])
    assert np.abs(out.data[0] - reference(minilm.path, text, 256)).max() <= 1e-5
    assert out.usage["prompt_tokens"] == 700 + 3
    with pytest.raises(InputTooLongError, match="max_embed_len"):
        model.embed(document(minilm.tokenizer, 2049))
