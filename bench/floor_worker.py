"""The floor of a Python worker: the least a process can do around poolwire's own model code and
still serve embeddings over NATS. `bench/service_cost.py --floor` runs it in place of `poolwire
serve`, to tell what poolwire's path costs apart from what any Python service on nats-py pays.

What it does, per burst of arrivals: MessagePack decode, the Rust tokenizer's batch call in a
thread (as the engine's tokenize thread does), one forward pass of everything that arrived
through poolwire's backend and `run_batch` in a thread (the same compiled model, padding and
pooling as the worker), and one MessagePack reply per request. What it leaves out is the
service: no validation beyond "a map with input", no task policy, no batch planning (a burst is
one pass, however large), no deadlines, priorities, size checks, streams, metrics, traces or
events. It is a benchmark's reference, not a server: never deploy it.

    python bench/floor_worker.py --nats-url URL --prefix P --model DIR --state-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Only the installed poolwire is imported: neither this folder nor the checkout's top-level
# folders (its `kernels/` would shadow the package transformers looks for by that name).
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

# What bench/worker.py's WorkerProcess waits for in the log before it drives the worker.
READY_LINE = "floor worker: configured task embed (a benchmark reference, not poolwire)"


def error_reply(message: str, code: str = "invalid_request") -> bytes:
    import msgpack

    return msgpack.packb({"error": {"code": code, "message": message}})


def texts_of(body) -> list[str]:
    """The request's texts, or ValueError naming what is wrong."""
    if not isinstance(body, dict) or "input" not in body:
        raise ValueError("send a MessagePack map with `input`")
    texts = body["input"]
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("`input` must be a string or a non-empty list of strings")
    return texts


async def serve(args: argparse.Namespace) -> None:
    import gc

    import msgpack
    import nats
    from poolwire.actors.engine import TOKENIZE_THREAD, name_os_thread, start_tokenizer_pool
    from poolwire.models.backend_choice import build_backend
    from poolwire.models.forward import run_batch
    from poolwire.models.model import load_model
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import Tokenizing

    start_tokenizer_pool()  # as `poolwire serve` does, for the same CPU split by thread
    model = load_model(args.model)
    backend = build_backend("auto", model, "exact", "float32", Path(args.state_dir) / "openvino")
    # The engine's own batch call (its tokenize thread's copy of the Rust tokenizer), every text
    # cut at the model's maximum length (truncate_prompt_tokens -1).
    tokenizing = Tokenizing(model.tokenizer, model.max_length)
    spec = PoolSpec(Forward.HIDDEN, method=model.pooling_method, normalize=model.normalize_default)
    # Named as the worker's threads are, so that service_cost.py's CPU split reads the same.
    tokenize = ThreadPoolExecutor(1, initializer=name_os_thread, initargs=(TOKENIZE_THREAD,))
    forward = ThreadPoolExecutor(1, initializer=name_os_thread, initargs=("poolwire-forward",))
    gc.freeze()
    counts = {"batches": 0, "sequences": 0, "seconds": 0.0}

    nc = await nats.connect(args.nats_url)
    arrived: deque = deque()
    wake = asyncio.Event()

    async def on_request(msg) -> None:
        arrived.append(msg)
        wake.set()

    async def on_stats(msg) -> None:  # the fields service_cost.py reads of `$SRV.STATS`
        data = {"batches": counts["batches"], "sequences": counts["sequences"],
                "seconds": {"forward": counts["seconds"], "pool": 0.0},
                "gc": {"seconds": [0.0, 0.0, 0.0]}}
        await msg.respond(json.dumps({"endpoints": [{"data": data}]}).encode())

    await nc.subscribe(f"{args.prefix}.*", queue="poolwire", cb=on_request)
    await nc.subscribe("$SRV.STATS.poolwire", cb=on_stats)
    await nc.flush()
    print(READY_LINE, flush=True)

    async def deliver(computing, requests) -> None:
        try:
            result = await computing
        except Exception as exc:  # the burst's requests are answered, and the worker goes on
            for msg, _, _ in requests:
                await nc.publish(msg.reply, error_reply(f"the forward pass failed: {exc!r}",
                                                        "internal"))
            return
        counts["batches"] += 1
        counts["sequences"] += len(result.outputs)
        counts["seconds"] += result.forward_s + result.pool_s
        start = 0
        for msg, request_id, n in requests:
            vectors = result.outputs[start:start + n]
            start += n
            await nc.publish(msg.reply, msgpack.packb({
                "request_id": request_id, "model": model.name, "task": "embed",
                "data": [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}))

    loop = asyncio.get_running_loop()
    delivering = None
    while True:
        if not arrived:
            wake.clear()
            await wake.wait()
        burst = list(arrived)
        arrived.clear()
        texts, requests = [], []
        for msg in burst:
            try:
                body = msgpack.unpackb(msg.data)
                batch = texts_of(body)
            except Exception as exc:  # a bad request is answered, never dropped
                await nc.publish(msg.reply, error_reply(str(exc)))
                continue
            texts += batch
            requests.append((msg, body.get("request_id"), len(batch)))
        if not texts:
            continue
        ahead = await loop.run_in_executor(tokenize, tokenizing.encode_ahead,
                                           [(text, -1, "right") for text in texts])
        tokenizing.use_ahead(ahead)
        seqs = tokenizing.texts(texts, -1, "right")
        if delivering is not None:
            await delivering  # one pass at a time, replies in order
        computing = loop.run_in_executor(forward, run_batch, backend, seqs, [spec] * len(seqs))
        delivering = asyncio.create_task(deliver(computing, requests))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nats-url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--state-dir", required=True)
    asyncio.run(serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
