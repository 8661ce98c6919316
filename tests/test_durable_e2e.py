"""Durable jobs in one process against the session's nats-server (PROTOCOL.md "Durable mode"):
answered on Pooling-Reply-To then acked, malformed jobs terminated, jobs kept while no worker
runs, poison jobs dead-lettered after the stated deliveries, an operator's stream."""

import asyncio
import dataclasses
import json
import subprocess
import sys
import time

import msgpack
import nats
import pytest
from nats.js.api import RetentionPolicy, StreamConfig

import poolwire.actors.engine
from poolwire.actors.durable import stream_name
from poolwire.actors.worker import Worker
from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.settings import WorkerSettings
from tests.helpers import poll_until

pytestmark = [pytest.mark.timeout(120)]

DURABLE = dict(durable=True, durable_ack_wait_s=1.0)


async def stream_messages(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages




async def test_a_job_is_answered_on_its_reply_subject_then_acked(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, **DURABLE) as worker:
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.submit("embed", {"input": ["hello", "world"], "request_id": "job-1"})
        assert reply["request_id"] == "job-1" and len(reply["data"]) == 2
        assert len(reply["data"][0]["data"]) == 384
        # A JSON job published by hand, as any JetStream client would, gets a JSON reply.
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        js = nc.jetstream()
        await js.publish(f"{prefix}.jobs.embed", b'{"input": "by hand"}',
                         headers={"Pooling-Reply-To": inbox, "Nats-Msg-Id": "by-hand-1"})
        frame = json.loads((await sub.next_msg(timeout=10)).data)
        assert frame["request_id"] == "by-hand-1" and len(frame["data"]) == 1
        stream = stream_name("JOBS", prefix)
        await poll_until(lambda: _empty(js, stream, "poolwire_poolwire"))
        stats = worker.discovery.response("STATS")["endpoints"][0]["data"]["durable"]
        assert stats["completed"] == 2 and stats["in_progress"] == 0
        assert stats["dead_lettered"] == 0 and stats["redelivered"] == 0


async def test_an_answer_lost_on_its_way_is_got_by_resubmitting(minilm, start_worker, nc, prefix):
    """A durable job's answer goes to the client's inbox by core NATS, at most once; here the
    first answer is lost on its way (as it is when the client is between servers), the worker
    has acked the job, and only resubmit_after_s gets an answer: the job published again under
    a new Nats-Msg-Id, computed again, its late repeat dropped by request_id."""
    async with start_worker(minilm, **DURABLE):
        client = PoolingClient(nc, prefix=prefix)
        deliver = client._on_job_frame
        lost = []

        async def losing_the_first(msg):
            if not lost:
                lost.append(msg)  # never reaches the client
                return
            await deliver(msg)

        client._on_job_frame = losing_the_first
        await client._ensure_jobs_inbox()
        with pytest.raises(asyncio.TimeoutError):  # without resubmitting: waits in vain
            await client.submit("embed", {"input": "lost once", "request_id": "lost-1"},
                                timeout=3)
        assert len(lost) == 1 and client.resubmitted == 0
        lost.clear()
        reply = await client.submit("embed", {"input": "lost once", "request_id": "lost-2"},
                                    timeout=30, resubmit_after_s=2)
        assert reply["request_id"] == "lost-2" and len(reply["data"][0]["data"]) == 384
        assert len(lost) == 1 and client.resubmitted == 1


async def _empty(js, stream: str, consumer: str) -> bool:
    info = await js.consumer_info(stream, consumer)
    return info.num_ack_pending == 0 and info.num_pending == 0 and \
        await stream_messages(js, stream) == 0


async def test_a_malformed_job_is_answered_with_its_error_and_terminated(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, **DURABLE) as worker:
        js = nc.jetstream()
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await js.publish(f"{prefix}.jobs.embed", b"\xc1 not msgpack",
                         headers={"Pooling-Reply-To": inbox, "Nats-Msg-Id": "bad-1"})
        frame = msgpack.unpackb((await sub.next_msg(timeout=10)).data)
        assert frame["request_id"] == "bad-1" and frame["error"]["code"] == "invalid_request"
        with pytest.raises(PoolingServiceError) as info:
            await PoolingClient(nc, prefix=prefix).submit("embed", {"input": "x", "dimensions": 0})
        assert info.value.code == "invalid_request"
        await poll_until(lambda: _empty(js, stream_name("JOBS", prefix), "poolwire_poolwire"))
        # Terminated, not left for redelivery: nothing more arrives after ack_wait.
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=2 * DURABLE["durable_ack_wait_s"])
        assert worker.intakes[0].redelivered == 0


