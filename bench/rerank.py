"""`bench/rerank.py`: one query ranked against N documents (100 by default), through NATS by
a poolwire worker (the rerank form of score, PROTOCOL 1.2) against `CrossEncoder.rank` run
in-process on the same model, in the same run, printed as a ratio.

    python bench/rerank.py                    # 100 documents, 10 timed reranks each side
    python bench/rerank.py --documents 20 --reps 3
    python bench/rerank.py --model /path/to/a/cross-encoder --json out.json

The model is a one-label cross-encoder: `--model` if given, else one built for the run from the
bundled all-MiniLM-L6-v2 encoder (its six trained layers under a seeded, untrained one-label
head, as bench/classifier.py builds its classifier), so the forward passes cost what a MiniLM
cross-encoder's do; its scores mean nothing, the two sides' must only agree. The documents are
the benchmark workload's (bench/workload.py: 70% short sentences, 30% passages of 60-200 words).
Both sides run float32 (`--precision exact`) on the same threads of this process, each warmed
up first, their timed runs alternating (so load from elsewhere falls on both alike); the worker is in-process (actors/worker.py) against a nats-server
this run starts. Prints markdown: the table, the command, and whether both sides ranked alike.
Numbers to compare, never assertions: on a shared machine they are noisy; the ratio, measured
in one run, is what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402
from bench.progress import log  # noqa: E402 - after the path fix, when run as a script

QUERY = "which team repairs the broken clock before dawn?"
PREFIX = "bench.rerank"
SEED = 4321
COLUMNS = ("setup", "documents", "p50 ms", "min ms", "documents/s", "vs CrossEncoder.rank")


def build_cross_encoder(dest: Path) -> Path:
    """The bundled encoder under a one-label head from a fixed seed (bench/classifier.py's
    builder), saved with its tokenizer."""
    from bench.classifier import build_classifier

    return build_classifier(dest, labels=("score",), seed=SEED)


def _summary(name: str, n_docs: int, seconds: list[float], peer_p50: float | None) -> dict:
    p50 = statistics.median(seconds)
    return {"setup": name, "documents": n_docs, "p50_ms": 1000 * p50,
            "min_ms": 1000 * min(seconds), "documents_per_s": n_docs / p50,
            # How many times the in-process rank's time this setup takes (1.0 for the peer).
            "vs_rank": p50 / peer_p50 if peer_p50 else 1.0}


async def run_both(folder: Path, docs: list[str], reps: int, warmup: int, batch_size: int,
                   worker_options: dict):
    """Timed reranks of both sides, alternating rep by rep, so that load from elsewhere on the
    machine falls on both alike. The in-process rank blocks the event loop while it runs; no
    request is in flight then, so the worker has nothing to do meanwhile."""
    import nats
    from sentence_transformers import CrossEncoder

    from poolwire.actors.nats_server import NatsServer
    from poolwire.actors.worker import Worker
    from poolwire.client import PoolingClient
    from poolwire.models.model import load_model
    from poolwire.settings import WorkerSettings

    peer = CrossEncoder(str(folder), device="cpu", trust_remote_code=False)
    model = load_model(folder)
    with NatsServer() as server:
        worker = Worker(WorkerSettings(prefix=PREFIX, precision="exact", **worker_options), model)
        await worker.start(server.url)
        nc = await nats.connect(server.url)
        try:
            client = PoolingClient(nc, prefix=PREFIX, timeout=600)
            for _ in range(warmup):
                peer.rank(QUERY, docs, batch_size=batch_size)
                await client.rerank(QUERY, docs)
            peer_s, ours_s, peer_result, reply = [], [], None, None
            for _ in range(reps):
                started = time.perf_counter()
                peer_result = peer.rank(QUERY, docs, batch_size=batch_size)
                peer_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                reply = await client.rerank(QUERY, docs)
                ours_s.append(time.perf_counter() - started)
        finally:
            await nc.close()
            await worker.stop()
    return (peer_s, [(r["corpus_id"], float(r["score"])) for r in peer_result],
            ours_s, [(d["index"], float(d["data"])) for d in reply["data"]])


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        lines.append(f"| {r['setup']} | {r['documents']} | {r['p50_ms']:.1f} | {r['min_ms']:.1f} "
                     f"| {r['documents_per_s']:.1f} | {r['vs_rank']:.2f}x |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--documents", type=count, default=100, help="documents per rerank")
    p.add_argument("--reps", type=count, default=10, help="timed reranks on each side")
    p.add_argument("--warmup", type=int, default=2, help="untimed reranks first, on each side")
    p.add_argument("--batch-size", type=int, default=32, help="CrossEncoder.rank's batch_size")
    p.add_argument("--model", type=Path, help="a one-label cross-encoder folder (default: built "
                                              "from the bundled MiniLM)")
    p.add_argument("--max-batch-tokens", type=int, help="the worker's --max-batch-tokens")
    p.add_argument("--json", type=Path, help="also write the rows and the agreement here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.workload import mixed_texts

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    docs = mixed_texts(args.documents, seed=7)
    worker_options = {"max_batch_tokens": args.max_batch_tokens} if args.max_batch_tokens else {}
    with tempfile.TemporaryDirectory(prefix="poolwire-rerank-") as tmp:
        folder = args.model or build_cross_encoder(Path(tmp) / "cross-encoder")
        log(f"CrossEncoder.rank in-process and poolwire rerank over NATS, alternating: "
             f"{args.documents} documents x {args.reps} each")
        peer_s, peer_ranking, ours_s, ours_ranking = asyncio.run(run_both(
            folder, docs, args.reps, args.warmup, args.batch_size, worker_options))
    peer = _summary("CrossEncoder.rank (in-process)", args.documents, peer_s, None)
    ours = _summary("poolwire rerank (NATS, one request)", args.documents, ours_s,
                    statistics.median(peer_s))
    rows = [peer, ours]
    same_order = [i for i, _ in peer_ranking] == [i for i, _ in ours_ranking]
    by_index = dict(peer_ranking)
    max_diff = max(abs(s - by_index[i]) for i, s in ours_ranking)
    print(table(rows))
    print()
    print(f"`python bench/rerank.py {shlex.join(argv if argv is not None else sys.argv[1:])}`"
          f" (one query against {args.documents} documents, {args.reps} timed runs each side, "
          f"p50 of them; timings on a shared machine are noisy, read the ratio).")
    print(f"Both sides ranked the documents {'alike' if same_order else 'DIFFERENTLY'}; "
          f"largest score difference {max_diff:.2e}.")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "same_order": same_order,
                                         "max_score_diff": max_diff}, indent=2))
    return 0 if all(math.isfinite(r["p50_ms"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
