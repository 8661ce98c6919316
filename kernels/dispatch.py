"""The one place that decides, per call, whether a pooling op runs as Triton or as the reference.

CUDA tensors run the Triton kernels. CPU tensors run the PyTorch references, unless the
process imported this package with TRITON_INTERPRET=1: then the kernels were decorated for the
Triton interpreter and CPU tensors run them, which is how tests check kernels without a GPU.
Where Triton is not installed (it has wheels for Linux only) every tensor runs the references,
which are plain PyTorch and correct on any device.
"""

from __future__ import annotations

from typing import Literal

import torch

from .reference import activation_reference, seq_pool_reference, token_pool_reference

try:
    from . import _launch
    from .activation_kernel import activation_triton
    from .seq_pool_kernel import seq_pool_triton
    from .token_pool_kernel import token_pool_triton

    TRITON_AVAILABLE = True
except ImportError as exc:
    if exc.name is None or exc.name.split(".")[0] != "triton":
        raise  # a broken install of ours, not a missing optional dependency
    TRITON_AVAILABLE = False

Backend = Literal["triton", "reference"]


def backend_for(tensor: torch.Tensor) -> Backend:
    """Which implementation the ops below use for a tensor on this device."""
    if TRITON_AVAILABLE and (tensor.is_cuda or _launch.INTERPRETED):
        return "triton"
    return "reference"


def describe_backend(device: torch.device | str) -> str:
    """One line for a worker's start-up: which pooling implementation runs on `device`."""
    if not TRITON_AVAILABLE:
        return "PyTorch references (Triton is not installed)"
    if backend_for(torch.empty(0, device=device)) == "triton":
        return "Triton" + (" (interpreter)" if _launch.INTERPRETED else "")
    return "PyTorch references (Triton kernels run on CUDA devices)"


def seq_pool(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    method: str,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> [B, D] float32: CLS / MEAN / LAST pooling per sequence.

    Keeps the first ``dimensions`` features (Matryoshka), then L2-normalises them if asked.
    """
    op = seq_pool_triton if backend_for(hidden) == "triton" else seq_pool_reference
    return op(hidden, lengths, method, normalize=normalize, dimensions=dimensions)


def token_pool(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> packed [sum(lengths), D] float32 rows of real tokens."""
    op = token_pool_triton if backend_for(hidden) == "triton" else token_pool_reference
    return op(hidden, lengths, normalize=normalize, dimensions=dimensions)


def activation(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] logits -> [N, C] float32 scores: "softmax", "sigmoid" or "none", row-wise."""
    op = activation_triton if backend_for(logits) == "triton" else activation_reference
    return op(logits, kind)
