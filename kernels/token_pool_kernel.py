"""token_pool as a Triton kernel: copy every real token of the padded [B, T, H] hidden states into
packed [sum(lengths), D] float32 rows, with Matryoshka truncation and per-row L2 normalisation
fused into the same pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch
from ._checks import check_pool
from .reference import NORM_EPS


@triton.jit
def _token_pool_kernel(
    hidden_ptr,  # [B, T, H] padded hidden states, fp32/fp16/bf16/fp64
    lengths_ptr,  # [B] int32/int64 real token counts, checked 1 <= length <= T on the host
    starts_ptr,  # [B] int64 packed row of each sequence's token 0 (exclusive cumsum of lengths)
    out_ptr,  # [sum(lengths), D] float32 packed token rows
    width,  # D: columns kept (Matryoshka), D <= H, so truncated columns are never read
    stride_hb,  # hidden strides in elements: any layout works, no .contiguous() copy
    stride_ht,
    stride_hh,
    stride_on,  # output row stride
    NORMALIZE: tl.constexpr,  # L2-normalise each kept row; constexpr so the branch compiles away
    NORM_EPS: tl.constexpr,  # norm clamp, the same as F.normalize's eps so zero rows agree
    BLOCK_T: tl.constexpr,  # tokens per program
    BLOCK_D: tl.constexpr,  # >= D: a whole kept row per tile, which the per-row norm needs
):
    # int64 before multiplying by strides: B * T * H overflows int32 on large batches.
    seq = tl.program_id(0).to(tl.int64)
    token_block = tl.program_id(1).to(tl.int64)
    length = tl.load(lengths_ptr + seq).to(tl.int64)
    start = tl.load(starts_ptr + seq)
    ts = token_block * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    # Tiles past this sequence's length are fully masked: padding is never read or written,
    # so the grid may be sized for T whatever the lengths are.
    ok = (ts < length)[:, None] & (cols < width)[None, :]
    src = hidden_ptr + seq * stride_hb + ts[:, None] * stride_ht + cols[None, :] * stride_hh
    rows = tl.load(src, mask=ok, other=0.0).to(tl.float32)  # [BLOCK_T, BLOCK_D]
    if NORMALIZE:
        # Masked columns hold 0, the identity of the sum of squares.
        norm = tl.sqrt(tl.sum(rows * rows, axis=1))
        rows = rows / tl.maximum(norm, NORM_EPS)[:, None]
    dst = out_ptr + (start + ts)[:, None] * stride_on + cols[None, :]
    tl.store(dst, rows, mask=ok)


def token_pool_triton(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> packed [sum(lengths), D] float32 token rows, via Triton."""
    shape = check_pool(hidden, lengths, dimensions)
    lengths = lengths.to(hidden.device).contiguous()  # the kernel reads lengths[b] at offset b
    starts = torch.cumsum(lengths, 0, dtype=torch.int64) - lengths  # [B] exclusive prefix sum
    out = torch.empty((shape.total, shape.width), dtype=torch.float32, device=hidden.device)

    block_d = _launch.pow2(shape.width)
    block_t = _launch.rows_per_tile(shape.tokens, block_d)
    grid = (shape.batch, triton.cdiv(shape.tokens, block_t))
    _token_pool_kernel[grid](
        hidden,
        lengths,
        starts,
        out,
        shape.width,
        hidden.stride(0),
        hidden.stride(1),
        hidden.stride(2),
        out.stride(0),
        NORMALIZE=bool(normalize),
        NORM_EPS=NORM_EPS,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=_launch.num_warps(block_d),
        enable_fp_fusion=_launch.FP_FUSION,
    )
    return out
