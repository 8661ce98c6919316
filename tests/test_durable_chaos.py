"""Durable jobs through failures: a worker SIGKILLed mid-stream, a worker drained by SIGTERM,
and a node of a three-node JetStream cluster SIGKILLed under load. Workers are subprocesses
(`python -m poolwire serve`) killed by PID. Each test prints its figures as one JSON line
(RELIABILITY.md "Durable jobs and pipelines" quotes them)."""

import asyncio
import json
import time

import msgpack
import nats
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from poolwire.actors.durable import stream_name
from poolwire.actors.events import events_stream_name
from poolwire.actors.worker import Worker
from poolwire.client import PoolingClient
from poolwire.settings import WorkerSettings
from tests.helpers import poll_until
from tests.procs import NatsCluster, WorkerProcess, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

# The waits below are bounded on progress, not on the clock: they fail only when no job was
# answered for this long (a loaded machine is slow; a lost job makes no progress at all).
NO_PROGRESS_S = 90.0


class Load:
    """Durable jobs submitted together; `mark` of them answered is when the test breaks something."""

    def __init__(self, client: PoolingClient, mark: int, tag: str) -> None:
        self.client, self.tag = client, tag
        self.answered = 0
        self.mark = mark
        self.tasks: list[asyncio.Task] = []

    def submit(self, start: int, count: int) -> None:
        self.tasks += [asyncio.create_task(self._job(i)) for i in range(start, start + count)]

    async def _job(self, i: int) -> dict:
        reply = await self.client.submit("embed", {"input": f"{self.tag} document {i}",
                                                   "request_id": f"{self.tag}-{i}"})
        self.answered += 1
        return reply

    async def until(self, count: int, no_progress_s: float = NO_PROGRESS_S) -> None:
        """Until `count` jobs are answered (or failed), failing only when none was for
        `no_progress_s`."""
        pending = {t for t in self.tasks if not t.done()}
        while len(self.tasks) - len(pending) < count:
            answered, pending = await asyncio.wait(pending, timeout=no_progress_s,
                                                   return_when=asyncio.FIRST_COMPLETED)
            if not answered:
                raise TimeoutError(f"{len(self.tasks) - len(pending)} of {count} jobs answered, "
                                   f"none in the last {no_progress_s} s")

    async def results(self, no_progress_s: float = NO_PROGRESS_S) -> tuple[list[str], list[BaseException]]:
        await self.until(len(self.tasks), no_progress_s)
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        return [r["request_id"] for r in results if not isinstance(r, BaseException)], errors


def report(name: str, **figures) -> None:
    print(json.dumps({"test": name, **figures}))


async def durable_stats(nc) -> dict:
    reply = await nc.request("$SRV.STATS.poolwire", b"", timeout=5)
    return json.loads(reply.data)["endpoints"][0]["data"]["durable"]


