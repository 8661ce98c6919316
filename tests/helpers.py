"""Helpers shared by the tests: the NATS tests' waits and comparisons, and the benchmarks'
command lines."""

import asyncio
import threading
from pathlib import Path
from typing import NamedTuple

import nats
import numpy as np
import pytest


async def poll_until(predicate, timeout: float = 20.0) -> None:
    """Await `predicate()` until it is true, a short pause between looks, failing at the
    deadline. For JetStream figures only (a stream's message count, a consumer's pending
    acks): no event says "the server removed the acked message", so the tests look."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def wait_until_answering(url: str, prefix: str, timeout: float = 10.0) -> None:
    """Wait until another connection gets an answer from the worker: readiness as a client sees
    it. When a worker created its events stream before subscribing, nats-server 2.15 answered
    the first request from another connection with no-responders in about 1 start in 50 (a
    request an instant later was delivered); Worker.start now subscribes first, and this wait
    keeps the tests independent of such server timing."""
    conn = await nats.connect(url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await conn.request(f"{prefix}.embed", b"", timeout=timeout)  # an error reply
                return
            except nats.errors.NoRespondersError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                # No event tells when the server will route to the new SUB, and a
                # no-responders answer comes back in well under a millisecond: pause
                # briefly between tries rather than spin, bounded by the deadline.
                await asyncio.sleep(0.01)
    finally:
        await conn.close()


def drop_streams_under(url: str, prefix: str) -> list[str]:
    """Delete the JetStream streams whose subjects all lie under `prefix`: what one test's
    workers created on the session's server. Each deployment's dead-letter and events streams
    reserve 320 MiB of the server's file store, which nats-server sizes from the free disk; a
    session of hundreds of prefixes that kept them ran out (error 10047) on a CI machine with
    30 GB free. Runs its own event loop on its own thread, so it works from any teardown."""
    async def drop() -> list[str]:
        conn = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = conn.jetstream()
            dropped = []
            for info in await js.streams_info():
                subjects = info.config.subjects or []
                if subjects and all(s.startswith(prefix + ".") for s in subjects):
                    await js.delete_stream(info.config.name)
                    dropped.append(info.config.name)
            return dropped
        finally:
            await conn.close()

    outcome: dict = {}

    def run() -> None:
        try:
            outcome["dropped"] = asyncio.run(drop())
        except Exception as exc:  # raised below, on the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    assert "dropped" in outcome, f"deleting the streams under {prefix} took over 30 s"
    return outcome["dropped"]


def rows(reply) -> list[np.ndarray]:
    """The items of a one-message reply as float32 arrays, checking they come in index order."""
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    return [np.asarray(d["data"], dtype=np.float32) for d in reply["data"]]


def close(got, want, atol=1e-5):
    """Same shape and every element within atol (float32)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= atol, np.abs(got - want).max()


def usage_error(main, args: list[str], capsys) -> str:
    """What a benchmark's `main` prints when its command line is refused: it must exit 2, as
    argparse does."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    return capsys.readouterr().err


class Process(NamedTuple):
    pid: int
    state: str  # R, S, Z, ...
    ppid: int
    sid: int
    cmdline: str


def processes() -> list[Process]:
    """Every process in /proc now (one that exits meanwhile is left out)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        # Fields after the command name, which may itself hold spaces or parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        out.append(Process(int(entry.name), fields[0], int(fields[1]), int(fields[3]), cmdline))
    return out
