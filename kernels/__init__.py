"""Pooling kernels over torch tensors, the same functions on every device.

`seq_pool`, `token_pool` and `activation` dispatch per call (see `dispatch`): Triton on CUDA,
NumPy on CPU (`numpy_ops`), or the Triton interpreter on CPU when TRITON_INTERPRET=1 was set
before this package was first imported; the PyTorch references on any other device. The
`*_reference` and `*_numpy` variants, and where Triton is installed the `*_triton` ones, run one
implementation directly, for tests and benchmarks.
"""

from .dispatch import (TRITON_AVAILABLE, activation, backend_for, describe_backend, seq_pool,
                       token_pool)
from .numpy_ops import activation_numpy, seq_pool_numpy, seq_pool_row, token_pool_numpy
from .reference import activation_reference, seq_pool_reference, token_pool_reference

__all__ = [
    "TRITON_AVAILABLE",
    "activation",
    "activation_numpy",
    "activation_reference",
    "backend_for",
    "describe_backend",
    "seq_pool",
    "seq_pool_numpy",
    "seq_pool_reference",
    "seq_pool_row",
    "token_pool",
    "token_pool_numpy",
    "token_pool_reference",
]

if TRITON_AVAILABLE:
    from .activation_kernel import activation_triton
    from .seq_pool_kernel import seq_pool_triton
    from .token_pool_kernel import token_pool_triton

    __all__ += ["activation_triton", "seq_pool_triton", "token_pool_triton"]
