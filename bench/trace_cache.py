"""`bench/trace_cache.py`: what tracing and the result cache cost and save, each as a ratio
of two rows measured in the same run on the same workload.

    python bench/trace_cache.py                     # 1,000 texts, concurrency 64, 3 rounds
    python bench/trace_cache.py --quick             # a small run, to check that it works
    python bench/trace_cache.py --texts 400 --concurrency 32 --json out.json

Rows:
- `trace-off`, `trace-on`: one text per request, `--concurrency` requests in flight, every
  request carrying a `traceparent`; one worker passes it on, the other (`--otlp-endpoint`)
  makes spans and exports them over OTLP/HTTP to a sink in this process (it reads and drops
  each export, so its cost counts against tracing). Rounds alternate between the two, and
  each row is the median round, so a machine's drift hits both alike.
- `cache-computed`, `cache-hits`: a worker with `--cache-bucket`; the workload's texts, never
  seen, are computed and stored (the cold pass: lookups that miss, forward passes, stores),
  then asked again (every item a hit).
- tracing's own CPU per request: a traced request's whole span work (span, stage events, its
  share of a forward-pass span, the reply's traceparent, the export) repeated `--span-reps`
  times, over the CPU an untraced request costs this process: the overhead the two tracing
  rows cannot resolve where other work makes their rounds vary by more than it.

Both workers run in this process against a nats-server this run starts on 127.0.0.1 (the
bundled all-MiniLM-L6-v2, exact precision). Prints markdown to stdout and, with `--json`, the
rows and ratios. Numbers to compare, never assertions; on a shared machine they are noisy,
the ratios less so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402 - after the path fix

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class OtlpSink:
    """An OTLP/HTTP endpoint that answers every export with success and keeps only counts."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.exports += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def drive(nc, subject: str, bodies: list[bytes], concurrency: int,
                headers: dict | None = None) -> dict:
    """Send every body with `concurrency` requests in flight; seconds and error replies."""
    import msgpack

    next_index = iter(range(len(bodies)))
    errors = 0

    async def one_lane() -> None:
        nonlocal errors
        for i in next_index:
            msg = await nc.request(subject, bodies[i], timeout=120, headers=headers)
            if "error" in msgpack.unpackb(msg.data):
                errors += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one_lane() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    # This process's CPU (the workers, their export threads and the load generator; not the
    # nats-server): steadier than wall time on a shared machine.
    cpu_ms = (time.process_time() - cpu) * 1e3 / len(bodies)
    return {"requests": len(bodies), "seconds": round(seconds, 4),
            "throughput": round(len(bodies) / seconds, 2), "errors": errors,
            "cpu_ms_per_request": round(cpu_ms, 3)}


def span_cpu_us(endpoint: str, n: int = 2000) -> float:
    """CPU per request of everything tracing adds (a request span with its six stage events,
    its share of a forward-pass span, injecting the reply's traceparent, exporting), measured
    alone: the cost the tracing rows cannot resolve on a noisy machine."""
    from poolwire.actors.tracing import Tracing

    tracing = Tracing.configure(endpoint)
    headers = {"traceparent": TRACEPARENT}
    started = time.process_time()
    for _ in range(n):
        t = tracing.begin(headers, "bench.on.embed", time.monotonic())
        for stage in ("decode", "validate", "cache lookup", "tokenize", "publish"):
            with t.stage(stage):
                pass
        t.set(task="embed", configured_task="embed", deprecated=False, items=1, tokens=12)
        t.open("queue wait")
        span = tracing.forward_started([t], 1, 16)
        tracing.forward_ended(span)
        t.end()
    tracing.shutdown()  # exports the rest: its CPU counts
    return (time.process_time() - started) * 1e6 / n


def bodies_of(texts: list[str], per_request: int, **fields) -> list[bytes]:
    import msgpack

    return [msgpack.packb({"input": texts[i:i + per_request], **fields})
            for i in range(0, len(texts), per_request)]


