"""The in-process peers: SentenceTransformer.encode (torch float32, or a Sentence-Transformers
backend of bench/peers.py) and, for classify, the same classifier run by transformers directly,
each in a child process of its own (`bench/throughput.py --inprocess-child`) so that its peak RSS
is its model's and not the load generator's. The child prints one JSON line; the parent makes the
table's rows of it.

The child runs in the peers' virtualenv too, where poolwire is not installed: it imports poolwire
only on the torch path."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.children import ROOT, child_env, stop_process
from bench.meters import BackgroundMeter, peak_rss_mib, wait_for_quiet
from bench.progress import log
from bench.table import INPROCESS_KEY, Row, percentile
from bench.workload import is_short, mixed_texts


def inprocess_child(args: argparse.Namespace) -> int:
    """Runs in its own process: prints one JSON line with the in-process rows of one task:
    embed (SentenceTransformer.encode, and encode([short]) one call at a time) or, given
    --classifier, classify (transformers directly)."""
    import torch

    texts = mixed_texts(args.texts, seed=args.seed)
    warm = mixed_texts(64, seed=args.seed + 1)
    single = None
    if args.classifier:
        from bench.classifier import classifier_logits, load_classifier

        tokenizer, module = load_classifier(Path(args.classifier), args.device)
        name = "in-process classify"

        def run_all(batch: list[str]):
            return classifier_logits(tokenizer, module, batch, args.batch_size)
    elif args.st_kwargs:  # a peer (bench/peers.py), in its own virtualenv: no poolwire there
        from bench.peers import load_peer

        module = load_peer(args.model, args.st_kwargs, args.device)
        name = f"in-process encode ({args.st_kwargs})"

        def run_all(batch: list[str]):
            return module.encode(batch, batch_size=args.batch_size, show_progress_bar=False)
    else:
        from sentence_transformers import SentenceTransformer

        from poolwire.models.model import bundled_model_dir

        module = SentenceTransformer(str(args.model or bundled_model_dir()), device=args.device,
                                     trust_remote_code=False)
        name = "in-process encode"

        def run_all(batch: list[str]):
            return module.encode(batch, batch_size=args.batch_size, show_progress_bar=False)
    run_all(warm)
    if not args.classifier:
        single = single_text_latency(module, texts, warm, args)

    # One pass over the whole workload; a forward hook times each batch (end to end: the
    # previous batch's end, or the call's start, to this batch's end).
    batch_ms: list[float] = []
    mark = [0.0]
    n_batches = math.ceil(len(texts) / args.batch_size)

    def hook(_module, _inp, _out):
        now = time.perf_counter()
        batch_ms.append((now - mark[0]) * 1000.0)
        mark[0] = now
        if len(batch_ms) % max(1, n_batches // 4) == 0:
            log(f"{name}: {len(batch_ms)}/{n_batches} batches")

    handle = module.register_forward_hook(hook)
    log(f"{name} of {len(texts)} texts, batch size {args.batch_size} "
        f"(torch threads {torch.get_num_threads()})")
    if args.settle_s > 0:
        wait_for_quiet(args.settle_s, label=name)
    meter = BackgroundMeter()
    cpu0 = time.process_time()
    mark[0] = t0 = time.perf_counter()
    outputs = run_all(texts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    background = meter.cores()
    handle.remove()
    if len(outputs) != len(texts):
        raise RuntimeError(f"{name} returned {len(outputs)} outputs for {len(texts)} texts")
    if args.reference_out:
        import numpy as np

        np.save(args.reference_out, np.asarray(outputs, dtype=np.float32))
    print(json.dumps({
        "single": single,
        "batch": {"wall_s": wall, "latencies_ms": batch_ms, "peak_rss_mib": peak_rss_mib(os.getpid()),
                  "cpu_s": cpu, "background": background},
        "torch_threads": torch.get_num_threads(),
    }), flush=True)
    return 0


def single_text_latency(model, texts: list[str], warm: list[str], args: argparse.Namespace) -> dict:
    """encode([short]) repeated: the in-process floor of one short text's latency."""
    shorts = [t for t in texts if is_short(t)] or texts
    for t in warm[:8]:
        model.encode([t], show_progress_bar=False)
    single_ms = []
    if args.settle_s > 0:
        wait_for_quiet(args.settle_s, label="in-process encode([short])")
    meter = BackgroundMeter()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(args.latency_reps):
        s = time.perf_counter()
        model.encode([shorts[i % len(shorts)]], show_progress_bar=False)
        single_ms.append((time.perf_counter() - s) * 1000.0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    log(f"in-process encode([short]) x {args.latency_reps}: p50 "
        f"{percentile(single_ms, 50):.2f} ms")
    return {"calls": args.latency_reps, "wall_s": wall, "latencies_ms": single_ms,
            "peak_rss_mib": peak_rss_mib(os.getpid()), "cpu_s": cpu, "background": meter.cores(),
            "texts": [shorts[i % len(shorts)] for i in range(args.latency_reps)]}


def run_inprocess(args: argparse.Namespace, count_tokens, task: str = "embed",
                  reference_out: str | None = None, peer=None, python: str | None = None) -> list[Row]:
    """The in-process rows of `task`, from a child process of their own (so its peak RSS is
    that task's model's); the child saves its outputs to `reference_out`. With `peer` (a
    bench/peers.py Peer), that Sentence-Transformers backend, run by the peers' `python`."""
    cmd = [python or sys.executable, "-m", "bench.throughput", "--inprocess-child", "--texts", str(args.texts),
           "--seed", str(args.seed), "--batch-size", str(args.batch_size),
           "--latency-reps", str(args.latency_reps), "--settle-s", str(args.settle_s),
           "--device", args.device]
    if reference_out:
        cmd += ["--reference-out", reference_out]
    if task == "classify":
        cmd += ["--classifier", args.classifier]
    elif peer is not None:
        from poolwire.models.model import bundled_model_dir

        cmd += ["--model", str(args.model or bundled_model_dir()), "--st-kwargs", peer.kwargs_json()]
    elif args.model:
        cmd += ["--model", args.model]
    log(f"in-process {task}{f' {peer.key}' if peer else ''}: starting its own process")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            env=child_env(args.torch_threads), text=True, cwd=str(ROOT))
    try:
        out, _ = proc.communicate(timeout=args.timeout_s)
    finally:
        stop_process(proc, timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"the in-process {task} run exited with {proc.returncode}")
    data = json.loads(out.strip().splitlines()[-1])
    texts = mixed_texts(args.texts, seed=args.seed)
    single, batch = data["single"], data["batch"]
    what = ("transformers classify" if task == "classify" else "encode")
    key = INPROCESS_KEY[task] if peer is None else f"inprocess-{peer.key}"
    label = (f"in-process {what}, batch size {args.batch_size}" if peer is None
             else f"{peer.label}, batch size {args.batch_size}")
    rows = [Row(key, label, len(texts),
                sum(count_tokens(texts)), batch["wall_s"], batch["latencies_ms"],
                batch["peak_rss_mib"], requests=len(batch["latencies_ms"]),
                latency_unit=f"batch of {args.batch_size}", task=task,
                cpu_s={"inprocess": batch["cpu_s"], "background": batch["background"]},
                peer_of="exact" if peer is None else peer.peer_of(args.openvino_bf16))]
    if peer is not None:
        rows[0].mode = peer.mode
    if single is not None:
        rows.append(Row("inprocess-1" if peer is None else f"inprocess-1-{peer.key}",
                        "in-process encode([short]), one call at a time" if peer is None
                        else f"{peer.label}: encode([short]), one call at a time",
                        single["calls"], sum(count_tokens(single["texts"])), single["wall_s"],
                        single["latencies_ms"], single["peak_rss_mib"], requests=single["calls"],
                        latency_unit="call", peer_of=rows[0].peer_of,
                        cpu_s={"inprocess": single["cpu_s"], "background": single["background"]}))
        rows[-1].mode = rows[0].mode
    return rows


