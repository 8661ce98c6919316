"""The attention a model is traced with for OpenVINO (`traceable_attention`): transformers' own
SDPA attention under a name of ours, with a mask builder that the tracer and the converted graph
both take. Registered through transformers' AttentionInterface / AttentionMaskInterface, the
documented way to give a model another attention implementation, and set on the module only
while it is traced, so torch serving never sees it.

Two things in transformers' `sdpa` mask break a conversion, both measured (issue 27):
- A mask with an extra rule (Gemma3's bidirectional attention and its bidirectional sliding
  window, any `or_mask_function` / `and_mask_function`) is built with `torch.vmap`, which
  `torch.jit.trace` cannot record ("Couldn't get TorchScript module by tracing").
  The rules transformers ships are index arithmetic that broadcasts, so the mask is built by
  broadcasting the indices instead, as transformers does for its plain masks.
- A padded query row that sees no key at all (a sliding window wholly over padding: ModernBERT's
  local attention) is all False. torch's SDPA gives such a row zeros; OpenVINO's gives NaN, and
  a NaN row poisons the real rows of the next layer (0 x NaN) and any mean pooling over the
  padded positions (a ModernBERT cross-encoder with `classifier_pooling: mean` scored NaN).
  Such a row is let see every key instead: it is padding, never pooled, and no real query reads
  it, since padded keys stay masked for every real row.

optimum's ONNX exporter builds its SDPA masks without vmap for the same reason
(`sdpa_mask_without_vmap`); optimum-intel itself is not used: it pins transformers 5.5."""

import contextlib

import torch

NAME = "poolwire_openvino"


def _mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
          kv_offset: int = 0, mask_function=None, attention_mask=None, local_size=None,
          allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False,
          use_vmap: bool = False, device="cpu", **kwargs):
    """transformers' `sdpa_mask` built without vmap, every row left with a key to see."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                     q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function or causal_mask_function,
                     attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip,
                     allow_is_bidirectional_skip=allow_is_bidirectional_skip,
                     use_vmap=False, device=device, **kwargs)
    if mask is None:  # no mask needed (is_causal, or full attention without padding)
        return None
    return mask | ~mask.any(dim=-1, keepdim=True)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, sdpa_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


@contextlib.contextmanager
def traceable_attention(module: torch.nn.Module):
    """While tracing: the module's SDPA attention under NAME (see the module's docstring).
    A module on another implementation (eager, a model's own attention code) is traced as
    it is: its masks are additive floats, finite on every row."""
    config = getattr(module, "config", None)
    current = getattr(config, "_attn_implementation", None)
    can_set = getattr(module, "_can_set_attn_implementation", lambda: False)
    if current != "sdpa" or not can_set():
        yield
        return
    _register()
    module.set_attn_implementation(NAME)
    try:
        yield
    finally:
        module.set_attn_implementation(current)
