"""Every pooling kernel against its PyTorch reference, on CPU through the Triton interpreter and,
where a GPU is present, compiled on CUDA (marked `gpu`); the NumPy ops that CPU workers run
against the same reference; small hand-computed cases on both CPU sides; and the dispatch
between the implementations."""

import os

# triton.jit picks interpreter mode when the kernels are decorated, i.e. when `kernels` is first
# imported, so this must run before that import (conftest does the same for the whole suite).
os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # noqa: E402

import numpy as np  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from poolwire import kernels  # noqa: E402
from poolwire.kernels import (  # noqa: E402
    _launch,
    activation_kernel,
    activation_numpy,
    activation_reference,
    activation_triton,
    dispatch,
    seq_pool_kernel,
    seq_pool_numpy,
    seq_pool_reference,
    seq_pool_row,
    seq_pool_triton,
    token_pool_numpy,
    token_pool_reference,
    token_pool_triton,
)

NEEDS_INTERPRETER = pytest.mark.skipif(
    not _launch.INTERPRETED,
    reason="CPU runs Triton only with TRITON_INTERPRET=1 set before importing kernels",
)
NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
DEVICES = [pytest.param("cpu", marks=NEEDS_INTERPRETER), pytest.param("cuda", marks=NEEDS_CUDA)]

# (dtype, atol, rtol) against the reference. Both sides upcast to fp32 before any arithmetic, so
# the input dtype sets the values but not the error: what is left is fp32 summation order and the
# GPU's approximate exp / sqrt / division, the same for every input dtype.
TOLERANCES = [
    (torch.float32, 1e-5, 1e-5),
    (torch.float16, 1e-5, 1e-5),
    (torch.bfloat16, 1e-5, 1e-5),
]
METHODS = ["cls", "mean", "last"]
# (B, T, H): odd sizes on purpose; H = 384 and 1000 are not powers of two, T = 1 has one token.
SHAPES = [(1, 1, 384), (5, 123, 384), (3, 17, 1000), (4, 200, 64), (2, 9, 7)]
# Every distinct dtype / tile / flag is a fresh compile on GPU, so CUDA runs a diagonal of the
# grid (each shape once, each head once) plus the widest realistic hidden size.
CUDA_SHAPES = [(1, 1, 384), (5, 123, 384), (3, 17, 1000), (8, 300, 4096), (2, 9, 7)]
# (normalize, dimensions as a fraction of H: None keeps all of it)
HEADS = [(False, None), (True, None), (False, 0.5), (True, 0.3)]


def _id(value) -> str | None:
    if isinstance(value, float):
        return None  # tolerances follow from the dtype; keep ids short
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value).replace(" ", "")


def on_devices(names: str, cpu_cases, cuda_cases):
    """parametrize(names) over ("cpu", *case) for cpu_cases and ("cuda", *case) for cuda_cases."""
    def param(device, case, marks):
        return pytest.param(device, *case, marks=marks, id="-".join(filter(None, [device, *map(_id, case)])))

    params = [param("cpu", c, NEEDS_INTERPRETER) for c in cpu_cases]
    params += [param("cuda", c, NEEDS_CUDA) for c in cuda_cases]
    return pytest.mark.parametrize("device, " + names, params)


def _diagonal(shapes):
    return [(shape, HEADS[i % len(HEADS)]) for i, shape in enumerate(shapes)]