def run_peers(args: argparse.Namespace, count_tokens, workdir: Path, reference=None,
              setups=(), skipped: list[str] | None = None) -> list[Row]:
    """The rows of every bench/peers.py peer, each run by the peers' own interpreter, then
    llama-server's at each embed setup's concurrency (`setups`; c64 without any). With the
    torch float32 embeddings (`reference`), each peer's parity with them; a peer that cannot be
    set up here adds one line to `skipped` and the run goes on."""
    from dataclasses import replace

    from bench.fastembed_peer import ensure_export
    from bench.peers import ENV_DIR, PEERS, openvino_has_bf16, parity_verdict, peer_python
    from bench.precision_modes import embed_accuracy
    from bench.setups import Setup
    from poolwire.models.model import bundled_model_dir

    skipped = [] if skipped is None else skipped
    model_dir = Path(args.model or bundled_model_dir())
    try:
        python = peer_python(log)
    except Exception as exc:  # noqa: BLE001 - every peer lives there: report, go on
        skipped.append(f"every peer: their virtualenv could not be built: {_why(exc)}")
        log(f"peers: {skipped[-1]}")
        return []
    args.openvino_bf16 = openvino_has_bf16()
    rows: list[Row] = []

    def check(row: Row, vectors) -> None:
        if reference is not None:
            row.accuracy = embed_accuracy(reference, vectors)
        row.parity = parity_verdict(row.accuracy, row.peer_of)
        log(f"{row.key}: parity {row.parity}")

    for peer in PEERS:
        try:
            if peer.backend == "fastembed":
                export = ensure_export(python, model_dir, ENV_DIR / "fastembed-onnx", log)
                peer = replace(peer, model_kwargs={"path": str(export)})
            out = str(workdir / f"peer-{peer.key}.npy")
            peer_rows = run_inprocess(args, count_tokens, "embed", out, peer, python)
        except Exception as exc:  # noqa: BLE001 - one peer down is one line, not the run
            skipped.append(f"{peer.key}: {_why(exc)}")
            log(f"peers: {peer.key} not set up here: {_why(exc)}")
            continue
        import numpy as np

        check(peer_rows[0], np.load(out))
        rows += peer_rows
    setups = [s for s in setups if s.task == "embed"] or [Setup("c64", 1, 64, 1)]
    try:
        from bench.llama_peer import run_llama

        texts = mixed_texts(args.texts, seed=args.seed)
        llama_rows, vectors = run_llama(args, setups, python, model_dir, texts,
                                        count_tokens(texts), workdir, log)
    except Exception as exc:  # noqa: BLE001
        skipped.append(f"llama-server: {_why(exc)}")
        log(f"peers: llama-server not set up here: {_why(exc)}")
        return rows
    for row, got in zip(llama_rows, vectors):
        check(row, got)
    return rows + llama_rows


def _why(exc: BaseException) -> str:
    """One line: an error's type and the last line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400]
