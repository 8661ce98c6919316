"""How each task becomes token sequences for the forward pass, and how the pooled outputs of
those sequences become the reply's items. Values in, values out: the EngineActor does the I/O
and the forward thread (`forward.py`) does the tensor work."""

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from poolwire.models import m3
from poolwire.models.chunking import Chunks, chunk_sequences
from poolwire.models.model import LoadedModel, ModelKind
from poolwire.models.model_fields import prompt_for
from poolwire.models.ranking import maxsim, rank
from poolwire.models.tokenizing import Tokenizing, TokenSeq, normalise_input
from poolwire.schemas.errors import PoolingError, invalid
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task


class Forward:
    """Which forward pass a sequence needs; one micro-batch runs one of these."""

    HIDDEN = "hidden"              # base encoder's last hidden states
    SEQ_LOGITS = "seq_logits"      # the classifier head on the whole sequence
    TOKEN_LOGITS = "token_logits"  # a classifier on every token
    MLM_LOGITS = "mlm_logits"      # a sparse model's masked-LM logits, SPLADE-pooled
    TEXT_FEATURES = "text_features"    # a multimodal model's text tower (get_text_features)
    IMAGE_FEATURES = "image_features"  # its image tower (get_image_features)


class ScoreMethod:
    """How a deployment scores a pair (discovery's `score_method`, PROTOCOL.md 1.2)."""

    COSINE = "cosine"               # of the two embed vectors
    MAXSIM = "maxsim"               # late interaction over the two texts' token_embed rows
    DOT = "dot"                     # of the two sparse vectors
    CROSS_ENCODER = "cross-encoder"  # a one-label classifier on the pair
    HYBRID = "hybrid"               # BGE-M3: the weighted mean of its three outputs' scores
    TOKEN_LOGITS = "token-logits"    # a one-label classifier on the pair's prompt template


# Not frozen, for its __init__'s cost on the hot path (see actors/messages.py); never assigned.
@dataclass(unsafe_hash=True)
class PoolSpec:
    """What the forward thread does with one sequence's output. Sequences of one batch may
    differ here (per-request options); the thread groups them."""

    forward: str
    token_level: bool = False        # one row per real token instead of one vector
    method: str = "mean"             # seq pooling method (HIDDEN, not token_level)
    normalize: bool = False
    dimensions: int | None = None
    activation: str = "none"         # "softmax" | "sigmoid" | "none" (logits)
    max_active_dims: int | None = None  # MLM_LOGITS: keep the k largest weights
    # False: the pooled vector as it leaves the pooling, before Dense (a chunk of a longer
    # input, whose item is finished once its chunks are combined: chunking.py).
    project: bool = True
    # HIDDEN on a BGE-M3 model: each sequence's value is a map of these outputs (models/m3.py).
    outputs: tuple[str, ...] | None = None
    # The LoRA adapter the forward pass runs with (None: the base model); a batch has one.
    adapter: str | None = None

    @property
    def group(self) -> str:
        """What every sequence of one micro-batch shares: the forward pass and the adapter."""
        return self.forward if self.adapter is None else f"{self.forward}@{self.adapter}"


@dataclass(frozen=True)
class Rerank:
    """The rerank form of score: items ranked by score, cut to `top_n`, each with its text when
    `documents` is kept (return_documents)."""

    top_n: int | None = None
    documents: tuple[str | None, ...] | None = None  # None where a document is an image


