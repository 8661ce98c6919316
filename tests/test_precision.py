"""The precision decision (`--precision exact|fast`): values in, values out, per device, dtype
and CPU; and the autocast context the forward pass runs in."""

import pytest
import torch

from poolwire.models.precision import EXACT, autocast, choose_precision, cpu_has_bf16, precision_for
from poolwire.settings import WorkerSettings


def test_exact_is_the_default_and_never_autocasts():
    assert WorkerSettings().precision == "exact"
    for device in ("cpu", "cuda"):
        for dtype in ("float32", "float16", "bfloat16"):
            plan = choose_precision("exact", device, dtype, cpu_has_bf16=True)
            assert (plan.served, plan.autocast, plan.note) == ("exact", None, "")


def test_fast_is_bfloat16_autocast_on_a_cpu_with_bfloat16_and_float16_on_cuda():
    cpu = choose_precision("fast", "cpu", "float32", cpu_has_bf16=True)
    assert (cpu.served, cpu.autocast, cpu.device_type) == ("fast", torch.bfloat16, "cpu")
    cuda = choose_precision("fast", "cuda", "float32", cpu_has_bf16=False)  # the CPU is irrelevant
    assert (cuda.served, cuda.autocast, cuda.device_type) == ("fast", torch.float16, "cuda")
    assert "float16 autocast" in cuda.describe() and "bfloat16 autocast" in cpu.describe()


def test_fast_on_a_cpu_without_bfloat16_serves_float32_and_says_why():
    plan = choose_precision("fast", "cpu", "float32", cpu_has_bf16=False)
    assert (plan.requested, plan.served, plan.autocast) == ("fast", "exact", None)
    assert "no native bfloat16" in plan.note and "serving float32" in plan.describe()


def test_an_unknown_device_type_falls_back_to_float32():
    plan = choose_precision("fast", "mps", "float32", cpu_has_bf16=True)
    assert plan.served == "exact" and "'mps'" in plan.note


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fast_with_cast_weights_is_refused_naming_both_ways_out(dtype):
    with pytest.raises(ValueError, match=f"--dtype {dtype} already cast") as info:
        choose_precision("fast", "cpu", dtype, cpu_has_bf16=True)
    assert "--dtype float32 with --precision fast" in str(info.value)
    assert f"--dtype {dtype} with --precision exact" in str(info.value)


def test_an_unknown_precision_is_named():
    with pytest.raises(ValueError, match="'turbo' is not one of exact, fast"):
        choose_precision("turbo", "cpu", "float32", cpu_has_bf16=True)


def test_the_cpu_check_agrees_with_torchs_own():
    # torch routes bfloat16 matmuls to oneDNN exactly when this says so; a bool either way.
    assert cpu_has_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    plan = precision_for("fast", torch.device("cpu"), "float32")
    assert plan.served == ("fast" if cpu_has_bf16() else "exact")


def test_autocast_runs_linears_in_the_fast_dtype_only():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with autocast(EXACT):
        assert layer(x).dtype == torch.float32
    with autocast(choose_precision("fast", "cpu", "float32", cpu_has_bf16=True)):
        assert layer(x).dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32  # nothing leaks out of the context
