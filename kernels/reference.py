"""PyTorch references of the pooling ops, written for clarity rather than speed.

They are the CPU backend when the Triton interpreter is off, and the ground truth the
kernel tests compare against. Same signatures and same checks as the Triton wrappers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_activation, check_pool

# F.normalize's default; the kernels clamp the norm with the same value so zero rows agree.
NORM_EPS = 1e-12


def _real_tokens(lengths: torch.Tensor, tokens: int) -> torch.Tensor:
    """[B, T] bool: True where a position holds a real token, False on padding."""
    positions = torch.arange(tokens, device=lengths.device)
    return positions[None, :] < lengths[:, None]


def _head(pooled: torch.Tensor, width: int, normalize: bool) -> torch.Tensor:
    # Matryoshka: keep the leading `width` features, then normalise what was kept.
    pooled = pooled[..., :width]
    if normalize:
        pooled = F.normalize(pooled, p=2.0, dim=-1, eps=NORM_EPS)
    return pooled.contiguous()


def seq_pool_reference(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    method: str,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> [B, D] float32, one vector per sequence."""
    shape = check_pool(hidden, lengths, dimensions, method)
    lengths = lengths.to(hidden.device, torch.int64)
    x = hidden.float()  # [B, T, H], fp32 so fp16/bf16 sums do not lose precision
    if method == "cls":
        pooled = x[:, 0]
    elif method == "last":
        pooled = x[torch.arange(shape.batch, device=x.device), lengths - 1]
    else:
        # where() rather than a multiply: padding may hold inf/nan and must not leak in.
        mask = _real_tokens(lengths, shape.tokens)[..., None]  # [B, T, 1]
        pooled = torch.where(mask, x, 0.0).sum(dim=1) / lengths[:, None].float()
    return _head(pooled, shape.width, normalize)


def token_pool_reference(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> packed [sum(lengths), D] float32 token rows."""
    shape = check_pool(hidden, lengths, dimensions)
    lengths = lengths.to(hidden.device, torch.int64)
    # Boolean indexing walks [B, T] in row-major order: sequence 0's tokens, then sequence 1's.
    packed = hidden[_real_tokens(lengths, shape.tokens)].float()  # [sum(lengths), H]
    return _head(packed, shape.width, normalize)


def activation_reference(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] logits -> [N, C] float32 scores, row-wise over the classes."""
    check_activation(logits, kind)
    # copy=True: "none" must still hand back a fresh float32 tensor, never an alias of the input.
    x = logits.to(torch.float32, copy=True)
    if kind == "softmax":
        return torch.softmax(x, dim=-1)
    if kind == "sigmoid":
        return torch.sigmoid(x)
    return x
