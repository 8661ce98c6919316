"""The engine's hot path around the model (issue: the service's own cost): texts tokenized in
a thread beside the mailbox, in one batch call for the jobs queued together, with every job
answered whatever that thread does; a burst's first job computed with the rest of it; and the
batching wait, which ends once nothing more is on its way."""

import asyncio
import gc

import msgpack
import numpy as np
import pytest

from poolwire.actors.batch_planner import QueuedItem
from poolwire.actors.engine import EngineActor, EngineLimits
from poolwire.actors.messages import Job
from poolwire.models.tokenizing import Tokenizing
from poolwire.schemas.codec import WireFormat
from poolwire.schemas.requests import parse_request
from poolwire.schemas.tasks import Task

pytestmark = pytest.mark.timeout(180)

TEXTS = [f"text number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(12)]


async def _embed_all(nc, prefix):
    """20 requests of 3 texts in flight at once, and one lone one-text request."""
    bodies = [msgpack.packb({"input": TEXTS[i % 10:i % 10 + 3], "request_id": f"r{i}"})
              for i in range(20)]
    replies = await asyncio.gather(*(nc.request(f"{prefix}.embed", b, timeout=60) for b in bodies))
    lone = await nc.request(f"{prefix}.embed", msgpack.packb({"input": TEXTS[0]}), timeout=60)
    return [msgpack.unpackb(r.data) for r in replies] + [msgpack.unpackb(lone.data)]


def _count_batch_calls(monkeypatch) -> list[int]:
    """The tokenize thread's batch calls from now on, as the number of texts each encoded."""
    calls = []
    real = Tokenizing.encode_ahead

    def counted(self, triples):
        calls.append(len(triples))
        return real(self, triples)

    monkeypatch.setattr(Tokenizing, "encode_ahead", counted)
    return calls


def _vectors(frames):
    return [np.array([d["data"] for d in f["data"]], dtype=np.float32) for f in frames]


async def test_jobs_tokenized_beside_the_mailbox_are_answered_as_if_planned_alone(
        minilm, start_worker, nc, prefix, monkeypatch):
    """Several texts a request go through the tokenize thread's batch call, and a text's vector
    does not depend on the request or batch that carried it. Then the same with that thread
    failing on every call: each job is tokenized as it is planned instead (the path a lone
    request takes), and answered with the same vectors, no failure counted."""
    calls = _count_batch_calls(monkeypatch)
    async with start_worker(minilm) as worker:
        first = await _embed_all(nc, prefix)
        assert worker.engine.failures == 0
    assert calls and sum(calls) >= 60  # every text of the 3-text requests went through it
    assert [f["request_id"] for f in first[:20]] == [f"r{i}" for i in range(20)]

    def broken(self, triples):
        raise RuntimeError("the tokenize thread broke")

    monkeypatch.setattr(Tokenizing, "encode_ahead", broken)
    async with start_worker(minilm) as worker:
        second = await _embed_all(nc, prefix)
        assert worker.engine.failures == 0
    for a, b in zip(_vectors(first), _vectors(second)):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5
    # A text's vector does not depend on which request or batch carried it.
    seen = {}
    for frame, vecs in zip(first[:20], _vectors(first[:20])):
        i = int(frame["request_id"][1:])
        for text, vec in zip(TEXTS[i % 10:i % 10 + 3], vecs):
            if text in seen:
                assert np.abs(seen[text] - vec).max() < 1e-5
            seen[text] = vec


class _Replier:
    max_payload = 1 << 20


async def test_the_batching_wait_lasts_only_while_more_is_on_its_way(minilm):
    """Dense arrivals and a long max_wait_ms: the engine waits for more work while requests
    are still upstream (the ingest's and validator's backlogs), and plans the batch once none
    are, instead of idling the model for the rest of the wait."""
    engine = EngineActor(minilm, _Replier(), EngineLimits(max_wait_ms=60_000))
    try:
        upstream = [3]
        engine.upstream = lambda: upstream[0]
        engine._arrival_gap_s = 1e-4  # arrivals are dense: the wait applies
        engine._planner.add(QueuedItem(tokens=5, priority=0, deadline=None, group="hidden",
                                       payload=None))
        waiting = asyncio.create_task(engine._wait_for_batch())
        for _ in range(3):  # wakes (an arrival, a forward pass ending) while three are coming
            engine._wake.set()
            for _ in range(10):
                await asyncio.sleep(0)  # a turn of the loop, not a wait
            assert not waiting.done()
        upstream[0] = 0
        engine._wake.set()  # what their arrival (or any other wake) does
        await asyncio.wait_for(waiting, 5)  # not the 60 s of max_wait_ms
    finally:
        await engine.close()


async def _lone_vector(nc, prefix, text):
    reply = msgpack.unpackb((await nc.request(f"{prefix}.embed", msgpack.packb({"input": text}),
                                              timeout=60)).data)
    return np.array(reply["data"][0]["data"], dtype=np.float32)


async def test_a_quick_batch_of_an_idle_engine_is_computed_on_the_loop(
        minilm, start_worker, nc, prefix, monkeypatch):
    """Where the backend knows a batch to take well under a millisecond alone (OpenVINO's
    one-thread twin) and nothing else waits, the event loop computes it instead of handing it
    to the forward thread: the same vectors; a lone request whose time is unknown (torch) or
    too long still goes to the thread; requests in flight together are all answered; and a
    batch that fails on the loop is answered with an error, the worker carrying on."""
    import threading

    from poolwire.actors import engine as engine_module
    from poolwire.actors.batch_planner import LOOP_BATCH_S
    from poolwire.models.backend import TorchBackend

    threads = []
    real_run = TorchBackend.run

    def run(self, *args):
        threads.append(threading.current_thread().name)
        return real_run(self, *args)

    monkeypatch.setattr(TorchBackend, "run", run)
    known = {"seconds": None}
    monkeypatch.setattr(TorchBackend, "seconds_alone", lambda self, forward, tokens:
                        known["seconds"])
    async with start_worker(minilm, backend="torch") as worker:
        threaded = await _lone_vector(nc, prefix, TEXTS[0])
        assert threads[-1].startswith("poolwire-forward"), "unknown time: the forward thread"
        known["seconds"] = LOOP_BATCH_S * 2
        await _lone_vector(nc, prefix, TEXTS[0])
        assert threads[-1].startswith("poolwire-forward"), "too long: the forward thread"

        known["seconds"] = LOOP_BATCH_S / 10
        on_loop = await _lone_vector(nc, prefix, TEXTS[0])
        assert threads[-1] == threading.current_thread().name, "quick and idle: the loop"
        assert np.array_equal(on_loop, threaded)
        together = await _embed_all(nc, prefix)
        assert [f["request_id"] for f in together[:20]] == [f"r{i}" for i in range(20)]
        assert all(len(f["data"]) == 3 for f in together[:20])

        real_batch = engine_module.run_batch

        def broken(*args):
            raise RuntimeError("the batch broke on the loop")

        monkeypatch.setattr(engine_module, "run_batch", broken)
        failed = msgpack.unpackb((await nc.request(f"{prefix}.embed", msgpack.packb(
            {"input": TEXTS[1], "request_id": "broken"}), timeout=60)).data)
        assert failed["request_id"] == "broken" and failed["error"]["code"] == "internal"
        assert "the batch broke on the loop" in failed["error"]["message"]
        monkeypatch.setattr(engine_module, "run_batch", real_batch)
        assert np.array_equal(await _lone_vector(nc, prefix, TEXTS[0]), threaded)
        assert worker.engine.failures == 0  # answered as its batch's failure, not a crash


async def test_an_answered_request_is_freed_with_its_reply_not_by_the_collector(
        minilm, start_worker, nc, prefix):
    """Nothing of an answered request waits for a garbage collection: with the collector off,
    no InFlight is left once every reply is in, neither of the requests that went through the
    tokenize thread and the forward thread nor of the lone one. A flight's queued items point
    back at it, and that cycle kept each request's job, plan and sequences alive until a
    collection (0.06 to 0.07 ms a text at 64 requests in flight: bench/service_cost.py's GC
    column)."""
    from poolwire.actors.engine import InFlight

    gc.collect()
    gc.disable()
    try:
        async with start_worker(minilm) as worker:
            replies = await _embed_all(nc, prefix)
            assert all("error" not in r for r in replies) and len(replies) == 21
            assert not worker.engine._inflight
            left = [o for o in gc.get_objects() if isinstance(o, InFlight)]
            assert left == [], f"{len(left)} answered requests wait for the collector"
    finally:
        gc.enable()


class _Recorder(_Replier):
    """A replier that keeps what the engine sends, and says when `expected` replies came."""

    def __init__(self, expected: int) -> None:
        self.bodies, self.errors = [], []
        self._expected = expected
        self.all_in = asyncio.Event()

    def _count(self) -> None:
        if len(self.bodies) + len(self.errors) >= self._expected:
            self.all_in.set()

    async def send(self, subject, body, headers=None) -> None:
        self.bodies.append(msgpack.unpackb(body))
        self._count()

    async def send_error(self, subject, request_id, error, fmt, headers=None) -> None:
        self.errors.append(error)
        self._count()


def _one_text_job(i: int) -> Job:
    request = parse_request(Task.EMBED, {"input": TEXTS[i], "request_id": f"r{i}"})
    return Job(request=request, task=Task.EMBED, reply=f"_INBOX.{i}", fmt=WireFormat.MSGPACK,
               request_id=f"r{i}", received_at=0.0)


@pytest.mark.parametrize("burst", [8, 1])
async def test_the_first_job_of_a_burst_waits_for_the_rest_of_it(minilm, monkeypatch, burst):
    """A burst of one-text requests reaching an idle engine (all its jobs in the mailbox) is
    tokenized in one batch call and computed in one forward pass: its first job finds the
    engine idle but the others right behind it, and joins them instead of running a pass of
    its own ahead of them (which every burst paid at 64 requests in flight:
    bench/service_cost.py). A job that is alone is still planned at once, without the round
    trip through the tokenize thread."""
    calls = _count_batch_calls(monkeypatch)
    replier = _Recorder(burst)
    engine = EngineActor(minilm, replier, EngineLimits())
    for i in range(burst):
        engine.tell(_one_text_job(i))
    running = [asyncio.create_task(engine.run()), asyncio.create_task(engine.batch_loop())]
    try:
        await asyncio.wait_for(replier.all_in.wait(), 60)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await engine.close()
    assert replier.errors == []
    assert sorted(b["request_id"] for b in replier.bodies) == [f"r{i}" for i in range(burst)]
    assert engine.stats.batches == 1
    assert calls == ([burst] if burst > 1 else [])
