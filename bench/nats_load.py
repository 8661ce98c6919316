"""The load of one poolwire setup over NATS: every text sent once in the setup's shape (its
connections, requests in flight, texts per request), each request timed, the replies checked
after the clock stops; and the worker's own account of it ($SRV.INFO, $SRV.STATS)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

from bench.meters import BackgroundMeter, thread_cpu_s, wait_for_quiet
from bench.progress import log
from bench.setups import Setup
from bench.workload import is_short

PREFIX = "bench.pooling"     # the subject prefix of the benchmark's workers
STATS_SERVICE = "poolwire"   # the workers' NATS micro service name ($SRV.STATS.poolwire)
DERIVED_STATS = ("mean_batch_size", "padding_waste")


@dataclass
class LoadResult:
    wall_s: float
    latencies_ms: list[float]
    short_latencies_ms: list[float]
    errors: int
    error_samples: list[str]
    token_mismatches: int
    client_cpu_s: float
    worker_cpu_s: dict[str, float]
    background_cores: float
    worker_stats: dict[str, float] | None = None
    vectors: list | None = None          # each text's embedding or logits, in workload order
    served_precision: str | None = None  # the worker's $SRV.INFO metadata says


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]


async def drive(url: str, texts: list[str], tokens: list[int], setup: Setup, *,
                timeout: float, truncate: bool, worker_pid: int | None = None,
                label: str = "", warmup: list[str] | None = None,
                settle_s: float = 0.0) -> LoadResult:
    """Send every text once in the setup's shape and record each request's latency. Replies are
    kept raw and checked after the clock stops, so the load generator's CPU (which shares the
    machine with the worker) goes on sending and receiving only."""
    import msgpack
    import nats

    subject = f"{PREFIX}.{setup.task}"
    extra = {"truncate_prompt_tokens": -1} if truncate else {}
    if setup.task == "classify":
        extra["use_activation"] = False  # logits, what the in-process peer is compared on

    def body(batch: list[str]) -> bytes:
        return msgpack.packb({"input": batch[0] if len(batch) == 1 else batch, **extra},
                             use_bin_type=True)

    conns = [await nats.connect(url, name=f"poolwire-bench-{i}") for i in range(setup.connections)]
    try:
        if warmup:
            # Both code paths (one text, many texts) and a burst, excluded from the timing.
            await conns[0].request(subject, body(warmup[:setup.per_request]), timeout=timeout)
            await asyncio.gather(*(c.request(subject, body([t]), timeout=timeout)
                                   for c in conns for t in warmup[:16]))
            for t in warmup[:4]:
                await conns[0].request(subject, body([t]), timeout=timeout)

        chunks = _chunks(len(texts), setup.per_request)
        bodies = [body(texts[a:b]) for a, b in chunks]
        replies: list[bytes | BaseException | None] = [None] * len(chunks)
        latencies = [math.nan] * len(chunks)
        next_chunk = iter(range(len(chunks)))
        done = [0]

        async def sender(nc) -> None:
            for i in next_chunk:  # shared: each sender takes the next request to send
                start = time.perf_counter()
                try:
                    msg = await nc.request(subject, bodies[i], timeout=timeout)
                    replies[i] = msg.data
                except Exception as exc:  # a timeout or no responders: counted, not fatal
                    replies[i] = exc
                latencies[i] = (time.perf_counter() - start) * 1000.0
                done[0] += chunks[i][1] - chunks[i][0]

        async def progress(started: float) -> None:
            while True:
                await asyncio.sleep(3.0)
                log(f"{label}: {done[0]}/{len(texts)} texts, {time.perf_counter() - started:.1f} s")

        if settle_s > 0:
            await asyncio.to_thread(wait_for_quiet, settle_s, label=label)
        served = await worker_precision(conns[0]) if worker_pid else None
        stats_before = await worker_stats(conns[0]) if worker_pid else None
        meter = BackgroundMeter()
        cpu_before = thread_cpu_s(worker_pid) if worker_pid else {}
        client_cpu0 = time.process_time()
        started = time.perf_counter()
        reporter = asyncio.create_task(progress(started))
        try:
            await asyncio.gather(*(sender(c) for c in conns for _ in range(setup.in_flight)))
        finally:
            reporter.cancel()
        wall = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu0
        cpu_after = thread_cpu_s(worker_pid) if worker_pid else {}
        background = meter.cores()
        stats_after = await worker_stats(conns[0]) if stats_before is not None else None
    finally:
        for c in conns:
            await c.close()

    errors, samples, mismatches, short_lat = 0, [], 0, []
    vectors: list | None = [None] * len(texts)
    for (a, b), reply, lat in zip(chunks, replies, latencies):
        problem = None
        if isinstance(reply, BaseException) or reply is None:
            problem = repr(reply)
        else:
            frame = msgpack.unpackb(reply, raw=False)
            if "error" in frame:
                problem = f"{frame['error'].get('code')}: {frame['error'].get('message')}"
            elif len(frame.get("data", [])) != b - a:
                problem = f"{len(frame.get('data', []))} items for {b - a} texts"
            else:
                for item in frame["data"]:
                    vectors[a + item["index"]] = item["data"]
                if frame.get("usage", {}).get("prompt_tokens") != sum(tokens[a:b]):
                    mismatches += 1
        if problem:
            errors += 1
            if len(samples) < 3:
                samples.append(problem)
        elif b - a == 1 and is_short(texts[a]):
            short_lat.append(lat)
    worker_cpu = {k: cpu_after[k] - cpu_before[k] for k in cpu_after} if cpu_before else {}
    stats = stats_delta(stats_before, stats_after) if stats_before and stats_after else None
    return LoadResult(wall, latencies, short_lat, errors, samples, mismatches, client_cpu,
                      worker_cpu, background, stats,
                      vectors=None if any(v is None for v in vectors) else vectors,
                      served_precision=served)


async def worker_precision(nc) -> str | None:
    """The precision the worker serves, from its $SRV.INFO metadata (None when it does not say)."""
    try:
        msg = await nc.request(f"$SRV.INFO.{STATS_SERVICE}", b"", timeout=1.0)
        return (json.loads(msg.data).get("metadata") or {}).get("precision")
    except Exception:
        return None


async def worker_stats(nc) -> dict[str, float] | None:
    """The worker's own counters ($SRV.STATS of the `poolwire` micro service, summed over its
    endpoints), flattened to {"seconds.forward": ..., "batches": ...}; None when the worker
    does not answer (older workers expose nothing)."""
    try:
        msg = await nc.request(f"$SRV.STATS.{STATS_SERVICE}", b"", timeout=1.0)
        endpoints = json.loads(msg.data).get("endpoints") or []
    except Exception:
        return None
    flat: dict[str, float] = {}
    for ep in endpoints:
        items = {"num_requests": ep.get("num_requests"), "num_errors": ep.get("num_errors"),
                 "processing_time_s": (ep.get("processing_time") or 0) / 1e9,  # nanoseconds
                 **_flatten(ep.get("data") or {})}
        for k, v in items.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                flat[k] = flat.get(k, 0) + v
    return flat


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def stats_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters of the measured phase alone (warm-up excluded); ratios recomputed."""
    delta = {k: after[k] - before[k] for k in after if k in before and k not in DERIVED_STATS}
    if delta.get("batches"):
        delta["mean_batch_size"] = delta.get("sequences", 0) / delta["batches"]
    if delta.get("padded_tokens"):
        delta["padding_waste"] = 1 - delta.get("real_tokens", 0) / delta["padded_tokens"]
    return delta
