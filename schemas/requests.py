"""The pooling request of PROTOCOL.md and its validation, in the protocol's error order:
unknown key, then a field not valid for the task, then types, then ranges."""

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from poolwire.schemas.errors import invalid
from poolwire.schemas.media import Element, empty_element
from poolwire.schemas.sanity import MAX_REQUEST_ID_CHARS, field_name, preview
from poolwire.schemas.tasks import Task

# Token ids are used as given; ids are non-negative. JSON ints are unbounded: every int field has
# a 32-bit bound, past any vocabulary, queue priority or deadline a client means.
INT32_MAX = 2**31 - 1
TokenId = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
# PROTOCOL 1.3: image and `{"text"}` elements (schemas/media.py) after the 1.2 forms, so a
# plain text input validates and fails exactly as before.
PoolingInput = Union[StrictStr, list[StrictStr], list[TokenId], list[list[TokenId]], Element,
                     list[Element]]
ElementOrElements = Union[StrictStr, list[StrictStr], Element, list[Element]]


class PoolingRequest(BaseModel):
    """One request, as sent on `P.<task>` (MessagePack or JSON map)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: PoolingInput | None = Field(
        None, description="texts, or token ids used as given (no special tokens added)")
    text_1: ElementOrElements | None = Field(None, description="score: first texts of the pairs")
    text_2: ElementOrElements | None = Field(None, description="score: second texts of the pairs")
    request_id: Annotated[StrictStr, Field(max_length=MAX_REQUEST_ID_CHARS)] | None = Field(
        None, description="echoed in every reply frame")
    dimensions: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = Field(
        None, description="Matryoshka: keep the first d dimensions, then normalise if asked")
    normalize: StrictBool | None = Field(None, description="L2-normalise the output vectors")
    use_activation: StrictBool | None = Field(
        None, description="vLLM's switch: on embed/token_embed it means normalize; on classify, "
                          "score and token_classify the model's activation (default true)")
    prompt_name: StrictStr | None = Field(
        None, description="a prompt the model folder defines (Sentence-Transformers `prompts`); "
                          "default: the folder's default_prompt_name")
    prompt: StrictStr | None = Field(
        None, description="a literal prefix put before every input text")
    return_tokens: StrictBool | None = Field(
        None, description="token-level tasks: each item also carries tokens and character offsets")
    aggregation: Literal["none", "simple", "first", "max"] | None = Field(
        None, description="token_classify: entity spans grouped as the transformers "
                          "token-classification pipeline groups them")
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=-INT32_MAX - 1, le=INT32_MAX)] | None = \
        Field(None, description="-1: truncate to the model maximum; k>0: keep at most k tokens")
    truncation_side: Literal["right", "left"] = Field("right", description="which end is cut")
    encoding_format: Literal["float", "binary"] = Field("float", description="item encoding")
    embed_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="element type in binary encoding")
    stream: StrictBool = Field(False, description="reply as item frames and one final frame")
    deadline_ms: Annotated[StrictInt, Field(gt=0, le=INT32_MAX)] | None = Field(
        None, description="drop work still queued this many ms after the worker received it")
    priority: Annotated[StrictInt, Field(ge=-INT32_MAX - 1, le=INT32_MAX)] = Field(
        0, description="lower runs first among queued work")
    query: Element | None = Field(
        None, description="score, rerank form: the one query ranked against `documents`")
    documents: Union[list[StrictStr], list[Element]] | None = Field(
        None, description="score, rerank form: the texts to rank; each pair is (query, document)")
    top_n: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = Field(
        None, description="score, rerank form: reply with the top_n best documents only")
    return_documents: StrictBool | None = Field(
        None, description="score, rerank form: each item also carries `document`, the text")
    max_active_dims: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = Field(
        None, description="embed on a sparse model: keep only the k largest weights of each item")
    # Any names here: one the model lacks is refused against the model, listing its outputs.
    outputs: Annotated[list[Annotated[StrictStr, Field(max_length=64)]],
                       Field(min_length=1, max_length=3)] | None = Field(
        None, description="embed on a model with several outputs (BGE-M3): which embeddings "
                          "each item carries; default [\"dense\"]")
    adapter: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = Field(
        None, description="the LoRA adapter this request is computed with, by the name the "
                          "deployment gives it (discovery `adapters`); default: the base model")
    instruction: StrictStr | None = Field(
        None, description="score on a reranker scoring with token logits: the task description "
                          "its template puts before the query; default: the template's own")
    cache: StrictBool = Field(
        True, description="false: neither read nor write the worker's result cache for this "
                          "request (no effect where no cache is configured)")


# PROTOCOL 1.2, the rerank form of score: one query ranked against documents.
RERANK_FIELDS = ("query", "documents", "top_n", "return_documents")

COMMON_FIELDS = frozenset({
    "request_id", "truncate_prompt_tokens", "truncation_side", "encoding_format",
    "embed_dtype", "stream", "deadline_ms", "priority", "cache", "adapter",
})

# Which keys each task accepts besides COMMON_FIELDS, and which of them it requires.
TASK_FIELDS: dict[Task, frozenset[str]] = {
    Task.EMBED: frozenset({"input", "dimensions", "normalize", "use_activation", "prompt_name",
                           "prompt", "max_active_dims", "outputs"}),
    Task.TOKEN_EMBED: frozenset({"input", "dimensions", "normalize", "use_activation",
                                 "prompt_name", "prompt", "return_tokens"}),
    Task.CLASSIFY: frozenset({"input", "use_activation"}),
    Task.TOKEN_CLASSIFY: frozenset({"input", "use_activation", "return_tokens", "aggregation"}),
    Task.SCORE: frozenset({"text_1", "text_2", "use_activation", "prompt_name", "prompt",
                           "instruction", *RERANK_FIELDS}),
}
REQUIRED_FIELDS: dict[Task, tuple[str, ...]] = {
    Task.EMBED: ("input",),
    Task.TOKEN_EMBED: ("input",),
    Task.CLASSIFY: ("input",),
    Task.TOKEN_CLASSIFY: ("input",),
    Task.SCORE: ("text_1", "text_2"),
}
ALL_FIELDS = frozenset(PoolingRequest.model_fields)
_ALLOWED: dict[Task, frozenset[str]] = {task: keys | COMMON_FIELDS
                                         for task, keys in TASK_FIELDS.items()}


def request_id_of(body: Any) -> str | None:
    """The client's request_id when the body carries a usable one (for error replies): a
    non-empty string short enough to echo in every frame."""
    if isinstance(body, dict):
        rid = body.get("request_id")
        if isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_CHARS:
            return rid
    return None


def parse_request(task: Task, body: dict[str, Any]) -> PoolingRequest:
    """Validate a decoded body for `task`; raises PoolingError(invalid_request) naming the field."""
    present = {k: v for k, v in body.items() if v is not None}  # null counts as absent
    allowed = _ALLOWED[task]
    if not allowed.issuperset(present):
        _refuse_key(task, present)
    if task is Task.SCORE:
        _check_score_form(present)
    else:
        for key in REQUIRED_FIELDS[task]:
            if key not in present:
                raise invalid(f"{key!r} is required for task {task}", field=key)
    try:
        request = PoolingRequest.model_validate(present)
    except ValidationError as exc:
        raise _first_error(exc) from None
    _check_not_empty(request)
    if request.outputs is not None and len(set(request.outputs)) != len(request.outputs):
        raise invalid(f"outputs {request.outputs} names an output twice: name each once",
                      field="outputs")
    return request


def _refuse_key(task: Task, present: dict[str, Any]) -> None:
    """The error for the first key a body for `task` may not carry: an unknown key before one
    that is valid only for another task."""
    for key in present:
        if not isinstance(key, str) or key not in ALL_FIELDS:
            raise invalid(f"unknown key {preview(key)}; valid keys for {task}: "
                          f"{sorted(_ALLOWED[task])}",
                          field=field_name(key) if isinstance(key, str) else preview(key))
    for key in present:
        if key not in _ALLOWED[task]:
            raise invalid(f"{key!r} is not valid for task {task}", field=key)


def _check_score_form(present: dict[str, Any]) -> None:
    """A score request is either the pair form (text_1 and text_2) or the rerank form (query
    and documents, with top_n and return_documents only there); any other mix is refused,
    naming the first field that does not belong."""
    if "query" in present or "documents" in present:
        for key in ("text_1", "text_2"):
            if key in present:
                raise invalid(f"{key!r} is the pair form of score and 'query'/'documents' the "
                              f"rerank form: send text_1 and text_2, or query and documents",
                              field=key)
        for key in ("query", "documents"):
            if key not in present:
                raise invalid(f"{key!r} is required for the rerank form of score (query and "
                              f"documents)", field=key)
        return
    for key in RERANK_FIELDS[2:]:
        if key in present:
            raise invalid(f"{key!r} belongs to the rerank form of score: send query and "
                          f"documents with it, or leave it out", field=key)
    for key in REQUIRED_FIELDS[Task.SCORE]:
        if key not in present:
            raise invalid(f"{key!r} is required for task score (or send the rerank form: query "
                          f"and documents)", field=key)


# pydantic's errors for a value of the right type outside what the field allows: its bounds,
# its length, or its set of values.
RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal",
                          "too_short", "too_long", "string_too_short", "string_too_long",
                          "literal_error", "enum", "multiple_of"})


def _first_error(exc: ValidationError):
    """PROTOCOL.md's order among the fields' errors: a wrong type before a value out of range,
    each in the fields' order. A field of several types (`input`: texts or token ids; pydantic
    names the type tried second in each error's place) is out of range where its value fails
    only the bounds of one of them (token id -5: the bound, not "a valid string")."""
    by_field: dict = {}
    for err in exc.errors():
        loc = err["loc"]
        branch = loc[1] if len(loc) > 1 and isinstance(loc[1], str) else None
        by_field.setdefault(loc[0] if loc else None, {}).setdefault(branch, []).append(err)
    wrong_type, out_of_range = None, None
    for branches in by_field.values():
        ranged = next((errors[0] for errors in branches.values()
                       if all(e["type"] in RANGE_ERRORS for e in errors)), None)
        if ranged is None:
            wrong_type = wrong_type or next(iter(branches.values()))[0]
        else:
            out_of_range = out_of_range or ranged
    err = wrong_type or out_of_range
    field = str(err["loc"][0]) if err["loc"] else None
    return invalid(f"{field}: {err['msg']} (got {preview(err.get('input'))})", field=field)


def _is_empty(value: Any) -> bool:
    if empty_element(value):
        return True
    if isinstance(value, str):
        return value == ""
    if isinstance(value, list):
        return len(value) == 0 or any(_is_empty(v) for v in value if not isinstance(v, int))
    return False


def _check_not_empty(request: PoolingRequest) -> None:
    for name in ("input", "text_1", "text_2", "query", "documents"):
        value = getattr(request, name)
        if value is not None and _is_empty(value):
            raise invalid(f"{name} is empty or holds an empty text/token list", field=name)
