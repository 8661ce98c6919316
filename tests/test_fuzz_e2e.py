"""Fuzz against a real worker: 10,000 hostile bodies (tests/hostile_bodies.py, seeded) on every
task subject and on unknown names. Each must be answered with a well-formed error frame that
fits max_payload, none `internal`, none unanswered; afterwards the worker computes the same
embeddings as before, no actor failed or restarted, and the process's RSS stayed bounded."""

import asyncio
import collections
import time

import msgpack
import nats.errors
import numpy as np
import pytest

from poolwire.actors.framing import header_bytes
from poolwire.schemas.codec import decode
from poolwire.schemas.errors import ErrorCode
from poolwire.schemas.replies import ErrorFrame
from tests import hostile_bodies as hb

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

COUNT = 10_000
CONCURRENCY = 64
# The worker runs in this process, so this counts the test's own client too; measured growth
# here was about 20 MiB (bodies of up to 1 MiB, 64 in flight).
RSS_GROWTH_BOUND_MIB = 100
REFERENCE = ["the same text before and after", "a second one", "ünïcödé ✓"]


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def embeddings(nc, prefix) -> np.ndarray:
    msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": REFERENCE}), timeout=60)
    return np.array([item["data"] for item in msgpack.unpackb(msg.data)["data"]])


async def test_ten_thousand_hostile_bodies_are_each_answered_with_a_well_formed_error(
        minilm, start_worker, nc, prefix):
    codes = collections.Counter()
    problems: list[str] = []
    lost = 0
    status = {code.value: str(code.status) for code in ErrorCode}

    async def one(name: str, subject: str, body: bytes) -> None:
        nonlocal lost
        try:
            msg = await nc.request(f"{prefix}.{subject}", body, timeout=60)
        except nats.errors.TimeoutError:
            lost += 1
            problems.append(f"{name} on {subject}: no answer to {body[:80]!r}")
            return
        try:
            frame, _ = decode(msg.data)
            ErrorFrame.model_validate(frame)
            code = frame["error"]["code"]
            codes[code] += 1
            assert code != "internal", frame
            assert msg.headers["Nats-Service-Error-Code"] == status[code]
            assert msg.headers["Nats-Service-Error"]
            assert len(msg.data) + header_bytes(msg.headers) <= nc.max_payload
            assert 0 < len(frame["request_id"]) <= 256
        except Exception as exc:  # collected so one run reports every kind of failure
            problems.append(f"{name} on {subject}: {exc!r:.300} for {body[:80]!r}")

    async with start_worker(minilm) as worker:
        before = await embeddings(nc, prefix)
        rss_before = rss_mib()
        slots = asyncio.Semaphore(CONCURRENCY)
        pending: set[asyncio.Task] = set()
        started = time.monotonic()
        for name, subject, body in hb.generate(COUNT):
            await slots.acquire()  # at most CONCURRENCY bodies (up to 1 MiB each) held at once
            task = asyncio.create_task(one(name, subject, body))
            pending.add(task)
            task.add_done_callback(lambda t: (pending.discard(t), slots.release()))
        await asyncio.gather(*pending)
        elapsed = time.monotonic() - started
        rss_after = rss_mib()
        after = await embeddings(nc, prefix)
        failures = {a.name: a.failures for a in (worker.ingest, worker.validator, worker.engine)}
        restarts = dict(worker.supervisor.restarts)
    print(f"fuzz: {COUNT} requests, {sum(codes.values())} answered, {lost} lost, "
          f"{codes['internal']} internal, {elapsed:.1f} s; codes {dict(codes)}; "
          f"RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    assert not problems, "\n".join(problems[:20])
    assert sum(codes.values()) == COUNT and lost == 0
    assert failures == {"ingest": 0, "validator": 0, "engine": 0} and restarts == {}
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6)
    assert rss_after - rss_before < RSS_GROWTH_BOUND_MIB


@pytest.mark.timeout(120)
async def test_hostile_bodies_without_a_reply_subject_are_dropped_and_warned_about_once(
        minilm, start_worker, nc, prefix, caplog):
    async with start_worker(minilm):
        for _, subject, body in hb.generate(500, seed=11):
            await nc.publish(f"{prefix}.{subject}", body)
        # Answered after all 500: the worker takes its requests in order.
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "still fine"}), timeout=60)
    assert len(msgpack.unpackb(msg.data)["data"][0]["data"]) == 384
    warned = [r for r in caplog.records
              if "no reply subject" in r.getMessage() and r.levelname == "WARNING"]
    assert len(warned) == 1