async def test_a_job_whose_reply_subject_cannot_be_published_to_is_terminated_and_holds_none_up(
        minilm, start_worker, nc, prefix):
    """A Pooling-Reply-To with a space (or a wildcard) can never get a reply: such a job is
    refused before any work and terminated, and the valid jobs fetched with it are answered
    (an audit saw it computed on every delivery, and its failed reply end the pull loop)."""
    async with start_worker(minilm, **DURABLE) as worker:
        js = nc.jetstream()
        inboxes = [nc.new_inbox() for _ in range(3)]
        subs = [await nc.subscribe(inbox) for inbox in inboxes]
        await js.publish(f"{prefix}.jobs.embed", b"\xc1garbage",
                         headers={"Pooling-Reply-To": "audit.bad subject"})
        await js.publish(f"{prefix}.jobs.embed", msgpack.packb({"input": "x"}),
                         headers={"Pooling-Reply-To": "audit.w.*"})
        for i, inbox in enumerate(inboxes):
            await js.publish(f"{prefix}.jobs.embed", msgpack.packb({"input": f"good {i}"}),
                             headers={"Pooling-Reply-To": inbox})
        for sub in subs:
            assert len(msgpack.unpackb((await sub.next_msg(timeout=10)).data)["data"]) == 1
        await poll_until(lambda: _empty(js, stream_name("JOBS", prefix), "poolwire_poolwire"))
        # A sleep, not a wait on an event: what is checked is that nothing happens (no
        # redelivery) for longer than ack_wait, after which JetStream would have redelivered.
        await asyncio.sleep(2 * DURABLE["durable_ack_wait_s"])
        assert worker.intakes[0].redelivered == 0 and worker.supervisor.restarts == {}


async def test_a_request_naming_a_job_s_internal_subject_cannot_take_its_answer(
        minilm, start_worker, nc, prefix):
    """A job's frames go to the worker's intake through an internal subject; an audit took a
    job's answer by sending requests whose reply subject named such subjects while the job was
    computed (they were numbered). Each job's answer reaches its own Pooling-Reply-To."""
    async with start_worker(minilm, **DURABLE) as worker:
        js = nc.jetstream()
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        texts = [f"text {i} " + "many words in a long sentence " * 30 for i in range(120)]
        await js.publish(f"{prefix}.jobs.embed", msgpack.packb({"request_id": "job-A",
                                                                 "input": texts}),
                         headers={"Pooling-Reply-To": inbox, "Nats-Msg-Id": "job-A"})
        # The intruders come while the job is in flight (its internal subject routed).
        await poll_until(lambda: asyncio.sleep(0, worker.intakes[0].held == 1))
        for k in range(40):
            await nc.publish(f"{prefix}.embed", msgpack.packb({"request_id": f"intruder-{k}",
                                                               "input": "hijack",
                                                               "priority": -10}),
                             reply=f"_POOLWIRE.durable.{k}")
        frame = msgpack.unpackb((await sub.next_msg(timeout=60)).data)
        assert frame["request_id"] == "job-A" and len(frame["data"]) == 120


async def test_jobs_published_while_no_worker_runs_are_answered_once_one_starts(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, **DURABLE):
        pass  # a worker ran once: the jobs stream exists; now none runs
    js = nc.jetstream()
    client = PoolingClient(nc, prefix=prefix)
    jobs = [asyncio.create_task(client.submit("embed", {"input": f"kept {i}"}, timeout=60))
            for i in range(50)]
    await poll_until(lambda: _count_is(js, stream_name("JOBS", prefix), 50))
    assert not any(job.done() for job in jobs)
    started = time.monotonic()
    async with start_worker(minilm, **DURABLE):
        replies = await asyncio.gather(*jobs)
        print(json.dumps({"test": "no_worker_running", "jobs": 50, "answered": len(replies),
                          "duplicates_before_dedup": client.duplicates_dropped,
                          "all_answered_s_after_start": round(time.monotonic() - started, 2)}))
    assert sorted(r["request_id"] for r in replies) == sorted({r["request_id"] for r in replies})
    assert len(replies) == 50 and client.duplicates_dropped == 0


