"""BGE-M3's three embeddings from one forward pass (PROTOCOL.md 1.3, "Several outputs"): the
heads FlagEmbedding ships beside the encoder (`sparse_linear.pt`, `colbert_linear.pt`), read
once at load, and what they compute from the encoder's last hidden states:

- dense: the CLS vector, normalised (the model's own pooling path, forward.py);
- sparse: relu(sparse_linear(h)) per token, the largest weight per token id, the tokenizer's
  cls, eos, pad and unk tokens left out (FlagEmbedding's `_process_token_weights`);
- multi_vector: colbert_linear(h) of every token but the first, normalised per row.

Scores (FlagEmbedding's `M3Embedder`): dense the dot product of the normalised vectors,
sparse the lexical matching score, multi_vector `colbert_score` (for each query row the
largest dot product with a document row, averaged over the query's rows), and the hybrid
`compute_score` weighting of the three.

FlagEmbedding is not a dependency: its inference stack pulls in training code and datasets;
these are the three small formulas it publishes, on hidden states any backend gives."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poolwire.models.sparse_vector import SparseVector

DENSE, SPARSE, MULTI_VECTOR = "dense", "sparse", "multi_vector"
OUTPUTS = (DENSE, SPARSE, MULTI_VECTOR)
HEAD_FILES = {SPARSE: "sparse_linear.pt", MULTI_VECTOR: "colbert_linear.pt"}

# `--score-method` on such a model, and the name discovery's `score_method` gives it.
SCORE_METHODS = {"dense": "cosine", "sparse": "dot", "multi_vector": "maxsim", "hybrid": "hybrid"}
DEFAULT_HYBRID_WEIGHTS = (0.4, 0.2, 0.4)  # dense, sparse, multi_vector: the model card's
# The special tokens FlagEmbedding leaves out of the lexical weights.
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True, eq=False)
class M3Heads:
    sparse_linear: torch.nn.Linear   # hidden -> 1
    colbert_linear: torch.nn.Linear  # hidden -> the ColBERT width
    unused_ids: tuple[int, ...]      # token ids never given a lexical weight
    vocab_size: int

    @property
    def colbert_size(self) -> int:
        return self.colbert_linear.out_features

    def to(self, device) -> "M3Heads":
        self.sparse_linear.to(device)
        self.colbert_linear.to(device)
        return self


def _linear(path: Path, hidden_size: int, out_features: int | None) -> torch.nn.Linear:
    state = torch.load(path, map_location="cpu", weights_only=True)
    weight = state.get("weight") if isinstance(state, dict) else None
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden_size or (
            out_features is not None and weight.shape[0] != out_features):
        shape = None if weight is None else tuple(weight.shape)
        want = f"[{out_features or 'D'}, {hidden_size}]"
        raise ValueError(f"{path}: expected an nn.Linear state dict with weight {want}, got "
                         f"{shape}")
    layer = torch.nn.Linear(hidden_size, weight.shape[0], bias="bias" in state)
    layer.load_state_dict(state)
    return layer.eval()


def read_m3_heads(folder: Path, hidden_size: int, vocab_size: int, tokenizer) -> M3Heads | None:
    """The heads of a BGE-M3 folder, or None when it has neither file; one without the other
    is refused naming the missing file."""
    present = {k: folder / f for k, f in HEAD_FILES.items() if (folder / f).is_file()}
    if not present:
        return None
    if len(present) == 1:
        missing = next(f for k, f in HEAD_FILES.items() if k not in present)
        raise ValueError(f"{folder} has {next(iter(present.values())).name} but no {missing}: "
                         f"a BGE-M3 folder carries both heads (as FlagEmbedding ships them)")
    unused = set()
    for name in UNUSED_TOKENS:
        token = tokenizer.special_tokens_map.get(name)
        if token is not None:
            unused.add(int(tokenizer.convert_tokens_to_ids(token)))
    return M3Heads(_linear(present[SPARSE], hidden_size, 1),
                   _linear(present[MULTI_VECTOR], hidden_size, None),
                   tuple(sorted(unused)), vocab_size)


def lexical_weights(heads: M3Heads, hidden: torch.Tensor, ids: torch.Tensor,
                    lengths: torch.Tensor) -> list[SparseVector]:
    """[B, T, H] hidden states of [B, T] ids -> one sparse vector per sequence: the largest
    relu(sparse_linear(h)) per token id over its real tokens, unused ids left out."""
    weights = torch.relu(heads.sparse_linear(hidden.float())).squeeze(-1)   # [B, T]
    unused = torch.tensor(heads.unused_ids, dtype=ids.dtype, device=ids.device)
    out = []
    for row in range(hidden.shape[0]):
        n = int(lengths[row])
        row_ids, row_w = ids[row, :n], weights[row, :n]
        keep = ~torch.isin(row_ids, unused) & (row_w > 0)
        row_ids, row_w = row_ids[keep], row_w[keep]
        # Unique sorts the ids, so the indices come out ascending as a sparse item wants.
        uniq, inverse = torch.unique(row_ids, return_inverse=True)
        values = torch.zeros(len(uniq), dtype=row_w.dtype, device=row_w.device)
        values.scatter_reduce_(0, inverse, row_w, "amax", include_self=False)
        out.append(SparseVector(uniq.cpu().numpy().astype(np.int64),
                                values.cpu().numpy().astype(np.float32), heads.vocab_size))
    return out


def colbert_rows(heads: M3Heads, hidden: torch.Tensor) -> torch.Tensor:
    """[B, T, H] -> [B, T - 1, D]: colbert_linear of every token but the first (CLS); the
    caller keeps each sequence's first length - 1 rows and normalises them."""
    return heads.colbert_linear(hidden[:, 1:].float())


