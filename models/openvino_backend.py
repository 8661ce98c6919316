"""The model's transformer compiled by OpenVINO for the CPU (`--backend openvino`, and `auto` on a
CPU): the same forward passes as `LoadedModel.encoder_hidden` / `head_logits` / `token_logits`,
converted once from the loaded torch module with `openvino.convert_model` (no optimum: it pins
an older transformers), with dynamic batch and sequence dimensions.

What the graph computes is exactly what TorchBackend computes: each forward kind the model
needs is traced through the LoadedModel method itself, so the decoder's last-token gather and a
sequence classifier's per-token head are part of the graph. A model on transformers' SDPA
attention is traced with `traceable_attention` (its masks built without vmap, no query row
left without a key: what Gemma3's bidirectional masks and ModernBERT's local attention need). Pooling, Dense, truncation and
normalisation stay after the backend (`forward.py`), for every backend alike.

The cache (see `OpenVinoCache`): the converted IR is saved under the state dir, keyed by the
model's files, poolwire's, transformers' and OpenVINO's versions, so a restart reads the IR
instead of tracing the model again (tracing is most of a start: about 2 s for MiniLM here).
The compiled blob is OpenVINO's own CACHE_DIR beside it: OpenVINO keys it by the graph, the
device, the compile properties (the precision hint among them) and its own version, which is
exactly the key a compiled model needs, so no key of ours repeats that."""

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poolwire.models.model import LoadedModel, ModelKind
from poolwire.models.precision import PrecisionPlan
from poolwire.models.task_heads import Forward
from poolwire.models.traceable_attention import traceable_attention

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# What poolwire traces, beyond its version: raised when the same files and versions give another
# graph, so an IR cached by the older trace is not reused (2: traceable_attention's masks).
TRACE_REVISION = 2

# Threads, streams and infer requests. The LATENCY hint gives one stream with a thread per core
# (INFERENCE_NUM_THREADS unset; `--openvino-threads` overrides it) and one infer request, which
# is what the engine's one forward thread feeds, one batch at a time. Measured through a worker
# (bench/throughput.py --configs c1,c64, MiniLM, 300 texts, 2-core AVX2 machine shared with
# other work at 1.2 to 1.3 cores): at concurrency 64 the event loop (decoding, tokenizing,
# NATS) used 0.4 CPU s against 9.4 for OpenVINO's threads, at concurrency 1 0.8 against 12.5:
# the loop needs 3% to 6% of what the forward pass does, so OpenVINO gets both cores and the
# loop's short bursts interleave. A second stream with a second infer request would halve each
# batch's threads to run two batches the planner rarely has ready (10 texts a batch at
# concurrency 64). Threads, 1 against 2 (`--openvino-threads`), interleaved runs of
# `bench/throughput.py --configs c1,c64 --modes exact --texts 200 --settle-s 3` (texts/s at
# concurrency 1 and 64, other processes' cores in brackets): 1 thread 27.5 / 33.9 (1.0),
# 2 threads 17.9 / 29.0 (0.9-1.1), 1 thread 23.7 / 31.0 (0.7-0.9), 2 threads 36.0 / 51.5
# (0.3). With a core taken by other work the two are within the noise; the quietest run, with
# two threads, was the fastest (1.5x to 1.7x the one-thread runs). The event loop took 0.1 to 0.5 CPU s against 4.7 to 8.2 for
# OpenVINO's threads in every run, so it never needed a core of its own: a thread per core.
PERFORMANCE_HINT = "LATENCY"

# A small batch runs on one thread. With a thread per core, every node of the graph is split
# across the cores and joined again, and oneTBB's threads busy-wait between nodes and after the
# pass (its worker_wait): on a batch computed in well under a millisecond, waking and joining
# the other threads costs about what they save, and they spin the whole time, on cores the
# event loop and the tokenizer need. So where the model is that fast, a one-thread twin of each
# compiled pass takes the batches it computes alone in at most SMALL_BATCH_S, and the
# all-cores pass the rest. Measured on the near-zero model of bench/service_cost.py (2-core AVX2
# VM, the caller's CPU / the process's CPU per infer, median): one short text 276 / 619 us on
# two threads, 214 / 228 us on one; 22 short texts 692 / 1,387 us against 787 / 797 us. A model
# whose smallest batch takes longer than that (MiniLM: milliseconds) compiles no twin.
SMALL_BATCH_S = 0.001
# The calibration batches (rows, tokens): the twin's time is modelled as fixed + per token.
CALIBRATION = ((2, 8), (8, 64))

