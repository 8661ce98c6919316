"""Checks of a request's fields against the served model and against each other (PROTOCOL.md
"Request"): prompts the folder defines, Matryoshka sizes, `use_activation` versus
`normalize`, and fields that need text input. Values in, PoolingError out; the
ValidatorActor calls it, so these are all `invalid_request` before any tokenizing."""

from dataclasses import dataclass, field

from poolwire.schemas.errors import ErrorCode, PoolingError, invalid
from poolwire.schemas.media import ELEMENT_FIELDS, TextElement, elements_of, has_elements, is_image
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.sanity import preview
from poolwire.schemas.tasks import Task


@dataclass(frozen=True)
class ModelFacts:
    """What request checking needs to know of the model."""

    name: str
    embedding_size: int
    prompts: dict[str, str] = field(default_factory=dict)
    matryoshka_dimensions: tuple[int, ...] | None = None
    cross_encoder_score: bool = False  # score is a one-label classifier, not cosine
    sparse: bool = False               # a sparse model (embed items are sparse vectors)
    token_logits: bool = False         # a reranker scoring with token logits (PROTOCOL 1.3)
    takes_instruction: bool = False    # its prompt template has an instruction
    outputs: tuple[str, ...] = ("dense",)  # the embeddings an embed item can carry
    adapters: tuple[str, ...] = ()     # the deployment's LoRA adapters, by name
    images: bool = False               # a multimodal model: image elements are inputs (1.3)

    @classmethod
    def of(cls, model) -> "ModelFacts":
        from poolwire.models.task_heads import score_uses_cross_encoder

        sparse = getattr(model, "sparse", None) is not None
        template = getattr(model, "prompt_template", None)
        return cls(model.name, model.embedding_size, dict(model.prompts),
                   model.matryoshka_dimensions, score_uses_cross_encoder(model), sparse,
                   template is not None, template is not None and template.takes_instruction,
                   tuple(getattr(model, "outputs", ("sparse",) if sparse else ("dense",))),
                   tuple(getattr(model, "adapter_names", ())),
                   getattr(model, "towers", None) is not None)


def _has_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], (int, list))


def check_model_fields(task: Task, request: PoolingRequest, facts: ModelFacts) -> None:
    _check_images(request, facts)
    _check_outputs(request, facts)
    _check_adapter(request, facts)
    _check_sparse(request, facts)
    _check_dimensions(request, facts)
    if (request.normalize is not None and request.use_activation is not None
            and task in (Task.EMBED, Task.TOKEN_EMBED)
            and request.normalize != request.use_activation):
        raise invalid(f"normalize {request.normalize} and use_activation "
                      f"{request.use_activation} disagree: on {task} use_activation means "
                      f"normalize; send one of them", field="use_activation")
    _check_prompt(task, request, facts)
    _check_instruction(request, facts)
    if request.aggregation not in (None, "none") and _has_token_ids(request.input):
        raise invalid(f"aggregation {request.aggregation!r} groups entities by their text, and "
                      f"this input is token ids: send the texts, or aggregation \"none\"",
                      field="aggregation")


def _check_outputs(request: PoolingRequest, facts: ModelFacts) -> None:
    """PROTOCOL.md 1.3: `outputs` only on a model with several, each one the model has."""
    if request.outputs is None:
        return
    listed = ", ".join(facts.outputs)
    if len(facts.outputs) == 1:
        raise PoolingError(ErrorCode.INVALID_REQUEST,
                           f"outputs applies to a model with several embeddings (BGE-M3); "
                           f"{facts.name} has one output, {listed}: leave outputs out",
                           field="outputs", outputs=list(facts.outputs))
    missing = [o for o in request.outputs if o not in facts.outputs]
    if missing:
        raise PoolingError(ErrorCode.INVALID_REQUEST,
                           f"outputs {missing} are not outputs of {facts.name}; its outputs: "
                           f"{listed}", field="outputs", outputs=list(facts.outputs))


def _check_adapter(request: PoolingRequest, facts: ModelFacts) -> None:
    if request.adapter is None or request.adapter in facts.adapters:
        return
    listed = ", ".join(facts.adapters) or "none (start the worker with --adapter NAME=DIR)"
    raise PoolingError(ErrorCode.INVALID_REQUEST,
                       f"adapter {preview(request.adapter)} is not an adapter of this "
                       f"deployment; its adapters: {listed}", field="adapter",
                       adapters=list(facts.adapters))


