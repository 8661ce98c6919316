"""The chaos soak (issue 21): a three-node JetStream cluster (every stream 3 replicas), two
worker processes each serving durable jobs and a document pipeline at once, a steady load of
both, and every 10 to 25 s a random node or worker SIGKILLed and started again. At the end:
every document has exactly one result, its embedding equal to Sentence-Transformers, every job
is answered, nothing was dead-lettered or answered with an error, and both workers are alive.

The fault schedule comes from a seed (`--soak-seed N`), so a failing schedule can be run again;
the run's own timing (what each fault hits) still varies. `make test` runs the 2-minute
version with the fixed seeds below; `pytest tests/test_soak_chaos.py --soak-minutes [N]
[--soak-seed S]` runs a long one (60 minutes when N is left out). Figures: one JSON line
(`-s` shows it), quoted in RELIABILITY.md."""

import asyncio
import json
import random
import time

import msgpack
import nats
import numpy as np
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import ServiceUnavailableError

from poolwire.actors.durable import stream_name
from poolwire.client import PoolingClient
from poolwire.schemas.codec import decode
from tests.procs import NatsCluster, WorkerProcess
from tests.test_durable_chaos import wait_for_jetstream

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

SHORT_MINUTES = 2.0
# The seeds `make test` runs. A seed that ever failed is added here, so it is run every time.
# 108: in a 6-minute run one job of 571 was never answered (all 1,377 documents were stored
# once, no worker logged an error): most likely its answer was published while the client's
# server was down (core NATS, at most once); the client now resubmits after a silence
# (`jobs_resubmitted` in the figures), see RELIABILITY.md.
FIXED_SEEDS = [21, 108]
DOCS_PER_S = 4.0             # 1,440 documents in 6 minutes
JOBS_PER_S = 1.6             # 576 jobs in 6 minutes
FAULT_GAP_S = (10.0, 25.0)   # between one fault's restart and the next fault
NODE_SHARE = 0.73            # about 11 node kills to 4 worker kills
DOWN_S = (1.0, 5.0)          # how long a killed node stays down
NO_PROGRESS_S = 240.0        # the settling phase fails when nothing was answered for this long
ACK_WAIT_S = "5"
DOCS, RESULTS = "SOAKDOCS", "SOAKOUT"
WORDS = ("river", "stone", "lantern", "quiet", "harbour", "engine", "paper", "winter", "orbit",
         "copper", "meadow", "signal", "glass", "thunder", "pocket", "violet", "anchor", "maple")


def pytest_generate_tests(metafunc):
    if "soak_seed" not in metafunc.fixturenames:
        return
    minutes = metafunc.config.getoption("--soak-minutes") or SHORT_MINUTES
    seed = metafunc.config.getoption("--soak-seed")
    # Bounded: the load, the starts, the settling phase (itself bounded on progress) and the
    # reference embeddings.
    limit = pytest.mark.timeout(int(minutes * 60 + 1200))
    metafunc.parametrize("soak_seed", [pytest.param(s, marks=limit)
                                       for s in ([seed] if seed is not None else FIXED_SEEDS)])


def fault_schedule(seed: int, duration_s: float) -> list[tuple[float, str, float]]:
    """(gap before it in seconds, victim: a node A/B/C or a worker w0/w1, seconds down)."""
    rng = random.Random(seed)
    faults, at = [], 0.0
    while True:
        gap = rng.uniform(*FAULT_GAP_S)
        at += gap
        if at >= duration_s:
            return faults
        victim = rng.choice("ABC") if rng.random() < NODE_SHARE else rng.choice(("w0", "w1"))
        faults.append((round(gap, 2), victim, round(rng.uniform(*DOWN_S), 2)))


def text_of(i: int) -> str:
    rng = random.Random(i)
    return f"document {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))


def test_the_schedule_is_repeatable_and_keeps_the_mix():
    a, b = fault_schedule(7, 3600), fault_schedule(7, 3600)
    assert a == b and a != fault_schedule(8, 3600)
    nodes = sum(v in "ABC" for _, v, _ in a)
    assert 0.6 < nodes / len(a) < 0.85 and all(10 <= g <= 25 for g, _, _ in a)