# Not frozen, for its __init__'s cost on the hot path (see actors/messages.py); never assigned.
@dataclass(unsafe_hash=True)
class TaskPlan:
    """A request's sequences, what to compute on each, and how outputs map to items."""

    sequences: list[TokenSeq]
    spec: PoolSpec
    # Bi-encoder score: item j is the cosine of sequences pairs[j]; None maps sequence i -> item i.
    pairs: list[tuple[int, int]] | None = None
    # Tokens per item for `usage` (a pair counts both of its texts).
    item_tokens: list[int] | None = None
    # return_tokens: per item {"tokens": [...], "offsets": [[start, end] | None, ...]}.
    token_meta: list[dict] | None = None
    # aggregation: (item index, its rows) -> entity spans.
    entities: Callable[[int, np.ndarray], list[dict]] | None = None
    # How a pair's outputs become its score (pairs only): ScoreMethod.COSINE, MAXSIM or DOT.
    pair_score: str = ScoreMethod.COSINE
    rerank: Rerank | None = None
    # Chunked processing: item i combines the chunks chunks.groups[i]; None: one sequence each.
    chunks: Chunks | None = None
    # BGE-M3's hybrid score: the weights of dense, sparse and multi_vector.
    hybrid_weights: tuple[float, float, float] = m3.DEFAULT_HYBRID_WEIGHTS
    # A multimodal model (multimodal_plan.py): each sequence's forward pass (TEXT_FEATURES or
    # IMAGE_FEATURES), so a micro-batch holds one modality; None: spec.forward for all.
    forwards: list[str] | None = None
    images: int = 0  # image elements computed, for usage.images

    def spec_for(self, index: int) -> PoolSpec:
        """What sequence `index` needs: the plan's spec, in its own modality."""
        if self.forwards is None:
            return self.spec
        return replace(self.spec, forward=self.forwards[index])

    @property
    def has_extras(self) -> bool:
        """Whether any item carries something besides its data (`extras`)."""
        return (self.token_meta is not None or self.entities is not None
                or (self.rerank is not None and self.rerank.documents is not None))

    def extras(self, index: int, rows: np.ndarray) -> dict | None:
        """What an item carries besides its data: tokens, offsets, entities, document."""
        out: dict = {}
        if self.rerank is not None and self.rerank.documents is not None \
                and self.rerank.documents[index] is not None:  # text documents only (1.3)
            out["document"] = self.rerank.documents[index]
        if self.token_meta is not None:
            out.update(self.token_meta[index])
        if self.entities is not None:
            out["entities"] = self.entities(index, rows)
        return out or None

    @property
    def n_items(self) -> int:
        if self.chunks is not None:
            return len(self.chunks.groups)
        return len(self.pairs) if self.pairs is not None else len(self.sequences)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.item_tokens) if self.item_tokens is not None else sum(map(len, self.sequences))


def _activation(model: LoadedModel, use_activation: bool | None) -> str:
    return model.activation_kind if use_activation in (None, True) else "none"


def _normalize(model: LoadedModel, request: PoolingRequest) -> bool:
    """`normalize`, else vLLM's `use_activation` (the validator refused a disagreement), else
    the folder's default."""
    for value in (request.normalize, request.use_activation):
        if value is not None:
            return value
    return model.normalize_default


def _token_meta(tokenizing: Tokenizing, seqs: list[TokenSeq], prefix: int) -> list[dict]:
    """Token strings and [start, end] spans in the input text: offsets of the prompted text
    shifted back by the prompt's length; tokens of the prompt itself, special tokens and
    token-id input (no text) get None."""
    meta = []
    for seq in seqs:
        spans = seq.offsets if seq.offsets is not None else [None] * len(seq)
        meta.append({"tokens": tokenizing.convert_ids_to_tokens(seq.ids),
                     "offsets": [None if s is None or s[0] < prefix else [s[0] - prefix, s[1] - prefix]
                                 for s in spans]})
    return meta


def broadcast_pairs(a: list, b: list, what: str = "texts") -> tuple[list, list]:
    """The two sides of score's pair form, 1 x N, N x 1 or N x N (zipped), as two lists of
    equal length; anything else is an error naming both sizes (`what` the sides hold)."""
    if len(a) == 1 and len(b) > 1:
        a = a * len(b)
    elif len(b) == 1 and len(a) > 1:
        b = b * len(a)
    elif len(a) != len(b):
        raise invalid(f"text_1 has {len(a)} {what} and text_2 has {len(b)}: send 1 x N, N x 1 "
                      f"or N x N {what}", field="text_2")
    return a, b


