"""Launch-time choices shared by the Triton host wrappers: interpreter mode and tile sizes.

Tile sizes differ on purpose between the two ways a kernel runs:
- compiled (GPU): a tile of about GPU_TILE elements keeps the fp32 working set in registers, and
  the row count of a tile depends only on the row width (H, D or C), so micro-batches of varying B and T
  reuse one compiled kernel instead of compiling a new one per shape;
- interpreted (CPU, TRITON_INTERPRET=1): every program instance is a Python call and every
  tl op a numpy call, so the fastest grid is the smallest one with the largest tiles; nothing
  compiles there, so tiles may follow the shape freely.
"""

from __future__ import annotations

import triton

# triton.jit picks JITFunction or InterpretedFunction when a kernel is decorated, i.e. when
# this package is imported, so the mode is read once here: setting TRITON_INTERPRET later
# would not change how the already-decorated kernels run, and the dispatch must agree with them.
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

# Elements per tile on GPU: 32 fp32 values per thread at 4 warps, 16 at 8. Checked with ptxas for
# sm_90: no spills and at most 96 registers at the tiles the wrappers pick for rows of 16..8192
# columns; twice this tile took up to 152 registers, or spilled.
GPU_TILE = 4096
INTERPRETER_TILE = 1 << 15  # elements per tile in the interpreter: measured fastest for MEAN pooling


def pow2(n: int) -> int:
    """Smallest power of two >= n (tl.arange needs power-of-two extents)."""
    return triton.next_power_of_2(max(1, n))


def rows_per_tile(rows: int, block_cols: int) -> int:
    """How many rows of `block_cols` columns one tile holds, as a power of two."""
    if INTERPRETED:
        return min(pow2(rows), max(1, INTERPRETER_TILE // block_cols))
    return max(1, GPU_TILE // block_cols)


def num_warps(block_cols: int) -> int:
    # Wide rows need more threads to keep the per-thread share of a tile small.
    return 8 if block_cols >= 2048 else 4


# Passed explicitly so results do not depend on TRITON_DEFAULT_FP_FUSION (whose default Triton is
# changing, with a warning when unset): no fused multiply-add, closer to the unfused PyTorch
# references, and free for kernels that wait on memory, not arithmetic.
FP_FUSION = False
