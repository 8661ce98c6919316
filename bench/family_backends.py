"""Torch against OpenVINO on one model folder, in one process: `poolwire.PoolingModel` with
`backend="torch"` and with `backend="openvino"` over the same texts, rounds interleaved (torch,
openvino, torch, ...) so a change of load on a shared machine falls on both; each side's figure
is its best round. Embeds with an embedder, scores (query, text) pairs with a cross-encoder.

    python bench/family_backends.py MODEL_DIR [--texts 200] [--rounds 3]
    python bench/family_backends.py --build embeddinggemma|modernbert-ce DIR   # see below

`--build` writes a random-weight folder with the real model's shapes (EmbeddingGemma-300m:
hidden 768, 24 layers, 3 heads of 256, 1 KV head, window 512, Dense 768-3072-768;
ModernBERT-base: hidden 768, 22 layers, 12 heads, local window 128, mean pooling) and MiniLM's
tokenizer, for a machine without the hub: speed depends on the shapes, not the weights (the
vocabulary is MiniLM's 30522 rows, a gather whatever its size). Prints the machine, the load
average and the ratio; numbers to compare, never assertions."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)  # run as a script: import bench.* from this checkout


def build(kind: str, folder: Path) -> Path:
    """A random-weight folder with the shapes of the real model (see the module docstring)."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import (AutoTokenizer, Gemma3TextConfig, Gemma3TextModel, ModernBertConfig,
                              ModernBertForSequenceClassification)

    from poolwire.models.model import bundled_model_dir

    torch.manual_seed(0)
    base = folder.with_name("_" + folder.name)
    if kind == "embeddinggemma":
        config = Gemma3TextConfig(
            vocab_size=30522, hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
            num_attention_heads=3, num_key_value_heads=1, head_dim=256, sliding_window=512,
            query_pre_attn_scalar=256, max_position_embeddings=2048, pad_token_id=0,
            use_bidirectional_attention=True)
        module = Gemma3TextModel(config)
    elif kind == "modernbert-ce":
        config = ModernBertConfig(
            vocab_size=30522, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
            num_attention_heads=12, local_attention=128, global_attn_every_n_layers=3,
            max_position_embeddings=8192, pad_token_id=0, cls_token_id=101, sep_token_id=102,
            bos_token_id=101, eos_token_id=102, classifier_pooling="mean", num_labels=1)
        module = ModernBertForSequenceClassification(config)
    else:
        raise SystemExit(f"--build {kind!r}: one of embeddinggemma, modernbert-ce")
    module.eval().save_pretrained(base)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(base)
    if kind == "modernbert-ce":
        CrossEncoder(str(base), device="cpu").save(str(folder))
        return folder
    identity = torch.nn.Identity()
    SentenceTransformer(modules=[
        models.Transformer(str(base)), models.Pooling(768, "mean"),
        models.Dense(768, 3072, bias=False, activation_function=identity),
        models.Dense(3072, 768, bias=False, activation_function=identity), models.Normalize()],
        device="cpu", prompts={"query": "task: search result | query: "}).save(str(folder))
    return folder


def measure(folder: str, texts: list[str], rounds: int) -> dict:
    import tempfile

    import numpy as np

    from poolwire import PoolerConfig, PoolingModel

    served, start_s = {}, {}
    with tempfile.TemporaryDirectory() as state:  # a cold start: the conversion is timed too
        for backend in ("torch", "openvino"):
            started = time.perf_counter()
            served[backend] = PoolingModel(folder, pooler_config=PoolerConfig(), device="cpu",
                                           backend=backend, precision="exact", state_dir=state)
            start_s[backend] = round(time.perf_counter() - started, 1)
    score = "embed" not in served["torch"].supported_tasks

    def run(model, batch):
        if score:
            return np.asarray(model.score(batch[0], batch[1:]))
        return np.asarray(model.embed(batch))

    run(served["torch"], texts[:16])
    run(served["openvino"], texts[:16])
    walls: dict[str, list[float]] = {"torch": [], "openvino": []}
    outputs = {}
    for _ in range(rounds):
        for backend, model in served.items():
            started = time.perf_counter()
            outputs[backend] = run(model, texts)
            walls[backend].append(time.perf_counter() - started)
    diff = float(np.abs(outputs["openvino"] - outputs["torch"]).max())
    best = {backend: len(texts) / min(w) for backend, w in walls.items()}
    return {"task": "score" if score else "embed", "texts": len(texts),
            "texts_per_s": {k: round(v, 2) for k, v in best.items()},
            "rounds_s": {k: [round(x, 2) for x in w] for k, w in walls.items()},
            "openvino_over_torch": round(best["openvino"] / best["torch"], 2),
            "max_abs_diff": diff, "start_s": start_s,
            "backends": {k: m.backend.describe() for k, m in served.items()}}


def main(argv: list[str] | None = None) -> int:
    from bench.machine import describe
    from bench.workload import mixed_texts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="model folder")
    p.add_argument("--build", nargs=2, metavar=("KIND", "DIR"),
                   help="write a random-weight folder of the real shapes, then exit")
    p.add_argument("--texts", type=int, default=200, help="workload size (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="timed passes of each (default 3)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.build:
        print(build(args.build[0], Path(args.build[1])))
        return 0
    if not args.model:
        p.error("a model folder, or --build")
    load_before = os.getloadavg()
    result = measure(args.model, mixed_texts(args.texts, seed=args.seed), args.rounds)
    result.update(machine=describe(), load_average_before=[round(x, 2) for x in load_before],
                  load_average_after=[round(x, 2) for x in os.getloadavg()],
                  command="python bench/family_backends.py " + " ".join(argv or sys.argv[1:]))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
