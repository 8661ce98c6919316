"""Argument checks shared by the Triton host wrappers and the PyTorch references.

Both sides call the same functions so that a bad call fails identically whichever backend
the dispatch picks: the engine never sees an error that only happens on GPU.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

POOL_METHODS = ("cls", "mean", "last")
ACTIVATIONS = ("softmax", "sigmoid", "none")
# The float dtypes models hand us; fp8 is left out because no model we serve emits it.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
LENGTH_DTYPES = (torch.int64, torch.int32)


@dataclass(frozen=True)
class PoolShape:
    batch: int  # B
    tokens: int  # T, the padded length
    hidden: int  # H
    width: int  # D, the kept (Matryoshka) width, 1 <= D <= H
    total: int  # sum(lengths): rows of token_pool's packed output


def _check_float(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{name} dtype {tensor.dtype} is not supported; pass one of "
            f"{', '.join(str(d) for d in FLOAT_DTYPES)}"
        )
    return tensor


def check_pool(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    dimensions: int | None,
    method: str | None = None,
) -> PoolShape:
    """Validate seq_pool / token_pool arguments; ``method`` is None for token_pool."""
    if method is not None:
        check_method(method)
    _check_float("hidden", hidden)
    if hidden.dim() != 3:
        raise ValueError(
            f"hidden must be 3-D [B, T, H], got {hidden.dim()}-D shape {tuple(hidden.shape)}"
        )
    batch, tokens, width_h = hidden.shape
    if batch == 0:
        raise ValueError(f"empty batch: hidden has shape {tuple(hidden.shape)}; pool at least one sequence")
    if width_h == 0:
        raise ValueError(f"hidden has shape {tuple(hidden.shape)} with H = 0; nothing to pool")

    if not isinstance(lengths, torch.Tensor):
        raise ValueError(f"lengths must be a torch.Tensor of int64 or int32, got {type(lengths).__name__}")
    if lengths.dtype not in LENGTH_DTYPES:
        raise ValueError(f"lengths dtype {lengths.dtype} is not supported; pass int64 or int32 token counts")
    if tuple(lengths.shape) != (batch,):
        raise ValueError(
            f"lengths has shape {tuple(lengths.shape)} but hidden holds B = {batch} sequences; "
            f"pass one length per sequence"
        )
    # One host copy of B integers: cheap, and the only way to name the bad value in the error.
    values = lengths.tolist()
    for i, n in enumerate(values):
        if n < 1:
            raise ValueError(
                f"lengths[{i}] = {n}: every sequence needs at least one token; "
                f"drop empty inputs before pooling"
            )
        if n > tokens:
            raise ValueError(f"lengths[{i}] = {n} exceeds the padded length T = {tokens} of hidden")

    return PoolShape(batch=batch, tokens=tokens, hidden=width_h,
                     width=kept_width(dimensions, width_h), total=sum(values))


def check_method(method: str) -> None:
    if method not in POOL_METHODS:
        raise ValueError(f"unknown pooling method {method!r}; use one of {', '.join(POOL_METHODS)}")


def kept_width(dimensions: int | None, width_h: int) -> int:
    """The features kept of H (Matryoshka `dimensions`; None keeps all), checked."""
    if dimensions is None:
        return width_h
    # Any integer (numpy's too) is fine; bool is an int subclass, but dimensions=True is a bug.
    try:
        if isinstance(dimensions, bool):
            raise TypeError
        width = operator.index(dimensions)
    except TypeError:
        raise ValueError(f"dimensions must be an int or None, got {dimensions!r}") from None
    if not 1 <= width <= width_h:
        raise ValueError(f"dimensions = {width} is out of range; use 1..{width_h} (the hidden size H)")
    return width


def check_activation(logits: torch.Tensor, kind: str) -> None:
    if kind not in ACTIVATIONS:
        raise ValueError(f"unknown activation {kind!r}; use one of {', '.join(ACTIVATIONS)}")
    _check_float("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, C], got {logits.dim()}-D shape {tuple(logits.shape)}")
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ValueError(f"empty logits of shape {tuple(logits.shape)}; pass at least one row and one class")