async def test_a_drain_hands_back_what_the_server_delivered_after_the_last_fetch(minilm, start_worker, nc, prefix):
    """A pull request outlives the fetch that sent it (a fetch returns early with part of its
    batch, or past its deadline on a stalled event loop), and what the server delivers for it
    waits in the subscription's queue for the next fetch. A drain has no next fetch: those
    messages must be handed back (naked) before unsubscribing, not dropped to wait out
    ack_wait. Here the intake stops pulling (no room), and a pull request sent on its own inbox
    puts 3 jobs in that queue, as a late batch would. The jobs' own timeout (30 s) is below
    ack_wait (60 s): a dropped job is not back in time."""
    js = nc.jetstream()
    client = PoolingClient(nc, prefix=prefix)
    async with start_worker(minilm, durable=True, durable_ack_wait_s=60.0) as worker:
        [intake] = worker.intakes
        intake.limits = dataclasses.replace(intake.limits, capacity=0)  # pull_size is 0 now
        await poll_until(lambda: _no_pull_waiting(js, intake))  # its last fetch expired
        jobs = [asyncio.create_task(client.submit("embed", {"input": f"late {i}"}, timeout=30))
                for i in range(3)]
        await poll_until(lambda: _count_is(js, intake.stream, 3))
        # The intake's own inbox (nats-py keeps it private), as the lingering request of a
        # fetch would have it.
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{intake.stream}.{intake.durable}",
                         json.dumps({"batch": 3}).encode(), reply=intake._psub._deliver)
        await nc.flush()
        # (with the 408 that ended its last pull request, when that came after the fetch)
        await poll_until(lambda: _async(intake._psub.pending_msgs >= 3))
    assert intake.released == 3 and intake.completed == 0
    async with start_worker(minilm, durable=True, durable_ack_wait_s=60.0) as second:
        replies = await asyncio.gather(*jobs)
        [again] = second.intakes
        assert again.redelivered == 3 and again.completed == 3
    assert sorted(len(r["data"]) for r in replies) == [1, 1, 1]


async def _async(value):
    return value


async def _no_pull_waiting(js, intake) -> bool:
    return (await js.consumer_info(intake.stream, intake.durable)).num_waiting == 0


async def _count_is(js, stream: str, n: int) -> bool:
    return await stream_messages(js, stream) == n


@pytest.mark.chaos
async def test_a_poison_job_is_dead_lettered_after_the_stated_deliveries(minilm, start_worker, nc, prefix, monkeypatch):
    """The poison makes the forward pass raise on every delivery (patched in this in-process
    worker, as a device fault on that input would); the jobs batched with it the first time
    are computed alone when delivered again, and flow on."""
    poison_ids = minilm.tokenizer("poisonous xylophone")["input_ids"]
    real = poolwire.actors.engine.run_batch
    poison_runs = []

    def failing_on_poison(backend, seqs, specs):
        if any(list(seq.ids) == poison_ids for seq in seqs):
            poison_runs.append(len(seqs))
            raise RuntimeError("simulated device fault on this input")
        return real(backend, seqs, specs)

    monkeypatch.setattr(poolwire.actors.engine, "run_batch", failing_on_poison)
    async with start_worker(minilm, durable_max_deliveries=3, **DURABLE) as worker:
        errors_before = worker.discovery.response("STATS")["endpoints"][0]["num_errors"]
        client = PoolingClient(nc, prefix=prefix)
        started = time.monotonic()
        results = await asyncio.gather(
            client.submit("embed", {"input": "poisonous xylophone", "request_id": "poison-1"}),
            *(client.submit("embed", {"input": f"good {i}"}) for i in range(20)),
            return_exceptions=True)
        poison, good = results[0], results[1:]
        print(json.dumps({"test": "poison", "jobs": 21, "dead_lettered": worker.intakes[0].dead_lettered,
                          "poison_forward_runs": len(poison_runs),
                          "others_answered": sum(isinstance(r, dict) for r in good),
                          "all_settled_s": round(time.monotonic() - started, 2)}))
        assert isinstance(poison, PoolingServiceError) and poison.code == "internal"
        assert "simulated device fault" in poison.error["message"]
        assert all(len(r["data"]) == 1 for r in good), good
        assert len(poison_runs) == 3
        js = nc.jetstream()
        dead = await js.pull_subscribe(f"{prefix}.dead.embed", stream=stream_name("DEAD", prefix))
        [msg] = await dead.fetch(1, timeout=5)
        record = msgpack.unpackb(msg.data)
        assert record["request_id"] == "poison-1" and record["task"] == "embed"
        assert record["deliveries"] == 3 and record["error"]["code"] == "internal"
        assert msgpack.unpackb(record["job"])["input"] == "poisonous xylophone"
        # Deduplicated by its own place in the jobs stream, the job's id kept beside it: a
        # second job reusing an id must not have its dead letter dropped as a duplicate.
        assert msg.headers["Pooling-Job-Msg-Id"] == "poison-1" and "Pooling-Reply-To" in msg.headers
        assert msg.headers["Nats-Msg-Id"].startswith(f"dead:{stream_name('JOBS', prefix)}:")
        assert worker.intakes[0].counters()["dead_lettered"] == 1
        await poll_until(lambda: _empty(js, stream_name("JOBS", prefix), "poolwire_poolwire"))
        # Counted once: the error frame the poison's client got. Its retried deliveries, and
        # the jobs that failed beside it and were delivered again, answered no error.
        stats = worker.discovery.response("STATS")["endpoints"][0]
        assert stats["num_errors"] - errors_before == 1
        assert "simulated device fault" in stats["last_error"], stats
        assert worker.metrics.registry.get_sample_value(
            "poolwire_errors_total", {"code": "internal"}) == 1


