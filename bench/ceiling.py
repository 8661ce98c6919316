"""How much faster than in-process float32 Sentence-Transformers any serving path could be on
this machine, from what its matrix multiplications can do: measured in one run.

An encoder's forward pass is almost all matmuls (the linears: 2 x (4 H^2 + 2 H I) FLOPs a token
a layer; attention adds 4 T H). So in-process `encode`'s useful FLOP rate (real tokens only),
set against this machine's float32 matmul rate at the model's own shapes, bounds what any
float32 path can gain, batching and padding included; a lower precision gains only what its
matmuls run faster. Issue 12's fast mode asks for 1.7x: this says whether the arithmetic the
machine has can give it.

    python bench/ceiling.py                  # 1,000 texts of the workload
    python bench/ceiling.py --device cuda    # the same on a GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

MATMUL_TOKENS = 1024  # rows of the activations in a timed matmul: a full batch's worth
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EncoderShape:
    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, config) -> "EncoderShape":
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size)

    def flops(self, length: int) -> int:
        """FLOPs of one sequence of `length` tokens through the encoder's matmuls."""
        h, i = self.hidden, self.intermediate
        per_token = 2 * (4 * h * h + 2 * h * i) + 4 * length * h  # linears, then QK^T and AV
        return self.layers * length * per_token

    def matmuls(self) -> list[tuple[int, int]]:
        """(in, out) of the encoder's linears: the attention projections and the feed-forward."""
        return [(self.hidden, self.hidden), (self.hidden, self.intermediate),
                (self.intermediate, self.hidden)]


def matmul_gflops(shape: EncoderShape, dtype: str, device: str, seconds: float,
                  rows: int = MATMUL_TOKENS) -> float:
    """The encoder's linears' shapes, `rows` rows each, in `dtype`: the rate of the fastest
    shape, each run for about `seconds`."""
    import torch

    best = 0.0
    for n_in, n_out in shape.matmuls():
        a = torch.randn(rows, n_in, device=device).to(getattr(torch, dtype))
        b = torch.randn(n_in, n_out, device=device).to(getattr(torch, dtype))
        (a @ b).sum().item()  # warm-up; .item() waits for a GPU
        runs, started = 0, time.perf_counter()
        while True:
            c = a @ b
            runs += 1
            if device != "cpu":
                c.sum().item()
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        best = max(best, 2 * rows * n_in * n_out * runs / elapsed / 1e9)
    return best


def encode_gflops(texts: list[str], device: str, batch_size: int) -> tuple[float, float, int]:
    """(useful GFLOP/s, texts/s, real tokens) of in-process Sentence-Transformers encode."""
    from sentence_transformers import SentenceTransformer

    from poolwire.models.model import bundled_model_dir

    model = SentenceTransformer(str(bundled_model_dir()), device=device,
                                trust_remote_code=False)
    shape = EncoderShape.of(model[0].auto_model.config)
    lengths = [len(ids) for ids in model.tokenizer(texts, truncation=True,
                                                   max_length=model.max_seq_length)["input_ids"]]
    model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up
    started = time.perf_counter()
    model.encode(texts, batch_size=batch_size)
    elapsed = time.perf_counter() - started
    useful = sum(shape.flops(n) for n in lengths)
    return useful / elapsed / 1e9, len(texts) / elapsed, sum(lengths)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=1000, help="workload size (default 1000)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rows", type=int, default=MATMUL_TOKENS,
                   help=f"rows of each timed matmul (default {MATMUL_TOKENS}: a full batch)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="time each matmul shape this long (default 1)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoConfig

    from bench.workload import mixed_texts
    from poolwire.models.model import bundled_model_dir

    shape = EncoderShape.of(AutoConfig.from_pretrained(bundled_model_dir(),
                                                        trust_remote_code=False))
    texts = mixed_texts(args.texts)
    print(f"[ceiling] in-process encode of {len(texts)} texts on {args.device}", file=sys.stderr)
    useful, texts_per_s, tokens = encode_gflops(texts, args.device, args.batch_size)
    rates = {}
    for dtype in DTYPES:
        print(f"[ceiling] {dtype} matmuls", file=sys.stderr)
        rates[dtype] = matmul_gflops(shape, dtype, args.device, args.seconds, args.rows)

    fp32 = rates["float32"]
    print(f"In-process `SentenceTransformer.encode(batch_size={args.batch_size})`: "
          f"{texts_per_s:.1f} texts/s, {tokens} real tokens, {useful:.1f} useful GFLOP/s "
          f"({useful / fp32:.0%} of this machine's float32 matmul rate below).\n")
    print("| matmuls in | GFLOP/s (model's shapes, "
          f"{args.rows} rows) | vs float32 | ceiling vs in-process float32 encode |")
    print("| --- | ---: | ---: | ---: |")
    for dtype, rate in rates.items():
        print(f"| {dtype} | {rate:.1f} | {rate / fp32:.2f}x | {rate / useful:.2f}x |")
    print(f"\nThe ceiling is a precision's matmul rate over encode's useful rate: what a path "
          f"that wasted nothing (no padding, no overhead, every FLOP at matmul speed) would "
          f"reach. {torch.get_num_threads()} torch threads; command: python bench/ceiling.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
