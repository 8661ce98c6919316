"""Reading a Sentence-Transformers model folder: pooling, Dense projections, Normalize, length,
prompts and a CrossEncoder's saved activation, in every layout Sentence-Transformers itself
reads (PROTOCOL.md "Model folders"). Plain file reading, no model weights of the base model."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poolwire.models.sparse import SpladeConfig, read_splade

# 1_Pooling/config.json, older layout: one boolean flag per mode -> our method name.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens")
# Current layout (Sentence-Transformers 5+): `"pooling_mode": "mean"` -> our method name.
_POOLING_MODES = {"cls": "cls", "mean": "mean", "lasttoken": "last"}

# Activation classes a CrossEncoder saves (their dotted path) -> kernels.activation kind.
_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax"}


@dataclass(frozen=True)
class DenseLayer:
    """One Sentence-Transformers `Dense` module: y = activation(x @ W.T + b)."""

    weight: torch.Tensor            # [out, in]
    bias: torch.Tensor | None       # [out]
    activation: str                 # dotted torch class path, e.g. torch.nn.modules.activation.Tanh

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def module(self) -> torch.nn.Module:
        linear = torch.nn.Linear(self.weight.shape[1], self.weight.shape[0], bias=self.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return torch.nn.Sequential(linear, _activation_module(self.activation))


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What a Sentence-Transformers folder says; defaults are those of a folder without one."""

    pooling_method: str | None = None   # None: no Pooling module (the architecture decides)
    normalize: bool = False
    max_seq_length: int | None = None
    dense: tuple[DenseLayer, ...] = ()
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    cross_encoder_activation: str | None = None  # "sigmoid" | "none" | "softmax", when saved
    splade: SpladeConfig | None = None  # a SparseEncoder folder's SpladePooling (models/sparse.py)
    # A ColBERT folder in PyLate's layout: Dense on the token rows, no Pooling module.
    late_interaction: bool = False


