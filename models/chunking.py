"""Chunked processing of embed inputs longer than the model (PROTOCOL.md "Longer than the
model"), as pure functions over token ids and pooled vectors: cutting an input into chunks,
and combining the chunks' pooled vectors into the item's. The forward pass, Dense, dimensions
and normalisation are the engine's as for any input (task_heads.py, assembly.py)."""

from dataclasses import dataclass

import numpy as np

from poolwire.models.tokenizing import TokenSeq


def cut(ids: list[int], max_length: int) -> list[list[int]]:
    """Consecutive chunks of exactly `max_length` ids, in order, the last one shorter (as vLLM
    cuts them): special tokens are ids like any other, so only the first chunk starts with
    [CLS] and only the last ends with [SEP]. An input within the maximum is one chunk."""
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    if not ids:
        return [[]]
    return [list(ids[start:start + max_length]) for start in range(0, len(ids), max_length)]


def weighted_mean(vectors: list[np.ndarray], counts: list[int]) -> np.ndarray:
    """The mean of the chunks' pooled vectors weighted by their token counts, in float64
    and returned as float32 (a long document adds up many chunks)."""
    if len(vectors) != len(counts) or not vectors:
        raise ValueError(f"{len(vectors)} vectors and {len(counts)} token counts: give one "
                         f"count per vector, at least one")
    weights = np.asarray(counts, dtype=np.float64)
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])  # [chunks, H]
    return (weights @ stacked / weights.sum()).astype(np.float32)


@dataclass(frozen=True)
class Chunks:
    """How a plan's sequences make its items: item i is the weighted mean of the pooled vectors
    of sequences `groups[i]`, which is then finished as `finish` says (Dense, dimensions,
    normalisation; a task_heads.PoolSpec)."""

    groups: list[list[int]]
    finish: object

    def combine(self, outputs: dict[int, np.ndarray], lengths: list[int]) -> list[np.ndarray]:
        """The items' vectors before finishing, from every sequence's pooled output."""
        return [weighted_mean([outputs[s] for s in group], [lengths[s] for s in group])
                for group in self.groups]


def chunk_sequences(seqs: list[TokenSeq], max_length: int) -> tuple[list[TokenSeq], list[list[int]]]:
    """Every input's chunks as sequences of their own, and for each input the positions of its
    chunks among them."""
    out: list[TokenSeq] = []
    groups: list[list[int]] = []
    for seq in seqs:
        pieces = cut(seq.ids, max_length)
        groups.append(list(range(len(out), len(out) + len(pieces))))
        out.extend(TokenSeq(piece) for piece in pieces)
    return out, groups
