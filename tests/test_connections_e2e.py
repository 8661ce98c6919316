"""Lost and missing servers: a server restart under load, SIGTERM while the server is down,
an unreachable server at start (the worker and the client CLI), and the CLI's one-line
answers for no responders and timeouts."""

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time

import msgpack
import nats
import nats.errors
import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.nats_connect import NatsOptions, close_quietly, connect

pytestmark = [pytest.mark.chaos]

RATE = 20            # requests per second during the restart
RESTART_BOUND_S = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
async def test_requests_succeed_again_soon_after_a_server_restart(minilm, start_worker, prefix,
                                                                   tmp_path, report):
    port = free_port()
    server = NatsServer(store_dir=tmp_path / "a", port=port, jetstream=False)
    url = await asyncio.to_thread(server.start)
    client = None
    try:
        async with start_worker(minilm, url=url):
            client = await connect(NatsOptions.from_values(url))
            body = msgpack.packb({"input": "hello"})
            await client.request(f"{prefix}.embed", body, timeout=60)  # first forward pass
            results: list[tuple[float, bool]] = []   # (sent at, answered)

            async def one() -> None:
                sent = time.monotonic()
                try:
                    # A long timeout: under the Triton interpreter the worker serves about
                    # 12 requests/s here, so a queue builds; only lost requests must fail.
                    await client.request(f"{prefix}.embed", body, timeout=20.0)
                    results.append((sent, True))
                except (nats.errors.Error, asyncio.TimeoutError):
                    results.append((sent, False))

            async def load(seconds: float) -> list[asyncio.Task]:
                tasks = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    tasks.append(asyncio.create_task(one()))
                    await asyncio.sleep(1 / RATE)  # the load's own pace, 20 requests/s
                return tasks

            tasks = await load(1.0)
            await asyncio.to_thread(server.stop)
            down_at = time.monotonic()
            load_during = asyncio.create_task(load(4.0))
            await asyncio.sleep(1.0)  # the outage itself: the server stays down for 1 s
            server = NatsServer(store_dir=tmp_path / "b", port=port, jetstream=False)
            await asyncio.to_thread(server.start)     # returns once it accepts connections
            accepting_at = time.monotonic()
            tasks += await load_during
            await asyncio.gather(*tasks)
            first_ok_after = min(s for s, ok in results if ok and s >= accepting_at)
            recovered = first_ok_after - accepting_at
            # The first request sent at or after this instant that succeeded: tries go out
            # every 50 ms, so the figure is within 50 ms of the true recovery time.
            answered = sum(ok for _, ok in results)
            report("server restart under 20 req/s", requests=len(results), answered=answered,
                   lost=len(results) - answered, down_s=round(accepting_at - down_at, 3),
                   recovered_after_accepting_s=round(recovered, 3))
            assert recovered <= RESTART_BOUND_S
            assert all(ok for s, ok in results if s >= accepting_at + RESTART_BOUND_S)
    finally:
        if client is not None:
            await close_quietly(client)
        server.stop()


async def read_until(stream, pattern: str, seen: list[str], timeout: float = 120) -> re.Match:
    while True:
        line = await asyncio.wait_for(stream.readline(), timeout)
        if not line:
            raise AssertionError(f"poolwire exited before printing {pattern!r}:\n{''.join(seen)}")
        seen.append(line.decode(errors="replace"))
        if m := re.search(pattern, seen[-1]):
            return m


async def serve(*args: str, env: dict | None = None):
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", "serve", *args, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


