"""From the pooled outputs of a request's sequences to its items, for a worker's engine and the
offline PoolingModel alike: one sequence per item, a bi-encoder score from a pair of
sequences, or a long input from its chunks (chunking.py) finished with Dense, dimensions and
normalisation."""

import numpy as np
import torch

from poolwire import kernels
from poolwire.models.model import LoadedModel
from poolwire.models.ranking import rank
from poolwire.models.task_heads import TaskPlan, cosine_items
from poolwire.schemas.tasks import Task


def _pair_scores(task: Task, plan: TaskPlan) -> bool:
    """A cross-encoder's sequences, whose pooled output's one label is the pair's score."""
    return task is Task.SCORE and plan.pairs is None


def sequence_value(task: Task, plan: TaskPlan, value: np.ndarray) -> np.ndarray:
    """One sequence's pooled output as its plan keeps it."""
    return value.reshape(-1)[0] if _pair_scores(task, plan) else value


def sequence_values(task: Task, plan: TaskPlan,
                    outputs: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """sequence_value of each (sequence index, output) of one request, decided once for it:
    the engine delivers a request's outputs of a batch together."""
    if not _pair_scores(task, plan):
        return outputs
    return [(i, sequence_value(task, plan, value)) for i, value in outputs]


def finish_vectors(model: LoadedModel, vectors: list[np.ndarray], spec) -> list[np.ndarray]:
    """What forward.py does to a pooled vector after pooling, on vectors pooled elsewhere:
    the Dense modules, then Matryoshka truncation and normalisation through the same kernel."""
    with torch.inference_mode():
        pooled = torch.from_numpy(np.stack(vectors)).to(model.device)      # [N, H]
        projected = model.project(pooled).float()                          # [N, D]
        ones = torch.ones(len(vectors), dtype=torch.long, device=projected.device)
        out = kernels.seq_pool(projected[:, None, :], ones, "cls", normalize=spec.normalize,
                               dimensions=spec.dimensions)
    return list(out.cpu().numpy())


def assemble_items(plan: TaskPlan, outputs: dict[int, np.ndarray],
                   model: LoadedModel) -> list[tuple[int, np.ndarray]]:
    """(item index, value) of every item once every sequence is pooled, in the order the reply
    carries them: by index, or for the rerank form by score (highest first), cut to top_n."""
    if plan.pairs is not None:
        items = list(enumerate(cosine_items(plan, outputs)))
    elif plan.chunks is not None:
        combined = plan.chunks.combine(outputs, [len(s) for s in plan.sequences])
        items = list(enumerate(finish_vectors(model, combined, plan.chunks.finish)))
    else:
        items = sorted(outputs.items())
    if plan.rerank is None:
        return items
    scores = [float(np.asarray(v).reshape(-1)[0]) for _, v in items]
    return [items[k] for k in rank(scores, plan.rerank.top_n)]
