"""Benchmark the pooling kernels on CUDA against their PyTorch references and against vLLM-style
MEAN pooling (packed tokens, index_add_ into [B, H], divide by the lengths).

    python bench/kernels.py            # the full table, about a minute on an H200
    python bench/kernels.py --quick    # a few rows, to check that it runs

Prints one table: time per call and effective bandwidth (the bytes a call must move, read once and
written once, over its time), and the speed-up of Triton over each alternative. Numbers to
compare side by side, never assertions. Exits 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Run as a script, this file's folder heads sys.path and this file, kernels.py, would shadow the
# kernels package; put the repository root there instead.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# B x T x H: one request up to a full micro-batch of long inputs; MiniLM (384), BERT-large
# (1024) and 7B-class embedders (4096).
SEQ_SHAPES = [
    (1, 16, 384),
    (32, 128, 384),
    (256, 128, 384),
    (64, 512, 1024),
    (16, 256, 4096),
    (256, 512, 4096),
]
QUICK_SEQ_SHAPES = [(32, 128, 384), (64, 512, 4096)]
# N x C: sequence classifiers (few labels) and token classifiers (a row per token).
ACT_SHAPES = [(256, 2), (4096, 9), (65536, 9), (1024, 1000)]
QUICK_ACT_SHAPES = [(4096, 9)]
DTYPES = [torch.float16, torch.bfloat16]


@dataclass
class Row:
    op: str
    variant: str
    dtype: torch.dtype
    shape: str
    nbytes: int
    triton_ms: float
    ref_ms: float
    vllm_ms: float | None = None
    ok: bool = True


def _bench(fn: Callable[[], object]) -> float:
    import triton.testing

    # Median of repeated runs with the L2 cache flushed in between (do_bench's default).
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _ragged(batch: int, tokens: int, hidden: int, dtype: torch.dtype, gen: torch.Generator):
    # Uniform lengths in [1, T] with one full row: micro-batches mix short and long inputs.
    lengths = torch.randint(1, tokens + 1, (batch,), generator=gen)
    lengths[0] = tokens
    x = torch.randn(batch, tokens, hidden, generator=gen, device="cpu").to(dtype).cuda()
    return x, lengths  # lengths stay on the host, as the tokenizer hands them over


def vllm_mean_pool(packed: torch.Tensor, lengths_cpu: torch.Tensor) -> torch.Tensor:
    """MEAN pooling as vLLM's MeanPool does it: packed [N, H] tokens, segment ids, fp32
    index_add_ into [B, H] in chunks of about 16 MB, then a division by the lengths."""
    batch, hidden = lengths_cpu.numel(), packed.shape[1]
    lengths = lengths_cpu.to(packed.device, non_blocking=True)
    segments = torch.repeat_interleave(
        torch.arange(batch, device=packed.device), lengths, output_size=int(lengths_cpu.sum())
    )
    sums = torch.zeros(batch, hidden, dtype=torch.float32, device=packed.device)
    chunk = max(1, (16 << 20) // (hidden * 4))
    for start in range(0, packed.shape[0], chunk):
        sums.index_add_(0, segments[start : start + chunk], packed[start : start + chunk].float())
    return sums / lengths[:, None]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, atol=1e-4, rtol=1e-4))


def bench_seq_pool(shapes, dtypes, gen) -> list[Row]:
    from poolwire import kernels

    rows = []
    # (method, normalize): MEAN with and without the fused head, and the one-token methods.
    variants = [("mean", False), ("mean", True), ("cls", True), ("last", True)]
    for batch, tokens, hidden in shapes:
        for dtype in dtypes:
            x, lengths = _ragged(batch, tokens, hidden, dtype, gen)
            real = int(lengths.sum())
            mask = (torch.arange(tokens)[None, :] < lengths[:, None]).cuda()
            packed = x[mask]  # vLLM's layout: its inputs arrive packed, so packing is not timed
            for method, normalize in variants:
                read = (real if method == "mean" else batch) * hidden * x.element_size()
                nbytes = read + batch * hidden * 4

                def triton_fn(method=method, normalize=normalize):
                    return kernels.seq_pool_triton(x, lengths, method, normalize=normalize)

                def ref_fn(method=method, normalize=normalize):
                    return kernels.seq_pool_reference(x, lengths, method, normalize=normalize)

                row = Row(
                    "seq_pool",
                    f"{method}{'+norm' if normalize else ''}",
                    dtype,
                    f"{batch}x{tokens}x{hidden}",
                    nbytes,
                    _bench(triton_fn),
                    _bench(ref_fn),
                    ok=_close(triton_fn(), ref_fn()),
                )
                if method == "mean":

                    def vllm_fn(normalize=normalize):
                        pooled = vllm_mean_pool(packed, lengths)
                        return F.normalize(pooled, dim=-1) if normalize else pooled

                    row.vllm_ms = _bench(vllm_fn)
                    row.ok = row.ok and _close(triton_fn(), vllm_fn())
                rows.append(row)
            del x, packed
    return rows


def bench_token_pool(shapes, dtypes, gen) -> list[Row]:
    from poolwire import kernels

    rows = []
    for batch, tokens, hidden in shapes:
        for dtype in dtypes:
            x, lengths = _ragged(batch, tokens, hidden, dtype, gen)
            nbytes = int(lengths.sum()) * hidden * (x.element_size() + 4)

            def triton_fn():
                return kernels.token_pool_triton(x, lengths, normalize=True)

            def ref_fn():
                return kernels.token_pool_reference(x, lengths, normalize=True)

            rows.append(
                Row(
                    "token_pool",
                    "norm",
                    dtype,
                    f"{batch}x{tokens}x{hidden}",
                    nbytes,
                    _bench(triton_fn),
                    _bench(ref_fn),
                    ok=_close(triton_fn(), ref_fn()),
                )
            )
            del x
    return rows


def bench_activation(shapes, dtypes, gen) -> list[Row]:
    from poolwire import kernels

    rows = []
    for n, c in shapes:
        for dtype in dtypes:
            logits = (torch.randn(n, c, generator=gen) * 5).to(dtype).cuda()
            for kind in ("softmax", "sigmoid"):

                def triton_fn(kind=kind):
                    return kernels.activation_triton(logits, kind)

                def ref_fn(kind=kind):
                    return kernels.activation_reference(logits, kind)

                rows.append(
                    Row(
                        "activation",
                        kind,
                        dtype,
                        f"{n}x{c}",
                        n * c * (logits.element_size() + 4),
                        _bench(triton_fn),
                        _bench(ref_fn),
                        ok=_close(triton_fn(), ref_fn()),
                    )
                )
    return rows


def print_table(rows: list[Row]) -> None:
    def gbps(nbytes: int, ms: float) -> str:
        return f"{nbytes / (ms * 1e-3) / 1e9:8.1f}"

    head = (
        f"{'op':<10} {'variant':<10} {'dtype':<8} {'shape':<14} "
        f"{'triton us':>10} {'GB/s':>8} {'ref us':>10} {'GB/s':>8} {'ref/tri':>8} "
        f"{'vllm us':>10} {'GB/s':>8} {'vllm/tri':>8}  ok"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        vllm = (
            f"{r.vllm_ms * 1e3:10.1f} {gbps(r.nbytes, r.vllm_ms)} {r.vllm_ms / r.triton_ms:8.2f}"
            if r.vllm_ms is not None
            else f"{'-':>10} {'-':>8} {'-':>8}"
        )
        print(
            f"{r.op:<10} {r.variant:<10} {str(r.dtype).removeprefix('torch.'):<8} {r.shape:<14} "
            f"{r.triton_ms * 1e3:10.1f} {gbps(r.nbytes, r.triton_ms)} "
            f"{r.ref_ms * 1e3:10.1f} {gbps(r.nbytes, r.ref_ms)} {r.ref_ms / r.triton_ms:8.2f} "
            f"{vllm}  {'yes' if r.ok else 'NO'}"
        )
    print(
        "\nGB/s: bytes a call must move (real tokens read once, output written once) over its median time;"
        "\nref/tri and vllm/tri: how many times faster Triton is. vLLM's MEAN starts from packed tokens"
        "\n(its own layout), so its packing is not timed; ours reads the padded batch in place."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench/kernels.py: no CUDA device visible; these benchmarks time GPU kernels. "
              "Run it on a machine with an NVIDIA GPU (bench/gpu_check.sh does).", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench/kernels.py: TRITON_INTERPRET is set, which would time the CPU interpreter; "
              "unset it (or set TRITON_INTERPRET=0) and run again.", file=sys.stderr)
        return 2

    gen = torch.Generator().manual_seed(0)
    seq_shapes = QUICK_SEQ_SHAPES if args.quick else SEQ_SHAPES
    act_shapes = QUICK_ACT_SHAPES if args.quick else ACT_SHAPES
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = bench_seq_pool(seq_shapes, DTYPES, gen)
    rows += bench_token_pool(seq_shapes, DTYPES, gen)
    rows += bench_activation(act_shapes, DTYPES, gen)
    print_table(rows)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
