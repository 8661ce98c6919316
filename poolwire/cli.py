"""The `poolwire` command: serve, embed, classify, score, submit, events, stats, lag, health."""

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from poolwire.actors.health import HEALTH_FILE_NAME
from poolwire.nats_connect import (NatsConnectError, NatsOptions, close_quietly, connect,
                                   nats_options, redact_url)
from poolwire.cli_nats import (CLIENT_EXIT_CODES, EXIT_CONFIG, EXIT_DEAF, EXIT_NATS_UNAVAILABLE,
                               EXIT_NO_RESPONDERS, EXIT_TIMEOUT, SERVE_EXIT_CODES,
                               add_connection_options, connect_options)
from poolwire.settings import ENV_PREFIX, WorkerSettings

log = logging.getLogger("poolwire")

def _serve_parser(sub) -> CliSettingsSource:
    """`serve` takes one option per WorkerSettings field, derived by pydantic-settings."""
    p = sub.add_parser("serve", help="run a worker (embedded NATS and bundled model by default)",
                       description="Every option is also an environment variable "
                                   f"{ENV_PREFIX}<NAME> (and NATS_URL, NATS_CREDS, NATS_NKEY, "
                                   "NATS_USER, NATS_PASSWORD, NATS_TOKEN, NATS_CA, NATS_CERT, "
                                   "NATS_KEY for the --nats-* options of the same names).",
                       epilog=SERVE_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    return CliSettingsSource(WorkerSettings, root_parser=p)


def _client_parser(sub, name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, epilog=CLIENT_EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_options(p)
    p.add_argument("--prefix", default=os.environ.get("POOLWIRE_PREFIX", "pooling"))
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
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
        if name == "embed":
            p.add_argument("texts", nargs="*")
            p.add_argument("--dimensions", type=int, help="Matryoshka: keep the first d dimensions")
            p.add_argument("--image", action="append", default=[], type=Path, metavar="FILE",
                           help="an image file to embed after the texts (a multimodal model: "
                                "CLIP, SigLIP); repeat for several; too big for a message, it "
                                "goes through the NATS object store")
        else:
            p.add_argument("texts", nargs="+")
    p = _client_parser(sub, "score", "score text_1 against each text_2 and print JSON")
    p.add_argument("text_1")
    p.add_argument("text_2", nargs="+")
    p = _client_parser(sub, "rerank", "rank documents against one query (the rerank form of "
                                      "score) and print JSON, best first")
    p.add_argument("query")
    p.add_argument("documents", nargs="+")
    p.add_argument("--top-n", type=int, help="print only the n best documents")
    p.add_argument("--return-documents", action="store_true",
                   help="each item also carries its document's text")
    p = _client_parser(sub, "submit", "submit a durable job through JetStream (kept until a "
                                      "--durable worker answers it) and print the reply as JSON")
    p.add_argument("task", help="embed, classify, token_embed, token_classify")
    p.add_argument("texts", nargs="+")
    p = sub.add_parser("bench", add_help=False,
                       help="in-process Sentence-Transformers vs a poolwire worker over NATS "
                            "(options: poolwire bench --help)")
    _operator_parsers(sub)
    p = sub.add_parser("health", help="is the worker of this state dir healthy? exit 0 or 1, one line",
                       description="Reads the heartbeat the worker's self-check writes (every "
                                   "--probe-interval-s) to <state-dir>/health.json; for a docker "
                                   "compose healthcheck inside the worker's container.")
    p.add_argument("--state-dir", type=Path,
                   default=Path(os.environ.get(f"{ENV_PREFIX}STATE_DIR", ".poolwire")))
    p.add_argument("--health-file", type=Path, default=os.environ.get(f"{ENV_PREFIX}HEALTH_FILE"),
                   help="the worker's --health-file, when it was given one")
    return parser, serve_options


def _operator_parsers(sub) -> None:
    def connected(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        add_connection_options(p)
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
    _lag_parser(sub)


def _lag_parser(sub) -> None:
    p = sub.add_parser(
        "lag", help="print a durable consumer's lag as KEDA's nats-jetstream scaler computes it",
        description="lag = num_pending + num_ack_pending of the durable consumer the workers of "
                    "--prefix and --queue pull from (durable jobs, or --pipeline-stream), read "
                    "from the server's monitoring port (/jsz, as KEDA reads it) with "
                    "--monitoring-url, else through the JetStream API.")
    add_connection_options(p)
    p.add_argument("--prefix", default=os.environ.get(f"{ENV_PREFIX}PREFIX", "pooling"))
    p.add_argument("--queue", default=os.environ.get(f"{ENV_PREFIX}QUEUE", "poolwire"))
    p.add_argument("--pipeline-stream", default=os.environ.get(f"{ENV_PREFIX}PIPELINE_STREAM"),
                   help="the pipeline's stream instead of the durable jobs stream")
    p.add_argument("--stream", help="a stream name of your own (default: the workers' stream)")
    p.add_argument("--consumer", help="a consumer name of your own (default: the workers' consumer)")
    p.add_argument("--monitoring-url", default=os.environ.get("NATS_MONITORING_URL"),
                   help="the server's monitoring endpoint, e.g. http://nats:8222 (also "
                        "NATS_MONITORING_URL); without it, the JetStream API is asked")
    p.add_argument("--account", default="$G", help="the JetStream account (/jsz only; default $G)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def refuse_remote_code(settings: WorkerSettings) -> str | None:
    """A folder that names its own code, without --trust-remote-code: the one-line refusal,
    decided from its files before torch and transformers are even imported (load_model checks
    again, for every other caller)."""
    from poolwire.models.model_source import resolve_model_source
    from poolwire.models.remote_code import check_remote_code

    if settings.model is None:  # the bundled MiniLM
        return None
    try:
        check_remote_code(resolve_model_source(settings.model).path,
                          settings.pooler_config.trust_remote_code)
    except ValueError as exc:
        return str(exc)
    return None


def freeze_startup_heap() -> None:
    """Move every object alive once the model and its backend are loaded (torch,
    transformers, OpenVINO, the model: about 400,000 objects with service_cost's near-zero
    model) out of the garbage collector's reach: they live as long as the process, yet every
    full collection walked them all. Under load one came every ten seconds or so and held the
    event loop for 0.2 to 0.35 s (bench/service_cost.py at 64 requests in flight, timed with
    gc.callbacks, 2026-12-04); now it walks only what was made since. A process decision, so
    `poolwire serve` makes it, not the Worker that tests run in their own process."""
    gc.collect()
    gc.freeze()


async def serve(settings: WorkerSettings) -> int:
    if (refusal := refuse_remote_code(settings)) is not None:
        print(f"poolwire: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    from poolwire import kernels
    from poolwire.actors.engine import start_tokenizer_pool
    from poolwire.models.model import bundled_model_dir, load_model
    from poolwire.actors.nats_server import NatsServer
    from poolwire.actors.queue_guard import QueueConflictError
    from poolwire.actors.task_policy import TaskConfigError
    from poolwire.actors.worker import Worker
    from poolwire.operators import try_hint

    try:  # a typo in a key or certificate path shows now, not after the model has loaded
        opts = nats_options(settings)
        opts.check()
        opts.tls_context()
    except (NatsConnectError, ValueError) as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # Before the model's start-up check makes the first batch call: see its docstring.
    start_tokenizer_pool()
    try:
        model = load_model(settings.model or bundled_model_dir(), settings.model_name,
                           settings.device, settings.dtype,
                           trust_remote_code=settings.pooler_config.trust_remote_code,
                           reranker=settings.reranker, adapters=settings.adapters)
        if model.remote_code:
            print(f"poolwire: --trust-remote-code: running the code of {model.path} "
                  f"({', '.join(model.remote_code)})", flush=True)
        worker = Worker(settings, model)
    except (TaskConfigError, ValueError, OSError) as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return 2
    server = None
    url = settings.nats_url
    health_file = settings.health_file or settings.state_dir / HEALTH_FILE_NAME
    if url is None:
        server = NatsServer(store_dir=settings.state_dir / "nats", port=settings.nats_port,
                            stop_with_parent=True)
        try:
            url = server.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"poolwire: could not start the embedded nats-server on port "
                  f"{settings.nats_port} ({exc}); pass --nats-port -1 for any free port, or "
                  f"--nats-url to join a running server", file=sys.stderr)
            return 2
        print(f"poolwire: started an embedded nats-server (JetStream) at {url}", flush=True)
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Ctrl-C and SIGTERM stop the worker in every state, connecting included: the start races
    # the signal instead of blocking it.
    print(f"poolwire: connecting to NATS at {redact_url(url)} (timeout "
          f"{settings.nats_connect_timeout_s:g} s)", flush=True)
    starting = asyncio.ensure_future(worker.start(url, health_file))
    signalled = asyncio.ensure_future(stop.wait())
    code, drain_timeout = 0, None
    try:
        await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            connected = worker.nc is not None
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            # Connected and still starting means waiting for a JetStream election (durable
            # intakes; the log shows the wait) while serving plain requests, which the stop
            # below drains as any stop does.
            print("poolwire: stopped during start-up, connected to NATS; draining what it took"
                  if connected else "poolwire: stopped before the NATS connection was made",
                  flush=True)
            return 0
        try:
            starting.result()
        except NatsConnectError as exc:
            print(f"poolwire: {exc}", file=sys.stderr, flush=True)
            return EXIT_NATS_UNAVAILABLE
        except QueueConflictError as exc:  # another model or task in this queue group
            print(f"poolwire: {exc}", file=sys.stderr, flush=True)
            return 2
        except RuntimeError as exc:  # e.g. --durable without JetStream, a missing pipeline stream
            print(f"poolwire: {exc}", file=sys.stderr, flush=True)
            return 2
        policy = worker.policy
        print(f"poolwire: serving {model.name} (revision {model.revision}) on {redact_url(url)}: "
              f"subjects {settings.prefix}.<task>, "
              f"queue group {settings.queue}\n"
              f"poolwire: configured task {policy.configured}; supported tasks "
              f"{', '.join(t.value for t in policy.supported)}; multitask {policy.multitask}\n"
              f"poolwire: pooling kernels: {kernels.describe_backend(model.device)}\n"
              f"poolwire: {worker.backend.describe()}\n"
              f"poolwire: try  {try_hint(policy.configured.value, settings.prefix, redact_url(url))}\n"
              f"poolwire: health  poolwire health --health-file {health_file}\n"
              f"poolwire: Ctrl-C drains in-flight requests and stops", flush=True)
        await asyncio.wait({signalled, worker.failed}, return_when=asyncio.FIRST_COMPLETED)
        if worker.failed.done() and not stop.is_set():
            print(f"poolwire: {worker.failed.result()}; exiting {EXIT_DEAF} so that a "
                  f"supervisor replaces this worker", file=sys.stderr, flush=True)
            # Replies cannot get out of a deaf connection: a short drain, then go.
            code, drain_timeout = EXIT_DEAF, min(2.0, settings.drain_timeout_s)
        else:
            print("poolwire: draining...", flush=True)
    finally:
        signalled.cancel()
        try:
            await worker.stop(drain_timeout)
        finally:  # the embedded server is ours: it goes whatever the drain did
            if server is not None:
                server.stop()
            # The heap frozen at start goes back to the collector before exit: objects still
            # frozen then are never freed, and nanobind's extensions (Triton's) report each of
            # theirs as a leak, some thirty lines on stderr at every stop.
            gc.unfreeze()
    print("poolwire: stopped", flush=True)
    return code


async def client_command(args) -> int:
    import nats.errors

    from poolwire.client import JobNotStoredError, PoolingClient, PoolingServiceError
    from poolwire.refusals import PermissionRefusedError

    if args.command == "embed":
        if not (args.texts or args.image):
            print("poolwire embed: give texts, or --image FILE", file=sys.stderr)
            return 2
        missing = [str(p) for p in args.image if not p.is_file()]
        if missing:
            print(f"poolwire embed: no such image file: {', '.join(missing)}", file=sys.stderr)
            return 2
    subject = (f"{args.prefix}.jobs.{args.task}" if args.command == "submit"
               else f"{args.prefix}.score" if args.command == "rerank"
               else f"{args.prefix}.{args.command}")
    try:
        async with PoolingClient(args.nats_url, prefix=args.prefix, timeout=args.timeout,
                                 **connect_options(args)) as client:
            if args.command == "submit":
                reply = await client.submit(args.task, {"input": args.texts})
            elif args.command == "embed":
                reply = await client.embed([*args.texts, *args.image], dimensions=args.dimensions)
            elif args.command == "classify":
                reply = await client.classify(args.texts)
            elif args.command == "rerank":
                reply = await client.rerank(args.query, args.documents, top_n=args.top_n,
                                            return_documents=args.return_documents or None)
            else:
                reply = await client.score(args.text_1, args.text_2)
    except PoolingServiceError as exc:
        print(json.dumps({"request_id": exc.request_id, "error": exc.error}), file=sys.stderr)
        return 1
    except (NatsConnectError, PermissionRefusedError) as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return EXIT_NATS_UNAVAILABLE
    except nats.errors.NoRespondersError:
        print(f"poolwire: no worker serves {subject} on {redact_url(args.nats_url)}; start one "
              f"(poolwire serve --prefix {args.prefix}) or check --prefix", file=sys.stderr)
        return EXIT_NO_RESPONDERS
    except nats.errors.TimeoutError:
        print(f"poolwire: no reply on {subject} within {args.timeout:g} s; the workers may be "
              f"overloaded: retry, or raise --timeout", file=sys.stderr)
        return EXIT_TIMEOUT
    except JobNotStoredError as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(reply))
    return 0


async def operator_command(args) -> int:
    from datetime import datetime, timezone

    from poolwire import operators

    since = None
    if getattr(args, "since", None):
        try:
            since = operators.parse_since(args.since, datetime.now(timezone.utc))
        except ValueError as exc:
            print(f"poolwire: {exc}", file=sys.stderr)
            return 2
    nc = await _operator_connection(args)
    if nc is None:
        return EXIT_NATS_UNAVAILABLE
    from poolwire.refusals import PermissionRefusedError
    try:
        if args.command == "stats":
            return await operators.show_stats(nc, args.prefix, args.json)
        return await operators.tail_events(nc, args.prefix, "all" if args.all else None, since,
                                           args.count, args.timeout)
    except PermissionRefusedError as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return EXIT_NATS_UNAVAILABLE
    finally:
        await close_quietly(nc)


async def _operator_connection(args):
    """An operator command's connection, or None once it has said why there is none."""
    try:
        return await connect(NatsOptions.from_values(args.nats_url, **connect_options(args)))
    except NatsConnectError as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return None


async def lag_command(args) -> int:
    import nats.errors

    from poolwire import operators
    from poolwire.actors.durable import durable_names

    names = durable_names(args.prefix, args.queue, args.pipeline_stream)
    stream, consumer = args.stream or names.stream, args.consumer or names.consumer
    try:
        if args.monitoring_url:
            url = operators.jsz_url(args.monitoring_url, args.account)
            try:
                jsz = await asyncio.to_thread(operators.read_jsz, url)
            except (OSError, ValueError) as exc:
                print(f"poolwire: could not read {url} ({exc}); is the server's monitoring "
                      f"port (-m / http_port) open there?", file=sys.stderr)
                return EXIT_NATS_UNAVAILABLE
            reading = operators.keda_lag(jsz, args.account, stream, consumer)
        else:
            nc = await _operator_connection(args)
            if nc is None:
                return EXIT_NATS_UNAVAILABLE
            try:
                reading = await operators.jetstream_lag(nc, stream, consumer)
            except nats.errors.Error as exc:  # no JetStream there, or no permission for INFO
                print(f"poolwire: could not ask JetStream for {stream}/{consumer} ({exc!r}); "
                      f"give --monitoring-url, or credentials that may call "
                      f"$JS.API.CONSUMER.INFO", file=sys.stderr)
                return EXIT_NATS_UNAVAILABLE
            finally:
                await close_quietly(nc)
    except operators.LagError as exc:
        print(f"poolwire: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(reading) if args.json else operators.lag_line(reading))
    return 0


def health(args) -> int:
    import time

    from poolwire.actors.health import judge, read_heartbeat

    path = Path(args.health_file) if args.health_file else args.state_dir / HEALTH_FILE_NAME
    healthy, line = judge(read_heartbeat(path), time.time(), path)
    print(line)
    return 0 if healthy else 1


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
            conflicts = [e["msg"] for e in exc.errors() if e["type"] == "pooler_config_conflict"]
            # A conflict names both options in one sentence; pydantic's layout adds only noise.
            print(f"poolwire: {conflicts[0] if conflicts else exc}", file=sys.stderr)
            return 2
        # SIGTERM while the model loads (before the worker's own handlers exist) stops it
        # like Ctrl-C: nothing is in flight yet, so that is a clean stop.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            return asyncio.run(serve(settings))
        except KeyboardInterrupt:
            print("poolwire: stopped before serving", file=sys.stderr)
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
    if args.command == "health":
        return health(args)
    if args.command == "lag":
        return asyncio.run(lag_command(args))
    if args.command in ("events", "stats"):
        try:
            return asyncio.run(operator_command(args))
        except KeyboardInterrupt:
            return 0
    return asyncio.run(client_command(args))


if __name__ == "__main__":
    sys.exit(main())