# A one-row batch of a model with a twin (one request at a time) runs through a pass compiled
# for exactly one row of the next of these widths, right-padded to it: a pass of dynamic shape
# pays for shape inference and memory on every call, about as much as the near-zero model's
# whole pass. One short text on the near-zero model of bench/service_cost.py: 183 us through
# the dynamic one-thread twin, 72 us through a [1, 16] pass (2-core AVX2 VM, best of five
# runs of 2,000). Padding is what every batch of several rows already has: the mask keeps it
# out of the real tokens' outputs, and the start-up check compares these passes with torch too.
ONE_ROW_WIDTHS = (16, 32, 64, 128)
# A model too slow for a twin (MiniLM) gets one-row passes too, on all its cores, for the widths
# of a query: a dynamic pass fed one text after another of other lengths reshapes its kernels
# and memory on each, and the model's compute no longer hides that. Measured on MiniLM (2-core
# AMD EPYC with AVX-512 BF16, 2026-12-04; one row at a time, lengths varying within each range,
# the two passes interleaved, median ms): bf16 6-16 tokens 2.47 against 3.57, 17-24 3.71
# against 4.56, 25-32 3.69 against 5.12; f32 3.42 against 3.92, 5.76 against 5.56, 5.75
# against 6.74. Past 32 tokens the padding eats the gain (f32 33-48: 8.80 against 7.49).
QUERY_ROW_WIDTHS = (16, 32)
# Each such pass repacks the model's matmul weights for its shapes: MiniLM's 90 MB of float32
# weights cost 50 MB more resident per pass in f32 and 33 MB in bf16. Only models up to this
# many bytes of weights get them; a bigger one's lone text takes the dynamic pass.
ONE_ROW_MAX_WEIGHT_BYTES = 256 << 20
# Forward kinds whose outputs have a row per token ([B, T, ...]): cut back to the batch's width.
PER_TOKEN = frozenset({Forward.HIDDEN, Forward.TOKEN_LOGITS, Forward.MLM_LOGITS})


def forwards_for(model: LoadedModel) -> tuple[str, ...]:
    """The forward kinds this model's tasks can ask for (task_heads.plan)."""
    if model.kind == ModelKind.ENCODER:
        return (Forward.HIDDEN,)
    if model.kind == ModelKind.SPARSE:
        return (Forward.MLM_LOGITS,)
    if model.kind == ModelKind.TOKEN_CLASSIFICATION:
        return (Forward.TOKEN_LOGITS,)
    if model.per_token_classifier:
        return (Forward.SEQ_LOGITS, Forward.TOKEN_LOGITS)
    return (Forward.SEQ_LOGITS,)


class _Pass(torch.nn.Module):
    """One forward kind of a LoadedModel as a module with three tensor inputs, for tracing."""

    def __init__(self, model: LoadedModel, forward: str) -> None:
        super().__init__()
        self.module = model.module   # registered, so the tracer sees the weights as constants
        self._model = model
        self._forward = forward

    def forward(self, input_ids, attention_mask, token_type_ids):
        model = self._model
        if self._forward == Forward.HIDDEN:
            return model.encoder_hidden(input_ids, attention_mask, token_type_ids)
        if self._forward == Forward.SEQ_LOGITS:
            return model.head_logits(input_ids, attention_mask, token_type_ids)
        if self._forward == Forward.MLM_LOGITS:
            return model.mlm_logits(input_ids, attention_mask, token_type_ids)
        return model.token_logits(input_ids, attention_mask, token_type_ids)