def _check_sparse(request: PoolingRequest, facts: ModelFacts) -> None:
    """PROTOCOL.md 1.2: max_active_dims only on a sparse model; dimensions never on one."""
    if request.max_active_dims is not None and not facts.sparse:
        raise invalid(f"max_active_dims keeps the largest weights of a sparse vector, and "
                      f"{facts.name} is a dense model: leave it out, or use dimensions "
                      f"(Matryoshka) to shorten dense vectors", field="max_active_dims")
    if request.dimensions is not None and facts.sparse:
        raise invalid(f"dimensions (Matryoshka) does not apply to the sparse vectors of "
                      f"{facts.name}: use max_active_dims to keep the k largest weights",
                      field="dimensions")


def _check_dimensions(request: PoolingRequest, facts: ModelFacts) -> None:
    d = request.dimensions
    if d is None:
        return
    if d > facts.embedding_size:
        raise invalid(f"dimensions {d} is larger than the embedding size "
                      f"{facts.embedding_size} of {facts.name}", field="dimensions")
    allowed = facts.matryoshka_dimensions
    if allowed and d not in allowed:
        raise invalid(f"dimensions {d} is not one of the Matryoshka sizes {facts.name} declares: "
                      f"{', '.join(map(str, allowed))}", field="dimensions")


def _check_instruction(request: PoolingRequest, facts: ModelFacts) -> None:
    """PROTOCOL.md 1.3: `instruction` only on a token-logit reranker whose template has one."""
    if request.instruction is None:
        return
    if not facts.token_logits:
        raise invalid(f"instruction is the task description of a reranker that scores with "
                      f"token logits (Qwen3-Reranker, mxbai-rerank v2); {facts.name} is not "
                      f"one: leave it out", field="instruction")
    if not facts.takes_instruction:
        raise invalid(f"instruction: the prompt template of {facts.name} has no instruction; "
                      f"leave it out", field="instruction")


def _check_prompt(task: Task, request: PoolingRequest, facts: ModelFacts) -> None:
    if request.prompt is None and request.prompt_name is None:
        return
    field_name = "prompt_name" if request.prompt_name is not None else "prompt"
    if request.prompt is not None and request.prompt_name is not None:
        raise invalid("prompt and prompt_name were both given: send the literal prompt or the "
                      "name of one the model defines, not both", field="prompt")
    if task is Task.SCORE and facts.cross_encoder_score:
        raise invalid(f"{field_name} applies to a bi-encoder's score; {facts.name} scores pairs "
                      f"as a cross-encoder, which takes no prompt", field=field_name)
    if _has_token_ids(request.input):
        raise invalid(f"{field_name} is a text prefix and this input is token ids: send texts, "
                      f"or put the prompt's tokens in the ids yourself", field=field_name)
    if request.prompt_name is not None and request.prompt_name not in facts.prompts:
        defined = ", ".join(sorted(facts.prompts)) or "none"
        raise invalid(f"prompt_name {preview(request.prompt_name)} is not a prompt of "
                      f"{facts.name}; it defines: {defined}", field="prompt_name")


def prompt_for(task: Task, request: PoolingRequest, prompts: dict[str, str],
               default_prompt_name: str | None) -> str:
    """The prefix a request's texts get: its `prompt`, the folder's prompt `prompt_name`
    names, else the folder's default prompt (embed, token_embed and a bi-encoder's score)."""
    if request.prompt is not None:
        return request.prompt
    if request.prompt_name is not None:
        return prompts[request.prompt_name]
    if task in (Task.EMBED, Task.TOKEN_EMBED, Task.SCORE) and default_prompt_name is not None:
        return prompts[default_prompt_name]
    return ""


def _check_images(request: PoolingRequest, facts: ModelFacts) -> None:
    """PROTOCOL 1.3: an image on a text-only model is invalid_request naming its element."""
    if facts.images or not has_elements(request):  # plain strings, the common case
        return
    for field, index, value in elements_of(request):
        if is_image(value):
            at = f"{field}[{index}]" if index is not None else field
            err = invalid(f"{at} is an image, and {facts.name} embeds texts only: send texts, "
                          f"or images to a deployment of a multimodal model (CLIP, SigLIP)",
                          field=field)
            if index is not None:
                err.extra["index"] = index
            raise err


def texts_as_strings(request: PoolingRequest) -> PoolingRequest:
    """The request with its `{"text": ...}` elements as plain strings: what a text-only model's
    path (tokenizing, the result cache) reads. Called once images were refused."""
    if not has_elements(request):
        return request

    def plain(value):
        if isinstance(value, TextElement):
            return value.text
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return request.model_copy(update={name: plain(getattr(request, name))
                                      for name in ELEMENT_FIELDS
                                      if getattr(request, name) is not None})
