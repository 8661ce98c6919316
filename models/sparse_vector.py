"""A sparse item (PROTOCOL.md 1.2, "embed on a sparse model"): the non-zero weights of one
vector over the model's vocabulary, indices ascending. numpy only, so the reply framing can
shape it without knowing how it was computed."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SparseVector:
    indices: np.ndarray   # [K] int64, ascending token ids
    values: np.ndarray    # [K] float32, none zero
    size: int             # the vocabulary size, the vector's full length

    @classmethod
    def from_dense(cls, row: np.ndarray, max_active_dims: int | None = None) -> "SparseVector":
        """The non-zero weights of a [V] row; with `max_active_dims` only the k largest
        (Sentence-Transformers' topk, then zeros dropped)."""
        row = np.asarray(row, dtype=np.float32)
        if max_active_dims is not None and max_active_dims < row.shape[0]:
            keep = np.argpartition(-row, max_active_dims - 1)[:max_active_dims]
            kept = np.zeros_like(row)
            kept[keep] = row[keep]
            row = kept
        indices = np.flatnonzero(row)
        return cls(indices.astype(np.int64), row[indices], int(row.shape[0]))

    def normalized(self) -> "SparseVector":
        norm = float(np.linalg.norm(self.values))
        return self if norm == 0.0 else SparseVector(self.indices, self.values / np.float32(norm), self.size)

    def dot(self, other: "SparseVector") -> np.float32:
        """The dot product over the indices both hold (Sentence-Transformers' sparse similarity)."""
        common, mine, theirs = np.intersect1d(self.indices, other.indices, assume_unique=True,
                                              return_indices=True)
        if common.size == 0:
            return np.float32(0.0)
        return np.float32(np.dot(self.values[mine].astype(np.float64),
                                 other.values[theirs].astype(np.float64)))

    def wire(self) -> dict:
        """The float encoding's `data`: {indices, values}."""
        return {"indices": self.indices.tolist(), "values": self.values.tolist()}
