"""The tensor work of a multimodal micro-batch (one modality), in the engine's forward thread:
texts padded (SigLIP's to the tokenizer's model_max_length) through the text tower, images
stacked through the image tower, then Matryoshka truncation and normalisation by the same
`kernels.seq_pool` as every other vector."""

import time
from collections import defaultdict

import torch

from poolwire import kernels
from poolwire.models.forward import BatchResult, pad_batch
from poolwire.models.task_heads import Forward, PoolSpec


def run_towers(backend, seqs: list, specs: list[PoolSpec]) -> BatchResult:
    model = backend.model
    towers = model.towers
    forward = specs[0].forward
    started = time.perf_counter()
    if forward == Forward.IMAGE_FEATURES:
        inputs = {}
        for key in seqs[0].inputs:
            stacked = torch.stack([s.inputs[key] for s in seqs])
            inputs[key] = stacked.to(backend.device, dtype=model.dtype) \
                if stacked.is_floating_point() else stacked.to(backend.device)
        out = backend.run_images(inputs)                                  # [B, D]
    else:
        pad_id = model.pad_id
        ids, mask, types, _ = pad_batch(seqs, pad_id)
        if towers.pad_text_to and ids.shape[1] < towers.pad_text_to:
            extra = towers.pad_text_to - ids.shape[1]
            ids = torch.nn.functional.pad(ids, (0, extra), value=pad_id)
            mask = torch.nn.functional.pad(mask, (0, extra), value=0)
            types = torch.nn.functional.pad(types, (0, extra), value=0)
        out = backend.run(Forward.TEXT_FEATURES, ids.to(backend.device),
                          mask.to(backend.device), types.to(backend.device))  # [B, D]
    forwarded = time.perf_counter()
    results: list = [None] * len(seqs)
    groups: dict[PoolSpec, list[int]] = defaultdict(list)
    for row, spec in enumerate(specs):
        groups[spec].append(row)
    with torch.inference_mode():
        for spec, rows in groups.items():
            part = out[torch.tensor(rows, device=out.device)].float()[:, None, :]  # [b, 1, D]
            ones = torch.ones(len(rows), dtype=torch.long, device=out.device)
            pooled = kernels.seq_pool(part, ones, "cls", normalize=spec.normalize,
                                      dimensions=spec.dimensions)
            for row, value in zip(rows, pooled.cpu().numpy()):
                results[row] = value
    return BatchResult(results, forwarded - started, time.perf_counter() - forwarded)
