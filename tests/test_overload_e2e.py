"""Admission control under a burst: 20,000 requests against a worker with a small queue are
all answered, served or `overloaded` with a retry hint, none lost, and the worker's memory stays
bounded. The worker runs in its own process, as in production, so its RSS is its own."""

import asyncio
import os
import re
import subprocess
import sys

import msgpack
import nats
import pytest

from tests.helpers import wait_until_answering

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

BURST = 20_000
# The worker's peak RSS may grow at most this much over its idle RSS during the burst.
RSS_GROWTH_BOUND_MIB = 300


def rss_mib(pid: int, field: str) -> float:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024


async def start_worker_process(url: str, prefix: str, *extra: str):
    env = {**os.environ, "POOLWIRE_PREFIX": prefix}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", "serve", "--nats-url", url, *extra,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line, "the worker exited during start-up"
        if b"configured task" in line:
            return proc


async def test_a_burst_of_20000_requests_is_answered_in_full_with_bounded_memory(nats_server, prefix):
    proc = await start_worker_process(nats_server.url, prefix, "--max-queued-tokens", "2048")
    drain_output = asyncio.ensure_future(proc.stdout.read())  # keep the pipe from filling
    nc = await nats.connect(nats_server.url)
    try:
        await wait_until_answering(nats_server.url, prefix)
        idle_rss = rss_mib(proc.pid, "VmRSS")
        inbox = nc.new_inbox()
        answers: dict[str, dict] = {}
        all_in = asyncio.Event()

        async def on_reply(msg):
            frame = msgpack.unpackb(msg.data)
            answers[frame["request_id"]] = frame
            if len(answers) == BURST:
                all_in.set()

        await nc.subscribe(inbox, cb=on_reply, pending_msgs_limit=BURST * 2)
        texts = ["a short text to embed", "another sentence, a little longer than the first one"]
        for i in range(BURST):
            await nc.publish(f"{prefix}.embed", msgpack.packb(
                {"input": texts[i % 2], "request_id": f"b{i}"}), reply=inbox)
        await nc.flush()
        await asyncio.wait_for(all_in.wait(), 240)
        peak_rss = rss_mib(proc.pid, "VmHWM")
    finally:
        await nc.close()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)
        await drain_output
    assert set(answers) == {f"b{i}" for i in range(BURST)}
    served = [a for a in answers.values() if "data" in a]
    refused = [a for a in answers.values() if "error" in a]
    assert len(served) + len(refused) == BURST
    assert served and refused  # the small queue really overflowed, and work still got done
    assert all(a["error"]["code"] == "overloaded" and a["error"]["retry_after_ms"] >= 1 for a in refused)
    assert peak_rss - idle_rss < RSS_GROWTH_BOUND_MIB, (idle_rss, peak_rss)
    print(f"burst of {BURST}: {len(served)} served, {len(refused)} overloaded; "
          f"worker RSS idle {idle_rss:.0f} MiB, peak {peak_rss:.0f} MiB")
