"""Sparse models (PROTOCOL.md 1.2, Task policy): a Sentence-Transformers `SparseEncoder`
folder, a masked-LM transformer followed by `SpladePooling`, read once at load, and the
SPLADE pooling of its MLM logits into one weight per vocabulary entry."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poolwire.models.sparse_vector import SparseVector

_POOLINGS = ("max", "sum")
_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SpladeConfig:
    """What a folder's `SpladePooling` module says."""

    pooling: str = "max"        # "max" | "sum" over the tokens
    activation: str = "relu"    # "relu": log(1 + relu(x)); "log1p_relu": log(1 + log(1 + relu(x)))


def _is_mlm_transformer(kind: str, folder: Path, path: str) -> bool:
    """Sentence-Transformers 5 saves `MLMTransformer`; 6 also a plain `Transformer` whose
    sentence_bert_config.json says `transformer_task: fill-mask`."""
    if kind.endswith(".MLMTransformer"):
        return True
    if kind.endswith(".Transformer"):
        cfg = folder / path / "sentence_bert_config.json"
        return cfg.is_file() and json.loads(cfg.read_text()).get("transformer_task") == "fill-mask"
    return False


def read_splade(folder: Path, modules: list[dict]) -> SpladeConfig | None:
    """The SpladePooling of a SparseEncoder folder's modules.json, or None when the folder is
    not one. Raises naming the file when the folder is sparse in a way poolwire cannot serve."""
    kinds = [m.get("type", "") for m in modules]
    at = [i for i, k in enumerate(kinds) if k.endswith(".SpladePooling")]
    if not at:
        return None
    modules_file = folder / "modules.json"
    if len(modules) != 2 or at != [1] or not _is_mlm_transformer(kinds[0], folder,
                                                                 modules[0].get("path", "")):
        raise ValueError(f"{modules_file}: poolwire serves a SparseEncoder made of a masked-LM "
                         f"transformer followed by SpladePooling, got modules {kinds}")
    cfg_file = folder / modules[1].get("path", "") / "config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    pooling = cfg.get("pooling_strategy", "max")
    activation = cfg.get("activation_function", "relu")
    if pooling not in _POOLINGS or activation not in _ACTIVATIONS:
        raise ValueError(f"{cfg_file}: SpladePooling {pooling!r} with {activation!r} is not "
                         f"supported; poolwire pools with one of {_POOLINGS} after one of "
                         f"{_ACTIVATIONS}")
    return SpladeConfig(pooling, activation)


def splade_pool(config: SpladeConfig, logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, T, V] MLM logits -> [B, V] float32 weights, as SpladePooling computes them: padding
    rows are zeroed before the activation (zero is the identity of both max and sum here,
    every weight being >= 0)."""
    mask = (torch.arange(logits.shape[1], device=logits.device)[None, :]
            < lengths.to(logits.device)[:, None])                          # [B, T]
    # One copy of the [B, T, V] logits, the rest in place: at vocabulary width they dominate
    # the batch's memory.
    weights = logits.float().masked_fill(~mask[..., None], 0.0).relu_().log1p_()   # [B, T, V]
    if config.activation == "log1p_relu":
        weights.log1p_()
    return weights.amax(dim=1) if config.pooling == "max" else weights.sum(dim=1)


def sparse_items(config: SpladeConfig, logits: torch.Tensor, lengths: torch.Tensor,
                 max_active_dims: int | None, normalize: bool) -> list[SparseVector]:
    pooled = splade_pool(config, logits, lengths).cpu().numpy()            # [B, V]
    items = [SparseVector.from_dense(row, max_active_dims) for row in pooled]
    return [item.normalized() for item in items] if normalize else items


def dense_of(item: SparseVector) -> np.ndarray:
    """The [V] vector a sparse item stands for (tests, references)."""
    row = np.zeros(item.size, dtype=np.float32)
    row[item.indices] = item.values
    return row
