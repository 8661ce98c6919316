"""The service's own cost: a poolwire worker serving a model that costs almost nothing, against
a bare nats-py responder on the same nats-server, driven by the same client, interleaved.

    python bench/service_cost.py                 # the full run (about 2 minutes)
    python bench/service_cost.py --scale 0.1     # a small run, to check that it works
    python bench/service_cost.py --worker-args="--openvino-threads 1"
    python bench/service_cost.py --floor         # bench/floor_worker.py in poolwire's place

The model (built here, into a temporary folder, never shipped): a 1-layer, 32-wide BERT with
mean pooling, saved as a Sentence-Transformers folder with MiniLM's tokenizer. Its forward pass
costs microseconds, so what the worker spends is the path around it: decoding, validating,
tokenizing, batching, framing and publishing. The responder (`responder`, below) decodes the
MessagePack request and replies one fixed 384-float item per text: the least any service on
NATS can do. Three shapes, each run in rounds that alternate which side goes first:
1 text a request at 64 in flight, 32 texts a request at 8 in flight, and one request at a time
(its median round trip). Printed: texts/s of each side and their ratio, the worker's CPU per
text split by thread (event loop, tokenize thread, forward thread, the backend's threads, by
/proc thread name),
the responder's, the CPU's model and flags, and the load average beside each figure (these
benchmarks run on shared machines: the interleaved ratios are what count).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402
from bench import machine  # noqa: E402
from bench.children import child_env, stop_process  # noqa: E402
from bench.meters import _CLK_TCK, BackgroundMeter, process_cpu_s  # noqa: E402
from bench.nats_load import PREFIX  # noqa: E402
from bench.progress import log  # noqa: E402

BARE_SUBJECT = "bench.bare.embed"
WIDTH = 384  # the responder's item: MiniLM's width, what a real reply carries


@dataclass(frozen=True)
class Shape:
    key: str
    label: str
    per_request: int
    in_flight: int
    texts: int  # per side per round, at --scale 1

    @property
    def one_at_a_time(self) -> bool:
        return self.in_flight == 1


SHAPES = (
    Shape("1x64", "1 text a request, 64 in flight", 1, 64, 3000),
    Shape("32x8", "32 texts a request, 8 in flight", 32, 8, 9600),
    Shape("1x1", "one request at a time, median round trip", 1, 1, 400),
)


def build_near_zero_model(folder: Path) -> Path:
    """A 1-layer, 32-wide BERT with mean pooling, as a Sentence-Transformers folder with
    MiniLM's tokenizer (random weights, seeded): a model whose forward pass costs microseconds."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st_modules
    from transformers import AutoTokenizer, BertConfig, BertModel

    from poolwire.models.model import bundled_model_dir

    torch.manual_seed(0)
    base = folder.parent / (folder.name + "-base")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    BertModel(config).eval().save_pretrained(base)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(base)
    SentenceTransformer(modules=[st_modules.Transformer(str(base), max_seq_length=256),
                                 st_modules.Pooling(32, "mean")], device="cpu").save(str(folder))
    return folder


# The bare responder: what any nats-py service must do at the least, and nothing else.
def responder(url: str, subject: str) -> None:
    import msgpack
    import nats

    item = [0.125] * WIDTH

    async def main() -> None:
        nc = await nats.connect(url, name="bare-responder")

        async def answer(msg) -> None:
            body = msgpack.unpackb(msg.data, raw=False)
            texts = body["input"]
            n = 1 if isinstance(texts, str) else len(texts)
            await msg.respond(msgpack.packb(
                {"request_id": body.get("request_id", ""), "model": "bare",
                 "data": [{"index": i, "data": item} for i in range(n)],
                 "usage": {"prompt_tokens": n, "total_tokens": n}},
                use_single_float=True, use_bin_type=True))

        await nc.subscribe(subject, cb=answer)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# ---- pure parts: thread grouping, ratios, the table ----

