"""What a forward pass costs on this device, in this precision, and the padding budget that
follows from it (`--max-added-padding auto`, the default on CUDA).

A forward pass costs about `fixed + per_token x padded tokens`. An item joining a batch adds its
own tokens plus the padding it brings; run on its own it would cost its tokens plus another
`fixed`. So joining pays while the padding it adds costs less than a batch's fixed cost:
budget = fixed / per_token. Both terms change with the hardware and the precision: float32 on
a 2-core CPU measured about 3.5 ms + 0.12 ms a token (a budget near 30), bfloat16 autocast
halves the per-token term (the budget doubles), and on a GPU the per-token term nearly
vanishes, so batches should fill up to `max_batch_tokens`.

Why not measured by default on a CPU: there the timing reads the machine's load as much as the
model. With other processes on the cores, torch's worker threads wait for each other and a
16-token pass that takes 4 ms quiet took 100 to 670 ms, giving budgets from 69 to 1,952 tokens
in six measurements at a load of 4 to 5 on 2 cores (and up to 60% padding in the benchmark).
A CPU keeps the float32 budget of 16, chosen by a sweep that found 8 to 32 equally good
(docs/PERFORMANCE.md), unless asked for `auto`; a GPU's fixed cost is its kernel launches, which
the CPU's load barely moves, and a fixed 16 there would keep its batches needlessly small.

`fit_batch_cost`, `BatchCost.padding_budget` and `budget_rule` are pure;
`measure_batch_cost` times real forward passes."""

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from poolwire.models.backend import Backend
from poolwire.models.task_heads import Forward

# (sequences, tokens each): padded sizes from 16 to 512 tokens, small enough to take about
# 0.3 s in all on a 2-core CPU (all-MiniLM-L6-v2) and long enough that the per-token term shows.
CALIBRATION_SHAPES: tuple[tuple[int, int], ...] = ((1, 16), (4, 16), (4, 64), (8, 64))
CALIBRATION_REPEATS = 2  # the fastest of these runs counts: other load only ever adds time
MIN_BUDGET = 1
CPU_BUDGET = 16  # tokens, for float32 on a CPU: the sweep of 8 / 16 / 32 in docs/PERFORMANCE.md
# Tokens, for OpenVINO on a CPU: the median of eight measurements of measure_batch_cost on the
# OpenVINO backend (MiniLM, f32; `fast` serves f32 on this AVX2 CPU, so both precisions are one
# arithmetic here and were measured as such), at a load of 2.7 to 3.8 on these 2 cores (other
# engineers' work): `bench/batch_cost_backends.py --runs 2 --repeats 8` and runs like it gave
# fixed 1.0 to 8.6 ms, 0.155 to 0.394 ms a padded token, budgets 12, 12, 54, 1, 19, 40, 41 and 5
# (median 15.5; torch in the same runs: 17 to 295, median 45). The per-token cost is torch's
# (0.16 to 0.27 ms) and the fixed cost about half of it, which would halve the budget, but the
# spread is wider than that difference: so 16, as for torch, inside the 8 to 32 the torch sweep
# found equally good; `--max-added-padding auto` measures it per worker. Under a load of 8 to 20
# the same measurement gave fixed 0 to 33 ms and 1.0 to 1.5 ms a token: the load, not the model.
OPENVINO_CPU_BUDGET = 16
# Tokens, for OpenVINO computing in bf16 (`fast` on a CPU with AVX-512 BF16 or AMX): its tokens
# cost about half of f32's and its fixed cost stays, so the budget doubles. Five interleaved
# pairs of `bench/throughput.py --configs c64 --modes fast --texts 1000
# --worker-args="--max-added-padding N"` (MiniLM, 2-core AMD EPYC with AVX-512 BF16,
# 2026-12-04): 16 read 183, 202, 201, 216 and 218 texts/s (10.6 sequences a batch), 32 read
# 219, 206, 212, 218 and 215 (14.1 a batch); 64 read 217 and 191 in two of them.
OPENVINO_BF16_BUDGET = 32
AUTO = "auto"


