"""Which backend serves (`--backend auto|torch|openvino`): the rule (`plan_backend`,
`outputs_agree`, pure) and the start that follows it (`build_backend`).

`auto` serves OpenVINO on a CPU where it is importable, converts this model and gives torch's
outputs on a check batch; torch on CUDA; else torch, with the reason on the start-up line.
`openvino` asked for where it cannot serve is a start-up error (BackendError, one line)."""

import logging
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from poolwire.models.backend import Backend, TorchBackend
from poolwire.models.model import LoadedModel
from poolwire.models.precision import PrecisionPlan, precision_for

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "openvino")

# How close OpenVINO's outputs must be to torch float32's on the check batch, relative to the
# outputs' largest magnitude: f32 differs by summation order only (4e-6 of MiniLM's hidden
# states, 1e-7 on the zoo's logits, measured); bf16 keeps 8 bits of mantissa, so it is judged by
# the direction of each output row (the pooled vectors' cosine is what users see).
EXACT_TOLERANCE = 1e-4
FAST_MIN_COSINE = 0.999


class BackendError(ValueError):
    """`--backend` cannot be served as asked; the message says why and what to pass."""


@dataclass(frozen=True)
class BackendPlan:
    try_openvino: bool   # convert and check the model with OpenVINO
    required: bool       # --backend openvino: a failure is a start-up error, not a fallback
    reason: str = ""     # why torch serves, when it does and was not asked for


def plan_backend(requested: str, device: str, weights_dtype: str,
                 openvino_missing: str | None) -> BackendPlan:
    """From `--backend`, the model's device ("cpu", "cuda:0"), its weights' dtype and why
    openvino cannot be imported (None: it can)."""
    if requested not in BACKENDS:
        raise BackendError(f"--backend {requested!r} is not one of {', '.join(BACKENDS)}")
    if requested == "torch":
        return BackendPlan(False, False)
    required = requested == "openvino"
    if not device.startswith("cpu"):
        if required:
            raise BackendError(f"--backend openvino serves the CPU, and the model is on "
                               f"{device}: pass --device cpu, or --backend torch")
        return BackendPlan(False, False, f"auto chose torch on {device}")
    why_not = None
    if openvino_missing is not None:
        why_not = f"openvino is not installed ({openvino_missing})"
    elif weights_dtype != "float32":
        why_not = f"OpenVINO converts float32 weights, and --dtype {weights_dtype} cast them"
    if why_not is None:
        return BackendPlan(True, required)
    if required:
        raise BackendError(f"--backend openvino cannot serve: {why_not}; pass --backend torch "
                           f"or auto")
    return BackendPlan(False, False, f"auto chose torch: {why_not}")


def outputs_agree(want: torch.Tensor, got: torch.Tensor, mask: torch.Tensor,
                  served: str) -> str | None:
    """None when OpenVINO's outputs (`got`) match torch float32's (`want`) on the real tokens
    of the batch (rows [B, ...] or token rows [B, T, ...] under `mask` [B, T]); else why not."""
    if tuple(got.shape) != tuple(want.shape):
        return f"its outputs have shape {tuple(got.shape)}, torch's {tuple(want.shape)}"
    want, got = want.float(), got.float()
    if want.dim() == 3:  # only real tokens count: padded positions are never pooled
        keep = mask.bool()
        want, got = want[keep], got[keep]
    if not torch.isfinite(got).all():
        return "its outputs are not all finite"
    if served == "exact":
        scale = max(1.0, want.abs().max().item())
        diff = (got - want).abs().max().item()
        if diff > EXACT_TOLERANCE * scale:
            return (f"its outputs differ from torch's by {diff:.3g} (more than "
                    f"{EXACT_TOLERANCE:g} x {scale:.3g})")
        return None
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=-1, eps=1e-12).min().item()
    if cosine < FAST_MIN_COSINE:
        return f"its outputs' cosine to torch's is {cosine:.6f} (under {FAST_MIN_COSINE})"
    return None


CHECK_TEXTS = ("poolwire", "A short sentence to check the converted model against torch.",
               "Two texts, as a cross-encoder takes them.")


