"""Reading Sentence-Transformers folders (PROTOCOL.md "Model folders") without loading a model:
both pooling layouts, Dense modules, prompts, a CrossEncoder's saved activation, and refusals
that name the file and the value."""

import json

import pytest
import torch

from poolwire.models.model import activation_for, default_pooling
from poolwire.models.st_folder import SentenceTransformersConfig, read_sentence_transformers_config


def _folder(tmp_path, pooling: dict, extra_modules=(), **files):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
               *extra_modules]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    return tmp_path


@pytest.mark.parametrize("mode, method", [("mean", "mean"), ("cls", "cls"), ("lasttoken", "last")])
def test_the_current_pooling_mode_layout(tmp_path, mode, method):
    cfg = read_sentence_transformers_config(_folder(tmp_path, {"embedding_dimension": 32,
                                                               "pooling_mode": mode}))
    assert (cfg.pooling_method, cfg.normalize, cfg.dense) == (method, False, ())


@pytest.mark.parametrize("pooling, named", [
    ({"pooling_mode": "max"}, "'max'"),
    ({"pooling_mode": "mean", "include_prompt": False}, "include_prompt"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "['cls', 'mean']"),
])
def test_pooling_poolwire_cannot_do_is_refused_naming_it(tmp_path, pooling, named):
    with pytest.raises(ValueError, match="1_Pooling/config.json") as info:
        read_sentence_transformers_config(_folder(tmp_path, pooling))
    assert named in str(info.value)


def test_dense_modules_prompts_and_normalize(tmp_path):
    from safetensors.torch import save_file

    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    norm = {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}
    folder = _folder(tmp_path, {"pooling_mode": "cls"}, [dense, norm],
                     **{"config_sentence_transformers.json": {
                         "prompts": {"query": "q: ", "doc": ""}, "default_prompt_name": "query"}})
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps({
        "in_features": 4, "out_features": 2, "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity"}))
    weight, bias = torch.arange(8.0).reshape(2, 4), torch.tensor([1.0, -1.0])
    save_file({"linear.weight": weight, "linear.bias": bias}, folder / "2_Dense" / "model.safetensors")
    cfg = read_sentence_transformers_config(folder)
    assert (cfg.normalize, cfg.prompts, cfg.default_prompt_name) == (True, {"query": "q: ", "doc": ""}, "query")
    x = torch.ones(1, 4)
    assert torch.equal(cfg.dense[0].module()(x), x @ weight.T + bias)
    # A Dense activation is only ever a torch.nn class: a folder cannot name code to import.
    (folder / "2_Dense" / "config.json").write_text(json.dumps({
        "in_features": 4, "out_features": 2, "activation_function": "os.system"}))
    with pytest.raises(ValueError, match="'os.system' is not a torch.nn activation"):
        read_sentence_transformers_config(folder)


@pytest.mark.parametrize("where, content, kind", [
    ("config_sentence_transformers.json", {"activation_fn": "torch.nn.modules.linear.Identity"}, "none"),
    ("config.json", {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}},
     "sigmoid"),
    ("config.json", {"sbert_ce_default_activation_function": "torch.nn.modules.activation.Softmax"},
     "softmax"),
])
def test_cross_encoder_activation_in_each_layout(tmp_path, where, content, kind):
    (tmp_path / where).write_text(json.dumps(content))
    assert read_sentence_transformers_config(tmp_path).cross_encoder_activation == kind


def test_an_unknown_cross_encoder_activation_is_refused(tmp_path):
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "torch.nn.modules.activation.Tanh"}))
    with pytest.raises(ValueError, match="Tanh"):
        read_sentence_transformers_config(tmp_path)


def test_activation_defaults():
    assert activation_for(3, None, None) == "softmax"
    assert activation_for(1, None, None) == "sigmoid"
    assert activation_for(4, "multi_label_classification", None) == "sigmoid"
    assert activation_for(1, "regression", None) == "none"
    assert activation_for(1, None, "none") == "none"  # what the CrossEncoder saved wins


def test_pooling_without_a_pooling_module_follows_the_architecture():
    from transformers import BertConfig, Qwen3Config

    assert default_pooling(SentenceTransformersConfig(), BertConfig()) == "cls"
    assert default_pooling(SentenceTransformersConfig(), Qwen3Config()) == "last"
    assert default_pooling(SentenceTransformersConfig(pooling_method="mean"), Qwen3Config()) == "mean"


def test_model_values_that_are_neither_folder_nor_hub_id_say_how_models_load(tmp_path):
    from poolwire.models.model_source import resolve_model_source

    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_source(tmp_path)
    with pytest.raises(ValueError, match="at/all is not a model folder: it has no config.json"):
        resolve_model_source("./not/a/folder/at/all")  # a path, never tried as a hub id
