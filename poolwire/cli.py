"""The `poolwire` command: serve, embed, classify, score, events."""

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from poolwire.settings import ENV_PREFIX, WorkerSettings

log = logging.getLogger("poolwire")


def _serve_parser(sub) -> CliSettingsSource:
    """`serve` takes one option per WorkerSettings field, derived by pydantic-settings."""
    p = sub.add_parser("serve", help="run a worker (embedded NATS and bundled model by default)",
                       description="Every option is also an environment variable "
                                   f"{ENV_PREFIX}<NAME> (and NATS_URL for --nats-url).")
    return CliSettingsSource(WorkerSettings, root_parser=p)


def _client_parser(sub, name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--prefix", default=os.environ.get("POOLWIRE_PREFIX", "pooling"))
    p.add_argument("--timeout", type=float, default=30.0)
    return p


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource]:
    """The parser, and the settings source that reads `serve`'s options from its result."""
    parser = argparse.ArgumentParser(prog="poolwire", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_options = _serve_parser(sub)
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
    _operator_parsers(sub)
    return parser, serve_options


def _operator_parsers(sub) -> None:
    def connected(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
        return p

    p = connected("events", "print deprecation events as JSON lines: stored ones first with "
                            "--all or --since, then new ones")
    p.add_argument("--prefix", default=os.environ.get("POOLWIRE_PREFIX", "pooling"))
    replay = p.add_mutually_exclusive_group()
    replay.add_argument("--all", action="store_true", help="replay every stored event first")
    replay.add_argument("--since", help="replay stored events from this time (RFC 3339) or age "
                                        "(90s, 10m, 2h, 1d) first")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after this many seconds without an event (default: follow until Ctrl-C)")
    p = connected("stats", "print every worker's $SRV.STATS as a table")
    p.add_argument("--prefix", default=None, help="only the workers of this subject prefix")
    p.add_argument("--json", action="store_true", help="print the raw STATS answers as JSON")


async def serve(settings: WorkerSettings) -> int:
    from poolwire import kernels
    from poolwire.actors.model import bundled_model_dir, load_model
    from poolwire.actors.nats_server import NatsServer
    from poolwire.actors.queue_guard import QueueConflictError
    from poolwire.actors.task_policy import TaskConfigError
    from poolwire.actors.worker import Worker
    from poolwire.operators import try_hint

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
        try:
            await worker.start(url)
        except QueueConflictError as exc:
            print(f"poolwire: {exc}", file=sys.stderr)
            return 2
        policy = worker.policy
        print(f"poolwire: serving {model.name} (revision {model.revision}) on {url}: subjects "
              f"{settings.prefix}.<task>, "
              f"queue group {settings.queue}\n"
              f"poolwire: configured task {policy.configured}; supported tasks "
              f"{', '.join(t.value for t in policy.supported)}; multitask {policy.multitask}\n"
              f"poolwire: pooling kernels: {kernels.describe_backend(model.device)}\n"
              f"poolwire: try  {try_hint(policy.configured.value, settings.prefix, url)}\n"
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
    from poolwire.client import PoolingClient, PoolingServiceError

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


async def operator_command(args) -> int:
    from datetime import datetime, timezone

    import nats

    from poolwire import operators

    since = None
    if getattr(args, "since", None):
        try:
            since = operators.parse_since(args.since, datetime.now(timezone.utc))
        except ValueError as exc:
            print(f"poolwire: {exc}", file=sys.stderr)
            return 2
    nc = await nats.connect(args.nats_url)
    try:
        if args.command == "stats":
            return await operators.show_stats(nc, args.prefix, args.json)
        return await operators.tail_events(nc, args.prefix, "all" if args.all else None, since,
                                           args.count, args.timeout)
    finally:
        await nc.close()


def run_benchmark(argv: list[str]) -> int:
    """The benchmark harness ships with the source repository (bench/), not in the wheel."""
    script = Path(__file__).resolve().parent.parent / "bench" / "throughput.py"
    if not script.is_file():
        print("poolwire: the benchmark comes with the source repository: clone it and run "
              "`make bench` (or python bench/throughput.py)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(script), *argv])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # every option after `bench` is the benchmark's own
        return run_benchmark(argv[1:])
    parser, serve_options = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local folders only
    if args.command == "serve":
        try:
            settings = WorkerSettings(_cli_settings_source=serve_options(parsed_args=args))
        except ValidationError as exc:
            print(f"poolwire: {exc}", file=sys.stderr)
            return 2
        return asyncio.run(serve(settings))
    if args.command in ("events", "stats"):
        try:
            return asyncio.run(operator_command(args))
        except KeyboardInterrupt:
            return 0
    return asyncio.run(client_command(args))


if __name__ == "__main__":
    sys.exit(main())