def check_batch(model: LoadedModel):
    """Real token ids of texts of different lengths (one of them a pair), right-padded."""
    tok = model.tokenizer
    rows = [tok(CHECK_TEXTS[0]), tok(CHECK_TEXTS[1]), tok(CHECK_TEXTS[1], CHECK_TEXTS[2])]
    ids = [r["input_ids"][: model.max_length] for r in rows]
    types = [(r.get("token_type_ids") or [0] * len(r["input_ids"]))[: model.max_length]
             for r in rows]
    width = max(map(len, ids))
    pad = model.pad_id
    out = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(out)
    segments = torch.zeros_like(out)
    for row, (i, t) in enumerate(zip(ids, types)):
        out[row, : len(i)] = torch.tensor(i)
        mask[row, : len(i)] = 1
        segments[row, : len(t)] = torch.tensor(t)
    return out, mask, segments


def _openvino_missing() -> str | None:
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


# One OpenVINO backend per loaded model and precision in a process: workers that share a model
# (the tests, several workers in one process) share its compiled model too, instead of
# compiling it again. Its one infer request is guarded by the backend's lock.
_shared: dict = {}


def _shared_openvino(model: LoadedModel, precision: PrecisionPlan, cache_dir: Path | None,
                     threads: int | None):
    from poolwire.models.openvino_backend import OpenVinoBackend, forwards_for

    key = (id(model), precision, threads)  # where it is cached on disk does not change what it computes
    entry = _shared.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1], entry[2]
    backend = OpenVinoBackend(model, precision, cache_dir, threads)
    ids, mask, types = check_batch(model)
    reference = TorchBackend(model)
    why = None
    for forward in forwards_for(model):
        want = reference.run(forward, ids, mask, types)
        # Every compiled pass (the all-cores one and its one-thread twin) on the same batch.
        for got in backend.run_each(forward, ids, mask, types):
            why = outputs_agree(want, got, mask, precision.served)
            if why is not None:
                break
        if why is not None:
            why = f"OpenVINO's {forward} pass on the check batch: {why}"
            break
    _shared[key] = (weakref.ref(model), backend, why)
    weakref.finalize(model, _shared.pop, key, None)
    return backend, why


def build_backend(requested: str, model: LoadedModel, precision: str, weights_dtype: str,
                  cache_dir: Path | None, threads: int | None = None) -> Backend:
    """The backend `--backend` asks for on this machine and model (see the module's
    docstring); raises BackendError where `openvino` was asked for and cannot serve."""
    from poolwire.models.openvino_backend import OpenVinoUnavailable

    if model.adapters is not None and requested != "torch":
        # An OpenVINO model is compiled once, with the base weights; PEFT switches LoRA
        # adapters per batch inside the torch module.
        why = (f"the LoRA adapters ({', '.join(model.adapter_names)}) are applied by PEFT on "
               f"torch, and OpenVINO compiles the base model only")
        if requested == "openvino":
            raise BackendError(f"--backend openvino cannot serve: {why}; pass --backend torch "
                               f"or auto, or leave the adapters out")
        reason = f"auto chose torch: {why}"
        log.warning("--backend %s: %s", requested, reason)
        return TorchBackend(model, precision_for(precision, model.device, weights_dtype), reason)
    plan = plan_backend(requested, str(model.device), weights_dtype,
                        _openvino_missing() if requested != "torch" else None)
    reason = plan.reason
    if plan.try_openvino and model.towers is not None:
        # Converting the two towers (and SigLIP 2's variable patches) and checking both against
        # torch is not done: torch serves them, and says so.
        why = (f"{model.name} is a {model.towers.model_type} model (texts and images), whose "
               f"towers poolwire serves with torch only")
        if plan.required:
            raise BackendError(f"--backend openvino cannot serve {model.name}: {why}; pass "
                               f"--backend torch or auto")
        plan, reason = BackendPlan(False, False), f"auto chose torch: {why}"
    if plan.try_openvino:
        import openvino as ov

        from poolwire.models.precision import choose_openvino_precision

        ov_plan = choose_openvino_precision(
            precision, weights_dtype, ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        try:
            backend, why = _shared_openvino(model, ov_plan, cache_dir, threads)
        except OpenVinoUnavailable as exc:
            backend, why = None, str(exc)
        if why is None:
            if ov_plan.note:
                log.warning("--precision %s: %s", precision, ov_plan.note)
            return backend
        if plan.required:
            raise BackendError(f"--backend openvino cannot serve {model.name}: {why}; pass "
                               f"--backend torch or auto")
        reason = f"auto chose torch: {why}"
    if reason:
        log.warning("--backend %s: %s", requested, reason)
    return TorchBackend(model, precision_for(precision, model.device, weights_dtype), reason)
