"""The offline API: a pooling model in this process, no NATS. `PoolingModel` is a worker's
engine without the wire: the same request schemas and field checks, the same task policy
(actors/task_policy.py), the same plans (models/task_heads.py), the batch planner, the backend
and the pooling kernels, and the same assembly of items (models/assembly.py), so its numbers
are a worker's.

    from poolwire import PoolingModel, PoolerConfig
    model = PoolingModel("path/or/hub-id", pooler_config=PoolerConfig(task="embed"))
    vectors = model.embed(["a text", "another"])      # [2, D] float32, .usage, .warnings
"""

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from poolwire.offline_errors import (InvalidRequestError, PoolingDeprecationWarning,
                                     TaskNotConfiguredError, UnsupportedTaskError, error_from)
from poolwire.models.sparse_vector import SparseVector
from poolwire.pooler_config import PoolerConfig
from poolwire.schemas.tasks import TOKEN_LEVEL_TASKS, Task, parse_task

# Request fields about the wire, not the computation: offline they have nothing to do.
WIRE_ONLY_FIELDS = ("request_id", "stream", "encoding_format", "embed_dtype", "deadline_ms",
                    "priority", "cache")
def make_backend(model, backend: str, precision: str, dtype: str, cache_dir):
    """The forward backend a worker with `--backend backend` would serve with
    (models/backend_choice.py): OpenVINO on a CPU where it converts this model and agrees with
    torch, else torch; its converted model cached under `cache_dir`, as a worker's."""
    from poolwire.models.backend_choice import build_backend

    return build_backend(backend, model, precision, dtype, cache_dir)  # BackendError: a ValueError


def _sparse(vector: SparseVector) -> dict:
    return {"indices": vector.indices, "values": vector.values}


@dataclass
class PoolingResult:
    """What a call returns: `data` as numpy ([N, D] vectors, [N, labels] scores, [N] pair
    scores, or one [T_i, D] array per input for token tasks), with the reply's `usage` and
    `warnings`. Indexing, len() and np.asarray() go to `data`."""

    data: Any
    task: str
    model: str
    usage: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    # Per item, what a reply item carries besides its data (tokens, offsets, entities,
    # document), or None.
    extras: list[dict | None] | None = None
    # Per row of `data`, the input it belongs to: 0..N-1, except for rerank, whose rows are
    # ranked documents (`indices[k]` is the k-th best document's place in `documents`).
    indices: list[int] = field(default_factory=list)

    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self.data) if not isinstance(self.data, list) else np.stack(self.data)
        return out.astype(dtype) if dtype is not None else out

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]

    def __iter__(self):
        return iter(self.data)


