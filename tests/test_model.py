"""Model loading: Sentence-Transformers folders, the length rule, device and dtype."""

import json

import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient
from poolwire.models.model import (load_model, max_model_length, read_sentence_transformers_config,
                          resolve_device)


def test_the_bundled_folder_reads_as_mean_pooling_normalised_256_tokens(minilm):
    assert (minilm.name, minilm.pooling_method, minilm.normalize_default, minilm.max_length) == \
        ("all-MiniLM-L6-v2", "mean", True, 256)
    assert minilm.device == torch.device("cpu")


@pytest.mark.parametrize("flags, method", [({"pooling_mode_cls_token": True}, "cls"),
                                           ({"pooling_mode_lasttoken": True}, "last"),
                                           ({"pooling_mode_mean_tokens": True}, "mean")])
def test_pooling_method_and_normalize_come_from_the_modules(tmp_path, flags, method):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    cfg = read_sentence_transformers_config(tmp_path)
    assert (cfg.pooling_method, cfg.normalize, cfg.max_seq_length) == (method, False, None)


def test_max_pooling_is_refused_naming_the_file(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        read_sentence_transformers_config(tmp_path)


def test_the_length_rule():
    assert max_model_length(256, 512, 512) == 256          # Sentence-Transformers first
    assert max_model_length(None, 512, 1024) == 512        # then a finite tokenizer limit
    assert max_model_length(None, int(1e30), 1024) == 1024  # "no limit" falls to positions
    with pytest.raises(ValueError):
        max_model_length(None, None, None)


def test_devices_and_dtypes_are_checked():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
    from poolwire.models.model import bundled_model_dir

    with pytest.raises(ValueError, match="float8"):
        load_model(bundled_model_dir(), dtype="float8")


async def test_a_bfloat16_model_serves_embeddings_close_to_float32(minilm, start_worker, nc, prefix):
    from poolwire.models.model import bundled_model_dir

    half = load_model(bundled_model_dir(), device="cpu", dtype="bfloat16")
    texts = ["a short sentence", "another, somewhat longer sentence about the weather today"]
    async with start_worker(half):
        got = await PoolingClient(nc, prefix=prefix).embed(texts)
    with torch.inference_mode():
        enc = minilm.tokenizer(texts, padding=True, return_tensors="pt")
        hidden = minilm.module(**enc).last_hidden_state
        mask = enc["attention_mask"][..., None]
        want = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    vectors = np.array([d["data"] for d in got["data"]])
    cosine = (vectors * want).sum(1)
    assert cosine.min() > 0.99, cosine