def read_sentence_transformers_config(folder: Path) -> SentenceTransformersConfig | None:
    """None when the folder is not a Sentence-Transformers model (no modules.json and no
    CrossEncoder settings in config.json)."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    activation = _cross_encoder_activation(folder)
    if not modules_file.is_file():
        return SentenceTransformersConfig(cross_encoder_activation=activation) if activation else None
    method, normalize, dense = None, False, []
    modules = json.loads(modules_file.read_text())
    splade = read_splade(folder, modules)
    # PyLate's ColBERT layout: Dense modules project every token row and there is no Pooling
    # module; PyLate normalises those rows, so that is the default here too.
    late = not any(m.get("type", "").endswith(".Pooling") for m in modules) and \
        any(m.get("type", "").endswith(".Dense") for m in modules)
    for module in modules:
        kind = module.get("type", "")
        path = folder / module.get("path", "")
        if kind.endswith(".Pooling"):
            method = _pooling_method(path)
        elif kind.endswith(".Dense"):
            if method is None and not late:
                raise ValueError(f"{modules_file}: a Dense module before the Pooling module (a "
                                 f"projection of token embeddings) is not supported by poolwire")
            dense.append(_read_dense(path, token_rows=late))
        elif kind.endswith(".Normalize"):
            normalize = True
    normalize = normalize or late
    max_len = None
    st_file = folder / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = json.loads(st_file.read_text()).get("max_seq_length")
    prompts, default_prompt = {}, None
    cfg_file = folder / "config_sentence_transformers.json"
    if cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text())
        prompts = dict(cfg.get("prompts") or {})
        default_prompt = cfg.get("default_prompt_name")
        if default_prompt is not None and default_prompt not in prompts:
            raise ValueError(f"{cfg_file}: default_prompt_name {default_prompt!r} is not one of "
                             f"its prompts {sorted(prompts)}")
    return SentenceTransformersConfig(method, normalize, max_len, tuple(dense), prompts,
                                      default_prompt, activation, splade, late)


def _pooling_method(pooling_dir: Path) -> str:
    cfg_file = pooling_dir / "config.json"
    if not cfg_file.is_file():
        return "mean"  # Sentence-Transformers' own default
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("include_prompt") is False:
        raise ValueError(f"{cfg_file}: include_prompt false (pooling that leaves out the prompt's "
                         f"tokens) is not supported by poolwire")
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        if mode not in _POOLING_MODES:
            raise ValueError(f"{cfg_file}: pooling_mode {mode!r} is not supported; poolwire pools "
                             f"with one of {', '.join(_POOLING_MODES)}")
        return _POOLING_MODES[mode]
    chosen = [name for key, name in _POOLING_FLAGS.items() if cfg.get(key)]
    unsupported = [k for k in _UNSUPPORTED_FLAGS if cfg.get(k)]
    if unsupported or len(chosen) != 1:
        raise ValueError(f"{cfg_file}: poolwire supports exactly one of cls/mean/last pooling, "
                         f"got {chosen + unsupported or 'none'}")
    return chosen[0]


def _read_dense(dense_dir: Path, token_rows: bool = False) -> DenseLayer:
    cfg_file = dense_dir / "config.json"
    cfg = json.loads(cfg_file.read_text())
    # PyLate's Dense projects token rows whatever input name its config inherited.
    if not token_rows and cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"{cfg_file}: a Dense module on {cfg['module_input_name']!r} is not "
                         f"supported; poolwire applies Dense modules to the pooled embedding")
    if cfg.get("use_residual"):
        raise ValueError(f"{cfg_file}: a residual Dense module (use_residual) is not supported "
                         f"by poolwire")
    weights_file = dense_dir / "model.safetensors"
    if weights_file.is_file():
        from safetensors.torch import load_file

        state = load_file(weights_file)
    else:
        state = torch.load(dense_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    # Absent: Sentence-Transformers' default (Tanh); null: no activation.
    activation = cfg.get("activation_function", "torch.nn.modules.activation.Tanh") \
        or "torch.nn.modules.linear.Identity"
    _activation_module(activation)  # fail at load, naming the activation, not at the first request
    return DenseLayer(state["linear.weight"].float(),
                      state["linear.bias"].float() if cfg.get("bias", True) else None, activation)


def _activation_module(dotted: str) -> torch.nn.Module:
    """Sentence-Transformers saves a Dense activation as a dotted class path; only torch.nn
    classes are accepted (importing any path a folder names would run arbitrary code)."""
    module, _, name = dotted.rpartition(".")
    cls = getattr(torch.nn, name, None)
    if not module.startswith("torch.nn") or cls is None or not isinstance(cls, type):
        raise ValueError(f"activation {dotted!r} is not a torch.nn activation; poolwire loads "
                         f"Dense activations from torch.nn only")
    return cls()


def _cross_encoder_activation(folder: Path) -> str | None:
    """The activation a CrossEncoder saved: config_sentence_transformers.json `activation_fn`
    (Sentence-Transformers 5+), or config.json's `sentence_transformers.activation_fn`
    (3.x/4.x), or the older `sbert_ce_default_activation_function`."""
    dotted = None
    st_cfg = folder / "config_sentence_transformers.json"
    if st_cfg.is_file():
        dotted = json.loads(st_cfg.read_text()).get("activation_fn")
    hf_cfg = folder / "config.json"
    if dotted is None and hf_cfg.is_file():
        cfg = json.loads(hf_cfg.read_text())
        dotted = (cfg.get("sentence_transformers") or {}).get("activation_fn") \
            or cfg.get("sbert_ce_default_activation_function")
    if dotted is None:
        return None
    name = dotted.rpartition(".")[2]
    if name not in _ACTIVATIONS:
        raise ValueError(f"{folder}: the CrossEncoder activation {dotted!r} is not supported; "
                         f"poolwire applies one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]