class PoolingModel:
    """One pooling model served in this process, with one configured task (`pooler_config`),
    as vLLM's `LLM(..., pooler_config=PoolerConfig(task=...))`."""

    def __init__(self, model, *, pooler_config: PoolerConfig = PoolerConfig(), device: str = "auto",
                 backend: str = "auto", precision: str = "exact", dtype: str = "float32",
                 max_batch_tokens: int = 8192, max_batch_size: int = 64,
                 max_added_padding: int = 16, state_dir: str | Path = ".poolwire",
                 trust_remote_code: bool | None = None, reranker: str | None = None,
                 adapters: dict[str, str | Path] | None = None, score_method: str | None = None,
                 hybrid_weights=None, max_image_pixels: int = 89_478_485) -> None:
        """`adapters`: LoRA adapters {name: PEFT folder} beside the folder's own task adapters,
        picked per call with `adapter=name`; `score_method` and `hybrid_weights`: what score
        compares on a model with several outputs (BGE-M3), as the worker's options of those
        names; `max_image_pixels`: a worker's --max-image-pixels (CLIP, SigLIP)."""
        from poolwire.actors.task_policy import TaskConfigError
        from poolwire.actors.validator import ModelLimits
        from poolwire.actors.worker import task_policy_for
        from poolwire.models.model import load_model
        from poolwire.models.model_fields import ModelFacts
        from poolwire.models.tokenizing import Tokenizing

        if not isinstance(pooler_config, PoolerConfig):
            raise TypeError(f"pooler_config must be a poolwire.PoolerConfig, got "
                            f"{type(pooler_config).__name__}: PoolerConfig(task=...)")
        if precision not in ("exact", "fast"):
            raise ValueError(f"precision {precision!r} is not one of exact, fast")
        # vLLM's LLM(trust_remote_code=True), or PoolerConfig's field of the same name (as a
        # worker's --pooler-config); both given must agree.
        if trust_remote_code is not None and "trust_remote_code" in pooler_config.model_fields_set \
                and bool(trust_remote_code) != pooler_config.trust_remote_code:
            raise ValueError(f"trust_remote_code={trust_remote_code!r} and PoolerConfig("
                             f"trust_remote_code={pooler_config.trust_remote_code!r}) disagree: "
                             f"give one of them")
        if trust_remote_code is not None:
            pooler_config = pooler_config.model_copy(update={"trust_remote_code": bool(trust_remote_code)})
        self.pooler_config = pooler_config
        from types import SimpleNamespace

        from poolwire.models.m3 import parse_hybrid_weights

        self.hybrid_weights = parse_hybrid_weights(hybrid_weights or "0.4,0.2,0.4")
        self.model = load_model(model, None, device, dtype,
                                trust_remote_code=pooler_config.trust_remote_code,
                                reranker=reranker,
                                adapters={n: Path(p) for n, p in (adapters or {}).items()})
        # The worker's own start-up rule (priority rule, --task checks) on PoolerConfig's fields.
        try:
            self.policy = task_policy_for(self.model, SimpleNamespace(
                task=pooler_config.task, multitask=pooler_config.multitask,
                score_method=score_method))
        except TaskConfigError as exc:
            from poolwire.actors.task_policy import supported_tasks

            names = [t.value for t in supported_tasks(self.model.kind, self.model.num_labels,
                                                      self.model.per_token_classifier)]
            raise UnsupportedTaskError(f"PoolerConfig(task={pooler_config.task!r}): {exc}",
                                       supported_tasks=names) from None
        self.max_embed_len = pooler_config.embed_limit(self.model.max_length)
        self.backend = make_backend(self.model, backend, precision, dtype, Path(state_dir) / "openvino")
        self._limits = ModelLimits(self.model.name, self.model.max_length,
                                   self.model.embedding_size, ModelFacts.of(self.model))
        self._tokenizing = Tokenizing(self.model.tokenizer, self.model.max_length)
        self._batching = (max_batch_tokens, max_batch_size, max_added_padding)
        self.max_image_pixels = max_image_pixels  # a worker's --max-image-pixels

    @property
    def configured_task(self) -> str:
        return self.policy.configured.value

    @property
    def supported_tasks(self) -> list[str]:
        return [t.value for t in self.policy.supported]

    # ---- the tasks ----

    def embed(self, inputs, **fields) -> PoolingResult:
        return self._run("embed", {"input": inputs, **fields})

    def classify(self, inputs, **fields) -> PoolingResult:
        return self._run("classify", {"input": inputs, **fields})

    def score(self, text_1, text_2, **fields) -> PoolingResult:
        return self._run("score", {"text_1": text_1, "text_2": text_2, **fields})

    def rerank(self, query: str, documents, *, top_n: int | None = None,
               return_documents: bool = False, **fields) -> PoolingResult:
        """The rerank form of score (PROTOCOL 1.2): `data` the scores of the best `top_n`
        documents, highest first, `indices` their places in `documents`."""
        return self._run("score", {"query": query, "documents": documents, "top_n": top_n,
                                   "return_documents": return_documents or None, **fields})

    def encode(self, inputs, pooling_task: str | None = None, **fields) -> PoolingResult:
        """Any task on `inputs`, named as vLLM's LLM.encode names it: token_embed,
        token_classify, embed or classify."""
        if pooling_task is None:
            raise TypeError(f"encode() needs pooling_task=, one of {', '.join(self._encodable())} "
                            f"(as vLLM's LLM.encode); or call embed() / classify()")
        if pooling_task == "score":
            raise TypeError("encode() takes one list of inputs; score compares pairs: call "
                            "score(text_1, text_2)")
        return self._run(pooling_task, {"input": inputs, **fields})

    def _encodable(self) -> list[str]:
        return [t for t in self.supported_tasks if t != "score"]

    # ---- one request, as a worker's validator and engine handle it ----

    def _run(self, task_name: str, body: dict) -> PoolingResult:
        from poolwire.schemas.errors import PoolingError

        task, message = self._judge(task_name)
        try:
            return self._compute(task, body, [message] if message else [])
        except PoolingError as err:
            raise error_from(err.code.value, err.message, err.extra) from None

    def _judge(self, task_name: str) -> tuple[Task, str | None]:
        """The task policy: raises for unsupported or (policy reject) non-configured tasks;
        returns the deprecation text for a served non-configured one, having warned."""
        from poolwire.actors.task_policy import Verdict
        from poolwire.actors.validator import deprecation_message

        task = parse_task(task_name) if isinstance(task_name, str) else None
        verdict = self.policy.judge(task)
        supported = self.supported_tasks
        if verdict == Verdict.UNSUPPORTED:
            raise UnsupportedTaskError(
                f"task {task_name!r} is not supported by {self.model.name}; supported tasks: "
                f"{', '.join(supported)}", supported_tasks=supported)
        configured = self.configured_task
        hint = self.policy.worker_task_for(task).value  # score: the task it is computed with
        if verdict == Verdict.NOT_CONFIGURED:
            raise TaskNotConfiguredError(
                f"task {task_name!r} is supported by {self.model.name} but this model is "
                f"configured for {configured!r} only (multi-task serving is deprecated); use a "
                f"PoolingModel with pooler_config=PoolerConfig(task={hint!r})",
                configured_task=configured, supported_tasks=supported)
        if verdict == Verdict.DEPRECATED:
            message = (f"{deprecation_message(task, self.policy.configured)}; configure the "
                       f"task you use: PoolerConfig(task={hint!r})")
            warnings.warn(message, PoolingDeprecationWarning, stacklevel=4)
            return task, message
        return task, None

    def _compute(self, task: Task, body: dict, notes: list[str]) -> PoolingResult:
        from poolwire.actors.validator import check_against_model
        from poolwire.models.model_fields import texts_as_strings
        from poolwire.models.task_heads import plan_task
        from poolwire.offline_images import lift_images, prepare_images
        from poolwire.schemas.requests import parse_request

        body, pils = lift_images(body)  # PIL images and bytes beside texts (PROTOCOL 1.3)
        request = parse_request(task, body)  # unknown keys first, as on the wire
        for name in WIRE_ONLY_FIELDS:
            if body.get(name) is not None:
                raise InvalidRequestError(f"{name} is about the wire; PoolingModel returns numpy "
                                          f"arrays in this process: leave it out", field=name)
        check_against_model(task, request, self._limits)
        images = None
        if self.model.towers is not None:
            images = prepare_images(request, self.model.towers, pils, self.max_image_pixels)
        else:
            request = texts_as_strings(request)
        plan = plan_task(task, request, self.model, self._tokenizing,
                         score_method=self.policy.score_method, max_embed_len=self.max_embed_len,
                         hybrid_weights=self.hybrid_weights, images=images)
        items = self._pool(task, plan)
        values = [v if isinstance(v, (SparseVector, dict)) else np.asarray(v) for _, v in items]
        if values and isinstance(values[0], SparseVector):  # a sparse model's embed
            data: Any = [_sparse(v) for v in values]
        elif values and isinstance(values[0], dict):  # BGE-M3's outputs, one map per input
            data = [{k: _sparse(v) if isinstance(v, SparseVector) else v for k, v in m.items()}
                    for m in values]
        elif task in TOKEN_LEVEL_TASKS:
            data = values
        elif task is Task.SCORE:
            data = np.asarray(values, dtype=np.float32).reshape(len(values))
        else:
            data = np.stack(values).astype(np.float32, copy=False)
        extras = [plan.extras(i, v) for i, v in items]
        tokens = plan.prompt_tokens
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        if plan.images:
            usage["images"] = plan.images
        return PoolingResult(data, task.value, self.model.name, usage, notes,
                             extras if any(e is not None for e in extras) else None,
                             [i for i, _ in items])

    def _pool(self, task: Task, plan) -> list:
        """Every sequence through the batch planner (length-grouped batches under the token
        budget) and the backend, then the items as the engine assembles them."""
        from poolwire.actors.batch_planner import BatchPlanner, QueuedItem
        from poolwire.models.assembly import assemble_items, sequence_value
        from poolwire.models.forward import run_batch

        planner = BatchPlanner(*self._batching)
        for i, seq in enumerate(plan.sequences):
            planner.add(QueuedItem(tokens=len(seq), group=plan.spec_for(i).group, payload=i))
        outputs: dict[int, np.ndarray] = {}
        while batch := planner.next_batch():
            seqs = [plan.sequences[item.payload] for item in batch]
            result = run_batch(self.backend, seqs, [plan.spec_for(item.payload) for item in batch])
            for item, value in zip(batch, result.outputs):
                outputs[item.payload] = sequence_value(task, plan, value)
        return assemble_items(plan, outputs, self.model)

    def __repr__(self) -> str:
        return (f"PoolingModel({self.model.name!r}, configured_task={self.configured_task!r}, "
                f"supported_tasks={self.supported_tasks}, {self.backend.describe()})")
