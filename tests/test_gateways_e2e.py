"""Regions on loopback: two clusters (one nats-server each) joined by gateways, poolwire
workers in both in one queue group. A queue group is served inside the requester's cluster
while it has a member there, and through the gateway by the other cluster only when none is
left, so requests published in region A are answered by A's workers; with A's workers stopped,
B's answer them; A's workers back, A serves again. Durable jobs: a jobs stream placed in
cluster A is consumed by a worker of region B through the gateway. Which worker (region)
served is read from each worker's own request counter (the poolwire_requests metric). The
figures go to RELIABILITY.md ("Regions through gateways"; `pytest -s` prints them)."""

import asyncio
import json
import statistics
import time
import urllib.request

import nats.errors
import pytest
from nats.js.api import Placement, RetentionPolicy, StorageType, StreamConfig

from poolwire.actors.durable import durable_names
from poolwire.actors.worker import Worker
from poolwire.client import PoolingClient
from poolwire.settings import WorkerSettings
from tests.gateways import supercluster

REQUESTS = 10        # per phase: enough to see every one stay local, few enough for make test
FAILOVER_LIMIT_S = 10.0


def monitor(server, path: str) -> dict:
    with urllib.request.urlopen(server.monitoring_url + path, timeout=5) as answer:
        return json.loads(answer.read())


async def formed(servers, timeout: float = 30.0) -> float:
    """Seconds until every gateway is up both ways and JetStream's meta group (which spans the
    supercluster) has a leader."""
    start = time.monotonic()
    while True:
        ready = True
        for region, server in servers.items():
            gatewayz = await asyncio.to_thread(monitor, server, "/gatewayz")
            others = set(servers) - {region}
            ready &= others <= set(gatewayz.get("outbound_gateways") or {})
            ready &= others <= set(gatewayz.get("inbound_gateways") or {})
            jsz = await asyncio.to_thread(monitor, server, "/jsz")
            ready &= bool((jsz.get("meta_cluster") or {}).get("leader"))
        if ready:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, "the supercluster did not form in time"
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def regions(tmp_path_factory):
    with supercluster(tmp_path_factory.mktemp("regions")) as servers:
        yield servers


def served(workers: list[Worker]) -> int:
    return int(sum(w.metrics.registry.get_sample_value("poolwire_requests_total",
                                                       {"task": "embed"}) or 0 for w in workers))


async def start_workers(n: int, server, minilm, prefix: str, **settings) -> list[Worker]:
    workers = []
    for _ in range(n):
        worker = Worker(WorkerSettings(prefix=prefix, queue="geo", **settings), minilm)
        await worker.start(server.url)
        workers.append(worker)
    return workers


async def ask(client: PoolingClient, n: int) -> list[float]:
    """n requests one after another; their latencies (seconds), for the report only."""
    took = []
    for i in range(n):
        start = time.monotonic()
        reply = await client.embed([f"text {i}"])
        took.append(time.monotonic() - start)
        assert len(reply["data"]) == 1
    return took


