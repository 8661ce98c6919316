"""Issue 27's encoder families that poolwire serves right (ModernBERT embedder and token
classifier, MPNet, NomicBERT, GTE; tests/model_zoo.py builds them as the hub ships them): a
worker with --backend torch and one with --backend openvino, and an offline PoolingModel
(--backend auto, which picks OpenVINO for each, since each converts and agrees with torch),
all equal Sentence-Transformers' `encode` or the transformers model run directly, to 1e-5."""

import logging

import numpy as np
import pytest
import torch

from poolwire import PoolingModel, PoolerConfig
from poolwire.client import PoolingClient
from poolwire.models.model import bundled_model_dir, load_model
from tests.helpers import close, rows
from tests.model_zoo import NER_LABELS, NOMIC_PROMPTS, build_encoder_families

pytest.importorskip("openvino", reason="the openvino wheel is a dependency on this platform")

pytestmark = pytest.mark.timeout(300)

# The long text runs past ModernBERT's local window of 8, so a padded row sees no key in it.
TEXTS = ["Hi", "The committee questions a careful experiment after a long debate in Berlin.",
         "Angela Merkel visited Paris."]
EMBEDDERS = ["modernbert_st", "mpnet_st", "nomic_st", "gte_st"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build_encoder_families(tmp_path_factory.mktemp("zoo-families"), bundled_model_dir())


@pytest.fixture(scope="module")
def loaded(folders):
    """Each family loaded once: the process converts a loaded model to OpenVINO once
    (backend_choice._shared), so both workers of a family reuse it."""
    return {name: load_model(path) for name, path in folders.items()}


async def served(model, start_worker, nc, prefix, caplog, call):
    """call(client) answered by a torch worker, then an OpenVINO one; each says in its one
    'serving' line which backend serves it."""
    out = {}
    for backend in ("torch", "openvino"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="poolwire"):
            async with start_worker(model, backend=backend) as worker:
                assert worker.backend.name == backend, worker.backend.describe()
                out[backend] = await call(PoolingClient(nc, prefix=prefix))
        started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
        assert len(started) == 1 and f"backend {backend}" in started[0], started
    return out


@pytest.mark.parametrize("name", EMBEDDERS)
async def test_embedders_equal_sentence_transformers(folders, loaded, start_worker, nc, prefix,
                                                     caplog, tmp_path, name):
    from sentence_transformers import SentenceTransformer

    prompt = {"prompt_name": "query"} if name == "nomic_st" else {}
    if prompt:  # the folder's own prompts, which poolwire reads from it
        assert NOMIC_PROMPTS.items() <= loaded[name].prompts.items()
    want = SentenceTransformer(str(folders[name]), device="cpu").encode(
        TEXTS, convert_to_numpy=True, **prompt)
    assert want.shape == (3, 32) and np.isfinite(want).all()
    # GTE ships CLS pooling without Normalize; the others mean pooling with it.
    assert np.allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-5) == (name != "gte_st")
    got = await served(loaded[name], start_worker, nc, prefix, caplog,
                       lambda client: client.embed(TEXTS, **prompt))
    for reply in got.values():
        close(np.stack(rows(reply)), want)
    offline = PoolingModel(str(folders[name]), device="cpu", backend="auto", state_dir=tmp_path)
    assert offline.backend.name == "openvino", offline.backend.describe()
    close(offline.embed(TEXTS, **prompt).data, want)


async def test_modernbert_token_classifier_equals_transformers(folders, loaded, start_worker, nc,
                                                               prefix, caplog, tmp_path):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    reference = AutoModelForTokenClassification.from_pretrained(folders["modernbert_tok"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(folders["modernbert_tok"])
    with torch.inference_mode():  # one text at a time, unpadded: softmax per token
        want = [torch.softmax(reference(**tokenizer(t, return_tensors="pt")).logits[0], -1).numpy()
                for t in TEXTS]
    assert [w.shape[1] for w in want] == [len(NER_LABELS)] * 3
    got = await served(loaded["modernbert_tok"], start_worker, nc, prefix, caplog,
                       lambda client: client.token_classify(TEXTS))
    for reply in got.values():
        for got_rows, want_rows in zip(rows(reply), want, strict=True):
            close(got_rows, want_rows)
    offline = PoolingModel(str(folders["modernbert_tok"]), device="cpu", backend="auto",
                           state_dir=tmp_path, pooler_config=PoolerConfig(task="token_classify"))
    assert offline.backend.name == "openvino", offline.backend.describe()
    for got_rows, want_rows in zip(offline.encode(TEXTS, pooling_task="token_classify").data,
                                   want, strict=True):
        close(got_rows, want_rows)