def _score_pairs(first, second) -> tuple[list[str], list[str]]:
    return broadcast_pairs([first] if isinstance(first, str) else list(first),
                           [second] if isinstance(second, str) else list(second))


def score_uses_cross_encoder(model: LoadedModel) -> bool:
    return model.kind == ModelKind.SEQUENCE_CLASSIFICATION and model.num_labels == 1


def default_score_method(model: LoadedModel) -> str:
    """The score of a deployment configured for embed (or classify): what the model's kind
    gives; a token_embed deployment passes ScoreMethod.MAXSIM instead (actors/task_policy.py)."""
    if model.prompt_template is not None:
        return ScoreMethod.TOKEN_LOGITS
    if score_uses_cross_encoder(model):
        return ScoreMethod.CROSS_ENCODER
    return ScoreMethod.DOT if model.sparse is not None else ScoreMethod.COSINE


def _bi_encoder_spec(method: str, model: LoadedModel) -> PoolSpec:
    if model.m3 is not None:
        # The outputs the score method compares, as an embed item with `outputs` has them.
        return PoolSpec(Forward.HIDDEN, method=model.pooling_method, normalize=True,
                        outputs=m3.outputs_for_score(method))
    if method == ScoreMethod.MAXSIM:
        # The deployment's own token_embed rows as it returns them by default (Dense applied,
        # normalised unless the folder says otherwise); use_activation never changes a
        # bi-encoder's score, as it never changes the cosine.
        return PoolSpec(Forward.HIDDEN, token_level=True, normalize=model.normalize_default)
    if method == ScoreMethod.DOT:
        return PoolSpec(Forward.MLM_LOGITS)
    return PoolSpec(Forward.HIDDEN, method=model.pooling_method, normalize=True)


def _pair_sequences(request: PoolingRequest, model: LoadedModel, tokenizing: Tokenizing,
                    first: list[str], second: list[str]):
    """A cross-encoder's pairs: the tokenizer's text pair, or a token-logit reranker's prompt
    template (whose tokens count in usage as any pair's do)."""
    cut, side = request.truncate_prompt_tokens, request.truncation_side
    if model.prompt_template is not None:
        return model.prompt_template.pairs(first, second, request.instruction, cut, side,
                                           tokenizing.max_length)
    return tokenizing.pairs(first, second, cut, side)


def _plan_rerank(request: PoolingRequest, model: LoadedModel, tokenizing: Tokenizing,
                 method: str, prompt: str) -> TaskPlan:
    """One query against its documents: a cross-encoder reads every (query, document) pair;
    any other method encodes the query once (sequence 0) and each document once."""
    cut, side = request.truncate_prompt_tokens, request.truncation_side
    docs = list(request.documents)
    rerank = Rerank(request.top_n, tuple(docs) if request.return_documents else None)
    if method in (ScoreMethod.CROSS_ENCODER, ScoreMethod.TOKEN_LOGITS):
        seqs = _pair_sequences(request, model, tokenizing, [request.query] * len(docs), docs)
        return TaskPlan(seqs, PoolSpec(Forward.SEQ_LOGITS,
                                       activation=_activation(model, request.use_activation)),
                        rerank=rerank)
    # Apart, so that a document's input_too_long `index` is its place in `documents`.
    try:
        query = tokenizing.texts([prompt + request.query], cut, side)
    except PoolingError as err:
        raise PoolingError(err.code, f"query: {err.message}", field="query", **err.extra) from None
    seqs = query + tokenizing.texts([prompt + t for t in docs], cut, side)
    return TaskPlan(seqs, _bi_encoder_spec(method, model),
                    pairs=[(0, j) for j in range(1, len(seqs))], pair_score=method,
                    rerank=rerank)


