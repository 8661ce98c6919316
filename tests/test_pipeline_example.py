"""examples/pipeline run for real: documents published to a stream, embedded by two workers,
one SIGKILLed mid-way, results kept in a results stream (exactly one per
document), and the example's nearest-neighbour service answering over them."""

import asyncio
import collections
import json
import sys
import time
from pathlib import Path

import nats
import pytest

from tests.procs import WorkerProcess, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(240)]

LOOP = Path(__file__).resolve().parent.parent / "examples" / "pipeline" / "loop.py"
DOCS = 120
PIPELINE = dict(pipeline_stream="DOCS", pipeline_input="docs.in", pipeline_output="docs.embedded",
                pipeline_id_field="id", durable_ack_wait_s=1.0)


async def example(url: str, prefix: str, *args: str, timeout: float = 60.0) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(LOOP), "--nats-url", url, "--prefix", prefix, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=worker_env())
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, out.decode()
    return out.decode()


def cli_options(settings: dict) -> list[str]:
    return [part for key, value in settings.items()
            for part in (f"--{key.replace('_', '-')}", str(value))]


async def wait_for_stored(js, stream: str, count: int, timeout: float) -> None:
    """Polls the results stream's count (no event says a message was stored), a short pause
    between looks, bounded by the deadline."""
    deadline = time.monotonic() + timeout
    while (await js.stream_info(stream)).state.messages < count:
        assert time.monotonic() < deadline, f"{stream} did not reach {count} results"
        await asyncio.sleep(0.1)


async def test_the_pipeline_example_keeps_one_result_per_document_through_a_worker_kill(
        nats_server, prefix, tmp_path):
    """Two pipeline workers (subprocesses: a worker in the test's own process shares its event
    loop with the Triton interpreter and answered too late under load); one is SIGKILLed after
    a third of the results, the other carries on with what the killed one held."""
    url = nats_server.url
    await example(url, prefix, "setup")
    nc = await nats.connect(url)
    published = await nc.subscribe("docs.embedded.>")  # every publish, repeats included
    workers = [WorkerProcess(url, prefix, *cli_options(PIPELINE), log_dir=tmp_path)
               for _ in range(2)]
    nearest = None
    try:
        await asyncio.gather(*(w.start() for w in workers))
        await example(url, prefix, "publish", "--count", str(DOCS))
        for _ in range(DOCS // 3):
            await published.next_msg(timeout=60)
        workers[0].kill()
        killed = time.monotonic()
        js = nc.jetstream()
        await wait_for_stored(js, "RESULTS", DOCS, timeout=120)
        recovered_s = time.monotonic() - killed
        nearest = await asyncio.create_subprocess_exec(
            sys.executable, str(LOOP), "--nats-url", url, "--prefix", prefix, "nearest",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=worker_env())
        assert b"answering" in await asyncio.wait_for(nearest.stdout.readline(), 60)
        answer = json.loads(await example(url, prefix, "query", "Note 7 is about electric cars."))
        stored = await js.pull_subscribe("docs.embedded.>", stream="RESULTS")
        results = []
        while len(results) < DOCS + 10:  # read past the end: a duplicate would show up
            try:
                results += await stored.fetch(DOCS, timeout=2)
            except asyncio.TimeoutError:  # nats-py raises either its own or asyncio's
                break
        per_doc = collections.Counter(json.loads(m.data)["doc_id"] for m in results)  # JSON in, JSON out
        print(json.dumps({"test": "pipeline_example", "documents": DOCS,
                          "results_stored": len(results),
                          "results_published": published.pending_msgs + DOCS // 3,
                          "all_stored_s_after_kill": round(recovered_s, 2)}))
        assert per_doc == {f"doc-{i}": 1 for i in range(DOCS)}
        first = results[0]
        assert first.headers["Pooling-Source-Stream"] == "DOCS"
        assert first.headers["Nats-Msg-Id"] == f"DOCS:{first.headers['Pooling-Source-Seq']}"
        assert answer["indexed"] == DOCS
        assert answer["neighbours"][0]["doc_id"] == "doc-7"
        assert answer["neighbours"][0]["score"] > 0.99
    finally:
        if nearest is not None and nearest.returncode is None:
            nearest.kill()
            await nearest.wait()
        await asyncio.gather(*(w.close() for w in workers))
        await nc.close()
