"""How far each precision mode's outputs are from float32 over the benchmark workload:
embeddings against Sentence-Transformers (minimum and mean cosine) and the logits of the
benchmark's classifier (bench/classifier.py) against transformers (maximum absolute
difference), computed in this process through poolwire's own forward pass (no NATS, no
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

    import tempfile

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from bench.classifier import build_classifier, classifier_logits, load_classifier
    from bench.precision_modes import accuracy_cells, classify_accuracy, embed_accuracy
    from bench.workload import mixed_texts
    from poolwire.models.backend import TorchBackend
    from poolwire.models.forward import run_batch
    from poolwire.models.model import bundled_model_dir, load_model
    from poolwire.models.precision import EXACT, choose_precision
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import Tokenizing

    texts = mixed_texts(args.texts, seed=args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="poolwire-precision-")
    classifier = build_classifier(Path(tmp.name) / "classifier")
    references = {
        "embed": SentenceTransformer(str(bundled_model_dir()), device="cpu",
                                     trust_remote_code=False).encode(
            texts, batch_size=args.batch_size, show_progress_bar=False),
        "classify": classifier_logits(*load_classifier(classifier), texts, args.batch_size)}
    # Per task: the model folder, what to compute on each sequence, how far from its reference.
    tasks = {"embed": (bundled_model_dir(), lambda m: PoolSpec(
                 Forward.HIDDEN, method=m.pooling_method, normalize=True), embed_accuracy),
             "classify": (classifier, lambda m: PoolSpec(Forward.SEQ_LOGITS, activation="none"),
                          classify_accuracy)}
    fast = choose_precision("fast", "cpu", "float32", cpu_has_bf16=True)  # forced: see above
    modes = {"exact": ("float32", EXACT), "fast": ("float32", fast),
             "bfloat16": ("bfloat16", EXACT), "float16": ("float16", EXACT)}
    print("| mode | compute | embed: min cosine | embed: mean cosine | classify: max abs diff of "
          "logits |\n| --- | --- | ---: | ---: | ---: |")
    for mode, (dtype, plan) in modes.items():
        accuracy = {}
        for task, (folder, spec_of, compare) in tasks.items():
            model = load_model(folder, dtype=dtype)
            seqs = Tokenizing(model.tokenizer, model.max_length).texts(texts, -1, "right")
            spec = spec_of(model)
            backend = TorchBackend(model, plan)
            order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
            got = np.zeros_like(references[task])
            for start in range(0, len(order), args.batch_size):
                rows = order[start:start + args.batch_size]
                out = run_batch(backend, [seqs[i] for i in rows], [spec] * len(rows)).outputs
                got[rows] = np.stack(out)
            accuracy.update(compare(references[task], got))
            del model
        cells = accuracy_cells("embed", accuracy)[:2] + accuracy_cells("classify", accuracy)[2:]
        compute = plan.describe() if dtype == "float32" else f"{dtype} weights"
        print(f"| {mode} | {compute} | {' | '.join(cells)} |", flush=True)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
