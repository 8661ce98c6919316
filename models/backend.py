"""The one interface the engine calls for a padded batch (DESIGN.md, "Layout"): a backend owns
its device, its threads, its precision and its compiled model, and returns the model's raw
outputs for the batch. Everything after that (pooling kernels, Dense, truncation,
normalisation, activations) is the same code for every backend (`forward.py`), so backends
differ only in how fast they compute the transformer, never in what is done with it.

Like text-embeddings-inference's `backends/core` (`embed(batch)`, `predict(batch)`), the engine
plans batches and the backend only computes them, from one thread at a time: the engine's forward
thread, or its event loop for a batch the backend knows to be quick (`seconds_alone`).
"""

from typing import Protocol

import numpy as np
import torch

from poolwire.models.model import LoadedModel
from poolwire.models.precision import EXACT, PrecisionPlan, autocast
from poolwire.models.task_heads import Forward


class Backend(Protocol):
    name: str                   # "torch", "openvino": discovery's `backend`, the start-up line
    model: LoadedModel          # the loaded folder: tokenizer, heads, Dense, lengths
    precision: PrecisionPlan    # what `--precision` resolved to on this backend

    @property
    def device(self) -> torch.device:
        """Where run()'s outputs live; the pooling kernels run there."""

    def run(self, forward: Forward, ids: torch.Tensor, mask: torch.Tensor,
            types: torch.Tensor) -> torch.Tensor:
        """The model's outputs for one right-padded batch ([B, T] ids, mask and segment ids):
        HIDDEN [B, T, H] last hidden states, SEQ_LOGITS [B, labels], TOKEN_LOGITS
        [B, T, labels], MLM_LOGITS [B, T, vocabulary] (sparse models); any float dtype (pooling accumulates in float32)."""

    def run_row(self, forward: Forward, ids: list[int]) -> np.ndarray | None:
        """One text's outputs (a one-row batch of `ids`, every token real, no segment ids) as
        a NumPy array shaped as run() would give them, where the backend has a cheaper path
        for one row than a padded batch (OpenVINO's fixed one-row passes); None where it has
        not, and run() computes it."""

    def seconds_alone(self, forward: Forward, tokens: int) -> float | None:
        """How long a batch of `tokens` padded tokens takes when the calling thread computes it
        alone, where the backend measured that at start (OpenVINO's one-thread twin); None
        where it does not know. The engine computes a batch known to be that quick on its
        event loop when nothing else is waiting (batch_planner.computes_on_loop)."""

    def describe(self) -> str:
        """One phrase for the start-up line: which backend, in which arithmetic."""


class TorchBackend:
    """Eager PyTorch on the model's own device, under the precision's autocast (`fast`)."""

    name = "torch"

    def __init__(self, model: LoadedModel, precision: PrecisionPlan = EXACT,
                 reason: str = "") -> None:
        self.model = model
        self.precision = precision
        self.reason = reason  # why torch serves when `--backend auto` tried OpenVINO first

    @property
    def device(self) -> torch.device:
        return self.model.device

    def run(self, forward: Forward, ids: torch.Tensor, mask: torch.Tensor,
            types: torch.Tensor) -> torch.Tensor:
        model = self.model
        with torch.inference_mode(), autocast(self.precision):
            if forward == Forward.HIDDEN:
                return model.encoder_hidden(ids, mask, types)     # [B, T, H]
            if forward == Forward.SEQ_LOGITS:
                return model.head_logits(ids, mask, types)        # [B, labels]
            if forward == Forward.MLM_LOGITS:
                return model.mlm_logits(ids, mask, types)         # [B, T, vocabulary]
            if forward == Forward.TEXT_FEATURES:
                return model.towers.text_features(ids, mask)      # [B, D]
            return model.token_logits(ids, mask, types)           # [B, T, labels]

    def run_row(self, forward: Forward, ids: list[int]) -> np.ndarray | None:
        return None  # a one-row batch costs torch what any batch does

    def seconds_alone(self, forward: Forward, tokens: int) -> float | None:
        return None  # not measured: torch's own threads compute every batch

    def run_images(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """A multimodal model's image tower on a batch of preprocessed images -> [B, D]."""
        with torch.inference_mode(), autocast(self.precision):
            return self.model.towers.image_features(inputs)

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"backend torch{why}, {self.precision.describe()}"
