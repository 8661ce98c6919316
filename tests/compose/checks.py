"""The user's side of `make compose-test` (tests/compose/run.sh starts it with the repository's
.venv, after building the images): `docker compose up -d` of compose.yaml with
tests/compose/compose.test.yaml, then requests from the host with the publisher's NKey, as a
user's application would send them, while the containers are killed, scaled, restarted and
stopped. Every wait has a deadline; run.sh tears the project down whatever this exits with.

Environment (set by run.sh): COMPOSE (the compose command with its -p/-f/--env-file options),
NATS_URL (127.0.0.1 and the test's port), POOLWIRE_TEST_SECRETS (the seeds' folder)."""

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
import nats.errors

from poolwire.client import PoolingClient

COMPOSE = shlex.split(os.environ["COMPOSE"])
URL = os.environ["NATS_URL"]
SECRETS = Path(os.environ["POOLWIRE_TEST_SECRETS"])
METRICS_LINE = re.compile(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")
REQUESTS = re.compile(r"^poolwire_requests_total\{[^}]*\} ([0-9.e+]+)$", re.M)


class CheckFailed(Exception):
    pass


def say(message: str) -> None:
    print(f"compose-test: {message}", flush=True)


def sh(*argv: str, timeout: float = 120) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise CheckFailed(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def compose(*args: str, timeout: float = 300) -> str:
    return sh(*COMPOSE, *args, timeout=timeout)


def workers() -> list[str]:
    return sorted(compose("ps", "-q", "worker").split())


def inspect(container: str) -> dict:
    return json.loads(sh("docker", "inspect", container))[0]


def name(container: str) -> str:
    return inspect(container)["Name"].lstrip("/")


async def until(what: str, condition, timeout: float, every: float = 0.5):
    """Poll a cheap condition (docker inspect, a counter) until it holds; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(condition)
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(every)


def all_healthy(expected: int):
    ids = workers()
    states = {c: inspect(c)["State"] for c in ids}
    healthy = [c for c, s in states.items() if s.get("Health", {}).get("Status") == "healthy"]
    return ids if len(ids) == expected and len(healthy) == expected else None


def logs(container: str, *options: str) -> str:
    # One pipe for both streams, so the lines keep the order the worker wrote them in.
    return subprocess.run(["docker", "logs", *options, container], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=30).stdout


def metrics_port(container: str) -> int | None:
    """The port of this container's current worker process: the last one its log names (a
    restarted container keeps its log, and its new process binds a new port)."""
    ports = METRICS_LINE.findall(logs(container))
    return int(ports[-1]) if ports else None


def requests_received(container: str) -> float | None:
    port = metrics_port(container)
    if port is None:
        return None
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None  # the process is between lives (killed, restarting)
    return sum(float(v) for v in REQUESTS.findall(text))


def publisher() -> PoolingClient:
    return PoolingClient(URL, use_env=False, nkey=SECRETS / "publisher.nk",
                         inbox_prefix="_INBOX.publisher", connect_timeout_s=10, timeout=10)


async def embed_with_retry(client: PoolingClient, texts: list[str], timeout: float = 5.0,
                           tries: int = 2) -> int:
    """The retry a client does: a request lost with the worker that held it (killed) times
    out, and is sent again once. Returns the try that was answered (1 or 2)."""
    for attempt in range(1, tries + 1):
        try:
            reply = await client.request("embed", {"input": texts}, timeout=timeout)
            if len(reply["data"]) != len(texts):
                raise CheckFailed(f"{len(reply['data'])} embeddings for {len(texts)} texts")
            return attempt
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


async def discovery() -> set[str]:
    """The workers that answer $SRV.INFO.poolwire. The publisher's permissions do not include
    $SRV (PROTOCOL.md: publishers only send requests), the worker's do, so this asks with
    the worker's NKey and inbox prefix, as an operator's tool would."""
    nc = await nats.connect(URL, nkeys_seed=str(SECRETS / "worker.nk"),
                            inbox_prefix="_INBOX.worker", connect_timeout=10,
                            allow_reconnect=False)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.INFO.poolwire", b"", reply=inbox)
        found = set()
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)  # the answers come at once; 2 s of none ends it
            except nats.errors.TimeoutError:
                return found
            found.add(json.loads(msg.data)["metadata"]["worker"])
    finally:
        await nc.close()


async def tracked_load(client: PoolingClient, stop: asyncio.Event, tally: dict) -> dict:
    """One request every 50 ms until `stop`, counted in `tally` as they are answered."""
    tally.update(sent=0, first=0, retried=0, unanswered=0)

    async def one(k: int) -> None:
        try:
            attempt = await embed_with_retry(client, [f"load {k}"])
            tally["first" if attempt == 1 else "retried"] += 1
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            tally["unanswered"] += 1

    tasks = []
    while not stop.is_set():
        tasks.append(asyncio.ensure_future(one(tally["sent"])))
        tally["sent"] += 1
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except asyncio.TimeoutError:
            pass
    await asyncio.gather(*tasks)
    return tally


async def answered_by_each(client: PoolingClient, ids: list[str], timeout: float = 120) -> dict:
    """Requests until every container's worker has received some: the queue group spreads
    them, and each worker's own Prometheus counter says which took how many."""
    before = {c: requests_received(c) for c in ids}
    deadline = time.monotonic() + timeout
    sent = 0
    while True:
        await asyncio.gather(*(embed_with_retry(client, [f"spread {sent + k}"]) for k in range(8)))
        sent += 8
        now = {c: requests_received(c) for c in ids}
        got = {c: (now[c] or 0) - (before[c] or 0) for c in ids}
        if all(v > 0 for v in got.values()):
            return {name(c): int(v) for c, v in got.items()}
        if time.monotonic() > deadline:
            raise CheckFailed(f"after {sent} requests some worker took none: {got}")


async def main() -> int:
    # --- up, and the time to the first answer --------------------------------------------
    t0 = time.monotonic()
    say("docker compose up -d")
    compose("up", "-d", "--no-build", timeout=300)
    client = None
    first_deadline = t0 + 300
    while client is None:
        try:
            client = await publisher().__aenter__()
        except Exception as exc:  # NATS not accepting yet; up -d waited for its healthcheck
            if time.monotonic() > first_deadline:
                raise CheckFailed(f"no NATS connection with the publisher's NKey: {exc}")
            await asyncio.sleep(0.5)
    while True:
        try:
            await client.request("embed", {"input": ["hello"]}, timeout=5)
            break
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() > first_deadline:
                raise CheckFailed("no answer within 300 s of `up`")
            await asyncio.sleep(0.2)  # no worker subscribed yet: nothing to wait on but time
    say(f"first answer {time.monotonic() - t0:.1f} s after `docker compose up -d` began")

    try:
        ids = await until("both workers healthy", lambda: all_healthy(2), 240)
        nats_state = inspect(compose("ps", "-q", "nats").strip())["State"]["Health"]["Status"]
        say(f"healthchecks: nats {nats_state}, workers {', '.join(name(c) for c in ids)} "
            f"healthy ({time.monotonic() - t0:.1f} s after up)")
        found = await discovery()
        say(f"discovery ($SRV.INFO.poolwire) shows {len(found)} workers: {', '.join(sorted(found))}")
        if len(found) != 2:
            raise CheckFailed(f"discovery shows {len(found)} workers, not 2")
        await until("every worker's metrics port in its log", lambda: all(metrics_port(c) for c in ids), 60)
        say(f"requests with the publisher's NKey answered by both workers: "
            f"{await answered_by_each(client, ids)} (each worker's poolwire_requests_total)")

        # --- docker kill: restart: unless-stopped brings it back; the load stays answered -----
        victim = ids[0]
        restarts = inspect(victim)["RestartCount"]
        stop, tally = asyncio.Event(), {}
        loader = asyncio.ensure_future(tracked_load(client, stop, tally))
        await until("some load answered before the kill", lambda: tally.get("first", 0) >= 20,
                    60, every=0.1)
        killed_at = time.monotonic()
        # SIGKILL of the container's process from the host, as the OOM killer or a crash ends
        # it. Not `docker kill`: Docker (20.10 here) marks a container it killed as stopped by
        # hand, and `unless-stopped` then leaves it stopped, as it should.
        pid = inspect(victim)["State"]["Pid"]
        os.kill(pid, 9)
        say(f"SIGKILL of {name(victim)}'s worker process (host pid {pid}) under a load of one "
            f"request per 50 ms")
        await until(f"{name(victim)} restarted",
                    lambda: inspect(victim)["RestartCount"] > restarts and inspect(victim)["State"]["Running"], 120)
        await until(f"{name(victim)} healthy again", lambda: all_healthy(2), 240)
        back = time.monotonic() - killed_at
        answered_when_back = tally["first"] + tally["retried"]
        await until("load answered on the returned worker too",
                    lambda: tally["first"] + tally["retried"] >= answered_when_back + 20, 60,
                    every=0.1)
        stop.set()
        await asyncio.wait_for(loader, 60)
        say(f"{name(victim)} back: restart count {inspect(victim)['RestartCount']}, healthy "
            f"{back:.1f} s after the kill")
        say(f"during the kill: {tally['sent']} requests sent, {tally['first']} answered at once, "
            f"{tally['retried']} after the client's one retry, {tally['unanswered']} unanswered")
        if tally["unanswered"]:
            raise CheckFailed(f"{tally['unanswered']} requests unanswered after a retry")
        await until("the killed worker's metrics port", lambda: metrics_port(victim), 60)
        say(f"after the kill, answered by: {await answered_by_each(client, ids)}")

        # --- --scale worker=3 ----------------------------------------------------------------
        compose("up", "-d", "--no-build", "--no-recreate", "--scale", "worker=3", timeout=300)
        ids = await until("three workers healthy", lambda: all_healthy(3), 240)
        found = await discovery()
        say(f"--scale worker=3: discovery shows {len(found)} workers")
        if len(found) != 3:
            raise CheckFailed(f"discovery shows {len(found)} workers, not 3")
        await until("every worker's metrics port in its log", lambda: all(metrics_port(c) for c in ids), 60)
        say(f"answered by: {await answered_by_each(client, ids)}")

        # --- a durable job survives `docker compose restart worker` ---------------------------
        jobs = []

        async def job(k: int):
            start = time.monotonic()
            reply = await client.submit("embed", {"input": [f"durable job {k}"]}, timeout=300)
            if len(reply["data"]) != 1:
                raise CheckFailed(f"durable job {k}: {reply}")
            return time.monotonic() - start

        restart = asyncio.ensure_future(asyncio.to_thread(compose, "restart", "worker", timeout=300))
        while not restart.done():
            jobs.append(asyncio.ensure_future(job(len(jobs))))
            await asyncio.sleep(0.25)  # the pace of submissions while the restart runs
        await restart
        # Jobs published while no worker was up wait in the stream for the restarted ones.
        for _ in range(4):
            jobs.append(asyncio.ensure_future(job(len(jobs))))
        waits = await asyncio.wait_for(asyncio.gather(*jobs), 300)
        say(f"durable jobs across `docker compose restart worker`: {len(waits)} submitted, "
            f"{len(waits)} answered, the longest after {max(waits):.1f} s")
        ids = await until("three workers healthy after the restart", lambda: all_healthy(3), 240)
        await until("every worker's metrics port in its log", lambda: all(metrics_port(c) for c in ids), 60)

        # --- docker compose stop drains --------------------------------------------------------
        before = sum(requests_received(c) or 0 for c in ids)
        # Work that is still in flight when SIGTERM comes, yet done well within the drain
        # timeout (30 s) on a loaded 2-core machine: 64 texts of 80 tokens took over 30 s there
        # (3 workers sharing the cores with other jobs), 16 texts of 30 tokens a few seconds.
        texts = [f"a text for the drain, number {k}, " * 4 for k in range(16)]
        inflight = [asyncio.ensure_future(client.request("embed", {"input": texts}, timeout=120))
                    for _ in range(6)]
        await until("six requests received by the workers",
                    lambda: sum(requests_received(c) or 0 for c in ids) - before >= 6, 60, every=0.1)
        done_before_stop = sum(t.done() for t in inflight)
        stopper = asyncio.ensure_future(asyncio.to_thread(compose, "stop", timeout=180))
        try:
            replies = await asyncio.wait_for(asyncio.gather(*inflight), 150)
        except (asyncio.TimeoutError, nats.errors.TimeoutError) as exc:
            raise CheckFailed(f"in-flight requests unanswered after `docker compose stop` "
                              f"({exc!r}): the drain did not answer them") from exc
        await stopper
        if any(len(r["data"]) != len(texts) for r in replies):
            raise CheckFailed("a drained request's reply is incomplete")
        codes = {name(c): inspect(c)["State"]["ExitCode"] for c in ids}
        drained = {name(c): "poolwire: draining..." in logs(c) for c in ids}
        say(f"docker compose stop: {len(replies) - done_before_stop} of {len(replies)} in-flight "
            f"requests (16 texts each) answered during the drain; exit codes {codes}")
        for line in compose("ps", "-a", "--format", "table {{.Name}}\t{{.Status}}").splitlines():
            say(f"  {line}")
        for c in ids:
            tail = [line for line in logs(c, "--tail", "3").splitlines() if line]
            say(f"  {name(c)} log ends: {' | '.join(tail)}")
        if any(codes.values()) or not all(drained.values()):
            raise CheckFailed(f"not a clean drain: exit codes {codes}, drained {drained}")
        return 0
    finally:
        await client.close()


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except (CheckFailed, subprocess.TimeoutExpired, asyncio.TimeoutError) as exc:
        print(f"compose-test: FAILED: {exc!r}", file=sys.stderr, flush=True)
        sys.exit(1)
