"""The path alone: poolwire's actor graph (ingest, validator, engine: actors/worker.py's
`build_graph`) driven inside this process with the near-zero model of bench/service_cost.py,
its NATS connection a stand-in that keeps each reply instead of sending it, against the bare
nats-py responder answering the same requests through a real nats-server, in alternating rounds.

    python bench/loop_cost.py               # about a minute
    python bench/loop_cost.py --scale 0.1   # a small run, to check that it works

Both sides take 64 one-text requests at a time: the bare side as bench/service_cost.py's
client sends them (64 in flight); the path as 64 messages handed to the ingest's NATS
callback, then the wait for their 64 replies. What the path does with a request is all here
(decode, validate, task policy, tokenize, plan, batch, forward pass, pooling, framing) except
nats-py's own receive and publish; no client and no nats-server share the cores with it
during its rounds. So its ratio is the most poolwire's path can reach against the responder
with NATS and the client costing it nothing, and its event loop's CPU a request is steadier
than bench/service_cost.py's figures on a shared machine. Printed with the CPU's model and
flags; every reply is checked (a vector per request, no error frames).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench import machine  # noqa: E402
from bench.arguments import count  # noqa: E402
from bench.children import stop_process  # noqa: E402
from bench.progress import log  # noqa: E402
from bench.service_cost import (BARE_SUBJECT, _errors, _load, _start_responder,  # noqa: E402
                                build_near_zero_model, request_bodies, short_texts)

IN_FLIGHT = 64
REQUESTS = 3000  # per side per round at --scale 1, as service_cost.py's one-text shape


class StandIn:
    """The worker's NATS connection, as far as the actor graph uses it on the request path:
    the ingest's subscription (its callback is kept, and called with each message) and the
    publish of every reply frame (kept by reply subject, for the round to check)."""

    max_payload = 1024 * 1024  # nats-server's default
    is_connected = True

    def __init__(self) -> None:
        self.callback = None
        self.replies: dict[str, tuple[bytes, dict | None]] = {}
        self.expected = 0
        self.all_in = asyncio.Event()

    async def subscribe(self, subject: str, queue: str = "", cb=None):
        self.callback = cb

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict | None = None) -> None:
        self.replies[subject] = (payload, headers)
        if len(self.replies) >= self.expected:
            self.all_in.set()


@dataclass
class PathSide:
    requests: int = 0
    wall_s: float = 0.0
    loop_cpu_s: float = 0.0     # the event loop's thread: all of the path but the threads below
    process_cpu_s: float = 0.0  # with the tokenize and forward threads and the backend's
    errors: int = 0


@dataclass
class BareSide:
    requests: int = 0
    wall_s: float = 0.0
    errors: int = 0


@dataclass
class Result:
    bare: BareSide = field(default_factory=BareSide)
    path: PathSide = field(default_factory=PathSide)

    def ratio(self) -> float:
        bare = self.bare.requests / self.bare.wall_s
        return (self.path.requests / self.path.wall_s) / bare


async def _path_round(nc: StandIn, bodies: list[bytes], prefix: str,
                      timeout: float) -> PathSide:
    """Every body through the graph, IN_FLIGHT at a time; each reply checked. Raises
    RuntimeError where replies stop coming: a run that hangs would tell nothing."""
    from nats.aio.msg import Msg

    side = PathSide()
    answers: list[bytes] = []  # checked once the round is timed, as the bare side's are
    loop0, cpu0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    for start in range(0, len(bodies), IN_FLIGHT):
        chunk = bodies[start:start + IN_FLIGHT]
        nc.replies, nc.expected = {}, len(chunk)
        nc.all_in.clear()
        for i, body in enumerate(chunk):
            await nc.callback(Msg(_client=nc, subject=f"{prefix}.embed",
                                  reply=f"_INBOX.loop-cost.{i}", data=body))
        try:
            await asyncio.wait_for(nc.all_in.wait(), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"the path answered {len(nc.replies)} of {len(chunk)} requests "
                               f"within {timeout:g} s") from None
        answers.extend(payload for payload, _ in nc.replies.values())
        side.errors += len(chunk) - len(nc.replies)
    side.wall_s = time.perf_counter() - wall0
    side.loop_cpu_s = time.thread_time() - loop0
    side.process_cpu_s = time.process_time() - cpu0
    side.errors += _errors(answers, 1)
    side.requests = len(bodies)
    return side


async def measure(url: str, model_dir: Path, state_dir: Path, rounds: int, scale: float,
                  timeout: float) -> Result:
    import nats

    from poolwire.actors.engine import start_tokenizer_pool
    from poolwire.actors.replier import Replier
    from poolwire.actors.worker import SWITCH_INTERVAL_S, Worker
    from poolwire.cli import freeze_startup_heap
    from poolwire.models.model import load_model
    from poolwire.settings import WorkerSettings

    # As `poolwire serve` and Worker.start set up the process.
    start_tokenizer_pool()
    settings = WorkerSettings(model=model_dir, state_dir=state_dir)
    worker = Worker(settings, load_model(model_dir))
    freeze_startup_heap()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    stand_in = StandIn()
    worker.nc = stand_in
    worker.build_graph(Replier(stand_in, worker.metrics))
    await worker.ingest.subscribe()
    worker.start_actors()

    nc = await nats.connect(url, name="loop-cost-client")
    try:
        bodies = request_bodies(short_texts(), 1, max(IN_FLIGHT, int(REQUESTS * scale)))
        # Warm both sides.
        await _load(nc, BARE_SUBJECT, bodies[:IN_FLIGHT * 2], IN_FLIGHT, timeout)
        await _path_round(stand_in, bodies[:IN_FLIGHT * 2], settings.prefix, timeout)
        result = Result()
        for rnd in range(rounds):
            for who in (("bare", "path") if rnd % 2 == 0 else ("path", "bare")):
                if who == "bare":
                    wall, _, replies = await _load(nc, BARE_SUBJECT, bodies, IN_FLIGHT, timeout)
                    result.bare.requests += len(bodies)
                    result.bare.wall_s += wall
                    result.bare.errors += _errors(replies, 1)
                else:
                    side = await _path_round(stand_in, bodies, settings.prefix, timeout)
                    for name in ("requests", "wall_s", "loop_cpu_s", "process_cpu_s", "errors"):
                        setattr(result.path, name, getattr(result.path, name) + getattr(side, name))
            log(f"round {rnd + 1}/{rounds}: ratio so far {result.ratio():.2f}x")
        return result
    finally:
        await nc.close()
        await worker.supervisor.stop()
        await worker.engine.close()
        worker.metrics.close()
        gc.unfreeze()  # as serve does before it exits (see poolwire/cli.py)


def markdown(result: Result, machine_line: str, command: str) -> str:
    bare, path = result.bare, result.path
    per = 1e3 / max(path.requests, 1)
    return "\n".join([
        "| 1 text a request, 64 at a time | bare responder, through NATS | poolwire's path, "
        "in-process (no NATS, no client) | ratio | path's CPU a request: event loop / whole "
        "process |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| requests/s | {bare.requests / bare.wall_s:,.0f} | {path.requests / path.wall_s:,.0f} "
        f"| {result.ratio():.2f}x | {path.loop_cpu_s * per:.3f} / {path.process_cpu_s * per:.3f} "
        f"ms |",
        "",
        f"Errors: bare {bare.errors}, path {path.errors} (every reply is checked). The path's "
        f"process CPU includes its tokenize and forward threads and the backend's.",
        "",
        f"CPU: {machine_line}",
        f"command: {command}",
    ])


def run(args: argparse.Namespace, command: str) -> tuple[Result, str]:
    from poolwire.actors.nats_server import NatsServer

    with tempfile.TemporaryDirectory(prefix="poolwire-loop-cost-") as tmp:
        tmp_path = Path(tmp)
        log("building the near-zero model (1 layer, 32 wide, mean pooling)")
        model = build_near_zero_model(tmp_path / "near-zero")
        server = NatsServer(store_dir=tmp_path / "nats")
        url = server.start()
        responder_proc = None
        try:
            responder_proc = _start_responder(url, tmp_path / "responder.log")
            result = asyncio.run(measure(url, model, tmp_path / "state", args.rounds,
                                         args.scale, args.timeout_s))
        finally:
            if responder_proc is not None:
                stop_process(responder_proc)
            server.stop()
    return result, markdown(result, machine.describe(), command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The path alone: poolwire's actor graph in-process "
                                "against a bare nats-py responder through NATS, interleaved.")
    p.add_argument("--rounds", type=count, default=4,
                   help="rounds, alternating which side goes first (default 4)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="requests per round relative to the default 3,000 (0.1: a small run)")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="per request through NATS; per 64 requests in-process")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.scale <= 0:
        build_parser().error(f"--scale must be above 0, got {args.scale}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what this run started
    command = " ".join([".venv/bin/python bench/loop_cost.py", *map(shlex.quote, argv)])
    result, text = run(args, command)
    print(text, flush=True)
    return 1 if result.bare.errors or result.path.errors else 0


if __name__ == "__main__":
    sys.exit(main())