SEQ_CASES = on_devices(
    "dtype, atol, rtol, shape, method, head",
    [(*tol, shape, m, head) for tol in TOLERANCES for shape in SHAPES for m in METHODS for head in HEADS],
    [(*tol, shape, m, head) for tol in TOLERANCES for m in METHODS for shape, head in _diagonal(CUDA_SHAPES)],
)
TOKEN_CASES = on_devices(
    "dtype, atol, rtol, shape, head",
    [(*tol, shape, head) for tol in TOLERANCES for shape in SHAPES for head in HEADS],
    [(*tol, shape, head) for tol in TOLERANCES for shape, head in _diagonal(CUDA_SHAPES)],
)
KINDS = ["softmax", "sigmoid", "none"]
ACTIVATION_SHAPES = [(1, 1), (7, 2), (33, 1000), (300, 5), (4, 5000)]
ACTIVATION_CASES = on_devices(
    "dtype, atol, rtol, shape, kind",
    [(*tol, shape, k) for tol in TOLERANCES for shape in ACTIVATION_SHAPES for k in KINDS],
    [(*tol, shape, k) for tol in TOLERANCES for shape in ACTIVATION_SHAPES[1:4] for k in KINDS],
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> None:
    """Like torch.testing.assert_close, but names the first mismatching index and its values."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    actual, expected = actual.cpu(), expected.cpu()
    bad = ~torch.isclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} elements differ; first at index {first}: "
            f"got {actual[first].item()!r}, expected {expected[first].item()!r} (atol={atol}, rtol={rtol})"
        )


def ragged(batch: int, tokens: int, hidden: int, dtype: torch.dtype, device: str = "cpu",
           padding: float = float("nan")):
    """Padded hidden states with ragged lengths that include a full row and a one-token row.

    Padding holds nan by default: a kernel that reads past a sequence's length poisons its
    result. A large finite `padding` catches a kernel that weighs padding in where nan would
    send it down its guarded path (numpy_ops' mean).
    """
    lengths = torch.randint(1, tokens + 1, (batch,))
    lengths[0] = tokens
    if batch > 1:
        lengths[-1] = 1
    x = torch.randn(batch, tokens, hidden, dtype=torch.float32)
    pad = torch.arange(tokens)[None, :] >= lengths[:, None]
    x[pad] = padding
    return x.to(dtype).to(device), lengths.to(device)


def kept(hidden: int, fraction):
    return None if fraction is None else max(1, int(hidden * fraction))


@SEQ_CASES
def test_seq_pool_matches_reference(device, dtype, atol, rtol, shape, method, head):
    normalize, fraction = head
    hidden, lengths = ragged(*shape, dtype, device)
    dims = kept(shape[2], fraction)
    got = seq_pool_triton(hidden, lengths, method, normalize=normalize, dimensions=dims)
    want = seq_pool_reference(hidden.cpu(), lengths.cpu(), method, normalize=normalize, dimensions=dims)
    assert got.device.type == device
    assert_close(got, want, atol, rtol)


@TOKEN_CASES
def test_token_pool_matches_reference(device, dtype, atol, rtol, shape, head):
    normalize, fraction = head
    hidden, lengths = ragged(*shape, dtype, device)
    dims = kept(shape[2], fraction)
    got = token_pool_triton(hidden, lengths, normalize=normalize, dimensions=dims)
    want = token_pool_reference(hidden.cpu(), lengths.cpu(), normalize=normalize, dimensions=dims)
    assert_close(got, want, atol, rtol)


@ACTIVATION_CASES
def test_activation_matches_reference(device, dtype, atol, rtol, shape, kind):
    logits = (torch.randn(shape) * 20).to(dtype).to(device)  # wide spread: sigmoid tails, peaked softmax
    got = activation_triton(logits, kind)
    assert_close(got, activation_reference(logits.cpu(), kind), atol, rtol)


# The NumPy ops (what CPU workers run) against the same reference, over the whole CPU grid, with
# padding that is nan and padding that is a large finite number.
PADDINGS = pytest.mark.parametrize("padding", [float("nan"), 1e4], ids=["nan-pad", "big-pad"])
NUMPY_TOLERANCES = pytest.mark.parametrize("dtype, atol, rtol", TOLERANCES, ids=_id)


@PADDINGS
@NUMPY_TOLERANCES
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("head", HEADS, ids=str)
def test_seq_pool_numpy_matches_reference(dtype, atol, rtol, shape, method, head, padding):
    normalize, fraction = head
    hidden, lengths = ragged(*shape, dtype, padding=padding)
    dims = kept(shape[2], fraction)
    got = seq_pool_numpy(hidden, lengths, method, normalize=normalize, dimensions=dims)
    want = seq_pool_reference(hidden, lengths, method, normalize=normalize, dimensions=dims)
    assert_close(got, want, atol, rtol)


@PADDINGS
@NUMPY_TOLERANCES
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("head", HEADS, ids=str)
def test_token_pool_numpy_matches_reference(dtype, atol, rtol, shape, head, padding):
    normalize, fraction = head
    hidden, lengths = ragged(*shape, dtype, padding=padding)
    dims = kept(shape[2], fraction)
    got = token_pool_numpy(hidden, lengths, normalize=normalize, dimensions=dims)
    assert_close(got, token_pool_reference(hidden, lengths, normalize=normalize, dimensions=dims),
                 atol, rtol)


@NUMPY_TOLERANCES
@pytest.mark.parametrize("shape", ACTIVATION_SHAPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_activation_numpy_matches_reference(dtype, atol, rtol, shape, kind):
    logits = (torch.randn(shape) * 20).to(dtype)
    assert_close(activation_numpy(logits, kind), activation_reference(logits, kind), atol, rtol)


@pytest.mark.parametrize("tokens", [1, 13, 128])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("head", HEADS, ids=str)
def test_one_row_pools_exactly_as_the_batch_op(tokens, method, head):
    """seq_pool_row (a one-row pass's NumPy output, every token real) gives the very bits the
    batch op gives for that row alone, and for the same row inside a padded batch within
    float32 rounding: a request's vector does not depend on which path computed it."""
    normalize, fraction = head
    row = torch.randn(1, tokens, 48)
    dims = kept(48, fraction)
    got = seq_pool_row(row.numpy(), method, normalize=normalize, dimensions=dims)
    assert isinstance(got, np.ndarray) and got.shape == (dims or 48,) and got.dtype == np.float32
    alone = seq_pool_numpy(row, torch.tensor([tokens]), method, normalize=normalize,
                           dimensions=dims)
    assert np.array_equal(got, alone[0].numpy())
    batch = torch.cat([row, torch.randn(1, tokens, 48)])
    batch = torch.cat([batch, torch.full((2, 5, 48), float("nan"))], dim=1)  # padding
    inside = seq_pool_numpy(batch, torch.tensor([tokens, tokens]), method,
                            normalize=normalize, dimensions=dims)
    assert_close(torch.from_numpy(got), inside[0], 1e-6, 1e-6)


def test_one_row_refuses_what_the_batch_op_refuses():
    row = np.zeros((1, 4, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="unknown pooling method 'max'"):
        seq_pool_row(row, "max")
    with pytest.raises(ValueError, match=r"dimensions = 9 is out of range; use 1..8"):
        seq_pool_row(row, "mean", dimensions=9)
    for shape in ((2, 4, 8), (4, 8), (1, 0, 8)):
        with pytest.raises(ValueError, match="one non-empty row"):
            seq_pool_row(np.zeros(shape, dtype=np.float32), "cls")


def test_numpy_mean_keeps_a_real_tokens_nan_and_drops_paddings():
    # A real token's nan or inf is the sequence's result, as in the reference; padding's never.
    hidden = torch.zeros(3, 3, 2)
    hidden[0, 1, 0] = float("nan")  # real
    hidden[1, 0, 1] = float("inf")  # real
    hidden[2, 2] = float("-inf")    # padding
    lengths = torch.tensor([3, 2, 2])
    got = seq_pool_numpy(hidden, lengths, "mean")
    want = seq_pool_reference(hidden, lengths, "mean")
    assert_close(got, want, 0, 0)
    assert math.isnan(got[0, 0]) and got[1, 1] == math.inf and got[2].tolist() == [0.0, 0.0]


def test_numpy_ops_take_views_grad_tensors_and_return_fresh_arrays():
    store = torch.randn(40, 6, 400)
    hidden = store.transpose(0, 1)[..., :384]  # [B, T, H], non-contiguous
    lengths = torch.tensor([40, 1, 7, 33, 12, 40, 99], dtype=torch.int32)[:6]
    for method in METHODS:
        want = seq_pool_reference(hidden, lengths, method, normalize=True)
        assert_close(seq_pool_numpy(hidden, lengths, method, normalize=True), want, 1e-5, 1e-5)
    assert_close(token_pool_numpy(hidden, lengths), token_pool_reference(hidden, lengths), 1e-6, 1e-6)
    weights = torch.randn(2, 5, 8, requires_grad=True)  # a torch backend's output outside no_grad
    got = seq_pool_numpy(weights, torch.tensor([5, 2]), "cls")
    assert not got.requires_grad and got.tolist() == weights[:, 0].tolist()
    got[0, 0] = 123.0
    assert weights[0, 0, 0] != 123.0  # never an alias of the caller's tensor
    logits = torch.randn(7, 33).t()
    for kind in KINDS:
        assert_close(activation_numpy(logits, kind), activation_reference(logits, kind), 1e-6, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_seq_pool_strided_input(device, method):
    # Hidden states as a view with odd strides (batch-major storage transposed, last dim sliced):
    # the kernels take strides, so no copy is needed and the result must not change.
    store = torch.randn(40, 6, 400, device=device)  # [T, B, H + 16]
    hidden = store.transpose(0, 1)[..., :384]  # [B, T, H], non-contiguous
    lengths = torch.tensor([40, 1, 7, 33, 12, 40], device=device)
    want = seq_pool_reference(hidden.contiguous().cpu(), lengths.cpu(), method, normalize=True)
    assert_close(seq_pool_triton(hidden, lengths, method, normalize=True), want, 1e-5, 1e-5)
    packed = token_pool_reference(hidden.contiguous().cpu(), lengths.cpu())
    assert_close(token_pool_triton(hidden, lengths), packed, 1e-5, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_lengths_and_logits(device):
    # Views as the engine may build them: every other entry of a lengths tensor, int32, and a
    # transposed [C, N] -> [N, C] logits tensor.
    hidden, _ = ragged(4, 30, 96, torch.float32, device)
    lengths = torch.tensor([30, 99, 3, 99, 1, 99, 17, 99], dtype=torch.int32, device=device)[::2]
    for method in METHODS:
        want = seq_pool_reference(hidden.cpu(), lengths.cpu(), method)
        assert_close(seq_pool_triton(hidden, lengths, method), want, 1e-5, 1e-5)
    want = token_pool_reference(hidden.cpu(), lengths.cpu())
    assert_close(token_pool_triton(hidden, lengths), want, 1e-5, 1e-5)
    logits = torch.randn(7, 33, device=device).t()  # [33, 7], column-major
    for kind in ("softmax", "sigmoid", "none"):
        assert_close(activation_triton(logits, kind), activation_reference(logits.cpu(), kind), 1e-5, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [None, 1000, 300, 129])
def test_seq_pool_split_columns(device, dims, monkeypatch):
    # The GPU splits an unnormalised row over several column blocks; force that split here.
    monkeypatch.setattr(seq_pool_kernel, "SPLIT_COLS", 128)
    hidden, lengths = ragged(3, 50, 1000, torch.float16, device)
    for method in METHODS:
        want = seq_pool_reference(hidden.cpu(), lengths.cpu(), method, dimensions=dims)
        assert_close(seq_pool_triton(hidden, lengths, method, dimensions=dims), want, 1e-5, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["softmax", "sigmoid", "none"])
def test_activation_class_loop(device, kind, monkeypatch):
    # Rows wider than one class tile take the looping (online softmax) path; force it here, with
    # the row maximum in a late block so the running max has to rescale the running sum.
    monkeypatch.setattr(activation_kernel, "MAX_BLOCK_C", 16)
    logits = torch.randn(9, 100, device=device) * 30
    logits[:, 77] = 500.0
    logits[0] = torch.linspace(-50, 50, 100)
    assert_close(activation_triton(logits, kind), activation_reference(logits.cpu(), kind), 1e-5, 1e-5)


# Small hand-computed cases, run through the public dispatch on both CPU sides: Triton under the
# interpreter, and the NumPy ops a CPU worker runs.


@pytest.fixture(params=[pytest.param("triton", marks=NEEDS_INTERPRETER), "numpy"])
def cpu_side(request, monkeypatch):
    monkeypatch.setattr(_launch, "INTERPRETED", request.param == "triton")
    assert kernels.backend_for(torch.zeros(1)) == request.param
    return request.param


def test_one_token_is_its_own_pool(cpu_side):
    hidden = torch.tensor([[[1.0, -2.0, 3.0]]])
    lengths = torch.tensor([1])
    for method in ("cls", "mean", "last"):
        assert kernels.seq_pool(hidden, lengths, method).tolist() == [[1.0, -2.0, 3.0]]
    assert kernels.token_pool(hidden, lengths).tolist() == [[1.0, -2.0, 3.0]]


def test_known_means_and_positions(cpu_side):
    hidden = torch.tensor(
        [
            [[1.0, 10.0], [3.0, 20.0], [99.0, 99.0]],  # 2 real tokens, then padding
            [[2.0, 0.0], [4.0, 3.0], [6.0, 6.0]],  # 3 real tokens
        ]
    )
    lengths = torch.tensor([2, 3], dtype=torch.int32)
    assert kernels.seq_pool(hidden, lengths, "mean").tolist() == [[2.0, 15.0], [4.0, 3.0]]
    assert kernels.seq_pool(hidden, lengths, "cls").tolist() == [[1.0, 10.0], [2.0, 0.0]]
    # LAST is the final real token, never the final padded position.
    assert kernels.seq_pool(hidden, lengths, "last").tolist() == [[3.0, 20.0], [6.0, 6.0]]


def test_truncate_then_normalize(cpu_side):
    hidden = torch.tensor([[[3.0, 4.0, 12.0]]])
    lengths = torch.tensor([1])
    # Matryoshka keeps [3, 4] first, then normalises it: [0.6, 0.8], not [3/13, 4/13].
    got = kernels.seq_pool(hidden, lengths, "cls", normalize=True, dimensions=2)
    assert_close(got, torch.tensor([[0.6, 0.8]]), 1e-7, 1e-6)
    got = kernels.token_pool(hidden, lengths, normalize=True, dimensions=2)
    assert_close(got, torch.tensor([[0.6, 0.8]]), 1e-7, 1e-6)
    got = kernels.seq_pool(hidden, lengths, "cls", normalize=True)
    assert_close(got, torch.tensor([[3 / 13, 4 / 13, 12 / 13]]), 1e-7, 1e-6)
    # Any integer type is a width, numpy's included (settings may come through numpy).
    assert kernels.seq_pool(hidden, lengths, "cls", dimensions=np.int64(2)).tolist() == [[3.0, 4.0]]


def test_zero_vector_normalizes_to_zero(cpu_side):
    hidden = torch.zeros(2, 3, 5)
    lengths = torch.tensor([3, 1])
    assert kernels.seq_pool(hidden, lengths, "mean", normalize=True).tolist() == [[0.0] * 5] * 2
    assert kernels.token_pool(hidden, lengths, normalize=True).tolist() == [[0.0] * 5] * 4


def test_fp16_input_accumulates_in_fp32(cpu_side):
    # An fp16 running sum of ones stops at 2048 (2048 + 1 rounds back to 2048); fp32 does not.
    hidden = torch.ones(1, 3000, 8, dtype=torch.float16)
    lengths = torch.tensor([3000])
    got = kernels.seq_pool(hidden, lengths, "mean")
    assert got.dtype == torch.float32
    assert got.tolist() == [[1.0] * 8]


def test_bf16_values_upcast_exactly(cpu_side):
    hidden = torch.tensor([[[1.0078125, -3.5]]], dtype=torch.bfloat16)  # exact in bf16
    assert kernels.seq_pool(hidden, torch.tensor([1]), "last").tolist() == [[1.0078125, -3.5]]


def test_token_pool_packs_in_sequence_order(cpu_side):
    # Each feature encodes (sequence, token) so the packed order can be read back.
    batch, tokens = 3, 4
    hidden = torch.tensor([[[10.0 * b + t, -(10.0 * b + t)] for t in range(tokens)] for b in range(batch)])
    lengths = torch.tensor([2, 4, 1])
    got = kernels.token_pool(hidden, lengths)
    codes = [0, 1, 10, 11, 12, 13, 20]
    assert got.tolist() == [[c, -c] for c in codes]


def test_softmax_known_values(cpu_side):
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    e = [math.exp(v) for v in (1.0, 2.0, 3.0)]
    want = torch.tensor([[v / sum(e) for v in e], [1 / 3] * 3])
    assert_close(kernels.activation(logits, "softmax"), want, 1e-7, 1e-6)


def test_softmax_large_logits_do_not_overflow(cpu_side):
    logits = torch.tensor([[1000.0, 0.0, -1000.0], [1000.0, 1000.0, 1000.0], [-1000.0, -1000.0, 1000.0]])
    got = kernels.activation(logits, "softmax")
    assert torch.isfinite(got).all()
    want = torch.tensor([[1.0, 0.0, 0.0], [1 / 3] * 3, [0.0, 0.0, 1.0]])
    assert_close(got, want, 1e-7, 1e-6)
    half = kernels.activation(torch.tensor([[1000.0, 1000.0]], dtype=torch.float16), "softmax")
    assert half.tolist() == [[0.5, 0.5]]


def test_sigmoid_known_values_and_tails(cpu_side):
    logits = torch.tensor([[0.0, 1000.0, -1000.0, math.log(3.0)]])
    got = kernels.activation(logits, "sigmoid")
    assert_close(got, torch.tensor([[0.5, 1.0, 0.0, 0.75]]), 1e-7, 1e-6)


def test_none_is_a_float32_copy(cpu_side):
    logits = torch.tensor([[1.5, -2.0]], dtype=torch.float16)
    got = kernels.activation(logits, "none")
    assert got.dtype == torch.float32 and got.tolist() == [[1.5, -2.0]]
    same = torch.tensor([[1.0, 2.0]])
    out = kernels.activation(same, "none")
    out[0, 0] = 9.0
    assert same[0, 0] == 1.0  # never an alias of the input


# Errors: both backends run the same checks, so each bad call must fail the same way on both.

GOOD_HIDDEN = torch.zeros(2, 4, 8)
GOOD_LENGTHS = torch.tensor([4, 1])
POOL_ERRORS = [
    ({"lengths": torch.tensor([5, 1])}, "lengths[0] = 5"),
    ({"lengths": torch.tensor([4, 0])}, "lengths[1] = 0"),
    ({"lengths": torch.tensor([-2, 1])}, "lengths[0] = -2"),
    ({"lengths": torch.tensor([4.0, 1.0])}, "torch.float32"),
    ({"lengths": torch.tensor([4, 1], dtype=torch.int16)}, "torch.int16"),
    ({"lengths": [4, 1]}, "list"),
    ({"lengths": torch.tensor([4, 1, 1])}, "(3,)"),
    ({"hidden": torch.zeros(0, 4, 8), "lengths": torch.zeros(0, dtype=torch.int64)}, "empty batch"),
    ({"hidden": torch.zeros(2, 8)}, "(2, 8)"),
    ({"hidden": torch.zeros(2, 4, 8, dtype=torch.int32)}, "torch.int32"),
    ({"dimensions": 9}, "dimensions = 9"),
    ({"dimensions": 0}, "dimensions = 0"),
    ({"dimensions": True}, "True"),
]


POOL_OPS = {"triton": (seq_pool_triton, token_pool_triton),
            "numpy": (seq_pool_numpy, token_pool_numpy),
            "reference": (seq_pool_reference, token_pool_reference)}


@pytest.mark.parametrize("backend", list(POOL_OPS))
@pytest.mark.parametrize("change, message", POOL_ERRORS, ids=lambda v: str(v)[:40])
def test_pool_errors_name_the_value(backend, change, message):
    args = {"hidden": GOOD_HIDDEN, "lengths": GOOD_LENGTHS, "dimensions": None, **change}
    seq, tok = POOL_OPS[backend]
    with pytest.raises(ValueError) as err:
        seq(args["hidden"], args["lengths"], "mean", dimensions=args["dimensions"])
    assert message in str(err.value)
    with pytest.raises(ValueError) as err:
        tok(args["hidden"], args["lengths"], dimensions=args["dimensions"])
    assert message in str(err.value)


@pytest.mark.parametrize("op", [seq_pool_triton, seq_pool_numpy, seq_pool_reference])
def test_unknown_method(op):
    with pytest.raises(ValueError, match="'max'"):
        op(GOOD_HIDDEN, GOOD_LENGTHS, "max")


ACTIVATION_ERRORS = [
    (torch.zeros(2, 3), "softmax2", "'softmax2'"),
    (torch.zeros(2, 3, 4), "softmax", "(2, 3, 4)"),
    (torch.zeros(0, 3), "softmax", "(0, 3)"),
    (torch.zeros(2, 0), "sigmoid", "(2, 0)"),
    (torch.zeros(2, 3, dtype=torch.int64), "none", "torch.int64"),
]


@pytest.mark.parametrize("op", [activation_triton, activation_numpy, activation_reference])
@pytest.mark.parametrize("logits, kind, message", ACTIVATION_ERRORS)
def test_activation_errors_name_the_value(op, logits, kind, message):
    with pytest.raises(ValueError) as err:
        op(logits, kind)
    assert message in str(err.value)


# Dispatch.


def test_cpu_routes_to_triton_under_the_interpreter(monkeypatch):
    calls = []
    for side in ("triton", "numpy", "reference"):
        monkeypatch.setattr(dispatch, f"seq_pool_{side}", lambda *a, _s=side, **k: calls.append(_s))
    monkeypatch.setattr(_launch, "INTERPRETED", True)
    assert kernels.backend_for(GOOD_HIDDEN) == "triton"
    kernels.seq_pool(GOOD_HIDDEN, GOOD_LENGTHS, "mean")
    monkeypatch.setattr(_launch, "INTERPRETED", False)
    assert kernels.backend_for(GOOD_HIDDEN) == "numpy"
    kernels.seq_pool(GOOD_HIDDEN, GOOD_LENGTHS, "mean")
    assert calls == ["triton", "numpy"]
    assert kernels.describe_backend("cpu") == "NumPy (Triton kernels run on CUDA devices)"


def test_other_devices_run_the_references(monkeypatch):
    monkeypatch.setattr(_launch, "INTERPRETED", False)
    assert kernels.backend_for(torch.empty(2, 3, device="meta")) == "reference"
    assert kernels.describe_backend("meta") == "PyTorch references (Triton kernels run on CUDA devices)"
    monkeypatch.setattr(dispatch, "TRITON_AVAILABLE", False)
    assert kernels.describe_backend("cpu") == "NumPy (Triton is not installed)"


@pytest.mark.parametrize("interpreted", [True, False])
def test_every_op_routes_by_backend(interpreted, monkeypatch):
    calls = []
    for name in ("seq_pool", "token_pool", "activation"):
        for side in ("triton", "numpy", "reference"):
            monkeypatch.setattr(dispatch, f"{name}_{side}", lambda *a, _s=side, **k: calls.append(_s))
    monkeypatch.setattr(_launch, "INTERPRETED", interpreted)
    kernels.seq_pool(GOOD_HIDDEN, GOOD_LENGTHS, "cls", normalize=True, dimensions=4)
    kernels.token_pool(GOOD_HIDDEN, GOOD_LENGTHS)
    kernels.activation(torch.zeros(2, 3), "softmax")
    assert calls == ["triton" if interpreted else "numpy"] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_routes_to_triton(monkeypatch):
    monkeypatch.setattr(_launch, "INTERPRETED", False)
    hidden = GOOD_HIDDEN.cuda()
    assert kernels.backend_for(hidden) == "triton"
    got = kernels.seq_pool(hidden, GOOD_LENGTHS, "mean")  # lengths may stay on the host
    assert got.device.type == "cuda"


def test_dispatch_passes_arguments_through():
    hidden, lengths = ragged(3, 10, 24, torch.float32)
    got = kernels.seq_pool(hidden, lengths, "mean", normalize=True, dimensions=10)
    want = seq_pool_reference(hidden, lengths, "mean", normalize=True, dimensions=10)
    assert_close(got, want, 1e-5, 1e-5)
    got = kernels.token_pool(hidden, lengths, normalize=True, dimensions=5)
    assert_close(got, token_pool_reference(hidden, lengths, normalize=True, dimensions=5), 1e-5, 1e-5)
