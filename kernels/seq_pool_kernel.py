"""seq_pool as a Triton kernel: CLS / MEAN / LAST pooling with Matryoshka truncation and L2
normalisation fused, reading the padded [B, T, H] hidden states in place (no packing copy)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch
from ._checks import check_pool
from .reference import NORM_EPS

_METHOD_CODES = {"cls": 0, "mean": 1, "last": 2}
# Widest column block when a row may be split across programs (no normalisation): more
# programs per sequence keep the GPU busy when the batch is small. The interpreter wants the
# fewest programs, so it never splits. Read at call time; tests lower it to cover the split path.
SPLIT_COLS = 1 << 30 if _launch.INTERPRETED else 512


@triton.jit
def _seq_pool_kernel(
    hidden_ptr,  # [B, T, H] padded hidden states, fp32/fp16/bf16/fp64
    lengths_ptr,  # [B] int32/int64 real token counts, checked 1 <= length <= T on the host
    out_ptr,  # [B, D] float32 pooled vectors
    width,  # D: columns kept (Matryoshka), D <= H, so truncated columns are never read
    stride_hb,  # hidden strides in elements: any layout works, no .contiguous() copy
    stride_ht,
    stride_hh,
    stride_ob,  # output row stride
    METHOD: tl.constexpr,  # 0 cls, 1 mean, 2 last: constexpr so the other branches compile away
    NORMALIZE: tl.constexpr,  # L2-normalise the kept columns; needs BLOCK_H >= D (one column block)
    NORM_EPS: tl.constexpr,  # norm clamp, the same as F.normalize's eps so zero rows agree
    BLOCK_T: tl.constexpr,  # tokens per tile in the MEAN loop
    BLOCK_H: tl.constexpr,  # columns per program
):
    # int64 before multiplying by strides: B * T * H overflows int32 on large batches.
    row = tl.program_id(0).to(tl.int64)
    col_block = tl.program_id(1).to(tl.int64)
    cols = col_block * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < width
    length = tl.load(lengths_ptr + row).to(tl.int64)
    row_ptrs = hidden_ptr + row * stride_hb + cols * stride_hh  # [BLOCK_H] token 0 of this row

    if METHOD == 1:
        # Accumulate whole tiles in fp32 and reduce over tokens once at the end: the loop body
        # is then pure loads and adds. Padding is masked with other=0, the identity of the sum,
        # so garbage (even nan) past `length` never reaches the result.
        acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
        for t0 in range(0, length, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
            ok = (ts < length)[:, None] & col_ok[None, :]
            tile = tl.load(row_ptrs[None, :] + ts[:, None] * stride_ht, mask=ok, other=0.0)
            acc += tile.to(tl.float32)
        pooled = tl.sum(acc, axis=0) / length.to(tl.float32)
    else:
        if METHOD == 0:
            token_ptrs = row_ptrs  # CLS is token 0 whatever the length
        else:
            # LAST is the final real token, not the final padded slot.
            token_ptrs = row_ptrs + (length - 1) * stride_ht
        pooled = tl.load(token_ptrs, mask=col_ok, other=0.0).to(tl.float32)

    if NORMALIZE:
        # Masked columns hold 0, so they add nothing to the norm of the kept (truncated) row.
        norm = tl.sqrt(tl.sum(pooled * pooled, axis=0))
        pooled = pooled / tl.maximum(norm, NORM_EPS)
    tl.store(out_ptr + row * stride_ob + cols, pooled, mask=col_ok)


def seq_pool_triton(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    method: str,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> [B, D] float32, one vector per sequence, via Triton."""
    shape = check_pool(hidden, lengths, dimensions, method)
    lengths = lengths.to(hidden.device).contiguous()  # the kernel reads lengths[b] at offset b
    out = torch.empty((shape.batch, shape.width), dtype=torch.float32, device=hidden.device)

    block_h = _launch.pow2(shape.width)
    if not normalize:  # the norm needs the whole kept row in one program
        block_h = min(block_h, SPLIT_COLS)
    # CLS / LAST read one token, so only MEAN needs a token tile.
    block_t = _launch.rows_per_tile(shape.tokens, block_h) if method == "mean" else 1
    grid = (shape.batch, triton.cdiv(shape.width, block_h))
    _seq_pool_kernel[grid](
        hidden,
        lengths,
        out,
        shape.width,
        hidden.stride(0),
        hidden.stride(1),
        hidden.stride(2),
        out.stride(0),
        METHOD=_METHOD_CODES[method],
        NORMALIZE=bool(normalize),
        NORM_EPS=NORM_EPS,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        num_warps=_launch.num_warps(block_h),
        enable_fp_fusion=_launch.FP_FUSION,
    )
    return out