async def run(args: argparse.Namespace) -> dict:
    import nats

    from bench.workload import mixed_texts
    from poolwire.actors.nats_server import NatsServer
    from poolwire.actors.worker import Worker
    from poolwire.models.model import bundled_model_dir, load_model
    from poolwire.settings import WorkerSettings

    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    logging.basicConfig(level=logging.WARNING)
    model = load_model(bundled_model_dir())
    texts = mixed_texts(args.texts, seed=args.seed)
    warm = mixed_texts(min(64, args.texts), seed=args.seed + 1)
    rows: dict[str, dict] = {}
    sink = OtlpSink()
    with NatsServer() as server:
        nc = await nats.connect(server.url)
        common = dict(max_batch_size=64, probe_interval_s=5.0)
        workers = {
            "trace-off": Worker(WorkerSettings(prefix="bench.off", **common), model),
            "trace-on": Worker(WorkerSettings(prefix="bench.on", otlp_endpoint=sink.url,
                                              **common), model),
            "cache": Worker(WorkerSettings(prefix="bench.cache", cache_bucket="bench_cache",
                                           cache_max_bytes=256 << 20, **common), model),
        }
        try:
            for w in workers.values():
                await w.start(server.url)
            # Warm-up: every worker's first batches pay one-off costs (allocations, kernels).
            for name, w in workers.items():
                extra = {"cache": False} if name == "cache" else {}
                await drive(nc, f"{w.settings.prefix}.embed", bodies_of(warm, 1, **extra),
                            args.concurrency, {"traceparent": TRACEPARENT})

            # Tracing: alternate rounds, median of each.
            one_each = bodies_of(texts, 1)
            rounds: dict[str, list[dict]] = {"trace-off": [], "trace-on": []}
            for r in range(args.rounds):
                order = ("trace-off", "trace-on") if r % 2 == 0 else ("trace-on", "trace-off")
                for key in order:
                    _log(f"round {r + 1}/{args.rounds}: {key}")
                    rounds[key].append(await drive(
                        nc, f"{workers[key].settings.prefix}.embed", one_each, args.concurrency,
                        {"traceparent": TRACEPARENT}))
            for key, results in rounds.items():
                best = sorted(results, key=lambda x: x["throughput"])[len(results) // 2]
                rows[key] = {**best, "rounds": [x["throughput"] for x in results]}
            await asyncio.sleep(0.5)  # let the last spans go out before counting exports
            rows["trace-on"]["exports"] = sink.exports
            span_us = await asyncio.to_thread(span_cpu_us, sink.url, args.span_reps)

            # The cache: a cold pass over unseen texts, then the same texts again.
            subject = f"{workers['cache'].settings.prefix}.embed"
            cache_bodies = bodies_of(texts, args.per_request)
            _log("cache: computed (cold)")
            rows["cache-computed"] = await drive(nc, subject, cache_bodies, args.concurrency)
            cache = workers["cache"].cache
            deadline = time.monotonic() + 30
            while cache._stores and time.monotonic() < deadline:  # stores finish in background
                await asyncio.sleep(0.05)
            before = workers["cache"].stats.sequences
            _log("cache: hits (warm)")
            rows["cache-hits"] = await drive(nc, subject, cache_bodies, args.concurrency)
            rows["cache-hits"]["computed_sequences"] = workers["cache"].stats.sequences - before
            rows["cache-hits"]["cache"] = cache.counters()
            for key in ("cache-computed", "cache-hits"):
                rows[key]["items"] = len(texts)
                rows[key]["items_per_s"] = round(len(texts) / rows[key]["seconds"], 2)
        finally:
            for w in workers.values():
                await w.stop()
            await nc.close()
            sink.close()
    return {
        "texts": args.texts, "concurrency": args.concurrency, "per_request": args.per_request,
        "rounds": args.rounds, "rows": rows,
        "ratios": {
            "trace_on_vs_off": round(rows["trace-on"]["throughput"]
                                     / rows["trace-off"]["throughput"], 3),
            "cached_vs_computed": round(rows["cache-hits"]["throughput"]
                                        / rows["cache-computed"]["throughput"], 2),
            # What tracing adds per request, in CPU, over what a request costs untraced.
            "span_cpu_vs_request_cpu": round(
                span_us / 1e3 / rows["trace-off"]["cpu_ms_per_request"], 4)},
        "span_cpu_us_per_request": round(span_us, 1),
    }


def markdown(report: dict, command: str) -> str:
    rows = report["rows"]
    lines = ["| row | requests | seconds | requests/s | errors |", "| --- | --- | --- | --- | --- |"]
    for key, r in rows.items():
        lines.append(f"| {key} | {r['requests']} | {r['seconds']:.2f} | {r['throughput']:.1f} | "
                     f"{r['errors']} |")
    ratios = report["ratios"]
    lines += ["", f"tracing on / off (requests/s, concurrency {report['concurrency']}, median of "
                  f"{report['rounds']} alternating rounds): **{ratios['trace_on_vs_off']:.3f}**",
              f"tracing's own CPU per request: {report['span_cpu_us_per_request']:.0f} us, "
              f"{ratios['span_cpu_vs_request_cpu']:.1%} of an untraced request's "
              f"({rows['trace-off']['cpu_ms_per_request']:.2f} ms)",
              f"all cached / computed ({report['per_request']} texts a request): "
              f"**{ratios['cached_vs_computed']:.2f}x**", "", f"`{command}`"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=count, default=1000, help="workload size (default 1000)")
    p.add_argument("--concurrency", type=count, default=64, help="requests in flight (default 64)")
    p.add_argument("--per-request", type=count, default=8,
                   help="texts per request in the cache rows (default 8)")
    p.add_argument("--rounds", type=count, default=3, help="alternating tracing rounds (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--span-reps", type=count, default=2000,
                   help="traced requests simulated to measure tracing's own CPU (default 2000)")
    p.add_argument("--quick", action="store_true", help="120 texts, concurrency 16, one round")
    p.add_argument("--json", type=Path, help="also write the report here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.quick:
        args.texts, args.concurrency, args.rounds = 120, 16, 1
    report = asyncio.run(run(args))
    command = " ".join(["python bench/trace_cache.py", *argv])
    report["command"] = command
    print(markdown(report, command))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
