"""From the pooled outputs of a request's sequences to its items, for a worker's engine and the
offline PoolingModel alike: one sequence per item, a bi-encoder score from a pair of
sequences, or a long input from its chunks (chunking.py) finished with Dense, dimensions and
normalisation."""

import numpy as np
import torch

from poolwire import kernels
from poolwire.models.model import LoadedModel
from poolwire.models.task_heads import TaskPlan, cosine_items
from poolwire.schemas.tasks import Task


def sequence_value(task: Task, plan: TaskPlan, value: np.ndarray) -> np.ndarray:
    """One sequence's pooled output as its plan keeps it: a cross-encoder's one label is the
    pair's score."""
    if task is Task.SCORE and plan.pairs is None:
        return value.reshape(-1)[0]
    return value


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
    """(item index, value) of every item, in index order, once every sequence is pooled."""
    if plan.pairs is not None:
        return list(enumerate(cosine_items(plan, outputs)))
    if plan.chunks is not None:
        combined = plan.chunks.combine(outputs, [len(s) for s in plan.sequences])
        return list(enumerate(finish_vectors(model, combined, plan.chunks.finish)))
    return sorted(outputs.items())
