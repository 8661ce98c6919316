"""The task policy of vLLM PR #37956 (PROTOCOL.md "Task policy"), as pure functions:
which tasks a model supports, which one a deployment is configured for, and what happens to a
request on each task. The ValidatorActor applies it; nothing else decides tasks."""

from dataclasses import dataclass

from poolwire.schemas.tasks import Task, in_protocol_order

# Supported tasks by model kind, as a table to read at a glance.
#   base encoder / Sentence-Transformers : embed, token_embed, score (cosine of embeddings)
#   *ForSequenceClassification           : classify, token_classify, + score if one label
#   *ForTokenClassification              : token_classify
#   SparseEncoder (masked LM + SPLADE)   : embed (sparse items), score (dot product)
#   CLIP / SigLIP (texts and images)     : embed, score (cosine); images have no token rows
_BY_KIND = {
    "multimodal": (Task.EMBED, Task.SCORE),
    "encoder": (Task.EMBED, Task.TOKEN_EMBED, Task.SCORE),
    "sparse": (Task.EMBED, Task.SCORE),
    "sequence_classification": (Task.CLASSIFY, Task.TOKEN_CLASSIFY),
    "token_classification": (Task.TOKEN_CLASSIFY,),
}

# With no --task: the first of these that the model supports (after the token-classifier rule).
_DEFAULT_PRIORITY = (Task.EMBED, Task.CLASSIFY, Task.TOKEN_EMBED, Task.TOKEN_CLASSIFY)


def supported_tasks(kind: str, num_labels: int = 0, per_token_head: bool = True) -> list[Task]:
    """`per_token_head`: a sequence classifier whose head can run on every token (else it
    cannot do token_classify)."""
    tasks = list(_BY_KIND[kind])
    if kind == "sequence_classification" and num_labels == 1:
        tasks.append(Task.SCORE)  # a one-label classifier is a cross-encoder
    if kind == "sequence_classification" and not per_token_head:
        tasks.remove(Task.TOKEN_CLASSIFY)
    return in_protocol_order(tasks)


class TaskConfigError(ValueError):
    """Start-up fails: the asked task is not one the model can do."""


def configured_task(architecture: str, supported: list[Task], asked: str | None) -> Task:
    """`--task` if given and supported; else `*ForTokenClassification` gives token_classify;
    else the first of embed, classify, token_embed, token_classify that the model supports."""
    names = ", ".join(t.value for t in supported)
    if asked is not None:
        try:
            task = Task(asked)
        except ValueError:
            raise TaskConfigError(f"--task {asked!r} is not a pooling task; this model "
                                  f"({architecture}) supports: {names}") from None
        if task is Task.SCORE:
            configurable = ", ".join(t.value for t in supported if t is not Task.SCORE)
            raise TaskConfigError(f"--task score is not a task a deployment is configured for "
                                  f"(vLLM PR #37537): score requests are computed with embed "
                                  f"(bi-encoder) or classify (one-label cross-encoder) and served "
                                  f"by a worker configured for that task; this model "
                                  f"({architecture}) can be configured for: {configurable}")
        if task not in supported:
            raise TaskConfigError(f"--task {asked} is not supported by this model "
                                  f"({architecture}); it supports: {names}")
        return task
    if architecture.endswith("ForTokenClassification"):
        return Task.TOKEN_CLASSIFY
    for task in _DEFAULT_PRIORITY:
        if task in supported:
            return task
    raise TaskConfigError(f"model {architecture} supports no configurable pooling task")


class Verdict:
    SERVE = "serve"              # the configured task (or score computed with it)
    DEPRECATED = "deprecated"    # supported, not configured, policy warn: serve with a warning
    NOT_CONFIGURED = "not_configured"  # supported, not configured, policy reject
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class TaskPolicy:
    configured: Task
    supported: tuple[Task, ...]
    multitask: str = "warn"  # "warn" | "reject"
    score_with_configured: bool = False  # score is computed with the configured task
    # The task score is computed with (None where score is unsupported): a deprecated score
    # request's hint names it, since `--task score` is refused at start.
    score_computed_with: Task | None = None
    # How score is computed (discovery's `score_method`; None where score is unsupported).
    score_method: str | None = None

    def worker_task_for(self, requested: Task) -> Task:
        """The --task of a worker that would serve `requested` without a deprecation."""
        if requested is Task.SCORE and self.score_computed_with is not None:
            return self.score_computed_with
        return requested

    def judge(self, requested: Task | None) -> str:
        if requested is None or requested not in self.supported:
            return Verdict.UNSUPPORTED
        if requested is self.configured or (requested is Task.SCORE and self.score_with_configured):
            return Verdict.SERVE
        return Verdict.DEPRECATED if self.multitask == "warn" else Verdict.NOT_CONFIGURED


def score_task(kind: str) -> Task:
    """The task a score request is computed with: embed (cosine) on an encoder, embed (dot
    product) on a sparse model, classify on a one-label cross-encoder."""
    return Task.EMBED if kind in ("encoder", "sparse", "multimodal") else Task.CLASSIFY


def score_uses_configured_task(kind: str, num_labels: int, configured: Task) -> bool:
    """Score is cosine of embed vectors, MaxSim of token_embed rows (late interaction), the dot
    product of sparse embed vectors, or a one-label classify cross-encoder."""
    if kind == "encoder":
        return configured in (Task.EMBED, Task.TOKEN_EMBED)
    if kind in ("sparse", "multimodal"):
        return configured is Task.EMBED
    return kind == "sequence_classification" and num_labels == 1 and configured is Task.CLASSIFY


def score_method(kind: str, num_labels: int, configured: Task,
                 token_logits: bool = False) -> str | None:
    """PROTOCOL.md 1.2 `score_method`: `cross-encoder` for a one-label classifier (1.3:
    `token-logits` where it is a reranker scoring with its answer tokens' logits), `dot` for a
    sparse model, `maxsim` in an encoder's token_embed deployment (late interaction), else
    `cosine`; None where the model cannot score."""
    if kind == "sequence_classification":
        if num_labels != 1:
            return None
        return "token-logits" if token_logits else "cross-encoder"
    if kind == "sparse":
        return "dot"
    if kind == "encoder":
        return "maxsim" if configured is Task.TOKEN_EMBED else "cosine"
    if kind == "multimodal":
        return "cosine"
    return None


def embedding_kind(kind: str) -> str | None:
    """PROTOCOL.md 1.2 `embedding_kind` of embed items: `sparse` or `dense`; None without embed."""
    if kind == "sparse":
        return "sparse"
    return "dense" if Task.EMBED in _BY_KIND.get(kind, ()) else None
