"""Pooling kernels over torch tensors, the same functions on every device.

`seq_pool`, `token_pool` and `activation` dispatch per call (see `dispatch`): Triton on CUDA,
the PyTorch reference on CPU, or the Triton interpreter on CPU when TRITON_INTERPRET=1 was set
before this package was first imported. The `*_triton` and `*_reference` variants run one side
directly, for tests and benchmarks.
"""

from .activation_kernel import activation_triton
from .dispatch import activation, backend_for, seq_pool, token_pool
from .reference import activation_reference, seq_pool_reference, token_pool_reference
from .seq_pool_kernel import seq_pool_triton
from .token_pool_kernel import token_pool_triton

__all__ = [
    "activation",
    "activation_reference",
    "activation_triton",
    "backend_for",
    "seq_pool",
    "seq_pool_reference",
    "seq_pool_triton",
    "token_pool",
    "token_pool_reference",
    "token_pool_triton",
]
