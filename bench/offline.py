"""The `offline` row: `poolwire.PoolingModel.embed` over the benchmark workload beside in-process
`SentenceTransformer.encode` of the same folder, in one process and one run, on the same
device and backend (eager torch), both warmed up first.

    python bench/offline.py                   # 2,000 texts, 3 rounds each, interleaved
    python bench/offline.py --texts 200 --rounds 1

Rounds alternate (encode, embed, encode, embed, ...) so that a change of load on a shared
machine falls on both; each side's figure is its best round. Prints a markdown table with the
ratio offline / in-process, and how close the vectors are (minimum cosine). Numbers to
compare, never assertions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)  # run as a script: import bench.* from this checkout

from bench.arguments import count  # noqa: E402 - after the path fix


def _timed(fn, texts) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn(texts)
    return time.perf_counter() - started, out


def measure(texts: list[str], model_dir: str, device: str, rounds: int, batch_size: int,
            precision: str) -> dict:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from poolwire import PoolingModel, PoolerConfig

    st = SentenceTransformer(model_dir, device=device, trust_remote_code=False)
    # backend="torch": the same backend as the peer (the default, auto, would take OpenVINO on
    # a CPU and compare two backends instead of the two paths over one).
    offline = PoolingModel(model_dir, pooler_config=PoolerConfig(task="embed"), device=device,
                           backend="torch", precision=precision)
    tokens = sum(len(ids) for ids in offline.model.tokenizer(texts)["input_ids"])

    def encode(batch):
        return st.encode(batch, batch_size=batch_size, show_progress_bar=False,
                         convert_to_numpy=True)

    def embed(batch):
        return np.asarray(offline.embed(batch))

    warm = texts[: min(64, len(texts))]
    encode(warm)
    embed(warm)
    walls: dict[str, list[float]] = {"inprocess": [], "offline": []}
    outputs = {}
    for _ in range(rounds):
        for key, fn in (("inprocess", encode), ("offline", embed)):
            wall, outputs[key] = _timed(fn, texts)
            walls[key].append(wall)
    a, b = (np.asarray(outputs[k], dtype=np.float64) for k in ("inprocess", "offline"))
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rows = []
    for key, label in (("inprocess", f"in-process SentenceTransformer.encode (batch {batch_size})"),
                       ("offline", f"poolwire.PoolingModel.embed ({offline.backend.describe()})")):
        best = min(walls[key])
        rows.append({"key": key, "setup": label, "texts": len(texts), "tokens": tokens,
                     "rounds_s": [round(w, 3) for w in walls[key]], "best_s": best,
                     "texts_per_s": len(texts) / best, "tokens_per_s": tokens / best})
    return {"rows": rows, "ratio": rows[1]["texts_per_s"] / rows[0]["texts_per_s"],
            "min_cos": float(cos.min()), "torch_threads": torch.get_num_threads(),
            "device": device, "shape": list(b.shape)}


def markdown(result: dict, command: str) -> str:
    lines = ["| setup | texts | texts/s | tokens/s | rounds (s) | vs in-process |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    base = result["rows"][0]["texts_per_s"]
    for row in result["rows"]:
        lines.append(f"| {row['key']}: {row['setup']} | {row['texts']} | {row['texts_per_s']:.1f} "
                     f"| {row['tokens_per_s']:.0f} | {', '.join(map(str, row['rounds_s']))} "
                     f"| {row['texts_per_s'] / base:.2f}x |")
    lines += ["", f"offline / in-process: {result['ratio']:.2f}x (best round of each, "
                  f"{result['device']}, torch threads {result['torch_threads']}); minimum cosine "
                  f"between their vectors {result['min_cos']:.7f}", "", f"`{command}`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.workload import mixed_texts
    from poolwire.models.model import bundled_model_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=count, default=2000, help="workload size (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--rounds", type=count, default=3, help="timed passes of each side (default 3)")
    p.add_argument("--model", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--batch-size", type=int, default=32, help="in-process encode batch size")
    p.add_argument("--precision", default="exact", choices=("exact", "fast"),
                   help="PoolingModel's precision (default exact, as encode computes)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    texts = mixed_texts(args.texts, seed=args.seed)
    result = measure(texts, str(args.model or bundled_model_dir()), args.device, args.rounds,
                     args.batch_size, args.precision)
    command = "python bench/offline.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(markdown(result, command.strip()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