class Soak:
    def __init__(self, cluster: NatsCluster, prefix: str, log_dir) -> None:
        self.cluster, self.prefix, self.log_dir = cluster, prefix, log_dir
        urls = cluster.urls
        self.worker_urls = {"w0": ",".join(urls[n] for n in "ABC"),
                            "w1": ",".join(urls[n] for n in "BCA")}
        self.workers: dict[str, WorkerProcess] = {}
        self.started: list[WorkerProcess] = []
        self.faults: list[tuple[str, float]] = []
        self.stalls: list[float] = []       # publish outages over 1 s (a stream without leader)
        self.docs = 0
        self.jobs: list[asyncio.Task] = []
        self.answered = 0
        self.began = time.monotonic()

    def worker(self, name: str) -> WorkerProcess:
        return WorkerProcess(
            self.worker_urls[name], self.prefix, "--durable", "--durable-replicas", "3",
            "--durable-ack-wait-s", ACK_WAIT_S, "--pipeline-stream", DOCS,
            "--pipeline-input", "soak.in", "--pipeline-output", "soak.out",
            "--pipeline-id-field", "id", log_dir=self.log_dir)

    async def start_worker(self, name: str) -> None:
        worker = self.worker(name)
        self.started.append(worker)
        self.workers[name] = await worker.start(timeout=300)

    async def inject(self, schedule, until: float) -> None:
        """The schedule's faults in order, each after its gap counted from the end of the last
        one's restart (so one node at most is down, and the cluster keeps its quorum), until
        the load ends."""
        for gap, victim, down_s in schedule:
            await asyncio.sleep(gap)
            if time.monotonic() >= until:
                return
            at = time.monotonic()
            if victim in self.workers:
                self.workers[victim].kill()
                await self.workers[victim].close()
                await self.start_worker(victim)
            else:
                self.cluster.kill(victim)
                await asyncio.sleep(down_s)
                self.cluster.restart(victim)
            self.faults.append((victim, round(time.monotonic() - at, 1)))
            self.progress(f"fault {len(self.faults)}: {victim} killed, back after "
                          f"{self.faults[-1][1]} s")

    def progress(self, what: str) -> None:
        """A line per fault and per half-minute of settling (`-s` shows them): a long soak
        says where it is."""
        print(f"soak {time.monotonic() - self.began:7.0f} s: {what}; {self.docs} documents "
              f"published, {self.answered} of {len(self.jobs)} jobs answered", flush=True)

    async def publish_docs(self, js, until: float) -> None:
        while time.monotonic() < until:
            i = self.docs
            body = msgpack.packb({"id": f"d{i}", "text": text_of(i)})
            failing_since = None
            while True:  # as a producer must: the same Nats-Msg-Id until a PubAck comes
                try:
                    await js.publish(f"soak.in.{i}", body, headers={"Nats-Msg-Id": f"d{i}"},
                                     timeout=2.0)
                    break
                except Exception:
                    failing_since = failing_since or time.monotonic()
                    assert time.monotonic() - failing_since < 120, "the docs stream never came back"
                    await asyncio.sleep(0.2)
            if failing_since and time.monotonic() - failing_since > 1.0:
                self.stalls.append(round(time.monotonic() - failing_since, 1))
            self.docs += 1
            await asyncio.sleep(1 / DOCS_PER_S)

    async def submit_jobs(self, client: PoolingClient, until: float) -> None:
        i = 0
        while time.monotonic() < until:
            self.jobs.append(asyncio.create_task(self._job(client, i)))
            i += 1
            await asyncio.sleep(1 / JOBS_PER_S)

    async def _job(self, client: PoolingClient, i: int) -> tuple[int, dict]:
        # An answer published while this client's server is down is lost (core NATS, at
        # most once; seed 108 lost one that way), so the client resubmits after a silence
        # longer than a worker's restart here (up to 94 s under load).
        reply = await client.submit("embed", {"input": text_of(10**6 + i), "request_id": f"j{i}"},
                                    timeout=3600, publish_retry_s=120, resubmit_after_s=150)
        self.answered += 1
        return i, reply