def thread_group(pid: int, tid: int, name: str) -> str:
    """The part of the worker a thread belongs to: its event loop (the main thread), the
    engine's forward thread(s), its tokenize thread with the Rust tokenizer's pool (made from
    that thread: actors/engine.py, start_tokenizer_pool), or the backend's own threads
    (OpenVINO's, torch's, ...)."""
    if tid == pid:
        return "event loop"
    if name.startswith("poolwire-forw"):  # comm is cut at 15 characters
        return "forward"
    if name.startswith("poolwire-toke"):
        return "tokenize"
    return "backend threads"


def threads_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{tid: (thread name, CPU seconds)} of every live thread of a process."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def cpu_by_group(pid: int, before: dict[int, tuple[str, float]],
                 after: dict[int, tuple[str, float]]) -> tuple[dict[str, float], list[str]]:
    """CPU seconds spent between two snapshots, summed by thread_group; and the distinct names
    of the backend's threads that ran."""
    groups = {"event loop": 0.0, "tokenize": 0.0, "forward": 0.0, "backend threads": 0.0}
    names: set[str] = set()
    for tid, (name, cpu) in after.items():
        spent = cpu - before.get(tid, (name, 0.0))[1]
        group = thread_group(pid, tid, name)
        groups[group] += spent
        if group == "backend threads" and spent > 0:
            names.add(name)
    return groups, sorted(names)


@dataclass
class Side:
    texts: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)
    # The workers' forward passes, the sequences in them and the wall seconds they took (the
    # padding, the model and the pooling: their `forward` and `pool` stages) over these rounds
    # ($SRV.STATS).
    batches: int = 0
    sequences: int = 0
    pass_s: float = 0.0
    gc_s: float = 0.0  # the workers' garbage collections, on whichever thread ran them

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.wall_s if self.wall_s else float("nan")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def mean_batch(self) -> float:
        return self.sequences / self.batches if self.batches else float("nan")

    @property
    def pass_ms(self) -> float:
        """A forward pass's mean wall time under this load: against what the same batch takes
        alone (bench/idle_penalty.py), what sharing the machine costs the model."""
        return 1000 * self.pass_s / self.batches if self.batches else float("nan")


@dataclass
class ShapeResult:
    shape: Shape
    bare: Side
    poolwire: Side
    backend_threads: list[str]
    load_average: float      # 1-minute load average after the shape's rounds
    background_cores: float  # cores other processes kept busy meanwhile

    def ratio(self) -> float:
        if self.shape.one_at_a_time:
            return self.poolwire.median_ms / self.bare.median_ms
        return self.poolwire.texts_per_s / self.bare.texts_per_s

    def cells(self) -> tuple[str, str, str]:
        if self.shape.one_at_a_time:
            return (f"{self.bare.median_ms:.2f} ms", f"{self.poolwire.median_ms:.2f} ms",
                    f"{self.ratio():.2f}x")
        return (f"{self.bare.texts_per_s:,.0f} texts/s", f"{self.poolwire.texts_per_s:,.0f} texts/s",
                f"{self.ratio():.2f}x")


def side_name(floor: bool) -> str:
    """Who the measured side is: `poolwire serve`, or with --floor bench/floor_worker.py."""
    return "the floor worker" if floor else "poolwire"


