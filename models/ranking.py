"""The rerank form of score (PROTOCOL.md 1.2): which documents a reply carries and in what
order, and the late-interaction score that ranks them in a token_embed deployment. Pure
values in and out; the engine applies them once every document is scored."""

from collections.abc import Sequence

import numpy as np


def rank(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """Document indices by score, highest first, equal scores by index (as
    `CrossEncoder.rank`'s stable sort leaves them), cut to `top_n` (None or more than there
    are: all)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return order if top_n is None else order[:top_n]


def maxsim(query_rows: np.ndarray, document_rows: np.ndarray) -> np.float32:
    """ColBERT's late interaction: for each query row [Tq, D] the largest dot product with any
    document row [Td, D], summed over the query rows."""
    sims = query_rows.astype(np.float32) @ document_rows.astype(np.float32).T   # [Tq, Td]
    return np.float32(sims.max(axis=1).sum())