@contextlib.contextmanager
def _no_kv_cache(module: torch.nn.Module):
    """A decoder returns its key/value cache by default (config.use_cache), built from empty
    tensors the converter cannot take; pooling never reads it, so trace without it."""
    config = getattr(module, "config", None)
    saved = getattr(config, "use_cache", None)
    if saved:
        config.use_cache = False
    try:
        yield
    finally:
        if saved:
            config.use_cache = saved


def _cycling_ids(model: LoadedModel, rows: int, tokens: int) -> np.ndarray:
    """[rows, tokens] int64 ids cycling through the vocabulary past its first two ids (the
    special tokens of most tokenizers), for batches made without a tokenizer call."""
    vocab = max(3, min(len(model.tokenizer), getattr(model.module.config, "vocab_size", 3)))
    return (np.arange(rows * tokens, dtype=np.int64) % (vocab - 2) + 2).reshape(rows, tokens)


def _example(model: LoadedModel):
    """A right-padded batch of two rows of different lengths, so the traced graph keeps the
    padding paths (a constant all-ones mask could be folded away)."""
    length = max(2, min(8, model.max_length))
    ids = torch.from_numpy(_cycling_ids(model, 2, length))
    mask = torch.ones_like(ids)
    mask[1, length // 2:] = 0
    return ids, mask, torch.zeros_like(ids)


def folder_digest(path: Path) -> str:
    """sha256 of every file of the model folder (names and contents): a plain folder has no
    revision, and a hub snapshot's files are what its revision names anyway. Reading the
    weights costs about 0.1 s for MiniLM's 90 MB, far less than a conversion."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def cache_key(model: LoadedModel, forward: str, ov_version: str) -> str:
    """What the converted IR depends on: the model's files, its weights' dtype, the code that
    traces it (poolwire's and transformers' versions) and the converter's version. The
    precision is a compile property, part of OpenVINO's own CACHE_DIR key instead."""
    import transformers

    from poolwire import __version__

    parts = {"files": folder_digest(model.path), "dtype": str(model.dtype), "forward": forward,
             "poolwire": __version__, "transformers": transformers.__version__,
             "openvino": ov_version, "trace": TRACE_REVISION}
    if model.answer_tokens:  # a token-logit reranker's head: --reranker's tokens, not the files'
        parts["answer_tokens"] = list(model.answer_tokens)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class _Compiled:
    request: object          # the one infer request (one stream; the engine's one thread)
    inputs: tuple[str, ...]  # the graph's inputs, in INPUTS order (unused ones are dropped)
    tensor: type             # openvino.Tensor, looked up once rather than per batch
    shape: tuple[int, ...] | None = None  # the input shape of the last pass that succeeded


def weight_bytes(model: LoadedModel) -> int:
    """The bytes of the model's weights as loaded (parameters and buffers)."""
    tensors = [*model.module.parameters(), *model.module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def fixed_width(width: int, widths: tuple[int, ...]) -> int | None:
    """The smallest of `widths` (ascending) that holds `width` tokens; None past the largest."""
    return next((w for w in widths if w >= width), None)


def _cut(out: np.ndarray, forward: str, width: int) -> np.ndarray:
    """A one-row pass's outputs without its padding: a per-token pass's rows past `width` go."""
    return out[:, :width] if forward in PER_TOKEN else out


def pad_into(row: np.ndarray, array: np.ndarray) -> None:
    """A one-row input (ids, mask or segment ids) written into a [1, width] buffer, right-padded
    with zeros: id 0 exists in every vocabulary, and the mask's zeros keep it out of every real
    token."""
    width = array.shape[1]
    row[:, :width] = array
    row[:, width:] = 0


class _OneRow:
    """A pass compiled for [1, width] that owns its input buffers: they are set on the infer
    request once, and each row is written into them. Setting new tensors on every call (as
    `_infer` does for passes of any shape) cost about 55 of a one-row pass's 160 us on the
    near-zero model (2-core AVX2 VM, 2026-12-04)."""

    def __init__(self, compiled: _Compiled, width: int) -> None:
        self.compiled = compiled
        self.rows = {name: np.zeros((1, width), dtype=np.int64) for name in compiled.inputs}
        for name, row in self.rows.items():
            compiled.request.set_tensor(name, compiled.tensor(row, shared_memory=True))

    def infer(self, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
        given = dict(zip(INPUTS, arrays))
        for name, row in self.rows.items():
            pad_into(row, given[name])
        return _outputs(self.compiled.request)

    def infer_ids(self, ids: list[int]) -> np.ndarray:
        """One text's token ids (no segment ids, every token real) -> the pass's outputs,
        written into the buffers without an array of the row's own on the way."""
        n = len(ids)
        for name, row in self.rows.items():
            if name == "input_ids":
                row[0, :n] = ids
                row[0, n:] = 0
            elif name == "attention_mask":
                row[0, :n] = 1
                row[0, n:] = 0
            else:  # segment ids: all zero, whatever a pair's row left there
                row[0] = 0
        return _outputs(self.compiled.request)


@dataclass(frozen=True)
class _Twin:
    """A pass compiled for one thread, with its measured cost: fixed_s + per_token_s x tokens."""

    compiled: _Compiled
    fixed_s: float
    per_token_s: float

    def seconds(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens


def one_thread_cost(timings: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per token) through two (padded tokens, seconds) calibration
    points. Where the bigger batch timed no slower (noise), all of the small batch's time is
    counted per token: the cost must grow with the batch, or every batch would take the twin."""
    (small_tokens, small_s), (big_tokens, big_s) = timings
    if big_s <= small_s:
        return 0.0, small_s / small_tokens
    per_token = (big_s - small_s) / (big_tokens - small_tokens)
    return max(0.0, small_s - per_token * small_tokens), per_token


def takes_one_thread(twin: "_Twin | None", tokens: int, limit_s: float) -> bool:
    """Whether a batch of `tokens` padded tokens runs on the one-thread twin."""
    return twin is not None and twin.seconds(tokens) <= limit_s


class OpenVinoUnavailable(RuntimeError):
    """This backend cannot serve this model here; the message says why, in one line."""


class OpenVinoBackend:
    name = "openvino"

    def __init__(self, model: LoadedModel, precision: PrecisionPlan, cache_dir: Path | None,
                 threads: int | None = None) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise OpenVinoUnavailable(f"openvino is not installed ({exc})") from None
        if model.device.type != "cpu":
            raise OpenVinoUnavailable(f"OpenVINO serves the CPU, and the model is on "
                                      f"{model.device}")
        if model.dtype != torch.float32:
            raise OpenVinoUnavailable(f"OpenVINO converts float32 weights; --dtype "
                                      f"{str(model.dtype).removeprefix('torch.')} cast them")
        self.model = model
        self.precision = precision
        self.version = ov.get_version().split("-")[0]
        self.core = ov.Core()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        config = {"INFERENCE_PRECISION_HINT": precision.ov_hint or "f32",
                  "PERFORMANCE_HINT": PERFORMANCE_HINT}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = threads
        if self.cache_dir is not None:
            config["CACHE_DIR"] = str(self.cache_dir / "compiled")
        self.converted: list[str] = []   # forward kinds traced in this start
        self.reused: list[str] = []      # read from the cache instead
        self._compiled: dict[str, _Compiled] = {}
        self._twins: dict[str, _Twin] = {}  # one-thread passes for small batches
        # forward -> {width: a one-thread pass compiled for [1, width]}, beside each twin
        self._one_row: dict[str, dict[int, _OneRow]] = {}
        self.small_batch_s = SMALL_BATCH_S
        self._lock = threading.Lock()
        # One-row passes for a model without a twin cost a share of its weights each.
        query_rows = weight_bytes(model) <= ONE_ROW_MAX_WEIGHT_BYTES
        for forward in forwards_for(model):
            try:
                graph = self._graph(ov, forward)
                compiled = self.core.compile_model(graph, "CPU", config)
                self._compiled[forward] = _request(compiled)
                # Only where the cores were not chosen (--openvino-threads) and are several.
                if threads is None and int(compiled.get_property("INFERENCE_NUM_THREADS")) > 1:
                    self._twin(graph, forward, {**config, "INFERENCE_NUM_THREADS": 1})
                if forward in self._twins:
                    self._one_row[forward] = self._fixed_passes(
                        graph, {**config, "INFERENCE_NUM_THREADS": 1}, ONE_ROW_WIDTHS)
                elif query_rows:
                    self._one_row[forward] = self._fixed_passes(graph, config, QUERY_ROW_WIDTHS)
            except Exception as exc:  # noqa: BLE001 - any converter failure means: not here
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise OpenVinoUnavailable(f"OpenVINO could not convert {model.architecture} "
                                          f"({forward}): {first[:300]}") from exc

    def _twin(self, graph, forward: str, config: dict) -> None:
        """Compile and calibrate the one-thread twin of a pass whose smallest batch the
        all-cores pass computes within SMALL_BATCH_S; a slower model gets none."""
        small, big = (self._calibration_batch(rows, tokens) for rows, tokens in CALIBRATION)
        if _best_seconds(self._compiled[forward], small, enough_s=self.small_batch_s) \
                > self.small_batch_s:
            return
        twin = _request(self.core.compile_model(graph, "CPU", config))
        fixed, per_token = one_thread_cost([(small[0].size, _best_seconds(twin, small)),
                                            (big[0].size, _best_seconds(twin, big))])
        self._twins[forward] = _Twin(twin, fixed, per_token)

    def _fixed_passes(self, graph, config: dict, widths: tuple[int, ...]) -> dict[int, _OneRow]:
        """The graph compiled for one row of each of `widths` the model can take."""
        passes = {}
        for width in widths:
            if width > self.model.max_length:
                break
            fixed = graph.clone()
            fixed.reshape({port.get_any_name(): [1, width] for port in fixed.inputs})
            passes[width] = _OneRow(_request(self.core.compile_model(fixed, "CPU", config)),
                                    width)
        return passes

    def _calibration_batch(self, rows: int, tokens: int) -> tuple[np.ndarray, ...]:
        """ids, mask and segment ids of `rows` full rows of `tokens` tokens (at most the
        model's max_length), ids cycling through the vocabulary past its special tokens."""
        ids = _cycling_ids(self.model, rows, max(2, min(tokens, self.model.max_length)))
        return ids, np.ones_like(ids), np.zeros_like(ids)

    def _graph(self, ov, forward: str):
        """The IR from the cache, or converted from the torch module (and saved)."""
        xml = None
        if self.cache_dir is not None:
            xml = (self.cache_dir / "ir" / cache_key(self.model, forward, self.version)
                   / f"{forward}.xml")
            if xml.is_file():
                self.reused.append(forward)
                return self.core.read_model(xml)
        shape = ov.PartialShape([-1, -1])
        # The tracer warns of every Python branch on a shape; they are the masking code's
        # checks that hold for every right-padded batch, not a start-up message for users.
        with _no_kv_cache(self.model.module), traceable_attention(self.model.module), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = ov.convert_model(_Pass(self.model, forward),
                                     example_input=_example(self.model),
                                     input=[(name, shape, ov.Type.i64) for name in INPUTS])
        self.converted.append(forward)
        if xml is not None:
            xml.parent.mkdir(parents=True, exist_ok=True)
            partial = xml.with_suffix(".partial.xml")
            # float32 as converted: the default would halve the weights to float16 on disk.
            ov.save_model(graph, partial, compress_to_fp16=False)
            # Renamed into place last, so a start killed mid-save never leaves a half IR that
            # the next start would read.
            os.replace(partial.with_suffix(".bin"), xml.with_suffix(".bin"))
            os.replace(partial, xml)
        return graph

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def run(self, forward: str, ids: torch.Tensor, mask: torch.Tensor,
            types: torch.Tensor) -> torch.Tensor:
        compiled = self._compiled.get(forward)
        if compiled is None:
            raise ValueError(f"{self.model.architecture} has no {forward} forward pass")
        arrays = (ids.numpy(), mask.numpy(), types.numpy())
        rows, width = arrays[0].shape
        row_pass = self._row_pass(forward, width) if rows == 1 else None
        if row_pass is not None:
            with self._lock:
                out = row_pass.infer(arrays)
            return torch.from_numpy(_cut(out, forward, width))
        twin = self._twins.get(forward)
        if takes_one_thread(twin, ids.numel(), self.small_batch_s):
            compiled = twin.compiled
        with self._lock:  # one infer request each: callers other than the forward thread wait
            out = _infer(compiled, arrays)
        return torch.from_numpy(out)

    def run_row(self, forward: str, ids: list[int]) -> np.ndarray | None:
        """One text's outputs ([1, len(ids), ...] for a per-token pass) as a NumPy array,
        through the fixed one-row pass that holds it; None where none does (a model without
        one-row passes, or a text past the widest). What `run` gives for the same one-row
        batch, without the batch's tensors: one request at a time, padding, tensors and the
        batch pooling cost the near-zero model more than its pass (forward.run_batch)."""
        row_pass = self._row_pass(forward, len(ids)) if ids else None
        if row_pass is None:
            return None
        with self._lock:
            out = row_pass.infer_ids(ids)
        return _cut(out, forward, len(ids))

    def _row_pass(self, forward: str, width: int) -> "_OneRow | None":
        """The narrowest one-row pass of `forward` that holds `width` tokens, if any."""
        passes = self._one_row.get(forward)
        fixed = fixed_width(width, tuple(passes)) if passes else None
        return passes[fixed] if fixed is not None else None

    def seconds_alone(self, forward: str, tokens: int) -> float | None:
        """The one-thread twin's modelled time for a batch it takes; None for a batch the
        all-cores pass takes (its time on a busy machine is not known) or a model without a
        twin."""
        twin = self._twins.get(forward)
        if not takes_one_thread(twin, tokens, self.small_batch_s):
            return None
        return twin.seconds(tokens)

    def run_each(self, forward: str, ids: torch.Tensor, mask: torch.Tensor,
                 types: torch.Tensor) -> list[torch.Tensor]:
        """The batch through every compiled pass of `forward` (the all-cores pass, then its
        twin where it has one), whatever the batch's size: what the start-up check compares
        with torch."""
        passes = [self._compiled[forward]] + (
            [self._twins[forward].compiled] if forward in self._twins else [])
        arrays = (ids.numpy(), mask.numpy(), types.numpy())
        with self._lock:
            outputs = [torch.from_numpy(_infer(c, arrays)) for c in passes]
        if self._one_row.get(forward):
            outputs.append(self._row_by_row(forward, ids, mask, types))
        return outputs

    def _row_by_row(self, forward: str, ids: torch.Tensor, mask: torch.Tensor,
                    types: torch.Tensor) -> torch.Tensor:
        """The batch computed one row at a time, each row cut to its real tokens (the paths of
        a one-row batch: a fixed-width pass where one holds it), stacked in the batch's shape
        with zeros on the padding."""
        rows = []
        for row in range(ids.shape[0]):
            real = int(mask[row].sum())
            # A row without segment ids takes the path of one text (run_row), the rest run().
            alone = None if types[row].any() else self.run_row(forward, ids[row, :real].tolist())
            rows.append(torch.from_numpy(alone) if alone is not None else
                        self.run(forward, ids[row:row + 1, :real], mask[row:row + 1, :real],
                                 types[row:row + 1, :real]))
        if forward not in PER_TOKEN:
            return torch.cat(rows)
        out = torch.zeros((ids.shape[0], ids.shape[1], *rows[0].shape[2:]), dtype=rows[0].dtype)
        for row, value in enumerate(rows):
            out[row, :value.shape[1]] = value[0]
        return out

    @property
    def twins(self) -> dict[str, float]:
        """{forward kind: the most padded tokens its one-thread twin takes}."""
        return {forward: max(0.0, (self.small_batch_s - twin.fixed_s) / twin.per_token_s)
                for forward, twin in self._twins.items()}

    def describe(self) -> str:
        how = ("converted " + ", ".join(self.converted) if self.converted else "") + (
            ("; " if self.converted and self.reused else "")
            + ("reused the cached " + ", ".join(self.reused) if self.reused else ""))
        where = f" ({how})" if how else ""
        small = "".join(f"; batches of up to {tokens:,.0f} tokens on one thread ({forward})"
                        for forward, tokens in self.twins.items())
        if self._one_row:
            widths = sorted({w for passes in self._one_row.values() for w in passes})
            small += f"; one row in fixed widths {', '.join(map(str, widths))}"
        return f"backend openvino {self.version}{where}, {self.precision.describe()}{small}"


def _request(compiled) -> _Compiled:
    import openvino as ov

    names = {name for port in compiled.inputs for name in port.get_names()}
    return _Compiled(compiled.create_infer_request(), tuple(n for n in INPUTS if n in names),
                     ov.Tensor)


def _infer(compiled: _Compiled, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """One batch through one infer request. The request's own API rather than infer(feed): its
    Python wrapper (a dispatch per input, a dict of outputs) cost about 40 us a call, a fifth of
    the near-zero model's whole forward pass (bench/service_cost.py). The tensors share the
    arrays' memory, which outlives the call; the output is copied out of the request's
    buffer, which the next batch overwrites."""
    _set_inputs(compiled, dict(zip(INPUTS, arrays)))
    try:
        out = _outputs(compiled.request)
    except Exception:
        _set_up_again(compiled)
        raise
    compiled.shape = arrays[0].shape
    return out


def _set_up_again(compiled: _Compiled) -> None:
    """After a pass that raised, one throwaway pass of a shape other than the last good one's.
    A failed pass leaves the CPU plugin's shapes half set up (OpenVINO 2026.4): the next batch
    of the last good pass's shape, which the plugin takes to be unchanged and so does not set
    up again, failed with the same error, and every batch of that shape after it, until one of
    another shape ran. So one bad batch (a sequence past the model's position table) went on
    failing other clients' valid requests (tests/test_openvino_backend.py)."""
    width = 2 if compiled.shape == (1, 1) else 1
    given = {"input_ids": np.zeros((1, width), dtype=np.int64),
             "attention_mask": np.ones((1, width), dtype=np.int64),
             "token_type_ids": np.zeros((1, width), dtype=np.int64)}
    try:
        _set_inputs(compiled, given)
        compiled.request.infer()  # the next pass sets its own tensors over these, as each does
        compiled.shape = (1, width)
    except Exception:  # the batch's own error is what its requests are answered with
        log.exception("a pass of one token, to set OpenVINO's shapes up again after a failed "
                      "pass, failed too; the next batches may fail until one of a new shape")


def _set_inputs(compiled: _Compiled, given: dict[str, np.ndarray]) -> None:
    """The graph's inputs set on the request, sharing the arrays' memory."""
    for name in compiled.inputs:
        compiled.request.set_tensor(name, compiled.tensor(given[name], shared_memory=True))


def _outputs(request) -> np.ndarray:
    """Run the request on the tensors set on it; its output copied out of the request's buffer,
    which the next call overwrites."""
    request.infer()
    return request.get_output_tensor(0).data.copy()


def _best_seconds(compiled: _Compiled, arrays: tuple[np.ndarray, ...], reps: int = 5,
                  enough_s: float | None = None) -> float:
    """The fastest of `reps` timed runs, after one untimed run that warms the request. With
    `enough_s`, it stops as soon as the answer to "within enough_s?" is known: at a run within
    it, or at one ten times over it (a big model pays one timed run at start, not five)."""
    _infer(compiled, arrays)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        _infer(compiled, arrays)
        best = min(best, time.perf_counter() - started)
        if enough_s is not None and (best <= enough_s or best > 10 * enough_s):
            break
    return best
