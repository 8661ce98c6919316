"""How a request on a multimodal model (CLIP, SigLIP) becomes sequences and items: every
element, text or image, is one sequence of its own modality (a text tokenized alone, an image
preprocessed alone), so a vector never depends on its batch; embed items are those vectors,
score items the cosine of two (PROTOCOL 1.3). Values in, values out."""

from poolwire.models.images import ImageInput
from poolwire.models.model_fields import prompt_for
from poolwire.models.task_heads import (Forward, PoolSpec, Rerank, ScoreMethod, TaskPlan,
                                        broadcast_pairs)
from poolwire.models.tokenizing import Tokenizing, TokenSeq, normalise_input
from poolwire.schemas.errors import PoolingError, invalid
from poolwire.schemas.media import is_image, text_of
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task


class _Elements:
    """The distinct elements of a request as sequences: a text by its prompted text, an image
    by its place in the request (the same place is computed once)."""

    def __init__(self, request: PoolingRequest, tokenizing: Tokenizing, prompt: str,
                 images: dict) -> None:
        self._request = request
        self._tokenizing = tokenizing
        self._prompt = prompt
        self._images = images
        self.sequences: list[TokenSeq | ImageInput] = []
        self.forwards: list[str] = []
        self._seen: dict = {}

    def add(self, field: str, index: int | None, value, once: bool = True) -> int:
        """The sequence of one element; `once`: an element seen before keeps its sequence
        (score computes each distinct element once; embed computes each item)."""
        if not once:
            self._seen.clear()
        if is_image(value):
            key = ("image", field, index)
            if key not in self._seen:
                self._seen[key] = self._append(self._images[(field, index)],
                                               Forward.IMAGE_FEATURES)
            return self._seen[key]
        text = self._prompt + text_of(value)
        key = ("text", text)
        if key not in self._seen:
            self._seen[key] = self._append(self._tokenize(text, field, index),
                                           Forward.TEXT_FEATURES)
        return self._seen[key]

    def _append(self, seq, forward: str) -> int:
        self.sequences.append(seq)
        self.forwards.append(forward)
        return len(self.sequences) - 1

    def _tokenize(self, text: str, field: str, index: int | None) -> TokenSeq:
        request = self._request
        try:
            return self._tokenizing.texts([text], request.truncate_prompt_tokens,
                                          request.truncation_side)[0]
        except PoolingError as err:  # its index is the element's place, not 0
            extra = {**err.extra, "field": field}
            extra.pop("index", None)
            at = f"{field}[{index}]" if index is not None else field
            raise PoolingError(err.code, f"{at}: {err.message.replace('input 0 ', 'it ')}",
                               **({"index": index} if index is not None else {}), **extra) \
                from None

    def tokens(self, i: int) -> int:
        """A sequence's text tokens for usage (an image counts in usage.images instead)."""
        return 0 if self.forwards[i] == Forward.IMAGE_FEATURES else len(self.sequences[i])

    @property
    def images(self) -> int:
        return self.forwards.count(Forward.IMAGE_FEATURES)


def _normalize(model, request: PoolingRequest) -> bool:
    for value in (request.normalize, request.use_activation):
        if value is not None:
            return value
    return model.normalize_default


def _side(value, field: str) -> list[tuple[str, int | None, object]]:
    if isinstance(value, list):
        return [(field, i, v) for i, v in enumerate(value)]
    return [(field, None, value)]


def plan_multimodal(task: Task, request: PoolingRequest, model, tokenizing: Tokenizing,
                    images: dict) -> TaskPlan:
    """`images`: every image element's ImageInput by (field, index), prepared beforehand."""
    prompt = prompt_for(task, request, model.prompts, model.default_prompt_name)
    elements = _Elements(request, tokenizing, prompt, images)
    if task is Task.EMBED:
        spec = PoolSpec(Forward.TEXT_FEATURES, method="cls",
                        normalize=_normalize(model, request), dimensions=request.dimensions)
        texts, ids = normalise_input(request.input) if _plain(request.input) else (None, None)
        if ids is not None:  # token ids, used as given: texts without their characters
            seqs = tokenizing.token_ids(ids, request.truncate_prompt_tokens,
                                        request.truncation_side)
            return TaskPlan(seqs, spec, forwards=[Forward.TEXT_FEATURES] * len(seqs))
        for field, index, value in _side(request.input, "input"):
            elements.add(field, index, value, once=False)  # sequence i is item i
        return TaskPlan(elements.sequences, spec, forwards=elements.forwards,
                        images=elements.images,
                        item_tokens=[elements.tokens(i) for i in range(len(elements.sequences))])
    if task is not Task.SCORE:
        raise invalid(f"task {task} is not served by a multimodal model", field=None)
    spec = PoolSpec(Forward.TEXT_FEATURES, method="cls", normalize=True)
    if request.query is not None:
        query = elements.add("query", None, request.query)
        docs = [elements.add(*e) for e in _side(request.documents, "documents")]
        kept = tuple(text_of(d) for d in request.documents) if request.return_documents else None
        pairs = [(query, d) for d in docs]
        return TaskPlan(elements.sequences, spec, pairs=pairs, pair_score=ScoreMethod.COSINE,
                        rerank=Rerank(request.top_n, kept), forwards=elements.forwards,
                        item_tokens=[elements.tokens(a) + elements.tokens(b) for a, b in pairs],
                        images=elements.images)
    first, second = broadcast_pairs(_side(request.text_1, "text_1"),
                                    _side(request.text_2, "text_2"), "elements")
    pairs = [(elements.add(*a), elements.add(*b)) for a, b in zip(first, second)]
    return TaskPlan(elements.sequences, spec, pairs=pairs, pair_score=ScoreMethod.COSINE,
                    forwards=elements.forwards, images=elements.images,
                    item_tokens=[elements.tokens(a) + elements.tokens(b) for a, b in pairs])


def _plain(value) -> bool:
    """Texts or token ids only (the 1.2 forms), which normalise_input reads."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(v, (str, int, list)) for v in value)

