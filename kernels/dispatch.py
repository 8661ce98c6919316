"""The one place that decides, per call, which implementation of a pooling op runs.

CUDA tensors run the Triton kernels. CPU tensors run the NumPy ops (`numpy_ops`: few
whole-batch ops, which keep their speed beside a busy event loop where torch's small ops do
not), unless the process imported this package with TRITON_INTERPRET=1: then the kernels were
decorated for the Triton interpreter and CPU tensors run them, which is how tests check kernels
without a GPU. Tensors on any other device (or CUDA where Triton is not installed: it has wheels
for Linux only) run the PyTorch references, which are correct on any device.
"""

from __future__ import annotations

from typing import Literal

import torch

from .numpy_ops import activation_numpy, seq_pool_numpy, token_pool_numpy
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

Backend = Literal["triton", "numpy", "reference"]


def backend_for(tensor: torch.Tensor) -> Backend:
    """Which implementation the ops below use for a tensor on this device."""
    if TRITON_AVAILABLE and (tensor.is_cuda or _launch.INTERPRETED):
        return "triton"
    if tensor.device.type == "cpu":
        return "numpy"
    return "reference"


_NAMES = {"numpy": "NumPy", "reference": "PyTorch references"}


def describe_backend(device: torch.device | str) -> str:
    """One line for a worker's start-up: which pooling implementation runs on `device`."""
    backend = backend_for(torch.empty(0, device=device))
    if backend == "triton":
        return "Triton" + (" (interpreter)" if _launch.INTERPRETED else "")
    why = "Triton is not installed" if not TRITON_AVAILABLE else "Triton kernels run on CUDA devices"
    return f"{_NAMES[backend]} ({why})"


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
    backend = backend_for(hidden)  # the triton names exist only where Triton imported
    op = (seq_pool_triton if backend == "triton" else seq_pool_numpy if backend == "numpy"
          else seq_pool_reference)
    return op(hidden, lengths, method, normalize=normalize, dimensions=dimensions)


def token_pool(
    hidden: torch.Tensor,
    lengths: torch.Tensor,
    *,
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """[B, T, H] padded hidden states -> packed [sum(lengths), D] float32 rows of real tokens."""
    backend = backend_for(hidden)  # the triton names exist only where Triton imported
    op = (token_pool_triton if backend == "triton" else token_pool_numpy if backend == "numpy"
          else token_pool_reference)
    return op(hidden, lengths, normalize=normalize, dimensions=dimensions)


def activation(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] logits -> [N, C] float32 scores: "softmax", "sigmoid" or "none", row-wise."""
    backend = backend_for(logits)  # the triton names exist only where Triton imported
    op = (activation_triton if backend == "triton" else activation_numpy if backend == "numpy"
          else activation_reference)
    return op(logits, kind)
