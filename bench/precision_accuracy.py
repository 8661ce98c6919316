"""How far each precision mode's embeddings are from float32 Sentence-Transformers over the
benchmark workload, computed in this process through poolwire's own forward pass (no NATS, no
timing). Unlike `bench/throughput.py --modes`, which measures what a worker serves on this
machine, this runs the fast mode's bfloat16 autocast even on a CPU without native bfloat16
(where a worker would serve float32 instead): its numbers are the same, only slower.

    python bench/precision_accuracy.py --texts 500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=2000, help="workload size (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass, by length")
    args = p.parse_args(argv)

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from bench.precision_modes import embed_accuracy
    from bench.workload import mixed_texts
    from poolwire.actors.forward import run_batch
    from poolwire.actors.model import bundled_model_dir, load_model
    from poolwire.actors.precision import EXACT, choose_precision
    from poolwire.actors.task_heads import Forward, PoolSpec
    from poolwire.actors.tokenizing import Tokenizing

    texts = mixed_texts(args.texts, seed=args.seed)
    reference = SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(
        texts, batch_size=args.batch_size, show_progress_bar=False)
    fast = choose_precision("fast", "cpu", "float32", cpu_has_bf16=True)  # forced: see above
    modes = {"exact": ("float32", EXACT), "fast": ("float32", fast),
             "bfloat16": ("bfloat16", EXACT), "float16": ("float16", EXACT)}
    print("| mode | compute | min cosine | mean cosine |\n| --- | --- | ---: | ---: |")
    for mode, (dtype, plan) in modes.items():
        model = load_model(bundled_model_dir(), dtype=dtype)
        seqs = Tokenizing(model.tokenizer, model.max_length).texts(texts, -1, "right")
        spec = PoolSpec(Forward.HIDDEN, method=model.pooling_method, normalize=True)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        got = np.zeros_like(reference)
        for start in range(0, len(order), args.batch_size):
            rows = order[start:start + args.batch_size]
            out = run_batch(model, [seqs[i] for i in rows], [spec] * len(rows), plan).outputs
            got[rows] = np.stack(out)
        acc = embed_accuracy(reference, got)
        compute = plan.describe() if dtype == "float32" else f"{dtype} weights"
        print(f"| {mode} | {compute} | {acc['min_cosine']:.6f} | {acc['mean_cosine']:.6f} |",
              flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