@pytest.mark.timeout(180)
async def test_requests_stay_in_their_region_fail_over_to_the_other_and_come_back(
        regions, minilm, report):
    formed_s = await formed(regions)
    prefix = "geo.rr.pooling"
    a = await start_workers(2, regions["A"], minilm, prefix)
    b = await start_workers(1, regions["B"], minilm, prefix)
    retired: list[Worker] = []
    try:
        async with PoolingClient(regions["A"].url, prefix=prefix, timeout=30) as in_a, \
                PoolingClient(regions["B"].url, prefix=prefix, timeout=30) as in_b:
            # Both regions up: each region's requests are served by its own workers.
            local = await ask(in_a, REQUESTS)
            assert (served(a), served(b)) == (REQUESTS, 0)
            await ask(in_b, REQUESTS)
            assert (served(a), served(b)) == (REQUESTS, REQUESTS)

            # Region A loses its workers: A's requests go through the gateway to B.
            for worker in a:
                await worker.stop()
            retired += a
            stopped = time.monotonic()
            refused = 0
            while True:
                try:
                    await in_a.embed(["first after failover"])
                    break
                except nats.errors.NoRespondersError:
                    refused += 1
                    assert time.monotonic() - stopped < FAILOVER_LIMIT_S, "B never took over"
                    await asyncio.sleep(0.005)
            failover_s = time.monotonic() - stopped
            remote = await ask(in_a, REQUESTS)
            assert (served(retired), served(b)) == (REQUESTS, 2 * REQUESTS + 1)

            # A's workers back: A serves its own requests again, from its first request on.
            a = await start_workers(2, regions["A"], minilm, prefix)
            await ask(in_a, REQUESTS)
            assert (served(a), served(b)) == (REQUESTS, 2 * REQUESTS + 1)
    finally:
        for worker in a + b:
            await worker.stop()
    # The first request after the stop includes one forward pass, so it is set beside the
    # median request of the phases before and after (Triton's interpreter, a shared CPU).
    report("regions", formed_s=f"{formed_s:.2f}", local_share_with_A_up="1.00",
           failover_first_reply_ms=f"{failover_s * 1000:.0f}", no_responders_meanwhile=refused,
           median_ms_served_in_A=f"{statistics.median(local) * 1000:.0f}",
           median_ms_served_by_B_for_A=f"{statistics.median(remote) * 1000:.0f}",
           served_by_B_while_A_down=REQUESTS + 1, local_share_after_A_back="1.00")


@pytest.mark.timeout(120)
async def test_a_jobs_stream_placed_in_one_region_is_consumed_from_the_other(regions, minilm, report):
    """The stream lives in cluster A (as a per-region design places it); a durable worker of
    region B binds to it and answers jobs through the gateway. A region's own prefix gets a
    stream of its own, in that region."""
    await formed(regions)
    prefix = "geo.jobs.pooling"
    names = durable_names(prefix, "geo")
    async with PoolingClient(regions["A"].url, prefix=prefix, timeout=60) as in_a:
        js = in_a.nc.jetstream()
        await js.add_stream(StreamConfig(
            name=names.stream, subjects=[f"{prefix}.jobs.>"], retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE, placement=Placement(cluster="A")))
        (worker,) = await start_workers(1, regions["B"], minilm, prefix, durable=True)
        try:
            start = time.monotonic()
            replies = await asyncio.gather(*(in_a.submit("embed", {"input": [f"job {i}"]})
                                             for i in range(10)))
            took = time.monotonic() - start
            assert all(len(r["data"]) == 1 for r in replies)
            stream = await js.stream_info(names.stream)
            consumer = await js.consumer_info(names.stream, names.consumer)
            assert stream.cluster.name == "A" and consumer.cluster.name == "A"
            assert stream.state.messages == 0 and consumer.num_ack_pending == 0
            assert worker.intakes[0].completed == 10
        finally:
            await worker.stop()
        # One jobs stream per region: a region's own prefix, its stream created by its first
        # durable worker, in the cluster that worker is connected to.
        regional = "geo.b.pooling"
        (worker,) = await start_workers(1, regions["B"], minilm, regional, durable=True)
        try:
            stream = await js.stream_info(durable_names(regional, "geo").stream)
            assert stream.cluster.name == "B"
        finally:
            await worker.stop()
    report("jobs across the gateway", jobs=10, seconds=f"{took:.2f}")


def test_regions_start_again_on_other_ports_when_one_was_taken(tmp_path, monkeypatch):
    """The regions' ports are picked before any server starts; when another process takes
    one meanwhile (here a listening socket holds region B's route port), the started region
    is stopped and both start again on newly picked ports."""
    import socket

    from tests import gateways, procs

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = procs.first_pick_taken(monkeypatch, taken.getsockname()[1])
        with gateways.supercluster(tmp_path) as servers:
            assert len(picks) == 2 and set(servers) == {"A", "B"}
            assert all(server.url for server in servers.values())
