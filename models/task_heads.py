"""How each task becomes token sequences for the forward pass, and how the pooled outputs of
those sequences become the reply's items. Values in, values out: the EngineActor does the I/O
and the forward thread (`forward.py`) does the tensor work."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from poolwire.models.chunking import Chunks, chunk_sequences
from poolwire.models.model import LoadedModel, ModelKind
from poolwire.models.model_fields import prompt_for
from poolwire.models.tokenizing import Tokenizing, TokenSeq, normalise_input
from poolwire.schemas.errors import invalid
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task


class Forward:
    """Which forward pass a sequence needs; one micro-batch runs one of these."""

    HIDDEN = "hidden"              # base encoder's last hidden states
    SEQ_LOGITS = "seq_logits"      # the classifier head on the whole sequence
    TOKEN_LOGITS = "token_logits"  # a classifier on every token


@dataclass(frozen=True)
class PoolSpec:
    """What the forward thread does with one sequence's output. Sequences of one batch may
    differ here (per-request options); the thread groups them."""

    forward: str
    token_level: bool = False        # one row per real token instead of one vector
    method: str = "mean"             # seq pooling method (HIDDEN, not token_level)
    normalize: bool = False
    dimensions: int | None = None
    activation: str = "none"         # "softmax" | "sigmoid" | "none" (logits)
    # False: the pooled vector as it leaves the pooling, before Dense (a chunk of a longer
    # input, whose item is finished once its chunks are combined: chunking.py).
    project: bool = True


@dataclass(frozen=True)
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
    # Chunked processing: item i combines the chunks chunks.groups[i]; None: one sequence each.
    chunks: Chunks | None = None

    def extras(self, index: int, rows: np.ndarray) -> dict | None:
        """What an item carries besides its data: tokens, offsets, entities."""
        out: dict = {}
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


def _score_pairs(first, second) -> tuple[list[str], list[str]]:
    """1 x N, N x 1 or N x N (zipped); anything else is an error naming both sizes."""
    a = [first] if isinstance(first, str) else list(first)
    b = [second] if isinstance(second, str) else list(second)
    if len(a) == 1 and len(b) > 1:
        a = a * len(b)
    elif len(b) == 1 and len(a) > 1:
        b = b * len(a)
    elif len(a) != len(b):
        raise invalid(f"text_1 has {len(a)} texts and text_2 has {len(b)}: send 1 x N, N x 1 or "
                      f"N x N texts", field="text_2")
    return a, b


def score_uses_cross_encoder(model: LoadedModel) -> bool:
    return model.kind == ModelKind.SEQUENCE_CLASSIFICATION and model.num_labels == 1


def plan_task(task: Task, request: PoolingRequest, model: LoadedModel,
              tokenizing: Tokenizing, max_embed_len: int | None = None) -> TaskPlan:
    """Tokenize a validated request and say what to compute; raises input_too_long.
    `max_embed_len`: chunked processing of embed inputs up to that many tokens."""
    cut, side = request.truncate_prompt_tokens, request.truncation_side
    prompt = prompt_for(task, request, model.prompts, model.default_prompt_name)
    if task is Task.SCORE:
        first, second = _score_pairs(request.text_1, request.text_2)
        if score_uses_cross_encoder(model):
            seqs = tokenizing.pairs(first, second, cut, side)
            return TaskPlan(seqs, PoolSpec(Forward.SEQ_LOGITS,
                                           activation=_activation(model, request.use_activation)))
        # Bi-encoder: embed each distinct text once (the prompt on both sides), then the
        # cosine of each pair.
        texts = list(dict.fromkeys(first + second))
        position = {t: i for i, t in enumerate(texts)}
        seqs = tokenizing.texts([prompt + t for t in texts], cut, side)
        pairs = [(position[x], position[y]) for x, y in zip(first, second)]
        spec = PoolSpec(Forward.HIDDEN, method=model.pooling_method, normalize=True)
        return TaskPlan(seqs, spec, pairs=pairs,
                        item_tokens=[len(seqs[i]) + len(seqs[j]) for i, j in pairs])

    texts, ids = normalise_input(request.input)
    grouping = request.aggregation not in (None, "none")
    offsets = bool(request.return_tokens) or grouping
    longest = max_embed_len if task is Task.EMBED else None
    if texts is not None:
        seqs = tokenizing.texts([prompt + t for t in texts], cut, side, offsets=offsets,
                                longest=longest)
    else:
        seqs = tokenizing.token_ids(ids, cut, side, longest=longest)
    if task is Task.EMBED:
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
    """Bi-encoder scores from L2-normalised embeddings: the dot product of each pair."""
    assert plan.pairs is not None
    return [np.asarray(np.dot(outputs[i], outputs[j]), dtype=np.float32) for i, j in plan.pairs]
