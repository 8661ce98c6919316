"""A worker never goes deaf: each fault that left a nats-py 2.16 worker alive but answering
nothing (NATS.md section 9), sent for real, and a normal request is answered again within
10 s. The junk is written as raw protocol bytes on a socket (tests/rawnats.py), as a hostile or
buggy publisher in another language would send it."""

import asyncio
import os
import subprocess
import sys
import time

import msgpack
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from poolwire.actors.nats_server import NatsServer
from poolwire.nats_client import ResilientClient
from tests.rawnats import RawNats

pytestmark = [pytest.mark.timeout(90), pytest.mark.chaos]

RECOVERY_BOUND_S = 10.0
FAST_PROBES = {"probe_interval_s": 0.5, "probe_timeout_s": 2.0}

# The four kinds of protocol-level junk, each on a subject the worker's `P.*` subscription
# receives: (raw protocol verb, subject suffix, reply, header block).
JUNK = {
    "header status line with invalid UTF-8": (b"embed", b"", b"NATS/1.0 \xff\xfe bad\r\n\r\n"),
    "bare NATS/1.0 header block": (b"embed", b"", b"NATS/1.0"),
    "subject with invalid UTF-8": (b"\xff\xfe", b"", None),
    "reply subject with invalid UTF-8": (b"embed", b"_INBOX.\xff\xfe", None),
}


@pytest.fixture(scope="module")
def server():
    # Its own server: the junk and the dropped connections stay away from other tests.
    with NatsServer(jetstream=False, max_payload=64 * 1024) as s:
        yield s


async def send_junk(url: str, prefix: str, kind: str) -> None:
    suffix, reply, headers = JUNK[kind]
    raw = await RawNats.connect(url)
    try:
        subject = prefix.encode() + b"." + suffix
        if headers is None:
            await raw.pub(subject, b'{"input": "junk"}', reply)
        else:
            await raw.hpub(subject, headers, b'{"input": "junk"}', reply)
    finally:
        await raw.close()


BODY = msgpack.packb({"input": "are you there"})


async def served(nc, prefix: str) -> None:
    """A first request, with time for the first forward pass (Triton's interpreter is slow)."""
    reply = await nc.request(f"{prefix}.embed", BODY, timeout=60)
    assert len(msgpack.unpackb(reply.data)["data"]) == 1


async def answered_again(nc, prefix: str, bound: float = RECOVERY_BOUND_S) -> tuple[float, int]:
    """Seconds until a normal request is answered again, and how many tries failed first
    (no reply within 3 s, or no responders). A try waits long enough for a slow forward pass
    on a loaded machine (Triton's interpreter): shorter tries pile up work that times out."""
    start = time.monotonic()
    lost = 0
    while time.monotonic() - start < bound:
        sent = time.monotonic()
        try:
            reply = await nc.request(f"{prefix}.embed", BODY,
                                     timeout=min(3.0, max(0.1, bound - (sent - start))))
            assert len(msgpack.unpackb(reply.data)["data"]) == 1
            return time.monotonic() - start, lost
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            lost += 1
            # No-responders comes back in under a millisecond and no event says when the
            # worker is back: pace the tries like a client would, bounded by `bound`.
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - sent)))
    raise AssertionError(f"no answer within {bound} s ({lost} tries lost)")


@pytest.mark.parametrize("kind", sorted(JUNK))
async def test_plain_nats_py_goes_deaf_on_junk(server, prefix, kind):
    """The upstream bug, shown on a plain nats-py Client: after the junk its read loop has
    ended while it still says it is connected, and a normal message never arrives."""
    nc = Client()
    await nc.connect(server.url, reconnect_time_wait=0.1)
    try:
        sub = await nc.subscribe(f"{prefix}.*")
        await nc.flush()
        await send_junk(server.url, prefix, kind)
        other = await nats.connect(server.url)
        try:
            await other.publish(f"{prefix}.embed", b"normal")
            await other.flush()
            with pytest.raises(nats.errors.TimeoutError):
                while True:  # the junk itself may or may not surface before the loop dies
                    msg = await sub.next_msg(timeout=1.0)
                    assert msg.data != b"normal"
        finally:
            await other.close()
        assert nc.is_connected and nc._reading_task.done()
    finally:
        await nc.close()