async def test_an_operators_jobs_stream_is_used_as_it_is(minilm, start_worker, nc, prefix):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="OPERATORS_JOBS", subjects=[f"{prefix}.jobs.>"],
                                     retention=RetentionPolicy.WORK_QUEUE, max_age=3600,
                                     description="made by an operator"))
    async with start_worker(minilm, **DURABLE):
        reply = await PoolingClient(nc, prefix=prefix).submit("embed", {"input": "hi"})
    assert len(reply["data"]) == 1
    info = await js.stream_info("OPERATORS_JOBS")
    assert info.config.description == "made by an operator" and info.config.max_age == 3600
    names = await js.streams_info()
    assert stream_name("JOBS", prefix) not in {s.config.name for s in names}


async def test_the_submit_command_prints_the_reply_as_json(minilm, start_worker, nats_server, prefix):
    async with start_worker(minilm, **DURABLE):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "submit", "embed", "hello", "world",
            "--nats-url", nats_server.url, "--prefix", prefix,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert len(json.loads(out)["data"]) == 2


async def test_work_longer_than_ack_wait_is_kept_by_in_progress_acks(minilm, start_worker, nc, prefix, monkeypatch):
    """The forward pass takes 2.5 ack_waits here (a slow model): without in-progress acks the
    job would be delivered again and answered twice."""
    real = poolwire.actors.engine.run_batch

    def slow(backend, seqs, specs):
        time.sleep(2.5 * DURABLE["durable_ack_wait_s"])  # the forward thread, not the test, waits
        return real(backend, seqs, specs)

    monkeypatch.setattr(poolwire.actors.engine, "run_batch", slow)
    async with start_worker(minilm, **DURABLE) as worker:
        client = PoolingClient(nc, prefix=prefix)
        reply = await client.submit("embed", {"input": "slow work"})
        assert len(reply["data"]) == 1
        assert worker.intakes[0].redelivered == 0 and client.duplicates_dropped == 0
        # The same Nats-Msg-Id again is not stored again (the jobs stream de-duplicates).
        ack = await nc.jetstream().publish(f"{prefix}.jobs.embed", b'{"input": "x"}',
                                           headers={"Nats-Msg-Id": reply["request_id"]})
        assert ack.duplicate