# ---- scores ----

def colbert_score(query_rows: np.ndarray, document_rows: np.ndarray) -> np.float32:
    """FlagEmbedding's `colbert_score`: MaxSim averaged over the query's rows."""
    sims = query_rows.astype(np.float32) @ document_rows.astype(np.float32).T   # [Tq, Td]
    return np.float32(sims.max(axis=1).sum() / max(query_rows.shape[0], 1))


def pair_scores(a: dict, b: dict) -> dict[str, np.float32]:
    """Each output's score of a pair of items (dicts of the outputs both hold)."""
    out = {}
    if DENSE in a:
        out[DENSE] = np.float32(np.dot(a[DENSE].astype(np.float32), b[DENSE].astype(np.float32)))
    if SPARSE in a:
        out[SPARSE] = a[SPARSE].dot(b[SPARSE])
    if MULTI_VECTOR in a:
        out[MULTI_VECTOR] = colbert_score(a[MULTI_VECTOR], b[MULTI_VECTOR])
    return out


def outputs_for_score(method: str) -> tuple[str, ...]:
    """The outputs a score method reads (its `--score-method` name or discovery's)."""
    return {"dense": (DENSE,), "cosine": (DENSE,), "sparse": (SPARSE,), "dot": (SPARSE,),
            "multi_vector": (MULTI_VECTOR,), "maxsim": (MULTI_VECTOR,), "hybrid": OUTPUTS}[method]


def m3_score(method: str, a: dict, b: dict, weights=DEFAULT_HYBRID_WEIGHTS) -> np.float32:
    """A pair's score by discovery's method name (cosine, dot, maxsim, hybrid); hybrid is
    FlagEmbedding's `compute_score` combination `(w_d d + w_s s + w_m m) / (w_d + w_s + w_m)`."""
    scores = pair_scores(a, b)
    if method == "hybrid":
        wd, ws, wm = (float(w) for w in weights)
        return np.float32((wd * scores[DENSE] + ws * scores[SPARSE] + wm * scores[MULTI_VECTOR])
                          / (wd + ws + wm))
    return scores[outputs_for_score(method)[0]]


def parse_hybrid_weights(text) -> tuple[float, float, float]:
    """`--hybrid-weights 0.4,0.2,0.4` (dense, sparse, multi_vector) -> three floats >= 0 with a
    positive sum."""
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = [p for p in str(text).split(",")]
    try:
        weights = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        weights = ()
    if len(weights) != 3 or any(w < 0 or not np.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise ValueError(f"--hybrid-weights {text!r}: give three weights >= 0, dense,sparse,"
                         f"multi_vector, not all zero (default 0.4,0.2,0.4)")
    return weights  # type: ignore[return-value]
