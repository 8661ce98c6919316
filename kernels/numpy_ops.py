"""The pooling ops for CPU tensors, in NumPy: what a CPU worker runs instead of the PyTorch
references. Same signatures, same checks (`_checks`) and results within float32 rounding of the
references; torch tensors in, float32 torch tensors out (sharing the NumPy arrays' memory).

Why not the references: they cost little alone, but the forward thread runs them while the
event loop holds the GIL, and every torch op releases the GIL and queues to take it back.
Beside a busy Python thread the references' dozen small ops took 4.2 ms of wall time for a
16 x 13 x 32 batch against 0.05 ms here (`bench/idle_penalty.py`, "beside a busy event loop").
So these ops are few and whole-batch: the mean's sum is one batched matrix product of the
hidden states with a mask row per sequence (1 on real tokens, 0 on padding).

Padding is never trusted: a product of 0 with padding that holds inf or nan is nan, so a result
that is not finite is recomputed with the padding masked out, which gives exactly the
reference's values (inf or nan from a real token stays, as there).
"""

from __future__ import annotations

import numpy as np
import torch

from ._checks import check_activation, check_method, check_pool, kept_width
from .reference import NORM_EPS


def _floats(tensor: torch.Tensor) -> np.ndarray:
    """A float32 NumPy array of a CPU tensor, without a copy where it already is one."""
    if tensor.requires_grad:  # checked first: detach() is a torch op of its own
        tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16; the upcast is exact
        return tensor.float().numpy()
    return tensor.numpy().astype(np.float32, copy=False)


def _head(pooled: np.ndarray, width: int, normalize: bool) -> np.ndarray:
    """Matryoshka: keep the leading `width` features, then normalise what was kept."""
    pooled = pooled[:, :width]
    if normalize:
        norms = np.sqrt(np.einsum("ij,ij->i", pooled, pooled))
        pooled = pooled / np.maximum(norms, np.float32(NORM_EPS))[:, None]
    return np.ascontiguousarray(pooled, dtype=np.float32)


def _lengths(lengths: torch.Tensor) -> np.ndarray:
    return lengths.numpy().astype(np.int64, copy=False)


def seq_pool_numpy(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    method: str,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> [B, D] float32, one vector per sequence."""
    shape = check_pool(hidden, lengths, dimensions, method)
    pooled = _pooled(_floats(hidden), _lengths(lengths), method)
    return torch.from_numpy(_head(pooled, shape.width, normalize))


def _pooled(x: np.ndarray, counts: np.ndarray, method: str) -> np.ndarray:
    """[B, T, H] float32 padded hidden states and their [B] real lengths -> [B, H]."""
    if method == "cls":
        return x[:, 0]
    if method == "last":
        return x[np.arange(x.shape[0]), counts - 1]
    real = np.arange(x.shape[1])[None, :] < counts[:, None]  # [B, T]
    # The sum, then the division, as the reference does: a product with 1 / length
    # per token would round differently (a mean of ones would not be exactly one).
    summed = np.matmul(real.astype(np.float32)[:, None, :], x)[:, 0]  # [B, 1, T] @ [B, T, H]
    if not np.isfinite(summed).all():
        summed = np.where(real[..., None], x, np.float32(0)).sum(axis=1)
    return summed / counts[:, None].astype(np.float32)


def seq_pool_row(
    hidden: np.ndarray,
    method: str,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> np.ndarray:
    """One sequence's [1, T, H] hidden states, every token real, -> its [D] float32 vector:
    `seq_pool_numpy` of a one-row batch, the same arithmetic, without torch on either side.
    For a backend that hands one row over as a NumPy array (OpenVINO's one-row passes): the
    batch op's checks and tensor conversions cost about as much as the near-zero model's
    whole pass (bench/service_cost.py, one request at a time)."""
    check_method(method)
    if hidden.ndim != 3 or hidden.shape[0] != 1 or 0 in hidden.shape:
        raise ValueError(f"hidden must be one non-empty row [1, T, H], got shape {hidden.shape}")
    width = kept_width(dimensions, hidden.shape[2])
    x = hidden.astype(np.float32, copy=False)
    counts = np.array([hidden.shape[1]], dtype=np.int64)
    return _head(_pooled(x, counts, method), width, normalize)[0]


def token_pool_numpy(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> packed [sum(lengths), D] float32 token rows."""
    shape = check_pool(hidden, lengths, dimensions)
    counts = _lengths(lengths)
    real = np.arange(shape.tokens)[None, :] < counts[:, None]
    # Boolean indexing walks [B, T] in row-major order: sequence 0's tokens, then sequence 1's.
    return torch.from_numpy(_head(_floats(hidden)[real], shape.width, normalize))


def activation_numpy(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] logits -> [N, C] float32 scores, row-wise over the classes."""
    check_activation(logits, kind)
    # copy=True: "none" must hand back a fresh array, never an alias of the caller's logits.
    x = _floats(logits).astype(np.float32, copy=True)
    if kind == "softmax":
        x -= x.max(axis=1, keepdims=True)  # the row's largest logit becomes exp(0): no overflow
        np.exp(x, out=x)
        x /= x.sum(axis=1, keepdims=True)
    elif kind == "sigmoid":
        with np.errstate(over="ignore"):  # exp(1000) is inf, and 1 / (1 + inf) is the 0 we want
            x = 1.0 / (1.0 + np.exp(-x))
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
