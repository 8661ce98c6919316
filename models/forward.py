"""The tensor work of one micro-batch, run in the engine's forward thread: pad, have the backend
run the model, pool through `kernels`, and hand back one float32 array per sequence. What
follows the backend is the same for every backend. No asyncio here."""

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from poolwire import kernels
from poolwire.models import m3
from poolwire.models.backend import Backend
from poolwire.models.model import LoadedModel
from poolwire.models.sparse import sparse_items
from poolwire.models.task_heads import Forward, PoolSpec
from poolwire.models.tokenizing import TokenSeq


def pad_batch(seqs: list[TokenSeq], pad_id: int):
    """Right-padded ids, attention mask, segment ids and lengths for a batch of sequences.
    Filled in numpy and shared with torch: a torch.tensor per row costs more than the
    near-zero model's whole forward pass (bench/service_cost.py)."""
    width = max(len(s) for s in seqs)
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    types = np.zeros((len(seqs), width), dtype=np.int64)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    if all(len(s) == width for s in seqs):
        ids[:] = [s.ids for s in seqs]
    else:
        ids[mask.astype(bool)] = [i for s in seqs for i in s.ids]
    for row, seq in enumerate(seqs):
        if seq.type_ids is not None:
            types[row, : len(seq)] = seq.type_ids
    return (torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types),
            torch.from_numpy(lengths))


def _split_rows(packed: torch.Tensor, lengths: torch.Tensor) -> list[np.ndarray]:
    return [t.numpy() for t in torch.split(packed.cpu(), lengths.tolist())]


@dataclass(frozen=True)
class BatchResult:
    outputs: list[np.ndarray]   # in sequence order: [D] vectors, [labels] scores, [T, D] rows
    forward_s: float            # the model's forward pass (padding included)
    pool_s: float               # pooling kernels and the copy out


def run_batch(backend: Backend, seqs: list[TokenSeq], specs: list[PoolSpec]) -> BatchResult:
    """Pad, have the backend run the model once, pool every sequence as its spec says (the
    pooling kernels accumulate in float32 whatever the outputs' dtype)."""
    forward, adapter = specs[0].forward, specs[0].adapter
    if any(s.forward != forward or s.adapter != adapter for s in specs):
        raise ValueError("a micro-batch must need one kind of forward pass and one adapter")
    if forward in (Forward.TEXT_FEATURES, Forward.IMAGE_FEATURES):
        from poolwire.models.multimodal_forward import run_towers

        return run_towers(backend, seqs, specs)
    if len(seqs) == 1:
        one = _one_text(backend, seqs[0], specs[0])
        if one is not None:
            return one
    model = backend.model
    started = time.perf_counter()
    device = backend.device
    padded = pad_batch(seqs, model.pad_id)
    ids, mask, types, lengths = padded if device.type == "cpu" else (
        t.to(device, non_blocking=True) for t in padded)
    if model.adapters is None:
        out = backend.run(forward, ids, mask, types)
    else:
        # PEFT's LoRA layers live inside the module the backend runs (only torch serves
        # adapters: backend_choice.py), so the adapter is chosen around the call and the
        # Backend interface stays the same for every backend.
        with model.adapters.scope(adapter):
            out = backend.run(forward, ids, mask, types)
    forwarded = time.perf_counter()
    with torch.inference_mode():
        results: list[np.ndarray | None] = [None] * len(seqs)
        groups: dict[PoolSpec, list[int]] = defaultdict(list)
        for row, spec in enumerate(specs):
            groups[spec].append(row)
        for spec, rows in groups.items():
            if len(rows) == len(seqs):  # one spec for the whole batch: no gather needed
                part, part_len = out, lengths
            else:
                index = torch.tensor(rows, device=out.device)
                part, part_len = out.index_select(0, index), lengths.index_select(0, index)
            part_ids = ids if len(rows) == len(seqs) else ids.index_select(0, index)
            for row, value in zip(rows, _pool(model, spec, part, part_len, part_ids)):
                results[row] = value
    return BatchResult(results, forwarded - started, time.perf_counter() - forwarded)  # type: ignore[arg-type]