async def test_a_pipeline_answers_msgpack_documents_and_names_a_missing_field(minilm, start_worker, nc, prefix):
    js = nc.jetstream()
    root = prefix.replace(".", "_")
    await js.add_stream(StreamConfig(name=f"{root}_DOCS", subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    results = await nc.subscribe(f"{root}.out.>")
    await js.publish(f"{root}.in.a", msgpack.packb({"body": ["one", "two"], "key": 7}))
    await js.publish(f"{root}.in.b", msgpack.packb({"text": "no body field", "key": 8}))
    async with start_worker(minilm, pipeline_stream=f"{root}_DOCS", pipeline_input=f"{root}.in",
                            pipeline_output=f"{root}.out", pipeline_text_field="body",
                            pipeline_id_field="key", **DURABLE):
        got = {}
        for _ in range(2):
            msg = await results.next_msg(timeout=20)
            got[msg.subject] = (msgpack.unpackb(msg.data), msg.headers)
    good, good_headers = got[f"{root}.out.a"]
    assert good["doc_id"] == 7 and len(good["data"]) == 2 and good["request_id"] == f"{root}_DOCS:1"
    assert good_headers["Pooling-Source-Stream"] == f"{root}_DOCS"
    assert good_headers["Pooling-Source-Seq"] == "1" and good_headers["Nats-Msg-Id"] == f"{root}_DOCS:1"
    bad, bad_headers = got[f"{root}.out.b"]
    assert bad["doc_id"] == 8 and bad["error"]["code"] == "invalid_request"
    assert "'body'" in bad["error"]["message"] and bad_headers["Nats-Service-Error-Code"] == "400"
    assert (await js.stream_info(f"{root}_OUT")).state.messages == 2


    async def acked() -> bool:  # the ack follows the stored result
        info = await js.consumer_info(f"{root}_DOCS", f"poolwire_pipeline_{root}_DOCS_poolwire")
        return info.num_ack_pending == 0 and info.num_pending == 0

    await poll_until(acked)


async def test_a_missing_pipeline_stream_is_named_at_start(minilm, nats_server, prefix):
    worker = Worker(WorkerSettings(prefix=prefix, pipeline_stream="NO_SUCH_STREAM",
                                   pipeline_input="nothing.in", pipeline_output="nothing.out"), minilm)
    try:
        with pytest.raises(RuntimeError, match="pipeline stream 'NO_SUCH_STREAM' does not exist"):
            await worker.start(nats_server.url)
    finally:
        await worker.stop()


async def test_a_second_queue_group_on_the_jobs_is_refused_at_once_naming_queue(minilm, start_worker, nats_server, prefix):
    """A real conflict is not waited on as an election is: the work-queue stream allows one
    consumer per subject, so a worker of the prefix in another queue group exits at start."""
    async with start_worker(minilm, **DURABLE):
        other = Worker(WorkerSettings(prefix=prefix, queue="others", **DURABLE), minilm)
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="must use the same --queue"):
            await other.start(nats_server.url)
        await other.stop()
        assert time.monotonic() - began < 30  # refused, not waited on for ELECTION_WAIT_S (120 s)


async def test_a_server_without_jetstream_is_named_at_once(minilm, prefix, tmp_path):
    from poolwire.actors.nats_server import NatsServer

    with NatsServer(store_dir=tmp_path / "nats", jetstream=False) as server:
        worker = Worker(WorkerSettings(prefix=prefix, **DURABLE), minilm)
        with pytest.raises(RuntimeError, match="need a NATS server with JetStream"):
            await worker.start(server.url)
        await worker.stop()


async def test_a_server_short_of_file_store_is_named_with_the_stream_and_plain_serving_goes_on(minilm, prefix, tmp_path, caplog):
    """docs/DURABLE.md "the room they reserve": a server whose JetStream file store cannot hold
    the dead-letter stream's 256 MiB, nor the events stream's 64, refuses them (10047): a
    durable worker exits naming the stream and the fix, and a worker without --durable serves,
    saying its events are not kept."""
    from poolwire.actors.nats_server import NatsServer

    conf = tmp_path / "nats.conf"
    conf.write_text(f'jetstream {{ store_dir: "{tmp_path / "js"}", max_file_store: 48MB }}\n')
    with NatsServer(store_dir=tmp_path / "nats", config=conf, jetstream=False) as server:
        durable = Worker(WorkerSettings(prefix=prefix, **DURABLE), minilm)
        with pytest.raises(RuntimeError, match=r"could not create stream POOLWIRE_DEAD_\S+ .*"
                                               r"insufficient storage.*JetStream limits"):
            await durable.start(server.url)
        await durable.stop()
        plain = Worker(WorkerSettings(prefix=prefix + "2"), minilm)
        await plain.start(server.url)
        try:
            async with PoolingClient(server.url, prefix=prefix + "2") as client:
                reply = await client.embed("served all the same")
            assert len(reply["data"]) == 1
            assert any("could not create stream POOLWIRE_EVENTS_" in r.getMessage()
                       and "published but not stored" in r.getMessage() for r in caplog.records)
        finally:
            await plain.stop()