@pytest.mark.timeout(240)
async def test_a_worker_killed_mid_stream_loses_no_job(nats_server, prefix, tmp_path):
    jobs = 1000
    options = ("--durable", "--durable-ack-wait-s", "1")
    first, second = (WorkerProcess(nats_server.url, prefix, *options, log_dir=tmp_path)
                     for _ in range(2))
    await asyncio.gather(first.start(), second.start())
    nc = await nats.connect(nats_server.url)
    try:
        client = PoolingClient(nc, prefix=prefix, timeout=3600)
        load = Load(client, mark=jobs * 3 // 10, tag="kill")
        started = time.monotonic()
        load.submit(0, jobs)
        await load.until(load.mark)
        first.kill()
        killed = time.monotonic()
        answered_before_kill = load.answered
        ids, errors = await load.results()
        finished = time.monotonic()
        stats = await durable_stats(nc)  # only the survivor answers now
        report("worker_kill", jobs=jobs, answered=len(ids), lost=jobs - len(ids),
               errors=len(errors), answered_before_kill=answered_before_kill,
               duplicates_before_dedup=client.duplicates_dropped,
               duplicates_after_dedup=len(ids) - len(set(ids)),
               redelivered_to_survivor=stats["redelivered"],
               all_answered_s_after_kill=round(finished - killed, 2),
               total_s=round(finished - started, 2))
        assert not errors, errors[:3]
        assert sorted(ids) == sorted(f"kill-{i}" for i in range(jobs))
        assert stats["redelivered"] > 0  # the killed worker held jobs, and they came back
    finally:
        await nc.close()
        await asyncio.gather(first.close(), second.close())


@pytest.mark.timeout(600)
async def test_a_drained_worker_answers_what_it_started_and_leaves_the_rest(minilm, start_worker, nats_server, prefix, tmp_path):
    """The drained worker runs in this process, the other is a subprocess. A job the drained
    worker dropped (neither answered nor handed back) stays unacked until ack_wait (two
    minutes) and then comes back as a redelivery; the jobs it hands back unstarted (naked, and
    counted in `released`) come back at once, also as redeliveries. So the survivor's
    redeliveries must be exactly the released ones: one more is a dropped job. The wait is
    bounded on progress, not on time: the survivor alone serves what is left, slowly on a
    loaded machine, and slow is not lost."""
    jobs = 200
    settings = dict(durable=True, durable_ack_wait_s=120.0, durable_capacity=32)
    other = WorkerProcess(nats_server.url, prefix, "--durable", "--durable-ack-wait-s", "120",
                          "--durable-capacity", "32", log_dir=tmp_path)
    other_started = asyncio.create_task(other.start())
    nc = await nats.connect(nats_server.url)
    try:
        async with start_worker(minilm, **settings) as first:
            await other_started
            client = PoolingClient(nc, prefix=prefix, timeout=3600)
            load = Load(client, mark=40, tag="drain")
            load.submit(0, jobs)
            await load.until(load.mark)
            drained = time.monotonic()
            await first.stop()
            drain_s = time.monotonic() - drained
            [intake] = first.intakes
            try:
                ids, errors = await load.results()
            except TimeoutError as exc:  # say which worker holds what is missing
                info = await nc.jetstream().consumer_info(intake.stream, intake.durable)
                raise AssertionError(
                    f"{exc}; the drained worker: completed {intake.completed}, held "
                    f"{intake.held}, released {intake.released}; the survivor: "
                    f"{await durable_stats(nc)}; the consumer: ack_pending "
                    f"{info.num_ack_pending}, pending {info.num_pending}, redelivered "
                    f"{info.num_redelivered}; the survivor's log: {other.log_tail()}") from exc
        stats = await durable_stats(nc)  # only the survivor answers now
        report("drain", jobs=jobs, answered=len(ids), lost=jobs - len(ids),
               answered_by_drained=intake.completed, released_by_drain=intake.released,
               redelivered_to_survivor=stats["redelivered"],
               duplicates_before_dedup=client.duplicates_dropped, drain_s=round(drain_s, 2),
               all_answered_s_after_drain_began=round(time.monotonic() - drained, 2))
        assert not errors, errors[:3]
        assert sorted(ids) == sorted(f"drain-{i}" for i in range(jobs))
        assert intake.completed > 0 and intake.held == 0
        assert stats["redelivered"] == intake.released, "a job the drained worker took was dropped"
    finally:
        await nc.close()
        other_started.cancel()
        await other.close()


async def wait_for_jetstream(js, timeout: float = 20.0) -> None:
    """The cluster elects its JetStream meta leader some 0.2-0.5 s after start (NATS.md 7) and
    no event says so: try to create a replicated stream until it works, a short pause between
    tries, bounded by the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await js.add_stream(StreamConfig(name="READY", subjects=["ready.>"], num_replicas=3))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def leader_off(nc, js, stream: str, avoid: str, timeout: float = 20.0) -> str:
    """Ask the stream's leader to step down until it is not on `avoid` (the client's node):
    the node killed is then the stream leader, the hardest case. Polled: no event says when a
    new leader is elected."""
    deadline = time.monotonic() + timeout
    while True:
        leader = (await js.stream_info(stream)).cluster.leader
        if leader and leader != avoid:
            return leader
        if time.monotonic() > deadline:
            raise TimeoutError(f"the leader of {stream} stayed on {avoid}")
        if leader == avoid:
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
        await asyncio.sleep(0.2)


@pytest.mark.timeout(240)
async def test_a_cluster_node_killed_under_load_loses_no_job(minilm, prefix, tmp_path):
    jobs_before, jobs_during = 200, 100
    with NatsCluster() as cluster:
        urls = cluster.urls
        # The client stays on C; workers are on A and B; the stream's leader is A or B.
        nc = await nats.connect(servers=[urls["C"], urls["A"], urls["B"]], dont_randomize=True,
                                max_reconnect_attempts=-1)
        js = nc.jetstream()
        await wait_for_jetstream(js)
        # One worker in this process on A, one subprocess on B (a subprocess costs a start).
        options = ("--durable", "--durable-replicas", "3", "--durable-ack-wait-s", "2")
        other = WorkerProcess(urls["B"], prefix, *options, log_dir=tmp_path)
        here = Worker(WorkerSettings(prefix=prefix, durable=True, durable_replicas=3,
                                     durable_ack_wait_s=2.0), minilm)
        try:
            await here.start(urls["A"])
            await other.start()
            stream = stream_name("JOBS", prefix)
            victim = await leader_off(nc, js, stream, avoid="C")
            client = PoolingClient(nc, prefix=prefix, timeout=3600)
            load = Load(client, mark=jobs_before // 2, tag="node")
            started = time.monotonic()
            load.submit(0, jobs_before)
            await load.until(load.mark)
            cluster.kill(victim)
            killed = time.monotonic()
            load.submit(jobs_before, jobs_during)  # published through the leader election
            ids, errors = await load.results()
            finished = time.monotonic()
            jobs = jobs_before + jobs_during
            new_leader = (await js.stream_info(stream)).cluster.leader
            report("cluster_node_kill", jobs=jobs, answered=len(ids), lost=jobs - len(ids),
                   errors=len(errors), killed_node=victim, new_leader=new_leader,
                   duplicates_before_dedup=client.duplicates_dropped,
                   duplicates_after_dedup=len(ids) - len(set(ids)),
                   publish_retries=client.publish_retries,
                   all_answered_s_after_kill=round(finished - killed, 2),
                   total_s=round(finished - started, 2))
            assert not errors, errors[:3]
            assert sorted(ids) == sorted(f"node-{i}" for i in range(jobs))
            assert new_leader != victim
        finally:
            await nc.close()
            await other.close()
            await here.stop()


@pytest.mark.timeout(180)
async def test_a_result_whose_stream_is_away_is_stored_later_and_costs_no_delivery(minilm, start_worker, nc, prefix):
    """The results stream vanishes (as when it has no leader: the publish gets no stream
    response) while a document is computed, and comes back 6 s later. With
    `--durable-max-deliveries 1`, the old accounting naked the document after the failed store
    and dead-lettered it as `internal` on its second delivery; now the worker holds it and
    retries the store, so it is stored once, delivered once, and nothing is dead-lettered."""
    root = prefix.replace(".", "_")
    docs, out = f"{root}_DOCS", f"{root}_OUT"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=docs, subjects=[f"{root}.in.>"]))
    results = StreamConfig(name=out, subjects=[f"{root}.out.>"])
    await js.add_stream(results)
    async with start_worker(minilm, pipeline_stream=docs, pipeline_input=f"{root}.in",
                            pipeline_output=f"{root}.out", durable_max_deliveries=1,
                            durable_ack_wait_s=2.0) as worker:
        [intake] = worker.intakes
        await js.delete_stream(out)
        await js.publish(f"{root}.in.1", msgpack.packb({"text": "stored after all"}))
        # The store is being retried: the document is held, its first delivery still open.
        await poll_until(lambda: asyncio.sleep(0, intake.held == 1 and intake.retried == 0))
        # The outage under test is a span of time with nothing to wait on: the stream stays
        # away three ack_waits, while in-progress acks keep the document from redelivery.
        away_s = 6.0
        await asyncio.sleep(away_s)
        await js.add_stream(results)
        await poll_until(lambda: asyncio.sleep(0, intake.completed == 1), timeout=30)
        consumer = await js.consumer_info(docs, f"poolwire_pipeline_{docs}_poolwire")
        stored = (await js.stream_info(out)).state.messages
        dead = (await js.stream_info(stream_name("DEAD", prefix))).state.messages
        msg = await js.get_msg(out, 1)
    report("result_stream_away", away_s=away_s, stored=stored, dead_lettered=dead,
           delivered=consumer.delivered.consumer_seq, redelivered=intake.redelivered)
    assert stored == 1 and dead == 0 and intake.dead_lettered == 0
    assert consumer.delivered.consumer_seq == 1 and intake.redelivered == 0
    assert consumer.num_ack_pending == 0
    assert len(msgpack.unpackb(msg.data)["data"][0]["data"]) == minilm.embedding_size


def test_a_cluster_starts_again_on_other_ports_when_a_route_port_was_taken(monkeypatch):
    """The route ports are picked before the nodes start (each names the others); when
    another process takes one meanwhile (a listening socket holds node C's here), the nodes
    are stopped and start again on newly picked ports, in a fresh folder."""
    import socket

    from tests import procs

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = procs.first_pick_taken(monkeypatch, taken.getsockname()[1])
        with NatsCluster() as cluster:
            assert len(picks) == 2 and set(cluster.urls) == {"A", "B", "C"}
            assert cluster.root.name == "attempt-2" and not cluster.log("A").count("[FTL]")
        assert not cluster.root.exists()  # the folder goes with the cluster


@pytest.mark.timeout(180)
async def test_a_worker_started_before_its_cluster_has_quorum_waits_and_then_serves(
        minilm, prefix, tmp_path, caplog):
    """A durable worker started beside one node of three (no JetStream leader can be elected)
    waits for the election instead of exiting, and serves once a majority is back, its events
    stream made then too. It exited at start before, blaming --queue, when add_consumer timed
    out during an election."""
    with NatsCluster() as cluster:
        cluster.kill("B")
        cluster.kill("C")
        worker = Worker(WorkerSettings(prefix=prefix, durable=True, durable_replicas=3), minilm)
        starting = asyncio.create_task(worker.start(cluster.urls["A"]))
        try:
            await poll_until(lambda: _logged(caplog, "durable: JetStream did not answer"), 60)
            assert not starting.done()
            lone_s = time.monotonic()
            cluster.restart("B")
            cluster.restart("C")
            await asyncio.wait_for(starting, 150)
            bound_s = round(time.monotonic() - lone_s, 2)
            async with PoolingClient(cluster.urls["A"], prefix=prefix, timeout=60) as client:
                reply = await client.submit("embed", {"input": "after the election",
                                                      "request_id": "quorum-1"})
            waits = sum("durable: JetStream did not answer" in r.getMessage()
                        for r in caplog.records)
            report("bind_through_election", waits_logged=waits, bound_s_after_quorum=bound_s)
            assert reply["request_id"] == "quorum-1" and len(reply["data"]) == 1
            # The events stream, which found no leader at start either, is made afterwards.
            nc = await nats.connect(cluster.urls["A"])
            try:
                async def events_kept() -> bool:
                    try:
                        await nc.jetstream().stream_info(events_stream_name(prefix))
                        return True
                    except NotFoundError:
                        return False
                await poll_until(events_kept, 30)
            finally:
                await nc.close()
        finally:
            if not starting.done():
                starting.cancel()
            await worker.stop()


async def _logged(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def test_sigterm_while_a_worker_waits_for_an_election_answers_what_it_took(prefix, tmp_path):
    """`poolwire serve` waiting for a JetStream election at start (its durable intake found no
    leader) already answers plain requests; SIGTERM then drains them like any stop: every
    request it took is answered, and it exits 0 at once with a line that says where it was."""
    with NatsCluster() as cluster:
        cluster.kill("B")
        cluster.kill("C")
        worker = WorkerProcess(cluster.urls["A"], prefix, "--durable", "--durable-replicas", "3",
                               log_dir=tmp_path)
        log = worker.log_path.open("wb")
        worker.proc = await asyncio.create_subprocess_exec(
            *worker.args, stdout=asyncio.subprocess.PIPE, stderr=log, env=worker_env())
        log.close()
        try:
            async def waiting() -> bool:
                return "durable: JetStream did not answer" in worker.log_tail(10**6)
            await poll_until(waiting, 120)
            nc = await nats.connect(cluster.urls["A"])
            try:
                first = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "pending"}),
                                         timeout=30)
                assert len(msgpack.unpackb(first.data)["data"]) == 1
                inbox = nc.new_inbox()
                sub = await nc.subscribe(inbox)
                for i in range(32):
                    await nc.publish(f"{prefix}.embed", msgpack.packb({"input": f"in flight {i}"}),
                                     reply=inbox)
                await nc.flush()  # every request reached the server before the signal
                signalled = time.monotonic()
                worker.terminate()
                replies = [msgpack.unpackb((await sub.next_msg(timeout=60)).data)
                           for _ in range(32)]
                out = (await asyncio.wait_for(worker.proc.stdout.read(), 60)).decode()
                rc = await asyncio.wait_for(worker.proc.wait(), 60)
                exited_s = round(time.monotonic() - signalled, 2)
            finally:
                await nc.close()
            answered = sum(len(r.get("data") or ()) == 1 for r in replies)
            report("sigterm_during_election_wait", answered=answered, exited_s=exited_s)
            assert rc == 0, worker.log_tail()
            assert answered == 32, replies  # nothing it took is lost
            assert "stopped during start-up, connected to NATS" in out, out
        finally:
            await worker.close()
