"""The `poolwire` command: serve, embed, classify, score, events."""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

import msgpack

from actors.settings import WorkerSettings

log = logging.getLogger("poolwire")


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="run a worker (embedded NATS and bundled model by default)",
                       description="Every option is also an environment variable POOLWIRE_<NAME> "
                                   "(and NATS_URL for --nats-url).")
    p.add_argument("--model", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--model-name", help="model name in replies (default: the folder's name)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: CUDA when present)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="model dtype (default float32)")
    p.add_argument("--task", help="the configured task (default: the priority rule)")
    p.add_argument("--multitask", choices=["warn", "reject"],
                   help="requests on other supported tasks: warn (default) or reject")
    p.add_argument("--prefix", help="subject prefix (default: pooling)")
    p.add_argument("--queue", help="queue group (default: poolwire)")
    p.add_argument("--nats-url", help="NATS server URL (default: start an embedded nats-server)")
    p.add_argument("--nats-port", type=int, help="embedded server's port (default 4222; -1: any)")
    p.add_argument("--state-dir", help="embedded server's store (default: .poolwire)")
    p.add_argument("--max-batch-tokens", type=int, help="padded tokens per forward pass")
    p.add_argument("--max-batch-size", type=int, help="sequences per forward pass")
    p.add_argument("--max-wait-ms", type=float, help="wait for more work when a batch is not full")
    p.add_argument("--max-added-padding", type=int,
                   help="padding tokens an item may add to join a batch (default 16)")
    p.add_argument("--max-queued-tokens", type=int, help="admission bound (then: overloaded)")
    p.add_argument("--drain-timeout-s", type=float, help="how long Ctrl-C waits for in-flight work")


def _client_parser(sub, name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--prefix", default=os.environ.get("POOLWIRE_PREFIX", "pooling"))
    p.add_argument("--timeout", type=float, default=30.0)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poolwire", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    for name, help in (("embed", "embed texts and print the reply as JSON"),
                       ("classify", "classify texts and print the reply as JSON")):
        p = _client_parser(sub, name, help)
        p.add_argument("texts", nargs="+")
        if name == "embed":
            p.add_argument("--dimensions", type=int, help="Matryoshka: keep the first d dimensions")
    p = _client_parser(sub, "score", "score text_1 against each text_2 and print JSON")
    p.add_argument("text_1")
    p.add_argument("text_2", nargs="+")
    p = sub.add_parser("bench", add_help=False,
                       help="in-process Sentence-Transformers vs a poolwire worker over NATS "
                            "(options: poolwire bench --help)")
    p = _client_parser(sub, "events", "print deprecation events as JSON lines")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: run until Ctrl-C)")
    return parser


SERVE_KEYS = ("model", "model_name", "device", "dtype", "task", "multitask", "prefix", "queue", "nats_url",
              "nats_port", "state_dir", "max_batch_tokens", "max_batch_size", "max_wait_ms",
              "max_added_padding", "max_queued_tokens", "drain_timeout_s")


async def serve(settings: WorkerSettings) -> int:
    from actors.model import bundled_model_dir, load_model
    from actors.nats_server import NatsServer
    from actors.task_policy import TaskConfigError
    from actors.worker import Worker

    try:
        model = load_model(settings.model or bundled_model_dir(), settings.model_name,
                           settings.device, settings.dtype)
        worker = Worker(settings, model)
    except (TaskConfigError, ValueError, OSError) as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return 2
    server = None
    url = settings.nats_url
    if url is None:
        server = NatsServer(store_dir=settings.state_dir / "nats", port=settings.nats_port)
        try:
            url = server.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"poolwire: could not start the embedded nats-server on port "
                  f"{settings.nats_port} ({exc}); pass --nats-port -1 for any free port, or "
                  f"--nats-url to join a running server", file=sys.stderr)
            return 2
        print(f"poolwire: started an embedded nats-server (JetStream) at {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker.start(url)
        policy = worker.policy
        print(f"poolwire: serving {model.name} on {url}: subjects {settings.prefix}.<task>, "
              f"queue group {settings.queue}\n"
              f"poolwire: configured task {policy.configured}; supported tasks "
              f"{', '.join(t.value for t in policy.supported)}; multitask {policy.multitask}\n"
              f"poolwire: try  poolwire embed \"hello world\"   or   "
              f"nats req {settings.prefix}.{policy.configured} '{{\"input\": \"hello\"}}'\n"
              f"poolwire: Ctrl-C drains in-flight requests and stops", flush=True)
        await stop.wait()
        print("poolwire: draining...", flush=True)
    finally:
        await worker.stop()
        if server is not None:
            server.stop()
    print("poolwire: stopped", flush=True)
    return 0


async def client_command(args) -> int:
    from actors.client import PoolingClient, PoolingServiceError

    async with PoolingClient(args.nats_url, prefix=args.prefix, timeout=args.timeout) as client:
        try:
            if args.command == "embed":
                reply = await client.embed(args.texts, dimensions=args.dimensions)
            elif args.command == "classify":
                reply = await client.classify(args.texts)
            else:
                reply = await client.score(args.text_1, args.text_2)
        except PoolingServiceError as exc:
            print(json.dumps({"request_id": exc.request_id, "error": exc.error}), file=sys.stderr)
            return 1
    print(json.dumps(reply))
    return 0


async def tail_events(args) -> int:
    import nats

    nc = await nats.connect(args.nats_url)
    sub = await nc.subscribe(f"{args.prefix}.events.deprecation")
    seen = 0
    try:
        while not args.count or seen < args.count:
            msg = await sub.next_msg(timeout=None)
            print(json.dumps(msgpack.unpackb(msg.data, raw=False)), flush=True)
            seen += 1
    finally:
        await nc.close()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # every option after `bench` is the benchmark's own
        from actors.benchmark import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local folders only
    if args.command == "serve":
        overrides = {k: getattr(args, k) for k in SERVE_KEYS}
        return asyncio.run(serve(WorkerSettings.from_env(**overrides)))
    if args.command == "events":
        try:
            return asyncio.run(tail_events(args))
        except KeyboardInterrupt:
            return 0
    return asyncio.run(client_command(args))


if __name__ == "__main__":
    sys.exit(main())