def _one_text(backend: Backend, seq: TokenSeq, spec: PoolSpec) -> BatchResult | None:
    """A one-text batch of a plain embedding (sequence pooling, nothing after it but the cut
    and the norm) through the backend's one-row path (`Backend.run_row`), pooled by
    `kernels.seq_pool_row`: the numbers of the batch path below, without its padded tensors
    and torch on the way. One short text on the near-zero model of bench/service_cost.py: 134
    us this way against 294 us through the batch path (2-core AVX2 VM, 2026-12-04), where the
    model's pass itself is about 50. None where it does not apply: run the batch path."""
    model = backend.model
    if (spec.forward != Forward.HIDDEN or spec.token_level or spec.outputs is not None
            or spec.adapter is not None or model.adapters is not None
            or seq.type_ids is not None or (model.dense is not None and spec.project)):
        return None
    started = time.perf_counter()
    hidden = backend.run_row(spec.forward, seq.ids)
    if hidden is None:
        return None
    forwarded = time.perf_counter()
    vector = kernels.seq_pool_row(hidden, spec.method, normalize=spec.normalize,
                                  dimensions=spec.dimensions)
    return BatchResult([vector], forwarded - started, time.perf_counter() - forwarded)


def _pool(model: LoadedModel, spec: PoolSpec, out: torch.Tensor,
          lengths: torch.Tensor, ids: torch.Tensor) -> list:
    if spec.forward == Forward.HIDDEN and spec.outputs is not None:
        return _m3_items(model, spec, out, lengths, ids)
    if spec.forward == Forward.HIDDEN and spec.token_level and model.m3 is not None:
        return _colbert(model, spec, out, lengths)
    if spec.forward == Forward.HIDDEN and not spec.token_level:
        if model.dense is None or not spec.project:
            pooled = kernels.seq_pool(out, lengths, spec.method, normalize=spec.normalize,
                                      dimensions=spec.dimensions)
        else:
            # Dense modules come after pooling and before truncation and normalisation
            # (Sentence-Transformers' module order); the projected vectors go through the
            # same kernel as a batch of one-token sequences, so cut and norm stay fused.
            projected = model.project(kernels.seq_pool(out, lengths, spec.method))  # [B, D]
            pooled = kernels.seq_pool(projected[:, None, :], torch.ones_like(lengths), "cls",
                                      normalize=spec.normalize, dimensions=spec.dimensions)
        return list(pooled.cpu().numpy())
    if spec.forward == Forward.HIDDEN:
        # vLLM applies the Dense projection to token_embed rows too.
        rows = kernels.token_pool(model.project(out), lengths, normalize=spec.normalize,
                                  dimensions=spec.dimensions)
        return _split_rows(rows, lengths)
    if spec.forward == Forward.MLM_LOGITS:
        return sparse_items(model.sparse, out, lengths, spec.max_active_dims, spec.normalize)
    if spec.forward == Forward.SEQ_LOGITS:
        scores = kernels.activation(out.float(), spec.activation)   # [B, labels]
        return list(scores.cpu().numpy())
    rows = kernels.token_pool(out, lengths)                           # [sum(T), labels]
    return _split_rows(kernels.activation(rows, spec.activation), lengths)


def _colbert(model: LoadedModel, spec: PoolSpec, out: torch.Tensor,
             lengths: torch.Tensor) -> list[np.ndarray]:
    """BGE-M3's multi-vector rows: every token but the first, through colbert_linear."""
    rows_lengths = (lengths - 1).clamp(min=0)
    rows = kernels.token_pool(m3.colbert_rows(model.m3, out), rows_lengths,
                              normalize=spec.normalize, dimensions=spec.dimensions)
    return _split_rows(rows, rows_lengths)


def _m3_items(model: LoadedModel, spec: PoolSpec, out: torch.Tensor, lengths: torch.Tensor,
              ids: torch.Tensor) -> list[dict]:
    """One map per sequence of the outputs `spec` asks for, all from this one forward pass."""
    parts: dict[str, list] = {}
    if m3.DENSE in spec.outputs:
        plain = PoolSpec(Forward.HIDDEN, method=spec.method, normalize=spec.normalize,
                         dimensions=spec.dimensions)
        parts[m3.DENSE] = _pool(model, plain, out, lengths, ids)
    if m3.SPARSE in spec.outputs:
        parts[m3.SPARSE] = m3.lexical_weights(model.m3, out, ids, lengths)
    if m3.MULTI_VECTOR in spec.outputs:
        # Dimensions (Matryoshka) cut the dense vector only; the rows keep ColBERT's width.
        parts[m3.MULTI_VECTOR] = _colbert(model, PoolSpec(Forward.HIDDEN, token_level=True,
                                                          normalize=spec.normalize), out, lengths)
    return [{name: parts[name][row] for name in spec.outputs} for row in range(len(lengths))]
