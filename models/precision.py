"""Which arithmetic the forward pass runs in (`--precision exact|fast`).

`exact` runs the weights as loaded (float32 unless `--dtype` cast them). `fast` keeps float32
weights and runs the model under torch.autocast: matmuls and linears in bfloat16 (CPU) or
float16 (CUDA), while autocast keeps the accuracy-sensitive operations (layer norm, softmax,
reductions) in float32. Casting the weights instead (`--dtype`) loses more accuracy for the
same speed (docs/PERFORMANCE.md, "Precision").

A CPU without bfloat16 support in oneDNN (neither AVX-512 nor ARM BF16) computes bfloat16
matmuls in a slow generic path: there `fast` would be 2x to 6x slower than float32, so the worker
serves float32 (`exact`) instead and says so at start-up."""

import contextlib
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("exact", "fast")

# On CUDA float16 rather than bfloat16: every CUDA GPU with tensor cores has it (bfloat16 needs
# Ampere or later), and its 10-bit mantissa keeps the embeddings closer to float32 than
# bfloat16's 7 bits; autocast keeps the ops that could overflow float16 in float32.
FAST_AUTOCAST = {"cpu": torch.bfloat16, "cuda": torch.float16}


@dataclass(frozen=True)
class PrecisionPlan:
    """What the worker serves. `served` is "exact" or "fast"; `autocast` is the autocast dtype
    of the fast mode (None for exact); `note` says why a requested fast mode was not served."""

    requested: str
    served: str
    device_type: str
    autocast: torch.dtype | None = None
    note: str = ""
    ov_hint: str | None = None   # OpenVINO's INFERENCE_PRECISION_HINT ("f32", "bf16")

    def describe(self) -> str:
        if self.ov_hint is not None:
            text = f"precision {self.served} (OpenVINO inference precision {self.ov_hint})"
        elif self.autocast is None:
            text = f"precision {self.served} (the weights' own dtype, no autocast)"
        else:
            kind = str(self.autocast).removeprefix("torch.")
            text = f"precision {self.served} (float32 weights under {kind} autocast)"
        return f"{text}; {self.note}" if self.note else text


EXACT = PrecisionPlan("exact", "exact", "cpu")


def choose_precision(requested: str, device_type: str, weights_dtype: str,
                     cpu_has_bf16: bool) -> PrecisionPlan:
    """Decide the served precision from the request, the device type ("cpu", "cuda"), the
    weights' dtype (`--dtype`) and whether this CPU computes bfloat16 natively. Raises
    ValueError for a combination that cannot be served as asked."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision {requested!r} is not one of {', '.join(PRECISIONS)}")
    if requested == "exact":
        return PrecisionPlan(requested, "exact", device_type)
    if weights_dtype != "float32":
        raise ValueError(f"--precision fast runs float32 weights under autocast, but --dtype "
                         f"{weights_dtype} already cast the weights: pass --dtype float32 with "
                         f"--precision fast, or keep --dtype {weights_dtype} with --precision exact")
    if device_type not in FAST_AUTOCAST:
        return PrecisionPlan(requested, "exact", device_type,
                             note=f"fast precision has no autocast type for device "
                                  f"{device_type!r}: serving float32")
    if device_type == "cpu" and not cpu_has_bf16:
        return PrecisionPlan(requested, "exact", device_type,
                             note="this CPU has no native bfloat16 (oneDNN needs AVX-512 or ARM "
                                  "BF16), where bfloat16 autocast is slower than float32: "
                                  "serving float32")
    return PrecisionPlan(requested, "fast", device_type, FAST_AUTOCAST[device_type])


def cpu_has_bf16() -> bool:
    """Whether torch runs bfloat16 matmuls on this CPU through oneDNN's native kernels: the
    same check torch itself makes before taking that path (AVX-512 BW/VL/DQ or ARM BF16)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and check is not None and check())
    except RuntimeError:  # a build without oneDNN's operators
        return False


def precision_for(requested: str, device: torch.device, weights_dtype: str) -> PrecisionPlan:
    """choose_precision for this machine's device and CPU."""
    has_bf16 = cpu_has_bf16() if device.type == "cpu" and requested == "fast" else False
    plan = choose_precision(requested, device.type, weights_dtype, has_bf16)
    if plan.note:
        log.warning("--precision %s: %s", requested, plan.note)
    return plan


def choose_openvino_precision(requested: str, weights_dtype: str,
                              capabilities: list[str]) -> PrecisionPlan:
    """The OpenVINO backend's precision: `exact` is the f32 inference precision hint (the
    CPU plugin would otherwise pick bf16 on a CPU that has it); `fast` is bf16 where the CPU
    plugin lists BF16 among its OPTIMIZATION_CAPABILITIES (AVX-512 BF16 or AMX), else f32 with
    the note saying so, for the same reason as torch's `fast` (bfloat16 emulated is slower)."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision {requested!r} is not one of {', '.join(PRECISIONS)}")
    if requested == "fast" and weights_dtype != "float32":
        raise ValueError(f"--precision fast runs float32 weights at a lower precision, but "
                         f"--dtype {weights_dtype} already cast the weights: pass --dtype "
                         f"float32 with --precision fast")
    if requested == "exact":
        return PrecisionPlan(requested, "exact", "cpu", ov_hint="f32")
    if "BF16" not in capabilities:
        return PrecisionPlan(requested, "exact", "cpu", ov_hint="f32",
                             note="this CPU has no native bfloat16 (OpenVINO's CPU plugin lists "
                                  "no BF16 capability), where bfloat16 is slower than float32: "
                                  "serving float32")
    return PrecisionPlan(requested, "fast", "cpu", ov_hint="bf16")


def autocast(plan: PrecisionPlan):
    """The context the forward pass runs in: torch.autocast for `fast`, nothing for `exact`."""
    if plan.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=plan.device_type, dtype=plan.autocast)