@pytest.mark.parametrize("kind", sorted(JUNK))
async def test_junk_on_the_request_subject_does_not_leave_the_worker_deaf(
        server, minilm, start_worker, prefix, kind, report):
    async with start_worker(minilm, url=server.url, **FAST_PROBES) as worker:
        nc = await nats.connect(server.url)
        try:
            await served(nc, prefix)
            await send_junk(server.url, prefix, kind)
            took, lost = await answered_again(nc, prefix)
            assert isinstance(worker.nc, ResilientClient) and worker.nc.stats["reconnects"] >= 1
            assert not worker.failed.done()
            report(f"junk: {kind}", recovered_s=round(took, 3), lost_tries=lost)
        finally:
            await nc.close()


async def test_a_message_over_max_payload_with_its_headers_does_not_close_the_worker(
        server, minilm, start_worker, prefix, report):
    """nats-py checks only the body against max_payload; the server counts the headers too,
    answers -ERR 'Maximum Payload Violation' and drops the connection, and nats-py 2.16 then
    closes the client for good. Whatever makes the worker publish such a message (an oversized
    error frame did), the worker must come back."""
    async with start_worker(minilm, url=server.url, **FAST_PROBES) as worker:
        nc = await nats.connect(server.url)
        try:
            await served(nc, prefix)
            limit = worker.nc.max_payload
            await worker.nc.publish(f"{prefix}.nobody", b"x" * (limit - 10),
                                    headers={"Padding": "p" * 200})
            took, lost = await answered_again(nc, prefix)
            assert not worker.nc.is_closed and not worker.failed.done()
            report("max_payload counting headers", recovered_s=round(took, 3), lost_tries=lost)
        finally:
            await nc.close()


async def test_the_self_check_catches_deafness_the_workarounds_do_not_know(
        server, minilm, start_worker, prefix, monkeypatch, report):
    """With the read-loop workaround switched off, junk leaves the connection deaf exactly as
    upstream does; the end-to-end probe notices within its timeout and forces a reconnect."""
    monkeypatch.setattr(ResilientClient, "_read_loop", Client._read_loop)
    async with start_worker(minilm, url=server.url, **FAST_PROBES) as worker:
        nc = await nats.connect(server.url)
        try:
            await served(nc, prefix)
            await send_junk(server.url, prefix, "subject with invalid UTF-8")
            took, lost = await answered_again(nc, prefix)
            assert worker.watchdog.reconnects_forced >= 1
            report("deaf by an unknown cause (probe)", recovered_s=round(took, 3), lost_tries=lost)
        finally:
            await nc.close()


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_a_worker_deaf_beyond_repair_exits_4(tmp_path, report):
    """A cause no reconnect cures: the worker's NATS user may not publish its own probes
    (a permission mistake), so nothing proves it still receives. It reconnects twice, then
    exits 4 for its supervisor to replace it (compose: restart unless-stopped)."""
    conf = tmp_path / "nats.conf"
    conf.write_text("""authorization { users: [
  { user: deaf, password: pw, permissions: {
      publish: { allow: ["$JS.API.>"] }, subscribe: ["deaf.>", "$SRV.>", "_INBOX.>"],
      allow_responses: true } }
] }
""")
    with NatsServer(store_dir=tmp_path / "nats", config=conf, jetstream=False) as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "serve", "--nats-url", server.url,
            "--prefix", "deaf", "--probe-interval-s", "0.5", "--probe-timeout-s", "1",
            "--state-dir", str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "NATS_USER": "deaf", "NATS_PASSWORD": "pw"})
        seen: list[str] = []
        try:
            while "poolwire: serving" not in (seen[-1] if seen else ""):
                line = await asyncio.wait_for(proc.stdout.readline(), 120)
                assert line, "".join(seen)
                seen.append(line.decode(errors="replace"))
            serving = time.monotonic()
            while "exiting 4" not in seen[-1]:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                assert line, "".join(seen)
                seen.append(line.decode(errors="replace"))
            gave_up = time.monotonic() - serving
            code = await asyncio.wait_for(proc.wait(), 60)
            exited = time.monotonic() - serving
            out = "".join(seen) + (await proc.stdout.read()).decode(errors="replace")
            report("deaf beyond repair (probe not permitted)", exit_code=code,
                   gave_up_after_serving_s=round(gave_up, 3), exited_after_serving_s=round(exited, 3))
            assert code == 4, out
            assert gave_up <= RECOVERY_BOUND_S
            assert "even after 2 reconnects" in out and "deaf.probe." in out
            assert "Traceback" not in out
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
