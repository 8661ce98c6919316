"""activation as a Triton kernel: row-wise softmax / sigmoid / identity over [N, C] classifier
logits, always producing float32 scores."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch
from ._checks import check_activation

_KIND_CODES = {"none": 0, "sigmoid": 1, "softmax": 2}
# Widest class tile; wider rows loop over class blocks (online softmax) instead of holding the
# whole row in registers. Read at call time; tests lower it to cover the loop in the interpreter.
MAX_BLOCK_C = 1 << 16 if _launch.INTERPRETED else 4096


@triton.jit
def _activation_kernel(
    logits_ptr,  # [N, C] logits, fp32/fp16/bf16/fp64
    out_ptr,  # [N, C] float32 scores
    n_rows,  # N
    n_cols,  # C
    stride_ln,  # logits strides in elements: any layout works, no .contiguous() copy
    stride_lc,
    stride_on,  # output row stride
    KIND: tl.constexpr,  # 0 none, 1 sigmoid, 2 softmax: constexpr so the other paths compile away
    BLOCK_N: tl.constexpr,  # rows per program: many small rows share one program
    BLOCK_C: tl.constexpr,  # classes per tile; rows wider than this loop over class blocks
):
    # int64 before multiplying by strides.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    src_rows = logits_ptr + rows[:, None] * stride_ln  # [BLOCK_N, 1]
    dst_rows = out_ptr + rows[:, None] * stride_on

    if KIND == 2:
        # Pass 1, online softmax: running max m and running sum s of exp(x - m), rescaled
        # whenever the max grows, so exp never sees a large positive argument (logits of 1000
        # do not overflow). Masked entries load as -inf, the identity of max, and add exp(-inf) = 0.
        m = tl.full([BLOCK_N], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c0 in range(0, n_cols, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(src_rows + cols[None, :] * stride_lc, mask=ok, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            # Rows past N are all -inf; pin their max to 0 so no inf - inf = nan is computed.
            m_new = tl.where(row_ok, m_new, 0.0)
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            m = m_new
        s = tl.where(row_ok, s, 1.0)  # rows past N summed nothing; avoid 0/0 below
        # Pass 2: normalise. When C <= BLOCK_C this re-reads one tile that is still in cache.
        for c0 in range(0, n_cols, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(src_rows + cols[None, :] * stride_lc, mask=ok, other=float("-inf")).to(tl.float32)
            tl.store(dst_rows + cols[None, :], tl.exp(x - m[:, None]) / s[:, None], mask=ok)
    else:
        for c0 in range(0, n_cols, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            ok = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(src_rows + cols[None, :] * stride_lc, mask=ok, other=0.0).to(tl.float32)
            if KIND == 1:
                # exp(-|x|) <= 1 never overflows; pick the algebraically equal form per sign.
                z = tl.exp(-tl.abs(x))
                x = tl.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
            tl.store(dst_rows + cols[None, :], x, mask=ok)


def activation_triton(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] logits -> [N, C] float32 scores, row-wise over the classes, via Triton."""
    check_activation(logits, kind)
    n_rows, n_cols = logits.shape
    out = torch.empty((n_rows, n_cols), dtype=torch.float32, device=logits.device)

    block_c = min(_launch.pow2(n_cols), MAX_BLOCK_C)
    block_n = _launch.rows_per_tile(n_rows, block_c)
    grid = (triton.cdiv(n_rows, block_n),)
    _activation_kernel[grid](
        logits,
        out,
        n_rows,
        n_cols,
        logits.stride(0),
        logits.stride(1),
        out.stride(0),
        KIND=_KIND_CODES[kind],
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=_launch.num_warps(block_c),
        enable_fp_fusion=_launch.FP_FUSION,
    )
    return out
