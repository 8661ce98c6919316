"""Property tests for the host wrappers: any valid call agrees with the reference, and any invalid
call raises ValueError naming the offending value, on both backends alike."""

import os

# Must precede importing kernels: triton.jit picks interpreter mode at decoration (see conftest).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from poolwire.kernels import (  # noqa: E402
    _launch,
    activation_reference,
    activation_triton,
    seq_pool_reference,
    seq_pool_triton,
    token_pool_reference,
    token_pool_triton,
)

# The agreement properties launch kernels on CPU tensors; the error properties stop in the host
# checks before any launch, so they run whatever the mode.
needs_interpreter = pytest.mark.skipif(
    not _launch.INTERPRETED,
    reason="CPU runs Triton only with TRITON_INTERPRET=1 set before importing kernels",
)

# Modest and reproducible: every interpreted example launches a kernel. database=None keeps
# hypothesis from writing a .hypothesis folder into the work tree; the function-scoped fixtures
# the suite's conftest may add (seeds, event loops) hold no state these tests depend on.
KERNEL_RUNS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
CHECKS_ONLY = settings(KERNEL_RUNS, max_examples=100)

FLOAT_DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
LENGTH_DTYPES = st.sampled_from([torch.int64, torch.int32])
TOL = {"atol": 1e-5, "rtol": 1e-5}  # fp32 summation order only; see TOLERANCES in test_kernels.py


@st.composite
def pool_calls(draw):
    """A valid (hidden, lengths, dimensions) with ragged lengths and any H, powers of two or not."""
    batch = draw(st.integers(1, 6))
    tokens = draw(st.integers(1, 40))
    hidden_size = draw(st.one_of(st.integers(1, 130), st.sampled_from([384, 1000])))
    lengths = draw(st.lists(st.integers(1, tokens), min_size=batch, max_size=batch))
    dimensions = draw(st.one_of(st.none(), st.integers(1, hidden_size)))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, hidden_size, generator=gen).to(draw(FLOAT_DTYPES))
    return hidden, torch.tensor(lengths, dtype=draw(LENGTH_DTYPES)), dimensions


@needs_interpreter
@KERNEL_RUNS
@given(call=pool_calls(), method=st.sampled_from(["cls", "mean", "last"]), normalize=st.booleans())
def test_seq_pool_agrees_with_reference(call, method, normalize):
    hidden, lengths, dims = call
    got = seq_pool_triton(hidden, lengths, method, normalize=normalize, dimensions=dims)
    want = seq_pool_reference(hidden, lengths, method, normalize=normalize, dimensions=dims)
    assert got.shape == (hidden.shape[0], dims or hidden.shape[2])
    torch.testing.assert_close(got, want, **TOL)


@needs_interpreter
@KERNEL_RUNS
@given(call=pool_calls(), normalize=st.booleans())
def test_token_pool_agrees_with_reference(call, normalize):
    hidden, lengths, dims = call
    got = token_pool_triton(hidden, lengths, normalize=normalize, dimensions=dims)
    want = token_pool_reference(hidden, lengths, normalize=normalize, dimensions=dims)
    assert got.shape == (int(lengths.sum()), dims or hidden.shape[2])
    torch.testing.assert_close(got, want, **TOL)


@needs_interpreter
@KERNEL_RUNS
@given(
    rows=st.integers(1, 50),
    classes=st.integers(1, 300),
    scale=st.sampled_from([1.0, 30.0, 1000.0]),
    kind=st.sampled_from(["softmax", "sigmoid", "none"]),
    dtype=FLOAT_DTYPES,
    seed=st.integers(0, 2**31 - 1),
)
def test_activation_agrees_with_reference(rows, classes, scale, kind, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, classes, generator=gen) * scale).to(dtype)
    got = activation_triton(logits, kind)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, activation_reference(logits, kind), **TOL)


def both_backends(call):
    """Run `call` on the Triton wrappers and on the references; both must raise ValueError."""
    messages = []
    for seq, tok in ((seq_pool_triton, token_pool_triton), (seq_pool_reference, token_pool_reference)):
        ops = (lambda h, ln, d: seq(h, ln, "mean", dimensions=d), lambda h, ln, d: tok(h, ln, dimensions=d))
        for op in ops:
            with pytest.raises(ValueError) as err:
                call(op)
            messages.append(str(err.value))
    assert len(set(messages)) == 1, messages  # one shared check, one message
    return messages[0]


@CHECKS_ONLY
@given(call=pool_calls(), excess=st.integers(1, 1000), data=st.data())
def test_length_past_t_is_named(call, excess, data):
    hidden, lengths, dims = call
    row = data.draw(st.integers(0, len(lengths) - 1))
    bad = lengths.clone()
    bad[row] = hidden.shape[1] + excess
    message = both_backends(lambda op: op(hidden, bad, dims))
    assert f"lengths[{row}] = {hidden.shape[1] + excess}" in message


@CHECKS_ONLY
@given(call=pool_calls(), value=st.integers(-5, 0), data=st.data())
def test_empty_or_negative_row_is_named(call, value, data):
    hidden, lengths, dims = call
    row = data.draw(st.integers(0, len(lengths) - 1))
    bad = lengths.clone()
    bad[row] = value
    assert f"lengths[{row}] = {value}" in both_backends(lambda op: op(hidden, bad, dims))


@CHECKS_ONLY
@given(call=pool_calls(), data=st.data())
def test_dimensions_out_of_range_are_named(call, data):
    hidden, lengths, _ = call
    size = hidden.shape[2]
    dims = data.draw(st.one_of(st.integers(size + 1, size + 5000), st.integers(-100, 0)))
    assert f"dimensions = {dims}" in both_backends(lambda op: op(hidden, lengths, dims))


@CHECKS_ONLY
@given(
    call=pool_calls(),
    dtype=st.sampled_from(
        [torch.float32, torch.float64, torch.float16, torch.int16, torch.uint8, torch.bool]
    ),
)
def test_wrong_lengths_dtype_is_named(call, dtype):
    hidden, lengths, dims = call
    assert str(dtype) in both_backends(lambda op: op(hidden, lengths.to(dtype), dims))


@CHECKS_ONLY
@given(tokens=st.integers(0, 40), hidden_size=st.integers(1, 64), dtype=FLOAT_DTYPES)
def test_empty_batch_is_named(tokens, hidden_size, dtype):
    hidden = torch.zeros(0, tokens, hidden_size, dtype=dtype)
    message = both_backends(lambda op: op(hidden, torch.zeros(0, dtype=torch.int64), None))
    assert "empty batch" in message and str((0, tokens, hidden_size)) in message


@CHECKS_ONLY
@given(rows=st.integers(0, 5), classes=st.integers(0, 5), kind=st.text(max_size=8))
def test_activation_rejects_bad_calls(rows, classes, kind):
    logits = torch.zeros(rows, classes)
    assume(kind not in ("softmax", "sigmoid", "none") or not rows or not classes)  # valid calls: see above
    for op in (activation_triton, activation_reference):
        with pytest.raises(ValueError) as err:
            op(logits, kind)
        named = repr(kind) if kind not in ("softmax", "sigmoid", "none") else str((rows, classes))
        assert named in str(err.value)