async def stream_count(js, stream: str) -> int:
    try:
        return (await js.stream_info(stream)).state.messages
    except Exception:  # no leader just now: ask again on the next look
        return -1


async def settle(soak: Soak, js) -> None:
    """Wait until every document has a result and every job an answer, failing only when
    nothing progressed for NO_PROGRESS_S: slow is not lost."""
    last, last_change = None, time.monotonic()
    shown = last_change
    while True:
        results = await stream_count(js, RESULTS)
        jobs_left = sum(not t.done() for t in soak.jobs)
        if results >= soak.docs and jobs_left == 0:
            return
        now = (results, soak.answered)
        if now != last:
            last, last_change = now, time.monotonic()
        if time.monotonic() - shown >= 30:
            soak.progress(f"settling, {results} results stored")
            shown = time.monotonic()
        assert time.monotonic() - last_change < NO_PROGRESS_S, (
            f"nothing answered for {NO_PROGRESS_S} s: {results} of {soak.docs} results, "
            f"{jobs_left} jobs unanswered "
            f"({[f'j{i}' for i, t in enumerate(soak.jobs) if not t.done()][:10]}); faults "
            f"(victim, seconds to restart): {soak.faults}")
        await asyncio.sleep(1.0)


async def retried(call, what: str, timeout: float = 120.0):
    """A JetStream API call made right after the faults: a node that was just restarted may
    still be catching up, and a call can time out meanwhile; tried again until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} failed for {timeout} s: {exc!r}") from exc
            await asyncio.sleep(1.0)


async def read_results(js) -> list[tuple[dict, dict]]:
    """Every message of the results stream, as many as its state says it holds: a fetch that
    times out on a loaded machine is tried again, bounded on progress."""
    count = (await retried(lambda: js.stream_info(RESULTS), "the results stream's info")).state.messages
    psub = await retried(lambda: js.pull_subscribe("soak.out.>", stream=RESULTS),
                         "a consumer on the results stream")
    out, since = [], time.monotonic()
    while len(out) < count:
        try:
            msgs = await psub.fetch(min(256, count - len(out)), timeout=5)
        except asyncio.TimeoutError:  # nats.errors.TimeoutError is one
            assert time.monotonic() - since < NO_PROGRESS_S, f"read {len(out)} of {count} results"
            continue
        except ServiceUnavailableError:
            # Status 503 on the fetch: the results stream has no leader for a moment right
            # after the faults (a CI run met it once the soak had settled). Answered at once,
            # so the next fetch waits for the stream to answer its info (its leader's reply)
            # instead; bounded on progress like a timeout.
            assert time.monotonic() - since < NO_PROGRESS_S, f"read {len(out)} of {count} results"
            await retried(lambda: js.stream_info(RESULTS), "the results stream's info")
            continue
        since = time.monotonic()
        for m in msgs:
            out.append((decode(m.data)[0], dict(m.headers or {})))
            await m.ack()
    return out


async def test_a_cluster_and_two_workers_under_random_kills_lose_nothing(minilm, prefix, tmp_path, soak_seed, request):
    from sentence_transformers import SentenceTransformer

    minutes = request.config.getoption("--soak-minutes") or SHORT_MINUTES
    duration = minutes * 60
    schedule = fault_schedule(soak_seed, duration)
    with NatsCluster() as cluster:
        urls = cluster.urls
        nc = await nats.connect(servers=[urls["C"], urls["A"], urls["B"]], dont_randomize=True,
                                max_reconnect_attempts=-1)
        js = nc.jetstream()
        soak = Soak(cluster, prefix, tmp_path)
        try:
            await wait_for_jetstream(js)
            window = duration + 600  # a redelivery's result is de-duplicated however late
            await js.add_stream(StreamConfig(name=DOCS, subjects=["soak.in.>"], num_replicas=3,
                                             duplicate_window=window))
            await js.add_stream(StreamConfig(name=RESULTS, subjects=["soak.out.>"],
                                             num_replicas=3, duplicate_window=window))
            await asyncio.gather(soak.start_worker("w0"), soak.start_worker("w1"))
            client = PoolingClient(nc, prefix=prefix, timeout=3600)
            started = time.monotonic()
            until = started + duration
            await asyncio.gather(soak.inject(schedule, until), soak.publish_docs(js, until),
                                 soak.submit_jobs(client, until))
            loaded = time.monotonic()
            await settle(soak, js)
            settled = time.monotonic()
            results = await read_results(js)
            job_errors = [t.exception() for t in soak.jobs if t.exception()]
            jobs = [t.result() for t in soak.jobs if not t.exception()]
            dead = (await retried(lambda: js.stream_info(stream_name("DEAD", prefix)),
                                  "the dead-letter stream's info")).state.messages
            alive = {name: w.proc.returncode is None for name, w in soak.workers.items()}
        finally:
            await nc.close()
            await asyncio.gather(*(w.close() for w in soak.workers.values()))
            for t in soak.jobs:
                t.cancel()

    by_doc: dict[str, list[dict]] = {}
    for frame, _ in results:
        by_doc.setdefault(frame.get("doc_id"), []).append(frame)
    errors = [f for f in (f for fs in by_doc.values() for f in fs) if "error" in f]
    expected = {f"d{i}" for i in range(soak.docs)}
    missing = sorted(expected - by_doc.keys())
    duplicated = sorted(d for d, fs in by_doc.items() if len(fs) > 1)
    st = SentenceTransformer(str(minilm.path), device="cpu")
    good = sorted((int(d[1:]), fs[0]) for d, fs in by_doc.items()
                  if d in expected and "error" not in fs[0])
    want_docs = st.encode([text_of(i) for i, _ in good], normalize_embeddings=True, batch_size=64)
    got_docs = np.array([f["data"][0]["data"] for _, f in good], dtype=np.float32)
    want_jobs = st.encode([text_of(10**6 + i) for i, _ in jobs], normalize_embeddings=True,
                          batch_size=64)
    got_jobs = np.array([r["data"][0]["data"] for _, r in jobs], dtype=np.float32)
    logs = "".join(w.log_tail(10**9) for w in soak.started)
    doc_diff = float(np.abs(got_docs - want_docs).max()) if good else 0.0
    job_diff = float(np.abs(got_jobs - want_jobs).max()) if jobs else 0.0
    figures = dict(
        seed=soak_seed, minutes=minutes, faults=len(soak.faults),
        node_kills=sum(v in "ABC" for v, _ in soak.faults),
        worker_kills=sum(v.startswith("w") for v, _ in soak.faults),
        documents=soak.docs, results=len(results), jobs=len(soak.jobs),
        jobs_failed=len(job_errors), dead_lettered=dead,
        error_results=len(errors), missing=len(missing), duplicated=len(duplicated),
        publish_stalls_over_1s=len(soak.stalls), longest_stall_s=max(soak.stalls, default=0),
        job_publish_retries=client.publish_retries,
        job_duplicates_dropped=client.duplicates_dropped,
        # Jobs published again after 150 s without an answer: each is an answer lost on its
        # way to this client (or a job lost by the workers, which this cannot tell apart).
        jobs_resubmitted=client.resubmitted,
        # What the workers met and retried in place (each a delivery the old accounting burned).
        result_stores_retried=logs.count("could not store the result"),
        dead_letters_retried=logs.count("could not dead-letter"),
        answers_naked_after_60s=logs.count("could not store the answer"),
        max_abs_diff_vs_sentence_transformers=max(doc_diff, job_diff),
        settle_s=round(settled - loaded, 1), workers_alive=alive, faults_log=soak.faults)
    print("SOAK " + json.dumps(figures))
    assert not errors, [f["error"] for f in errors[:3]]
    assert not missing and not duplicated, (missing[:10], duplicated[:10])
    assert dead == 0
    assert not job_errors, job_errors[:3]
    assert all(alive.values()) and len(alive) == 2, alive
    assert doc_diff <= 1e-5 and job_diff <= 1e-5, (doc_diff, job_diff)