def plan_task(task: Task, request: PoolingRequest, model: LoadedModel,
              tokenizing: Tokenizing, *, score_method: str | None = None,
              max_embed_len: int | None = None,
              hybrid_weights: tuple[float, float, float] | None = None,
              images: dict | None = None) -> TaskPlan:
    """Tokenize a validated request and say what to compute; raises input_too_long.
    `score_method`: how this deployment scores (None: the model's default_score_method);
    `max_embed_len`: chunked processing of embed inputs up to that many tokens;
    `hybrid_weights`: BGE-M3's hybrid score weights (dense, sparse, multi_vector); `images`: a
    multimodal request's preprocessed images by (field, index) (models/images.py)."""
    if model.towers is not None:
        from poolwire.models.multimodal_plan import plan_multimodal

        return plan_multimodal(task, request, model, tokenizing, images or {})
    plan = _plan_task(task, request, model, tokenizing, score_method, max_embed_len)
    if request.adapter is not None:
        plan = replace(plan, spec=replace(plan.spec, adapter=request.adapter))
    if hybrid_weights is not None and tuple(hybrid_weights) != plan.hybrid_weights:
        # Compared first: the worker passes its weights for every request, and a copy of the
        # plan per request was a visible part of the hot path (bench/service_cost.py).
        plan = replace(plan, hybrid_weights=tuple(hybrid_weights))
    return plan


def texts_for_ids(task: Task, request: PoolingRequest, model: LoadedModel) -> list[str]:
    """The texts `_plan_task` hands to Tokenizing.texts for their ids alone (embed, classify
    and the token tasks on texts, prompt included), so that the engine can have a micro-batch's
    texts encoded ahead in one call; [] for every other request (score, token ids, character
    offsets, images)."""
    if (model.towers is not None or task is Task.SCORE or request.return_tokens
            or request.aggregation not in (None, "none")):
        return []
    texts, _ = normalise_input(request.input)
    if texts is None:
        return []
    prompt = prompt_for(task, request, model.prompts, model.default_prompt_name)
    return [prompt + t for t in texts]


