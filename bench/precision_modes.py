"""The precision modes a benchmark run compares (`--modes`), and how far each mode's outputs are
from float32: values in, values out, so the tests check them without a worker."""

import argparse

import numpy as np

# Mode -> the `poolwire serve` options that select it. `exact` and `fast` are --precision;
# float16 / bfloat16 cast the weights (--dtype) and run them without autocast.
MODE_ARGS = {
    "exact": ["--precision", "exact"],
    "fast": ["--precision", "fast"],
    "float16": ["--dtype", "float16"],
    "bfloat16": ["--dtype", "bfloat16"],
}
DEFAULT_MODES = "exact,fast"


def parse_modes(spec: str) -> list[str]:
    modes = []
    for raw in spec.split(","):
        mode = raw.strip().lower()
        if not mode:
            continue
        if mode not in MODE_ARGS:
            raise argparse.ArgumentTypeError(
                f"unknown mode {raw!r} in --modes: use {', '.join(MODE_ARGS)} (e.g. {DEFAULT_MODES})")
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise argparse.ArgumentTypeError("--modes names no mode")
    return modes


def embed_accuracy(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Minimum and mean cosine between each text's embedding and its float32 reference
    (rows in the same order; [N, D] each)."""
    reference, got = np.asarray(reference, np.float64), np.asarray(got, np.float64)
    if reference.shape != got.shape:
        raise ValueError(f"{got.shape} embeddings to compare with {reference.shape} references")
    cos = (reference * got).sum(1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(got, axis=1))
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}



def classify_accuracy(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """The largest absolute difference of any logit from its float32 reference ([N, labels]
    each, rows in the same order): logits, not probabilities, since a softmax would hide an
    error on a confident text."""
    reference, got = np.asarray(reference, np.float64), np.asarray(got, np.float64)
    if reference.shape != got.shape:
        raise ValueError(f"{got.shape} logits to compare with {reference.shape} references")
    return {"max_abs_diff": float(np.abs(got - reference).max(initial=0.0))}


ACCURACY = {"embed": embed_accuracy, "classify": classify_accuracy}


def accuracy_cells(task: str, accuracy: dict[str, float], reference: bool = False) -> list[str]:
    """The table's min cosine, mean cosine and max abs diff cells of one row: its numbers, or
    `reference` for the float32 run they are measured against, or n/a where the column is not
    the row's task's (or no reference was run)."""
    own = {"embed": ("min_cosine", "mean_cosine"), "classify": ("max_abs_diff",)}[task]
    cells = []
    for name, fmt in (("min_cosine", ".6f"), ("mean_cosine", ".6f"), ("max_abs_diff", ".3g")):
        if name not in own:
            cells.append("n/a")
        elif reference:
            cells.append("reference")
        else:
            cells.append(format(accuracy[name], fmt) if name in accuracy else "n/a")
    return cells