async def health(path, want: int, expect: str, within: float = 15.0) -> tuple[int, str]:
    """Run `poolwire health` until it exits `want` saying `expect` (the heartbeat is rewritten
    every probe interval, so a new state shows within about a second), or return its last
    answer."""
    deadline = time.monotonic() + within
    while True:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "health", "--health-file", str(path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        lines = out.decode().splitlines()
        assert len(lines) == 1, lines
        if (proc.returncode == want and expect in lines[0]) or time.monotonic() > deadline:
            return proc.returncode, lines[0]


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_sigterm_while_the_server_is_down_exits_0_within_the_drain_timeout(tmp_path, report):
    server = NatsServer(store_dir=tmp_path / "nats", jetstream=False)
    url = server.start()
    proc = await serve("--nats-url", url, "--drain-timeout-s", "10", "--state-dir",
                       str(tmp_path), "--prefix", "down.pooling")
    seen: list[str] = []
    try:
        await read_until(proc.stdout, r"poolwire: serving", seen)
        # `poolwire health`, as compose's healthcheck runs it, reads this worker's heartbeat.
        # The first probe round trip takes a moment after start: retried under a deadline.
        code, line = await health(tmp_path / "health.json", want=0, expect="ok: self-check probe")
        assert code == 0 and line.startswith("worker ") and "ok: self-check probe" in line
        server.stop()
        # The worker logs its first failed reconnect: now it knows the server is gone.
        await read_until(proc.stdout, r"NATS connection: ", seen, timeout=30)
        code, line = await health(tmp_path / "health.json", want=1, expect="disconnected from NATS")
        assert code == 1 and "disconnected from NATS" in line, line
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await read_until(proc.stdout, r"poolwire: stopped", seen, timeout=30)
        stopped = time.monotonic() - signalled
        code = await asyncio.wait_for(proc.wait(), 30)
        took = time.monotonic() - signalled
        rest = (await proc.stdout.read()).decode(errors="replace")
        out = "".join(seen) + rest
        report("SIGTERM while the server is down", exit_code=code,
               stopped_after_s=round(stopped, 3), exit_after_s=round(took, 3))
        assert code == 0, out
        assert took <= 10.0  # the drain timeout
        assert "Traceback" not in out and "poolwire: stopped" in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_an_unreachable_server_at_start_is_one_line_and_exit_3(tmp_path, report):
    proc = await serve("--nats-url", f"nats://u:s3cret@127.0.0.1:{free_port()}",
                       "--nats-connect-timeout-s", "2", "--state-dir", str(tmp_path))
    seen: list[str] = []
    try:
        await read_until(proc.stdout, r"poolwire: connecting to NATS at nats://\*\*\*@", seen)
        connecting = time.monotonic()
        await read_until(proc.stdout, r"poolwire: could not connect", seen, timeout=30)
        took = time.monotonic() - connecting
        code = await asyncio.wait_for(proc.wait(), 60)
        exited = time.monotonic() - connecting
        out = "".join(seen) + (await proc.stdout.read()).decode(errors="replace")
        report("unreachable server at start", exit_code=code, error_line_after_s=round(took, 3),
               exit_after_s=round(exited, 3))
        assert code == 3, out
        assert took <= 2.0 + 1.0  # the connect timeout, plus closing the attempt
        errors = [line for line in out.splitlines() if "could not connect" in line]
        assert len(errors) == 1 and "Traceback" not in out and "s3cret" not in out
        assert "--nats-url / NATS_URL" in errors[0]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_ctrl_c_while_connecting_stops_at_once_with_exit_0(tmp_path):
    proc = await serve("--nats-url", f"nats://127.0.0.1:{free_port()}",
                       "--nats-connect-timeout-s", "60", "--state-dir", str(tmp_path))
    seen: list[str] = []
    try:
        await read_until(proc.stdout, r"poolwire: connecting to NATS", seen)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        out = "".join(seen) + (await proc.stdout.read()).decode(errors="replace")
        assert "Traceback" not in out and "stopped before the NATS connection was made" in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_cli(*args: str) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "poolwire", *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - start


@pytest.mark.timeout(120)
async def test_the_client_cli_answers_in_one_line_with_documented_exit_codes(nats_server, prefix):
    common = ("--prefix", prefix, "--connect-timeout", "1", "--timeout", "1")
    # No worker: no responders.
    code, out, err, _ = await run_cli("embed", "hi", "--nats-url", nats_server.url, *common)
    assert (code, out) == (4, "") and err.count("\n") == 1 and f"no worker serves {prefix}.embed" in err
    # Unreachable server.
    code, out, err, _ = await run_cli("embed", "hi", "--nats-url",
                                      f"nats://127.0.0.1:{free_port()}", *common)
    assert (code, out) == (3, "") and err.count("\n") == 1 and "could not connect" in err
    # A subscriber that never answers: timeout.
    nc = await nats.connect(nats_server.url)
    try:
        await nc.subscribe(f"{prefix}.embed")
        await nc.flush()
        code, out, err, _ = await run_cli("embed", "hi", "--nats-url", nats_server.url, *common)
        assert (code, out) == (5, "") and err.count("\n") == 1 and "no reply" in err
    finally:
        await nc.close()
    code, out, _, _ = await run_cli("embed", "--help")
    assert code == 0 and "exit codes:" in out and "4  no worker serves" in out