def _plan_task(task: Task, request: PoolingRequest, model: LoadedModel, tokenizing: Tokenizing,
               score_method: str | None, max_embed_len: int | None) -> TaskPlan:
    cut, side = request.truncate_prompt_tokens, request.truncation_side
    prompt = prompt_for(task, request, model.prompts, model.default_prompt_name)
    if task is Task.SCORE:
        method = score_method or default_score_method(model)
        if request.query is not None:
            return _plan_rerank(request, model, tokenizing, method, prompt)
        first, second = _score_pairs(request.text_1, request.text_2)
        if method in (ScoreMethod.CROSS_ENCODER, ScoreMethod.TOKEN_LOGITS):
            seqs = _pair_sequences(request, model, tokenizing, first, second)
            return TaskPlan(seqs, PoolSpec(Forward.SEQ_LOGITS,
                                           activation=_activation(model, request.use_activation)))
        # Bi-encoder: embed each distinct text once (the prompt on both sides), then the
        # cosine of each pair.
        texts = list(dict.fromkeys(first + second))
        position = {t: i for i, t in enumerate(texts)}
        seqs = tokenizing.texts([prompt + t for t in texts], cut, side)
        pairs = [(position[x], position[y]) for x, y in zip(first, second)]
        spec = _bi_encoder_spec(method, model)
        return TaskPlan(seqs, spec, pairs=pairs, pair_score=method,
                        item_tokens=[len(seqs[i]) + len(seqs[j]) for i, j in pairs])

    texts, ids = normalise_input(request.input)
    grouping = request.aggregation not in (None, "none")
    offsets = bool(request.return_tokens) or grouping
    # Chunks are pooled with the model's pooling (PROTOCOL 1.2); a sparse model's SPLADE
    # pooling is not, so its long inputs keep the usual length rules.
    # BGE-M3's outputs beside dense are per token, so they keep the usual length rules too.
    several = request.outputs is not None and tuple(request.outputs) != (m3.DENSE,)
    longest = (max_embed_len if task is Task.EMBED and model.sparse is None and not several
               else None)
    if texts is not None:
        seqs = tokenizing.texts([prompt + t for t in texts], cut, side, offsets=offsets,
                                longest=longest)
    else:
        seqs = tokenizing.token_ids(ids, cut, side, longest=longest)
    if task is Task.EMBED and model.sparse is not None:
        spec = PoolSpec(Forward.MLM_LOGITS, normalize=_normalize(model, request),
                        max_active_dims=request.max_active_dims)
    elif task is Task.EMBED and several:
        spec = PoolSpec(Forward.HIDDEN, method=model.pooling_method,
                        normalize=_normalize(model, request), dimensions=request.dimensions,
                        outputs=tuple(request.outputs))
    elif task is Task.EMBED:
        spec = PoolSpec(Forward.HIDDEN, method=model.pooling_method,
                        normalize=_normalize(model, request), dimensions=request.dimensions)
        if longest is not None and any(len(s) > model.max_length for s in seqs):
            return chunked_plan(seqs, spec, model.max_length)
    elif task is Task.TOKEN_EMBED:
        spec = PoolSpec(Forward.HIDDEN, token_level=True, normalize=_normalize(model, request),
                        dimensions=request.dimensions)
    elif task is Task.CLASSIFY:
        spec = PoolSpec(Forward.SEQ_LOGITS, activation=_activation(model, request.use_activation))
    else:  # TOKEN_CLASSIFY
        spec = PoolSpec(Forward.TOKEN_LOGITS, token_level=True,
                        activation=_activation(model, request.use_activation))
    meta = _token_meta(tokenizing, seqs, len(prompt)) if request.return_tokens else None
    if meta is not None and model.m3 is not None and task is Task.TOKEN_EMBED:
        # BGE-M3's multi-vector rows leave out the first token (CLS).
        meta = [{k: v[1:] for k, v in m.items()} for m in meta]
    entities = None
    if grouping and texts is not None:
        grouper, strategy = model.entity_grouper, request.aggregation
        entities = lambda i, rows: grouper.group(texts[i], seqs[i], rows, spec.activation, strategy)  # noqa: E731
    return TaskPlan(seqs, spec, token_meta=meta, entities=entities)


def chunked_plan(seqs: list[TokenSeq], spec: PoolSpec, max_length: int) -> TaskPlan:
    """Every input cut into chunks of the maximum length, pooled before Dense; the item's
    Dense, dimensions and normalisation wait until its chunks are combined (assembly.py)."""
    chunk_seqs, groups = chunk_sequences(seqs, max_length)
    raw = PoolSpec(Forward.HIDDEN, method=spec.method, project=False)
    return TaskPlan(chunk_seqs, raw, chunks=Chunks(groups, finish=spec))


def cosine_items(plan: TaskPlan, outputs: dict[int, np.ndarray]) -> list[np.ndarray]:
    """Bi-encoder scores of each pair: the dot product of L2-normalised embeddings (cosine) or
    of sparse vectors (dot), or MaxSim of token rows (late interaction)."""
    assert plan.pairs is not None
    if plan.pairs and isinstance(outputs[plan.pairs[0][0]], dict):  # BGE-M3's outputs
        return [np.asarray(m3.m3_score(plan.pair_score, outputs[i], outputs[j],
                                       plan.hybrid_weights), dtype=np.float32)
                for i, j in plan.pairs]
    if plan.pair_score == ScoreMethod.MAXSIM:
        return [np.asarray(maxsim(outputs[i], outputs[j])) for i, j in plan.pairs]
    if plan.pair_score == ScoreMethod.DOT:
        return [np.asarray(outputs[i].dot(outputs[j])) for i, j in plan.pairs]
    return [np.asarray(np.dot(outputs[i], outputs[j]), dtype=np.float32) for i, j in plan.pairs]