def markdown(results: list[ShapeResult], machine_line: str, command: str,
             processes: int = 1, floor: bool = False) -> str:
    who = side_name(floor)
    workers = f"{who}, near-zero model" + (f", {processes} processes" if processes > 1 else "")
    out = ["## The service's own cost", "", f"CPU: {machine_line}", "",
           f"| setup | bare responder | {workers} | ratio | load avg | other cores |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        bare, pool, ratio = r.cells()
        out.append(f"| {r.shape.label} | {bare} | {pool} | {ratio} | {r.load_average:.2f} | "
                   f"{r.background_cores:.2f} |")
    out += ["", "CPU per text, ms (the worker's by thread; the responder's whole process), and "
                "the worker's forward passes: mean sequences a pass and mean wall time a pass "
                "(padding, model and pooling); GC: the wall time the garbage collector held the "
                "worker, a text, whichever thread ran it (part of the threads' figures):", "",
            "| setup | event loop | tokenize | forward | backend threads | worker total | responder "
            "| GC | sequences a pass | ms a pass |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        c, n = r.poolwire.cpu_s, max(r.poolwire.texts, 1)
        per = {k: 1000 * v / n for k, v in c.items()}
        bare = 1000 * r.bare.cpu_s.get("process", float("nan")) / max(r.bare.texts, 1)
        out.append(f"| {r.shape.label} | {per.get('event loop', 0):.3f} "
                   f"| {per.get('tokenize', 0):.3f} | {per.get('forward', 0):.3f} "
                   f"| {per.get('backend threads', 0):.3f} | {sum(per.values()):.3f} | {bare:.3f} "
                   f"| {1000 * r.poolwire.gc_s / n:.3f} "
                   f"| {r.poolwire.mean_batch:.1f} | {r.poolwire.pass_ms:.2f} |")
    names = sorted({n for r in results for n in r.backend_threads})
    errors = sum(r.poolwire.errors + r.bare.errors for r in results)
    out += ["", f"backend threads seen: {', '.join(names) or 'none'}. Errors: {errors}. "
                f"Ratios: {who}'s texts/s over the responder's (higher is better), or its "
                f"median round trip over the responder's (lower is better).",
            "", f"command: {command}"]
    return "\n".join(out)


# ---- the load ----

async def _load(nc, subject: str, bodies: list[bytes], in_flight: int,
                timeout: float) -> tuple[float, list[float], list[bytes]]:
    """Send every body, `in_flight` at a time; (wall seconds, each latency, each reply)."""
    latencies: list[float] = [0.0] * len(bodies)
    replies: list[bytes] = [b""] * len(bodies)
    nxt = iter(range(len(bodies)))

    async def lane() -> None:
        for i in nxt:
            t = time.perf_counter()
            try:
                msg = await nc.request(subject, bodies[i], timeout=timeout)
                replies[i] = msg.data
            except Exception as exc:  # counted as an error below, never lost
                replies[i] = repr(exc).encode()
            latencies[i] = 1000 * (time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return time.perf_counter() - t0, latencies, replies


@dataclass(frozen=True)
class WorkerCounts:
    """What the workers' `$SRV.STATS` say so far, summed over every worker."""

    batches: int       # forward passes
    sequences: int     # sequences in them
    pass_s: float      # their wall seconds (the `forward` and `pool` stages)
    gc_s: float        # seconds the garbage collector held the worker processes


async def batch_counts(nc, workers: int, timeout: float = 5.0) -> WorkerCounts:
    """Every worker answers `$SRV.STATS.poolwire` with its stage stats and its collector's
    time (actors/stats.py); the sums."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish("$SRV.STATS.poolwire", b"", reply=inbox)
        batches = sequences = 0
        seconds = gc_s = 0.0
        for _ in range(workers):
            data = json.loads((await sub.next_msg(timeout=timeout)).data)["endpoints"][0]["data"]
            batches += data["batches"]
            sequences += data["sequences"]
            seconds += data["seconds"]["forward"] + data["seconds"]["pool"]
            gc_s += sum(data["gc"]["seconds"])
        return WorkerCounts(batches, sequences, seconds, gc_s)
    finally:
        await sub.unsubscribe()


def _errors(replies: list[bytes], per_request: int) -> int:
    import msgpack

    bad = 0
    for data in replies:
        try:
            reply = msgpack.unpackb(data, raw=False)
            bad += not (isinstance(reply, dict) and len(reply.get("data") or ()) == per_request)
        except Exception:
            bad += 1
    return bad


def short_texts() -> list[str]:
    """The texts of every request: the workload's short sentences (under 120 characters)."""
    from bench.workload import mixed_texts

    words = mixed_texts(64, seed=7)
    return [t for t in words if len(t) < 120] or words


def request_bodies(short: list[str], per_request: int, n_requests: int) -> list[bytes]:
    """MessagePack embed requests of `per_request` texts each (a string where one), cycling
    through `short`."""
    import msgpack

    bodies = []
    for i in range(n_requests):
        batch = [short[(i * per_request + j) % len(short)] for j in range(per_request)]
        bodies.append(msgpack.packb({"input": batch[0] if len(batch) == 1 else batch}))
    return bodies


async def measure(url: str, worker_pids: list[int], responder_pid: int, shapes: list[Shape],
                  rounds: int, scale: float, timeout: float,
                  label: str = "poolwire") -> list[ShapeResult]:
    import nats

    pool_subject = f"{PREFIX}.embed"
    nc = await nats.connect(url, name="service-cost-client")
    try:
        short = short_texts()
        # Warm both sides: each shape once.
        for s in (BARE_SUBJECT, pool_subject):
            for shape in shapes:
                body = request_bodies(short, shape.per_request, 1)[0]
                await _load(nc, s, [body] * 64, min(shape.in_flight, 16), timeout)
        results = []
        for shape in shapes:
            n_req = max(2, int(shape.texts * scale) // shape.per_request)
            bodies = request_bodies(short, shape.per_request, n_req)
            sides = {"bare": Side(), "poolwire": Side()}
            names: set[str] = set()
            meter = BackgroundMeter()
            for rnd in range(rounds):
                order = ("bare", "poolwire") if rnd % 2 == 0 else ("poolwire", "bare")
                for who in order:
                    subject = BARE_SUBJECT if who == "bare" else pool_subject
                    side = sides[who]
                    before_t = {pid: threads_cpu(pid) for pid in worker_pids}
                    before_r = process_cpu_s(responder_pid)
                    if who == "poolwire":
                        before = await batch_counts(nc, len(worker_pids))
                    wall, lat, replies = await _load(nc, subject, bodies, shape.in_flight, timeout)
                    if who == "poolwire":
                        after = await batch_counts(nc, len(worker_pids))
                        side.batches += after.batches - before.batches
                        side.sequences += after.sequences - before.sequences
                        side.pass_s += after.pass_s - before.pass_s
                        side.gc_s += after.gc_s - before.gc_s
                        for pid in worker_pids:  # summed over every worker process
                            groups, seen = cpu_by_group(pid, before_t[pid], threads_cpu(pid))
                            names.update(seen)
                            for k, v in groups.items():
                                side.cpu_s[k] = side.cpu_s.get(k, 0.0) + v
                    else:
                        side.cpu_s["process"] = (side.cpu_s.get("process", 0.0)
                                                 + process_cpu_s(responder_pid) - before_r)
                    side.texts += n_req * shape.per_request
                    side.wall_s += wall
                    side.latencies_ms += lat
                    side.errors += _errors(replies, shape.per_request)
            result = ShapeResult(shape, sides["bare"], sides["poolwire"], sorted(names),
                                 os.getloadavg()[0], meter.cores())
            bare, pool, ratio = result.cells()
            log(f"{shape.label}: bare {bare}, {label} {pool}, ratio {ratio} (load average "
                f"{result.load_average:.2f}, other processes {result.background_cores:.2f} cores)")
            results.append(result)
        return results
    finally:
        await nc.close()


def _start_responder(url: str, log_path: Path) -> subprocess.Popen:
    out = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--responder", url],
                            stdout=subprocess.PIPE, stderr=out, env=child_env())
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        stop_process(proc)
        raise RuntimeError(f"the bare responder did not start; its log: {log_path}")
    return proc


def run(args: argparse.Namespace, command: str) -> tuple[list[ShapeResult], str]:
    from bench.worker import WorkerProcess
    from poolwire.actors.nats_server import NatsServer

    shapes = [s for s in SHAPES if s.key in args.shapes]
    with tempfile.TemporaryDirectory(prefix="poolwire-service-cost-") as tmp:
        tmp_path = Path(tmp)
        log("building the near-zero model (1 layer, 32 wide, mean pooling)")
        model = build_near_zero_model(tmp_path / "near-zero")
        server = NatsServer(store_dir=tmp_path / "nats")
        url = server.start()
        workers: list = []
        responder_proc = None
        try:
            for n in range(args.processes):
                # Each its own state dir (health file, OpenVINO cache), as processes sharing
                # one host and device run (docs/PERFORMANCE.md, "More than one process").
                profile = Path(args.profile) / f"worker-{n}.prof" if args.profile else None
                worker = WorkerProcess(url, str(model),
                                       ["--state-dir", str(tmp_path / f"state-{n}"),
                                        *shlex.split(args.worker_args or "")],
                                       tmp_path / f"worker-{n}.log", profile,
                                       program=[str(_HERE / "floor_worker.py")] if args.floor
                                       else None)
                workers.append(worker)
                worker.start()
            responder_proc = _start_responder(url, tmp_path / "responder.log")
            log(f"{len(workers)} worker process(es) and the responder ready; {args.rounds} "
                f"rounds a shape")
            results = asyncio.run(measure(url, [w.pid for w in workers], responder_proc.pid,
                                          shapes, args.rounds, args.scale, args.timeout_s,
                                          side_name(args.floor)))
        finally:
            if responder_proc is not None:
                stop_process(responder_proc)
            for worker in workers:
                worker.stop()
            server.stop()
    if args.profile:
        from bench.worker import _print_profile

        _print_profile(Path(args.profile) / "worker-0.prof", "near-zero worker", top=45)
    return results, markdown(results, machine.describe(), command, args.processes, args.floor)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The service's own cost: a poolwire worker with a "
                                "near-zero model against a bare nats-py responder, interleaved.")
    p.add_argument("--rounds", type=count, default=4,
                   help="rounds per shape, alternating which side goes first (default 4)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="texts per round relative to the default (0.1: a small run)")
    p.add_argument("--shapes", default=",".join(s.key for s in SHAPES),
                   help="shapes to run, comma separated: 1x64, 32x8, 1x1 (default all)")
    p.add_argument("--processes", type=count, default=1,
                   help="worker processes in the queue group, each a `poolwire serve` sharing "
                        "the machine (and device); CPU is summed over them (default 1)")
    p.add_argument("--worker-args", default="",
                   help="extra `poolwire serve` options, one string")
    p.add_argument("--floor", action="store_true",
                   help="run bench/floor_worker.py in place of `poolwire serve`: the least a "
                        "Python worker does around poolwire's model code, to set against "
                        "poolwire's figures of the same command")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--profile", metavar="DIR",
                   help="run the worker under cProfile (event-loop thread only), write "
                        "DIR/worker.prof and print the top functions to stderr")
    p.add_argument("--responder", metavar="URL", help=argparse.SUPPRESS)
    return p


def to_json(results: list[ShapeResult]) -> list[dict]:
    out = []
    for r in results:
        d = {"shape": asdict(r.shape), "ratio": r.ratio(), "load_average": r.load_average,
             "background_cores": r.background_cores, "backend_threads": r.backend_threads}
        for side in ("bare", "poolwire"):
            s = getattr(r, side)
            d[side] = {"texts": s.texts, "wall_s": s.wall_s, "texts_per_s": s.texts_per_s,
                       "median_ms": s.median_ms, "errors": s.errors, "cpu_s": s.cpu_s,
                       "batches": s.batches, "sequences": s.sequences, "pass_s": s.pass_s,
                       "gc_s": s.gc_s}
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.responder:
        responder(args.responder, BARE_SUBJECT)
        return 0
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = set(args.shapes) - {s.key for s in SHAPES}
    if unknown:
        build_parser().error(f"--shapes {','.join(sorted(unknown))}: unknown; use "
                             f"{', '.join(s.key for s in SHAPES)}")
    if args.scale <= 0:
        build_parser().error(f"--scale must be above 0, got {args.scale}")
    if args.floor and args.worker_args:
        build_parser().error("--worker-args are `poolwire serve` options; the floor worker "
                             "(--floor) takes none")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # `timeout` (gpu_check.sh) sends SIGTERM: exit through the finally blocks, which stop the
    # workers, the responder and the nats-server this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    command = " ".join([".venv/bin/python bench/service_cost.py", *map(shlex.quote, argv)])
    results, text = run(args, command)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results), indent=2))
    return 1 if any(r.poolwire.errors or r.bare.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