def budget_rule(requested: int | str | None, device_type: str,
                backend: str = "torch", ov_hint: str | None = None) -> int | str:
    """`--max-added-padding` as given (a number of tokens, or "auto": measure), or by default
    "auto" on CUDA, for OpenVINO OPENVINO_CPU_BUDGET (OPENVINO_BF16_BUDGET where it computes in
    bf16: `ov_hint`), and CPU_BUDGET for torch on a CPU (see the module's docstring for why)."""
    if requested is None:
        if device_type == "cuda":
            return AUTO
        if backend == "openvino":
            return OPENVINO_BF16_BUDGET if ov_hint == "bf16" else OPENVINO_CPU_BUDGET
        return CPU_BUDGET
    return requested


@dataclass(frozen=True)
class BatchCost:
    fixed_s: float       # a forward pass's cost whatever its size
    per_token_s: float   # and its cost per padded token

    def padding_budget(self, max_batch_tokens: int) -> int:
        """The padding tokens an item may add to a batch: what costs as much as one more pass,
        within [MIN_BUDGET, max_batch_tokens]."""
        if self.per_token_s <= 0:  # tokens look free (a GPU below saturation): fill batches
            return max_batch_tokens
        return max(MIN_BUDGET, min(max_batch_tokens, round(self.fixed_s / self.per_token_s)))

    def describe(self, budget: int) -> str:
        return (f"padding budget {budget} tokens (a forward pass measured "
                f"{self.fixed_s * 1e3:.2f} ms + {self.per_token_s * 1e3:.4f} ms a padded token)")


def fit_batch_cost(samples: Sequence[tuple[int, float]]) -> BatchCost:
    """Least-squares line through (padded tokens, seconds) samples. A negative fixed cost
    (noise on a device where size barely matters) is read as zero fixed cost, which a budget
    treats as "never pad"; a negative slope as free tokens."""
    if len({tokens for tokens, _ in samples}) < 2:
        raise ValueError(f"a cost line needs samples of at least two sizes, got {list(samples)}")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_s = sum(s for _, s in samples) / n
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    slope = sum((t - mean_t) * (s - mean_s) for t, s in samples) / spread
    fixed = mean_s - slope * mean_t
    return BatchCost(fixed_s=max(fixed, 0.0), per_token_s=max(slope, 0.0))


def measure_batch_cost(backend: Backend, shapes=CALIBRATION_SHAPES,
                       repeats: int = CALIBRATION_REPEATS) -> BatchCost:
    """Time the model's encoder on dummy batches of each shape (after one pass to warm it up,
    which also spares the first real request the one-off set-up costs) and fit the line.
    Lengths are capped at the model's maximum length."""
    model = backend.model
    vocab = max(2, min(len(model.tokenizer), getattr(model.module.config, "vocab_size", 2)))
    device = backend.device

    def one_pass(batch: int, length: int) -> float:
        ids = (torch.arange(batch * length, dtype=torch.long) % (vocab - 1) + 1).view(batch, length)
        mask = torch.ones_like(ids)
        types = torch.zeros_like(ids)
        ids, mask, types = (t.to(device) for t in (ids, mask, types))
        started = time.perf_counter()
        backend.run(Forward.HIDDEN, ids, mask, types)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # CUDA runs asynchronously: wait for the work itself
        return time.perf_counter() - started

    shapes = [(batch, max(1, min(length, model.max_length))) for batch, length in shapes]
    one_pass(*shapes[-1])
    samples = [(batch * length, min(one_pass(batch, length) for _ in range(repeats)))
               for batch, length in shapes]
    return fit_batch_cost(samples)


def batch_cost_of(backend: Backend) -> BatchCost:
    """measure_batch_cost once per model, backend and precision in this process (workers that
    share a loaded model, as tests do, share its measurement)."""
    key = (backend.name, backend.precision)
    cost = backend.model.batch_costs.get(key)
    if cost is None:
        cost = backend.model.batch_costs[key] = measure_batch_cost(backend)
    return cost
