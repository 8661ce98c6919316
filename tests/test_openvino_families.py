"""Issue 27's families on OpenVINO: EmbeddingGemma's layout (Gemma3 with bidirectional attention,
which failed to trace) and a ModernBERT cross-encoder (which scored NaN) convert with the
attention of models/traceable_attention.py and equal torch, Sentence-Transformers and
CrossEncoder; `--backend auto` then serves them with OpenVINO.

The texts differ in length by more than either model's sliding window, so a padded row whose
window holds no real token is in every batch: the case that gave NaN."""

import logging

import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient
from poolwire.models.backend import TorchBackend
from poolwire.models.backend_choice import build_backend
from poolwire.models.model import bundled_model_dir, load_model
from poolwire.models.openvino_backend import forwards_for
from tests.helpers import close, rows
from tests.model_zoo import embedding_gemma, modernbert_cross_encoder

pytest.importorskip("openvino", reason="the openvino wheel is a dependency on this platform")

pytestmark = pytest.mark.timeout(600)

TEXTS = ["Hi", "The committee questions a careful experiment after a long debate in Berlin.",
         "Prices rose again in March, the third increase this year."]
QUERY = "what does the committee question?"
TOLERANCE = 1e-5   # relative above 1, as tests/test_openvino_backend.py


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ov-families")
    return {"gemma3": embedding_gemma(root / "embeddinggemma", bundled_model_dir()),
            "modernbert": modernbert_cross_encoder(root / "modernbert-ce", bundled_model_dir())}


@pytest.fixture(scope="module")
def models(folders):
    """Loaded once: the process converts each loaded model once (backend_choice._shared), so
    every test below reuses that conversion."""
    return {name: load_model(path) for name, path in folders.items()}


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got - want).abs() / want.abs().clamp(min=1.0)).max())


def padded_batch(model):
    """Token ids of TEXTS and the query, right-padded: 'Hi' is followed by a dozen pads."""
    enc = model.tokenizer([*TEXTS, QUERY], padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"])


@pytest.mark.parametrize("name", ["gemma3", "modernbert"])
def test_the_backend_converts_and_equals_torch(models, name):
    model = models[name]
    backend = build_backend("openvino", model, "exact", "float32", None)
    assert backend.name == "openvino", backend.describe()
    ids, mask, types = padded_batch(model)
    assert int((mask == 0).sum(dim=1).max()) > 8, "a padded run longer than the windows"
    for forward in forwards_for(model):
        got = backend.run(forward, ids, mask, types)
        want = TorchBackend(model).run(forward, ids, mask, types)
        if got.dim() == 3:  # token rows: padding is never pooled, but must stay finite
            assert torch.isfinite(got).all(), forward
            got, want = got[mask.bool()], want[mask.bool()]
        assert torch.isfinite(got).all(), forward
        assert relative(got, want) <= TOLERANCE, (forward, relative(got, want))


async def test_embedding_gemma_served_by_openvino_equals_sentence_transformers(
        models, folders, start_worker, nc, prefix, caplog):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folders["gemma3"]), device="cpu")
    want_query = reference.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    want_doc = reference.encode(TEXTS, prompt_name="document", convert_to_numpy=True)
    got = {}
    with caplog.at_level(logging.INFO, logger="poolwire"):
        for backend in ("openvino", "auto"):
            async with start_worker(models["gemma3"], backend=backend) as worker:
                assert worker.backend.name == "openvino", worker.backend.describe()
                client = PoolingClient(nc, prefix=prefix)
                got[backend] = (await client.embed(TEXTS, prompt_name="query"),
                                await client.embed(TEXTS, prompt_name="document"))
    for query, doc in got.values():
        close(np.stack(rows(query)), want_query)
        close(np.stack(rows(doc)), want_doc)
    assert len(want_query[0]) == 24  # through both Dense modules
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    assert len(started) == 2 and all("backend openvino" in line for line in started), started


async def test_modernbert_cross_encoder_served_by_openvino_equals_cross_encoder(
        models, folders, start_worker, nc, prefix, caplog):
    from sentence_transformers import CrossEncoder

    want = CrossEncoder(str(folders["modernbert"]), device="cpu").predict(
        [(QUERY, text) for text in TEXTS], convert_to_numpy=True)
    assert np.isfinite(want).all()
    got = {}
    with caplog.at_level(logging.INFO, logger="poolwire"):
        for backend in ("openvino", "auto"):
            async with start_worker(models["modernbert"], backend=backend) as worker:
                assert worker.backend.name == "openvino", worker.backend.describe()
                got[backend] = await PoolingClient(nc, prefix=prefix).score(QUERY, TEXTS)
    for score in got.values():
        close([item["data"] for item in score["data"]], want)
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    assert len(started) == 2 and all("backend openvino" in line for line in started), started
